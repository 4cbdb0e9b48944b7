"""benchmarks/connector_load.py (the vLLM worker's load vs a bare transaction) runs here; on the GPU machine
scripts/gpu/h200_check.sh --bench runs it with the staged and gio paths."""
import os

import pytest


@pytest.mark.parametrize("data_path", ["cpu", "host"])
def test_connector_load_benchmark_runs_on_cpu(tmp_path, data_path, request):
    """benchmarks/connector_load.py (worker vs bare transaction; staged on the GPU machine) works here."""
    import json
    import subprocess
    import sys
    if data_path == "host":
        request.getfixturevalue("gpu_lib")
    bench = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "connector_load.py")
    out = tmp_path / "res.json"
    res = subprocess.run([sys.executable, bench, "--data-path", data_path, "--prefix-tokens", "256", "--layers", "4",
                          "--runs", "1", "--dir", str(tmp_path), "--json", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["bit_exact"] and r["blocks"] == 16 and r["bytes"] == 16 * 4 * 2 * 16 * 8 * 128 * 2
    assert r["worker_gbps"] > 0 and r["bare_gbps"] > 0
    assert os.listdir(tmp_path) == ["res.json"]  # the store went with the run
