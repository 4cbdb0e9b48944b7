"""Metrics: `tutti-admin info --prometheus` (node exporter textfile format) and the Grafana dashboard in
dashboards/, whose every query must name only metrics that are exported (by that textfile, or by the
vLLM connector through vLLM's Prometheus endpoint)."""
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from tutti import Fingerprint, Store, metrics
from tutti.cli import EXIT_OK, EXIT_USAGE, main

# conftest's tiny model, restated: "from conftest import" picks whichever conftest pytest loaded first
# (tests/hil has one too).
TINY = Fingerprint(model_id="tests/tiny", dtype="float16", n_layers=4, kv_heads=2, head_dim=64, block_size=16)
ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "dashboards" / "grafana-tutti.json"
STATS = ROOT / "python" / "tutti" / "vllm" / "stats.py"
# PromQL words the dashboard may use besides metric names
PROMQL = {"sum", "rate", "deriv", "clamp_min", "by", "avg", "max", "min", "increase", "irate"}


def _connector_names() -> set:
    """What the connector exports through vLLM's Prometheus endpoint: prometheus_client Counters named
    tutti:<counter> (seconds as tutti:<name>_seconds), exposed with the _total suffix, and Gauges named
    tutti:<gauge>.  COUNTERS and GAUGES are read from tutti/vllm/stats.py's source: importing it imports
    vLLM and PyTorch (half a minute)."""
    import ast

    tree = ast.parse(STATS.read_text())

    def tuple_named(name):
        return next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                    and any(getattr(t, "id", None) == name for t in n.targets))
    counters = {(f"tutti:{k[:-2]}_seconds" if k.endswith("_s") else f"tutti:{k}") + "_total"
                for k in tuple_named("COUNTERS")}
    return counters | {f"tutti:{k}" for k in tuple_named("GAUGES")}


def _textfile(tmp_path, n_committed=3):
    paths = [str(tmp_path / "kv.img")]
    Store.format(paths, TINY, n_slots=8)
    with Store.open(paths) as s:
        block = bytes(s.geometry.n_layers * s.geometry.n_spans * s.geometry.span_bytes)
        for i in range(n_committed):
            s.put(f"key{i}".encode(), block)
    res = CliRunner().invoke(main, ["info", *paths, "--prometheus"], catch_exceptions=False)
    assert res.exit_code == EXIT_OK, res.output
    return res.stdout


def _samples(text):
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$", line)
            assert m, f"not an exposition line: {line!r}"
            out.setdefault(m.group(1), []).append((m.group(2) or "", float(m.group(3))))
    return out


def test_info_prometheus_values(tmp_path):
    text = _textfile(tmp_path)
    s = _samples(text)
    assert s["tutti_store_slots"][0][1] == 8
    assert s["tutti_store_committed_blocks"][0][1] == 3
    assert s["tutti_store_free_slots"][0][1] == 5
    assert s["tutti_store_occupancy_ratio"][0][1] == pytest.approx(3 / 8)
    assert s["tutti_store_capacity_bytes"][0][1] == 8 * TINY.n_layers * 2 * 16 * TINY.kv_heads * TINY.head_dim * 2
    assert 'model="tests/tiny"' in s["tutti_store_info"][0][0]
    # the store's own bytes-written count: format's writes, 3 blocks (4 KiB objects) and their table pages, a save
    (labels, written), = s["tutti_store_bytes_written_total"]
    assert 'member="0"' in labels and written >= 3 * (TINY.n_layers * 2 * 4096 + 4096)
    since = s["tutti_store_bytes_written_since_timestamp_seconds"][0][1]
    assert since == s["tutti_store_created_timestamp_seconds"][0][1]  # counting since format
    for name in s:
        assert f"# TYPE {name} " in text and f"# HELP {name} " in text


def test_info_prometheus_refuses_json_too(tmp_path):
    paths = [str(tmp_path / "kv.img")]
    Store.format(paths, TINY, n_slots=8)
    res = CliRunner().invoke(main, ["info", *paths, "--prometheus", "--json"])
    assert res.exit_code == EXIT_USAGE and "not both" in res.output


def test_drive_samples_and_label_escaping():
    smart = {"data_written_bytes": 5 * 10**12, "data_read_bytes": 10**12, "percent_used": 7, "avail_spare": 100,
             "power_on_hours": 1000, "media_errors": 0, "critical_warning": 0, "temperature_c": 41}
    text = metrics.render(metrics.drive_samples('a"b\\c', "0000:00:04.0", smart), notes=["two\nlines"])
    assert '{store="a\\"b\\\\c",pci_address="0000:00:04.0"} 5000000000000' in text
    assert "# two lines" in text
    assert set(_samples(text)) == set(metrics.DRIVE_METRICS)


def test_promtool_accepts_the_textfile(tmp_path):
    promtool = shutil.which("promtool")
    if not promtool:
        pytest.skip("promtool not installed (Debian package prometheus): the exposition format is not linted")
    smart = {"data_written_bytes": 1, "data_read_bytes": 1, "percent_used": 1, "avail_spare": 100,
             "power_on_hours": 1, "media_errors": 0, "critical_warning": 0, "temperature_c": 41}
    for text in (_textfile(tmp_path), metrics.render(metrics.drive_samples("u", "0000:00:04.0", smart))):
        res = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stdout + res.stderr


def _queries(dash):
    return [(p["title"], t["expr"]) for p in dash["panels"] for t in p.get("targets", [])]


def _metric_names(expr):
    bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\"[^\"]*\"", "", expr)  # label matchers, ranges, strings
    bare = re.sub(r"(?<![\w:])[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?", "", bare)  # numbers (1e9, 86400)
    words = re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", bare)
    return [w for w in words if w not in PROMQL]


def test_dashboard_queries_name_only_exported_metrics(tmp_path):
    dash = json.loads(DASHBOARD.read_text())
    exported = set(_samples(_textfile(tmp_path))) | set(metrics.DRIVE_METRICS) | _connector_names()
    queries = _queries(dash)
    assert len(queries) >= 8
    used = set()
    for title, expr in queries:
        names = _metric_names(expr)
        assert names, f"{title}: {expr!r} names no metric"
        for n in names:
            assert n in exported, f"{title}: {n} is not exported by tutti-admin info --prometheus or the connector"
        used |= set(names)
    # the dashboard shows what the issue asks for: hit ratio, occupancy, bytes, errors, drive wear
    for need in ("tutti:hit_tokens_total", "tutti_store_occupancy_ratio", "tutti:load_bytes_total",
                 "tutti:save_bytes_total", "tutti:load_errors_total", "tutti_drive_data_written_bytes_total",
                 "tutti_drive_percentage_used", "tutti_store_bytes_written_total", "tutti:store_evictions_total",
                 "tutti:write_budget_left_bytes"):
        assert need in used, need
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))


def test_dashboard_check_catches_a_wrong_name():
    assert _metric_names('sum(rate(tutti:hit_tokenz_total{job="v"}[5m])) / 1e9') == ["tutti:hit_tokenz_total"]
