"""tutti-admin plan: table and JSON output, agreement with tutti.sched, exit codes; no GPU, no torch."""
import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from tutti.cli import EXIT_USAGE, main
from tutti.sched import LLAMA3_8B, ComputeProfile, Hardware, crossover_hit_rate, predict


def run(args, expect=0):
    res = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    assert res.exit_code == expect, f"exit {res.exit_code} != {expect}\n{res.output}"
    return res


def profile_table(path, **io_extra):
    pts = [{"new_tokens": n, "prefix_tokens": p, "layer_s": 1e-4 + 2e-7 * n + 4e-12 * n * (p + n / 2)}
           for n in (1024, 4096, 16384) for p in (0, 16384, 65536)]
    d = {"version": 1, "device": "NVIDIA H200", "date": "2026-11-29", "model": LLAMA3_8B.to_dict(), "compute": pts,
         "io": {"read_gbps": 24.0, "write_gbps": 16.0, "n_ssd": 4, **io_extra}}
    path.write_text(json.dumps(d))
    return path


def test_plan_table():
    out = run(["plan", "--model", "llama3-8b", "--tokens", "32K,128K", "--hit-rates", "0.5,90%"]).output
    assert "Prefill TTFT" in out and "crossover hit rate" in out
    assert "32768" in out and "131072" in out and "90%" in out
    assert "analytic" in out  # says where the compute times come from


def test_plan_json_agrees_with_the_model():
    res = run(["plan", "--model", "llama3-8b", "--ssd-gbps", "3.5", "--n-ssd", "2", "--pcie-gbps", "5",
               "--tokens", "64K", "--hit-rates", "0,0.9", "--prefetch-depth", "3", "--mfu", "0.4", "--json"])
    d = json.loads(res.output)
    hw = Hardware.per_ssd(3.5, 2, pcie_gbps=5.0)
    prof = ComputeProfile.analytic(LLAMA3_8B, 989 * 0.4, 4800)
    assert d["hardware"]["effective_read_gbps"] == pytest.approx(5.0)
    (ln,) = d["lengths"]
    assert ln["tokens"] == 65536
    assert ln["crossover_hit_rate"] == pytest.approx(crossover_hit_rate(LLAMA3_8B, hw, prof, 65536))
    for row, h in zip(ln["rows"], (0.0, 0.9)):
        want = predict(LLAMA3_8B, hw, prof, 65536, h, 3)
        assert row["ttft_s"] == pytest.approx(want.ttft_s) and row["bubble_s"] == pytest.approx(want.bubble_s)
        assert row["recompute_ttft_s"] == pytest.approx(ln["recompute_ttft_s"])
        assert row["write_in_slack_s"] + row["deferred_write_bytes"] / hw.write_bps == pytest.approx(row["write_s"])
    assert ln["rows"][0]["ttft_s"] == pytest.approx(ln["recompute_ttft_s"])  # no hit: recompute
    for row in ln["rows"]:  # loading less than the hit is never predicted slower than loading it all
        assert row["best_ttft_s"] <= row["ttft_s"] and row["best_load_tokens"] <= row["load_tokens"]


def test_plan_best_load_beats_full_load_when_io_bound():
    d = json.loads(run(["plan", "--model", "llama3-8b", "--ssd-gbps", "1", "--n-ssd", "1", "--tokens", "32K",
                        "--hit-rates", "1.0", "--json"]).output)
    (row,) = d["lengths"][0]["rows"]
    assert row["best_load_tokens"] < row["load_tokens"] and row["best_ttft_s"] < 0.9 * row["ttft_s"]
    assert d["lengths"][0]["loading_stops_paying_hit_rate"] is not None


def test_plan_from_profile_uses_its_shape_and_io(tmp_path):
    path = profile_table(tmp_path / "p.json")
    d = json.loads(run(["plan", "--profile", path, "--tokens", "32K", "--json"]).output)
    assert d["model"]["n_layers"] == 32 and d["hardware"]["read_gbps"] == pytest.approx(24.0)
    assert d["hardware"]["write_gbps"] == pytest.approx(16.0) and d["hardware"]["n_ssd"] == 4
    assert d["compute"]["source"] == "measured" and d["compute"]["max_rel_err"] < 1e-9
    over = json.loads(run(["plan", "--profile", path, "--tokens", "32K", "--ssd-gbps", "1", "--json"]).output)
    assert over["hardware"]["read_gbps"] == pytest.approx(4.0)
    assert "fit error" in run(["plan", "--profile", path, "--tokens", "32K"]).output


def test_plan_uses_the_io_rate_alone_and_shows_the_crossover_beside_gemms(tmp_path):
    # I/O measured beside GEMMs (24 GB/s) and alone (2 x faster): the plan uses the rate alone (what loads
    # inside a prefill reached on the H200) and shows the crossover the slower rate gives, below it.
    path = profile_table(tmp_path / "p.json", read_gbps_idle=48.0, write_gbps_idle=40.0)
    d = json.loads(run(["plan", "--profile", path, "--tokens", "32K,128K", "--json"]).output)
    prof = ComputeProfile.from_json(str(path))
    fast, slow = Hardware.per_ssd(12.0, 4, 10.0), Hardware.per_ssd(6.0, 4, 4.0)
    assert d["hardware"]["read_gbps"] == pytest.approx(48.0) and d["hardware"]["io_source"] == "alone"
    assert d["hardware"]["read_gbps_io_beside_gemms"] == pytest.approx(24.0)
    for ln in d["lengths"]:
        assert ln["crossover_hit_rate"] == pytest.approx(crossover_hit_rate(prof.shape, fast, prof, ln["tokens"]))
        assert ln["crossover_hit_rate_io_beside_gemms"] == pytest.approx(
            crossover_hit_rate(prof.shape, slow, prof, ln["tokens"]))
        assert ln["crossover_hit_rate_io_beside_gemms"] < ln["crossover_hit_rate"]
    out = run(["plan", "--profile", path, "--tokens", "32K"]).output
    assert "beside GEMMs" in out and "measured alone" in out
    # Without the alone rates: the rate beside GEMMs, no second column; --ssd-gbps overrides both.
    plain = json.loads(run(["plan", "--profile", profile_table(tmp_path / "q.json"), "--tokens", "32K",
                            "--json"]).output)
    assert "crossover_hit_rate_io_beside_gemms" not in plain["lengths"][0]
    assert plain["hardware"]["io_source"] == "beside GEMMs" and plain["hardware"]["read_gbps"] == pytest.approx(24.0)
    over = json.loads(run(["plan", "--profile", path, "--tokens", "32K", "--ssd-gbps", "5", "--json"]).output)
    assert "crossover_hit_rate_io_beside_gemms" not in over["lengths"][0]
    assert over["hardware"]["io_source"] == "given" and over["hardware"]["read_gbps"] == pytest.approx(20.0)


def test_a_profile_with_a_bad_rate_alone_is_refused(tmp_path):
    path = profile_table(tmp_path / "p.json", read_gbps_idle=-1.0)
    r = run(["plan", "--profile", path, "--tokens", "32K"], expect=2)
    assert "read_gbps_idle" in r.output and "Traceback" not in r.output


@pytest.mark.parametrize("args,msg", [
    ([], "exactly one of --model"),
    (["--model", "llama3-8b", "--profile", __file__], "exactly one of --model"),
    (["--model", "gpt-5"], "'--model': 'gpt-5' is not one of 'llama3-8b'"),
    (["--model", "llama3-8b", "--tokens", "32Q"], "not a token count"),
    (["--model", "llama3-8b", "--tokens", "0"], ">= 1"),
    (["--model", "llama3-8b", "--hit-rates", "1.5"], "not in [0, 1]"),
    (["--model", "llama3-8b", "--hit-rates", "most"], "not a hit rate"),
    (["--model", "llama3-8b", "--ssd-gbps", "0"], "'--ssd-gbps': '0' must be at least 0.001"),
    (["--model", "llama3-8b", "--n-ssd", "0"], "'--n-ssd': 0 is too small: at least 1"),
    (["--model", "llama3-8b", "--mfu", "1.5"], "'--mfu'"),
    (["--profile", "/nonexistent/p.json"], "'/nonexistent/p.json': no such file"),
])
def test_plan_usage_errors(args, msg):
    res = run(["plan", *args], expect=EXIT_USAGE)
    assert msg in res.output


def test_plan_warns_when_the_fit_misses(tmp_path):
    path = profile_table(tmp_path / "p.json")
    d = json.loads(path.read_text())
    d["compute"][4]["layer_s"] *= 3  # one point far off the physical shape
    path.write_text(json.dumps(d))
    out = run(["plan", "--profile", path, "--tokens", "32K"]).output
    assert "warning: the fitted layer time misses a measured point" in out
    assert "new 4096, prefix 16384" in out
    assert "warning" not in run(["plan", "--profile", profile_table(tmp_path / "q.json"), "--tokens", "32K"]).output


def test_plan_bad_profile_says_why(tmp_path):
    path = profile_table(tmp_path / "p.json")
    d = json.loads(path.read_text())
    d["compute"][4]["layer_s"] = 0
    path.write_text(json.dumps(d))
    res = run(["plan", "--profile", path], expect=EXIT_USAGE)
    assert "compute[4]: 'layer_s' must be a number > 0" in res.output


def test_plan_runs_without_torch_or_gpu():
    code = ("import sys; from tutti.cli import main\n"
            "try:\n main(['plan','--model','qwen2.5-7b','--tokens','8K','--json'])\n"
            "except SystemExit as e:\n assert e.code in (0, None), e.code\n"
            "assert 'torch' not in sys.modules, 'plan imported torch'\n")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["model"]["name"] == "qwen2.5-7b"


@pytest.mark.parametrize("bad", ["Infinity", "0", "true", "\"fast\""])
def test_a_profile_with_an_unusable_io_rate_alone_is_refused(tmp_path, bad):
    p = tmp_path / "p.json"
    profile_table(p, read_gbps_idle=1.0)
    p.write_text(p.read_text().replace('"read_gbps_idle": 1.0', f'"read_gbps_idle": {bad}'))
    r = run(["plan", "--profile", p, "--tokens", "32K"], expect=2)
    assert "read_gbps_idle" in r.output and "Traceback" not in r.output


def test_a_rate_given_on_the_command_line_says_so_and_drops_the_second_column(tmp_path):
    path = profile_table(tmp_path / "p.json", read_gbps_idle=48.0, write_gbps_idle=40.0)
    d = json.loads(run(["plan", "--profile", path, "--tokens", "32K", "--ssd-write-gbps", "3", "--json"]).output)
    assert d["hardware"]["io_source"] == "alone" and d["hardware"]["write_gbps"] == pytest.approx(12.0)
    assert "crossover_hit_rate_io_beside_gemms" not in d["lengths"][0]
