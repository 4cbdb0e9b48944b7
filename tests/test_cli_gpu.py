"""tutti-admin gpu: what the GPU data paths need and whether this machine has it (runs anywhere)."""
import json
import os

import pytest
from click.testing import CliRunner

from tutti.cli import EXIT_PROBLEMS, main


def invoke(args, env):
    from tutti.gpu import _ffi
    _ffi._lib = None  # the library is looked up again under this environment
    try:
        return CliRunner(env=env).invoke(main, ["gpu", *args], catch_exceptions=False)
    finally:
        _ffi._lib = None


def test_missing_library_is_reported_with_how_to_get_it(tmp_path):
    res = invoke(["--json"], {"TUTTI_GPU_LIB": str(tmp_path / "none.so")})
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert s["library"]["ok"] is False and "TUTTI_GPU=1 pip install" in s["library"]["detail"]
    assert all("libtutti_gpu.so" in p["missing"] for p in s["paths"].values())
    assert s["vllm_gpu_kv_ready"] is False
    res = invoke(["--require", "staged"], {"TUTTI_GPU_LIB": str(tmp_path / "none.so")})
    assert res.exit_code == EXIT_PROBLEMS
    assert "required data path(s) not ready: staged" in res.output
    assert "refuse to start" in res.output


def test_report_matches_what_the_machine_has():
    torch = pytest.importorskip("torch")
    lib = os.environ.get("TUTTI_GPU_LIB")
    if not lib or not os.path.isfile(lib):
        pytest.skip("TUTTI_GPU_LIB does not name a built libtutti_gpu.so (make test sets it)")
    res = invoke(["--json"], {"TUTTI_GPU_LIB": lib})
    s = json.loads(res.stdout)
    assert s["library"]["ok"] is True and s["library"]["path"] == lib
    cuda = torch.cuda.is_available()
    assert s["cuda"]["ok"] is cuda and len(s["cuda"]["devices"]) == torch.cuda.device_count()
    assert s["paths"]["staged"]["ready"] is cuda and s["vllm_gpu_kv_ready"] is cuda
    want = 0 if cuda else EXIT_PROBLEMS
    assert invoke(["--require", "staged", "--require", "gio"], {"TUTTI_GPU_LIB": lib}).exit_code == want


def test_a_library_named_by_a_fifo_is_not_loaded(tmp_path):
    """dlopen opens the path: TUTTI_CUFILE naming a FIFO hung `tutti-admin gpu`."""
    fifo = tmp_path / "lib.fifo"
    os.mkfifo(fifo)
    res = invoke(["--json"], {"TUTTI_GPU_LIB": str(fifo), "TUTTI_CUFILE": str(fifo)})
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert s["library"]["ok"] is False and "is a FIFO, not a library file" in s["library"]["detail"]
    assert s["cufile"]["ok"] is False and "TUTTI_CUFILE" in s["cufile"]["detail"]
    assert "FIFO" in s["cufile"]["detail"]
