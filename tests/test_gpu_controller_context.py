"""The emulated controller makes progress with CUDA started first and its queues busy (needs a CUDA device).

Its data is moved by the gio kernels that wait for it (TUTTI_EMU_DMA=kernel, the default): the
controller's threads make no CUDA call, so nothing in the GPU's hardware queues can hold them up.  Before,
its copies ran on the copy engines, first from the primary context (they shared its hardware queues with
the gio kernels that wait for them and with compute streams waiting on those: on the H200 the layer-order
read hung in 6 of 12 processes with 32 queues), then from a context of its own (rarer, still stuck about
once in ten runs of the prefill harness, and always with CUDA_DEVICE_MAX_CONNECTIONS=1: docs/gpu.md).
Here CUDA starts before libtutti is loaded (as in vLLM's workers), with CUDA's default hardware queues and
with a single one, and a layer-wise read is ordered before compute on the GPU five times over: every layer
must land, bit-exact, within the bound.  The copy-engine mode runs once too, with the default queues.
"""
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

HERE = os.path.dirname(os.path.abspath(__file__))

SCRIPT = textwrap.dedent("""
    import sys
    import torch
    torch.cuda.init(); torch.zeros(1, device="cuda")   # CUDA first, with the environment's queue count
    sys.path.insert(0, sys.argv[1])
    import test_gpu_store_py as t

    with t._Dir() as d:
        rig = t.LayerOrderRig(torch, d.paths, torch.cuda.Stream(), seed=3)
        for rnd in range(5):
            assert rig.read_round(), f"round {rnd}: compute ran before its layer landed"
        rig.close()
    print("ROUNDS OK", flush=True)
""")



@pytest.mark.parametrize("dma,connections", [("kernel", None), ("kernel", "1"), ("copy", None)],
                         ids=["kernels-default-queues", "kernels-one-hw-queue", "copy-engines-default-queues"])
def test_progress_with_cuda_started_first(tmp_path, gpu_lib, dma, connections):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    script = tmp_path / "ctx.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, TUTTI_GIO_WAIT_TIMEOUT_S="20", PYTHONUNBUFFERED="1", TUTTI_EMU_DMA=dma)
    env.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
    if connections:
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = connections
    p = subprocess.run([sys.executable, str(script), HERE], env=env, capture_output=True, text=True,
                       timeout=180)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    assert "ROUNDS OK" in p.stdout
