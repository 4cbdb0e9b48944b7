"""benchmarks/write_budget.py: the connector's scheduler and worker sides over simulated hours, with and
without a write budget. A short run: the budget holds, refusals are counted, hits can only be lost."""
import json
import os
import subprocess
import sys


def test_write_budget_benchmark_runs(tmp_path):
    bench = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "write_budget.py")
    out = tmp_path / "res.json"
    res = subprocess.run([sys.executable, bench, "--hours", "12", "--budgets", "0.5", "--capacity", "256MiB",
                          "--dir", str(tmp_path), "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    r = json.loads(out.read_text())
    ref, *budgeted = r["runs"]
    assert ref["budget_bytes_per_day"] is None and ref["hit_tokens"] > 0 and ref["skipped_blocks"] == 0
    assert {b["policy"] for b in budgeted} == {"expected_value", "second_hit"}
    for b in budgeted:
        assert b["requests"] == ref["requests"]
        # Written within the budget plus the bucket's first hour (12 h here: at most 1 + 1/12 of it).
        assert b["written_bytes_per_day"] <= b["budget_bytes_per_day"] * (1 + 1 / 12) * 1.01
        assert b["skipped_blocks"] > 0 and 0 <= b["hits_lost"] < 1
        assert b["hit_tokens"] <= ref["hit_tokens"]
    assert os.listdir(tmp_path) == ["res.json"]
