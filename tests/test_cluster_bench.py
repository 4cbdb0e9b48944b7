"""benchmarks/cluster_ttft.py and cluster_serving.py: the parts that need no vLLM and no master (argument
checks, the report from a run's results).  The benchmarks themselves start vLLM engines for minutes: not
run in CI (docs/benchmarks.md has their runs)."""
import importlib.util
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("argv, msg", [
    (["--lengths", "4096,x"], "not a list of integers"),
    (["--lengths", "64"], "each between"),
    (["--lengths", "300000"], "each between"),
    (["--requests", "0"], "--requests: 1 to 16"),
])
def test_cluster_ttft_refuses_bad_arguments(argv, msg, capsys):
    with pytest.raises(SystemExit) as e:
        _load("cluster_ttft").parse_args(argv)
    assert e.value.code == 2 and msg in capsys.readouterr().err


@pytest.mark.parametrize("argv, msg", [
    (["--rate-multiples", "1,x"], "not a list of numbers"),
    (["--rate-multiples", "0"], "each > 0"),
    (["--docs", "-1"], "--docs: must be >= 1"),
    (["--doc-tokens", "100000"], "at most 65536"),
])
def test_cluster_serving_refuses_bad_arguments(argv, msg, capsys):
    with pytest.raises(SystemExit) as e:
        _load("cluster_serving").parse_args(argv)
    assert e.value.code == 2 and msg in capsys.readouterr().err


def _ttft_result(ttfts, lengths, stats=None, outputs=None):
    return {"ttft_s": ttfts, "outputs": outputs or [[1, 2]] * len(lengths), "stats": stats or {}}


def test_cluster_ttft_report_is_medians_per_length_and_ratios():
    mod = _load("cluster_ttft")
    lengths = [0, 4096, 4096, 8192, 8192]            # 0: the warm-up, left out
    res = {"A": _ttft_result([9, 1.0, 1.2, 2.0, 2.2], lengths),
           "none": _ttft_result([9, 0.8, 1.0, 1.6, 2.0], lengths),
           "remote": _ttft_result([9, 0.2, 0.4, 0.4, 0.6], lengths,
                                  stats={"scheduler": {"remote_hit_tokens": 24576},
                                         "worker0": {"remote_blocks": 96, "remote_errors": 0, "load_errors": 0}}),
           "local": _ttft_result([9, 0.1, 0.1, 0.2, 0.2], lengths, outputs=[[1, 2]] * 4 + [[9]])}
    data = {"results": res, "lengths": lengths, "model": {"num_hidden_layers": 2, "hidden_size": 256,
                                                          "num_key_value_heads": 2},
            "model_size": "tiny", "block": 128, "block_bytes": 131072, "date": "d", "machine": "m", "loadavg": 1.0}
    text = mod.render(data, "cmd")
    assert "| 4096 | 0.900 s | 0.300 s | 0.100 s | 0.33 | 3.00 | 1.100 s |" in text
    assert "| 8192 | 1.800 s | 0.500 s | 0.200 s | 0.28 | 2.50 | 2.100 s |" in text
    assert "remote yes, local NO" in text                       # a differing output is reported, not hidden
    assert "24576 tokens promised from the cluster, 96 blocks fetched verified" in text
    assert "| 0 |" not in text                                  # the warm-up is not a row


def test_cluster_serving_report_counts_hits_per_node_and_differing_outputs():
    mod = _load("cluster_serving")
    req = {"ttft_s": 0.5, "key": "k0", "ids": [1]}
    rec_i = {"config": "independent", "cold": [dict(req, key="c0")], "cold_p50": 0.5,
             "rates": [{"rate": 1.0, "summary": {"p50": 0.5, "p99": 0.9, "failed": 0}, "requests": [req]}],
             "stats": [{"scheduler": {"query_tokens": 1000, "hit_tokens": 100}}] * 2}
    rec_c = {"config": "cluster", "cold": [dict(req, key="c0")], "cold_p50": 0.4,
             "rates": [{"rate": 1.0, "summary": {"p50": 0.3, "p99": 0.6, "failed": 0},
                        "requests": [dict(req, ids=[2])]}],
             "stats": [{"scheduler": {"query_tokens": 1000, "hit_tokens": 600, "remote_hit_tokens": 400},
                        "worker0": {"remote_blocks": 3, "remote_errors": 0, "load_errors": 0}},
                       {"scheduler": {"query_tokens": 1000, "hit_tokens": 100}}]}
    outputs = mod.compare([rec_i, rec_c])
    assert outputs == {"cluster": {"compared": 2, "differ": ["k0"]}}
    meta = {"workload": {"docs": 1, "doc_tokens": 256, "questions": 1, "question_tokens": 8},
            "model": {"size": "tiny", "num_hidden_layers": 2, "hidden_size": 256}, "kv_cache_bytes": 1 << 20,
            "multiples": [1.0], "reference_cold_s": 0.5, "date": "d", "command": "c", "machine": "m",
            "loadavg": 1.0}
    text = mod.render(meta, [rec_i, rec_c], outputs)
    assert "cluster: 1 of 2 differ" in text
    assert "| cluster | 0 | 1000 | 200 | 400 | 40.0% | 3 / 0 | 0 |" in text
    assert "| independent | 1 | 1000 | 100 | 0 | 0.0% | 0 / 0 | 0 |" in text
    assert "| cluster | 1.000 | 0.300 s | 0.600 s | 0 |" in text


def test_scratch_dir_keeps_a_given_workdir_and_removes_its_own_even_on_failure(tmp_path):
    from tutti.bench import scratch_dir
    given = tmp_path / "work" / "deep"
    with scratch_dir(str(given), "tutti-test-") as d:
        assert d == str(given) and given.is_dir()
    assert given.is_dir()
    with pytest.raises(RuntimeError):
        with scratch_dir(None, "tutti-test-") as d:
            own = d
            assert own.startswith("/var/tmp/tutti-test-") and os.path.isdir(own)
            raise RuntimeError("benchmark failed")
    assert not os.path.exists(own)
