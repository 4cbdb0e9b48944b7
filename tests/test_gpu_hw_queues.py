"""The emulated controller refuses to run with fewer CUDA hardware queues than it needs (runs without a GPU).

With CUDA's default 8 hardware queues the controller's copies shared queues with the gio kernels that wait
for them and the store's gio path hung on the H200 (docs/gpu.md); libtutti asks for 32 and refuses, with
the reason, when it did not get them.
"""
import errno
import json

import pytest
from click.testing import CliRunner

from tutti.cli import main


@pytest.fixture
def queues(gpu_lib, monkeypatch):
    monkeypatch.delenv("TUTTI_EMU_SHARED_QUEUES", raising=False)

    def set_to(v):
        monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", v)  # putenv: the C library sees it
        return gpu_lib.tt_gpu_hw_queues()
    return set_to


def test_import_requested_32_before_cuda():
    import os

    from tutti.gpu import hw_queues
    if hw_queues.user_setting() is not None:
        pytest.skip(f"CUDA_DEVICE_MAX_CONNECTIONS was set by the environment ({hw_queues.user_setting()})")
    assert os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] == "32"


def test_count_follows_the_variable(queues):
    assert queues("32") == 32
    assert queues("8") == 8
    assert queues("64") == 32  # CUDA's maximum
    assert queues("0") == 1


def test_too_few_queues_is_refused_with_the_reason(queues, gpu_lib, monkeypatch):
    from tutti.gpu import _ffi
    assert queues("8") == 8
    assert gpu_lib.tt_emu_check_hw_queues() == -errno.EDEADLK
    msg = _ffi.ffi.string(gpu_lib.tt_errmsg()).decode()
    assert "CUDA_DEVICE_MAX_CONNECTIONS=32" in msg and "has 8" in msg
    assert queues("32") == 32 and gpu_lib.tt_emu_check_hw_queues() == 0
    monkeypatch.setenv("TUTTI_EMU_SHARED_QUEUES", "1")
    assert queues("8") == 8 and gpu_lib.tt_emu_check_hw_queues() == 0


def test_controller_open_refuses_before_touching_cuda(queues):
    from tutti.gpu import EmulatedController
    queues("8")
    with pytest.raises(OSError) as e:
        EmulatedController(n_ns=1, ns_bytes=1 << 20, n_queues=2, depth=64, n_threads=1)
    assert e.value.errno == errno.EDEADLK and "CUDA_DEVICE_MAX_CONNECTIONS=32" in str(e.value)


def test_admin_gpu_reports_a_user_setting_below_32(queues):
    from tutti.gpu import _ffi
    lib_path = str(_ffi.library_path())
    _ffi._lib = None
    try:
        res = CliRunner(env={"CUDA_DEVICE_MAX_CONNECTIONS": "8", "TUTTI_GPU_LIB": lib_path}).invoke(
            main, ["gpu", "--json"], catch_exceptions=False)
    finally:
        _ffi._lib = None
    s = json.loads(res.stdout)
    assert s["hw_queues"] == {"ok": False, "value": "8",
                              "detail": "CUDA_DEVICE_MAX_CONNECTIONS=8: the gio path's emulated controller needs 32"}
    assert s["paths"]["gio"]["ready"] is False
    assert "CUDA_DEVICE_MAX_CONNECTIONS=32" in s["paths"]["gio"]["missing"]


ORDER_SCRIPT = """
import errno, sys
import torch
if sys.argv[1] == "cuda-first":
    torch.zeros(1, device="cuda")  # the context exists before libtutti is loaded
from tutti.gpu import EmulatedController, lib
try:
    EmulatedController(n_ns=1, ns_bytes=1 << 20, n_queues=2, depth=64, n_threads=1).close()
    print("opened with", lib().tt_gpu_hw_queues(), "queues")
except OSError as e:
    print("refused", "EDEADLK" if e.errno == errno.EDEADLK else e.errno, e)
"""


@pytest.mark.parametrize("order,want", [("tutti-first", "opened with 32 queues"), ("cuda-first", "refused EDEADLK")])
def test_on_gpu_the_request_is_in_time_or_the_controller_refuses(gpu_lib, order, want):
    """On a GPU: importing tutti.gpu before CUDA starts gets 32 queues; starting CUDA first is refused, not hung."""
    import os
    import subprocess
    import sys
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_DEVICE_MAX_CONNECTIONS", "TUTTI_EMU_SHARED_QUEUES")}
    r = subprocess.run([sys.executable, "-c", ORDER_SCRIPT, order], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert want in r.stdout, r.stdout + r.stderr
