"""benchmarks/save_step_gpu.py (TTFT with and without saves, the data path's save and load rates) runs here
with --cpu --tiny (host KV cache, cpu data path, a 2-layer model); on the H200 with staged and gio."""
import json
import os
import subprocess
import sys


def test_save_step_benchmark_runs_on_cpu(tmp_path):
    bench = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "save_step_gpu.py")
    out = tmp_path / "res.json"
    res = subprocess.run([sys.executable, bench, "--cpu", "--tiny", "--tokens", "128", "--rate-tokens", "256",
                          "--requests", "2", "--decode-steps", "2", "--dir", str(tmp_path), "--json", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    r = json.loads(out.read_text())
    (rate,) = r["rates"]
    assert rate["bit_exact"] and rate["tokens"] == 256 and rate["bytes"] > 0
    assert len(rate["write_s"]) == len(rate["read_s"]) == 3 and rate["save_gbps"] > 0 and rate["load_gbps"] > 0
    (step,) = r["steps"]
    assert step["tokens"] == 128
    for v in ("none", "deferred", "step"):
        assert len(step[v]["ttft_s"]) == 3 and all(t > 0 for t in step[v]["ttft_s"])
    # Every measured request's deferred save was committed by the decode steps that followed it.
    assert len(step["deferred"]["decode_steps_to_commit"]) == 2
    assert all(1 <= n <= 48 for n in step["deferred"]["decode_steps_to_commit"])
    assert step["deferred"]["stats"]["save_blocks"] == 3 * 8 and step["step"]["stats"]["save_blocks"] == 3 * 8
    assert step["none"]["stats"]["save_blocks"] == 0
    for k in ("decode_busy_over_idle", "decode_busy_mean_over_idle"):  # median and mean, both reported
        assert step.get(k, 1.0) > 0
    assert ("decode_busy_over_idle" in step) == ("decode_busy_mean_over_idle" in step)
    assert os.listdir(tmp_path) == ["res.json"]  # the stores went with the run


def test_a_slow_fixed_drain_gets_the_steps_it_needs(tmp_path):
    """With a fixed drain_bytes_per_step the harness allows the steps that rate needs to write the prompt's KV
    (here over the default 400), instead of failing the run; after_step's writes all go with the drains."""
    bench = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "save_step_gpu.py")
    out = tmp_path / "res.json"
    res = subprocess.run([sys.executable, bench, "--cpu", "--tiny", "--parts", "steps", "--tokens", "128",
                          "--requests", "1", "--decode-steps", "2", "--variants", "deferred", "--write-policy",
                          "after_step", "--drain-bytes-per-step", "64", "--dir", str(tmp_path), "--json", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    (step,) = json.loads(out.read_text())["steps"]
    assert all(n > 400 for n in step["deferred"]["decode_steps_to_commit"]), step["deferred"]["decode_steps_to_commit"]
    assert step["deferred"]["stats"]["save_blocks"] == 2 * 8
