"""benchmarks/serving.py's parts that need no server: the document workload, the Poisson schedule,
TTFT statistics and the SLO rate, the server log's error line, argument checks and the report.

The benchmark itself starts vLLM servers for many minutes: it is not run in CI.
"""
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from tutti.bench import serve, workload
from tutti.bench.serving_report import render

ROOT = Path(__file__).resolve().parents[1]
INF = float("inf")


def _bench():
    spec = importlib.util.spec_from_file_location("serving_bench", ROOT / "benchmarks" / "serving.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_documents_share_a_prefix_per_document_and_are_the_same_in_every_process():
    kw = dict(docs=3, questions=2, doc_tokens=256, question_tokens=8, vocab_size=2048, seed=5)
    reqs = workload.document_requests("rate0", **kw)
    assert len(reqs) == 6 and len({r.key for r in reqs}) == 6
    by_doc = {}
    for r in reqs:
        assert len(r.prompt) == 264 and all(3 <= t < 2048 for t in r.prompt)
        by_doc.setdefault(r.doc, []).append(r.prompt)
    for prompts in by_doc.values():
        assert prompts[0][:256] == prompts[1][:256] and prompts[0][256:] != prompts[1][256:]
    assert by_doc[0][0][:256] != by_doc[1][0][:256]
    assert workload.document_requests("rate1", **kw)[0].prompt[:256] != reqs[0].prompt[:256]
    # Another process (another hash seed) builds the same prompts: configurations are comparable.
    code = ("from tutti.bench import workload; import sys; r = workload.document_requests('rate0', docs=3, "
            "questions=2, doc_tokens=256, question_tokens=8, vocab_size=2048, seed=5); "
            "print(sum(sum(x.prompt) for x in r))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "123", "PATH": "/usr/bin:/bin"})
    assert int(out.stdout) == sum(sum(r.prompt) for r in reqs)


def test_poisson_schedule_is_seeded_shuffled_and_has_the_rate():
    reqs = workload.document_requests("x", docs=50, questions=4, doc_tokens=4, question_tokens=1,
                                      vocab_size=64, seed=0)
    a = workload.poisson_schedule(reqs, 5.0, seed=1)
    assert a == workload.poisson_schedule(reqs, 5.0, seed=1)
    assert [r.key for r in a] != [r.key for r in reqs] and sorted(r.key for r in a) == sorted(r.key for r in reqs)
    times = [r.at_s for r in a]
    assert times[0] == 0 and times == sorted(times)
    assert 0.8 / 5 < times[-1] / (len(times) - 1) < 1.2 / 5  # mean gap 1/rate (200 arrivals)
    with pytest.raises(ValueError):
        workload.poisson_schedule(reqs, 0, seed=1)


def test_session_schedule_opens_documents_at_a_steady_pace():
    q, reuse, rate = 4, 16.0, 2.0
    reqs = workload.document_requests("x", docs=200, questions=q, doc_tokens=2, question_tokens=1,
                                      vocab_size=64, seed=0)
    a = workload.session_schedule(reqs, rate, seed=3, reuse=reuse)
    assert a == workload.session_schedule(reqs, rate, seed=3, reuse=reuse)
    assert sorted(r.key for r in a) == sorted(r.key for r in reqs)
    times = [r.at_s for r in a]
    assert times[0] == 0 and times == sorted(times)
    seen = {}
    for r in a:  # a document's questions in order, the first one opening it
        assert r.question == seen.get(r.doc, -1) + 1
        seen[r.doc] = r.question
    lo, hi = workload.steady_window(a, rate, reuse)
    assert lo == pytest.approx((q - 1) * reuse / rate)
    assert hi == max(r.at_s for r in a if r.question == 0)
    inside = [r for r in a if lo <= r.at_s <= hi]
    assert 0.8 * rate < len(inside) / (hi - lo) < 1.2 * rate  # the nominal rate inside the window
    assert 0.2 < sum(r.question == 0 for r in inside) / len(inside) < 0.3  # 1 in q opens a document
    gaps = [b.at_s - x.at_s for x in a for b in a if b.doc == x.doc and b.question == x.question + 1]
    assert 0.8 * reuse / rate < sum(gaps) / len(gaps) < 1.2 * reuse / rate
    # The shuffled order crowds first sightings into the start; sessions keep them level.
    first_half = [r for r in a if r.at_s < hi / 2]
    assert sum(r.question == 0 for r in first_half) / len(first_half) < 0.45
    with pytest.raises(ValueError):
        workload.session_schedule(reqs, rate, seed=1, reuse=0)


def test_summary_counts_failures_as_infinite_and_quantiles_are_observed_values():
    s = workload.summarize([0.1 * i for i in range(1, 101)], quantile=0.9)
    assert s["p50"] == pytest.approx(5.1) and s["p90"] == pytest.approx(9.1) and s["p99"] == pytest.approx(10.0)
    assert s["p_slo"] == s["p90"] and s["failed"] == 0
    s = workload.summarize([0.2] * 8 + [None, None], quantile=0.9)
    assert s["failed"] == 2 and s["p99"] == INF and s["p50"] == 0.2 and s["mean"] == pytest.approx(0.2)


def test_highest_rate_at_the_slo():
    def at(p):
        return {"p_slo": p}
    assert workload.max_rate_meeting_slo({1: at(0.5), 2: at(0.9), 4: at(3.0)}, 1.0) == (2, "exact")
    assert workload.max_rate_meeting_slo({1: at(0.5), 2: at(0.9)}, 1.0) == (2, "at least")
    assert workload.max_rate_meeting_slo({1: at(2.0), 2: at(0.5)}, 1.0) == (None, "below")
    # A rate counts only when every lower rate met the SLO too (no lucky point past the knee).
    assert workload.max_rate_meeting_slo({1: at(0.5), 2: at(5.0), 3: at(0.5)}, 1.0) == (1, "exact")
    assert workload.max_rate_meeting_slo({1: {"p_slo": 9, "p50": 0.5}}, 1.0, "p50") == (1, "at least")
    assert workload.rate_ratio((4, "exact"), (2, "exact")) == "2.00"
    assert workload.rate_ratio((4, "at least"), (2, "exact")) == "≥ 2.00"
    assert workload.rate_ratio((None, "below"), (2, "exact")) == "—"


def test_error_reason_is_the_root_cause_line():
    log = ("(APIServer pid=1) WARNING 12-01 [system_utils.py:255] Found ulimit ... like `OSError: [Errno 24] Too "
           "many open files`. Consider increasing\n"
           "Traceback (most recent call last):\n  File x\n"
           "(EngineCore pid=1) ERROR 12-01 22:58:14 [core.py:1234] Exception: CPU Offloading is currently only "
           "supported on CUDA-alike and XPU GPUs\n"
           "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}\n"
           "  warnings.warn('resource_tracker: There appear to be %d '\n")
    assert serve.error_reason(log) == ("Exception: CPU Offloading is currently only supported on CUDA-alike "
                                       "and XPU GPUs")
    assert serve.error_reason("(Worker pid=3) ERROR [x.py:1] RuntimeError: shape mismatch: a\n") == \
        "RuntimeError: shape mismatch: a"
    assert serve.error_reason("just text\n") == "just text"


@pytest.mark.parametrize("argv, msg", [
    (["--configs", "none,bogus"], "--configs"),
    (["--configs", "tutti,none"], "put 'none' first"),
    (["--doc-tokens", "100"], "multiple of the block size"),
    (["--rates", "1,x"], "comma-separated numbers"),
    (["--throttle-mbps", "0.5"], "--throttle-mbps must be >= 1"),
    (["--docs", "0"], "--docs must be >= 1"),
    (["--order", "sessions", "--docs", "4"], "steady window"),
    (["--order", "sessions", "--reuse", "0"], "--reuse must be > 0"),
])
def test_bad_arguments_are_refused_before_any_server_starts(argv, msg, capsys):
    with pytest.raises(SystemExit) as e:
        _bench().parse_args(argv)
    assert e.value.code == 2 and msg in capsys.readouterr().err


def test_sessions_default_to_enough_documents_for_a_steady_window():
    a = _bench().parse_args(["--order", "sessions"])
    assert a.docs == 30 and a.order == "sessions" and a.reuse == 16.0
    assert _bench().parse_args([]).docs == 12


def test_absolute_values_allow_runs_without_the_reference():
    a = _bench().parse_args(["--configs", "tutti", "--rates", "2,1", "--slo-ms", "500", "--throttle-mbps", "20"])
    assert a.configs == ["tutti"] and a.rate_list == [1.0, 2.0] and a.throttle_mbps == 20.0


def _meta(command="c", **workload):
    """A run's meta as serving.py writes it: 2 rates, SLO 3 s, 12 documents unless ``workload`` says."""
    return {"command": command, "date": "d",
            "machine": {"node": "n", "cpu": "c", "cores": 2, "kernel": "k", "python": "3", "vllm": "v",
                        "loadavg_end": (1.0, 1.0, 1.0)},
            "model": {"size": "small", "num_hidden_layers": 6, "hidden_size": 768, "num_attention_heads": 12,
                      "num_key_value_heads": 4},
            "kv_per_token": 6144, "doc_bytes": 9 << 20, "kv_cache_bytes": 36 << 20, "block": 128,
            "workload": {"docs": 12, "questions": 4, "doc_tokens": 1536, "question_tokens": 32, "cold": 4,
                         "max_tokens": 2, "seed": 0, "runs": 1, **workload},
            "rates": [1.0, 2.0], "slo_s": 3.0, "slo_quantile": 0.9, "throttle_mbps": 20,
            "reference_cold_s": 1.0}


def test_sessions_report_names_the_window():
    bench = _bench()
    recs = [_record("none", 1.0, (1.0, 9.0), [1, 2]), _record("tutti", 1.02, (0.3, 0.5), [1, 2])]
    for rec in recs:
        for x in rec["rates"]:
            x["window_s"], x["summary_all"] = [1.0, 2.0], workload.summarize([0.1] * 8)
    runs = [{"records": recs, "outputs": bench.compare_outputs(recs)}]
    meta = _meta(docs=30, order="sessions", reuse=16.0)
    text = render(meta, runs, "T")
    assert "a document opens at every 4th arrival" in text and "12 documents in use at once, 3.0×" in text
    assert "over the steady window" in text and ": 50%–50% of the requests" in text
    assert "| TuttiConnector (disk) | ≥ 2.000 | ≥ 2.00 |" in text  # judged on the window's summaries
    assert "over every request sent" in text  # and on every request's, in a table of its own
    assert "| TuttiConnector (disk) | ≥ 2.000 | ~1.00 | 0.100 | 0.100 |" in text  # all 0.1 s there


def _record(name, cold, p50s, ids, failed=None):
    if failed:
        return {"config": name, "failed": failed}
    rates = [{"rate": r, "summary": workload.summarize([p] * 4), "requests": [
        {"key": f"r{r}/{i}", "ids": ids, "ttft_s": p} for i in range(4)]} for r, p in zip((1.0, 2.0), p50s)]
    return {"config": name, "ready_s": 60.0, "cold_p50": cold, "rates": rates,
            "cold": [{"key": "c0", "ids": ids, "ttft_s": cold}]}


def test_report_shows_ratios_slo_rates_outputs_and_refusals():
    bench = _bench()
    recs = [_record("none", 1.0, (1.0, 9.0), [1, 2]),
            _record("offloading", 0, (), [], failed="Exception: CPU Offloading is currently only supported"),
            _record("tutti", 1.02, (0.3, 0.5), [1, 3]), _record("tutti-slow", 1.04, (0.4, 0.6), [1, 2])]
    runs = [{"records": recs, "outputs": bench.compare_outputs(recs)}]
    assert runs[0]["outputs"]["tutti"]["compared"] == 9 and len(runs[0]["outputs"]["tutti"]["differ"]) == 9
    meta = _meta(command="python benchmarks/serving.py")
    text = render(meta, runs, "T")
    assert "did not run**: `Exception: CPU Offloading" in text  # no failed_when recorded
    assert "| TuttiConnector (disk) | 1.020 | 1.020 |" in text
    assert "| TuttiConnector (disk) | ≥ 2.000 | ≥ 2.00 | ≥ 2.000 | ≥ 2.00 | 0 of 9 (differ:" in text
    assert "| no connector (vLLM prefix caching) | 1.000 | — | 60.000 |" in text
    assert "| TuttiConnector (disk): cold TTFT ≤ 1.05 × no connector | 1.020 | yes |" in text
    assert "| TuttiConnector (disk): highest rate at the SLO (p90) ≥ 2 × no connector | ≥ 2.00 | yes |" in text
    assert "| TuttiConnector (disk): highest rate at the SLO (p50) ≥ 2 × no connector | ≥ 2.00 | yes |" in text
    assert "| TuttiConnector (disk): outputs identical to no connector | 0 of 9 | **no** |" in text
    assert "save of one document ≥ 30 % of the no-connector cold TTFT | 47 % | yes |" in text
    assert "Throttled store: `TUTTI_FAULTS=rate:write:mbps=20`" in text
    assert "| TuttiConnector (writes throttled): outputs identical to no connector | 9 of 9 | yes |" in text
    # Without the throttled configuration, nothing is said about a throttle.
    text = render(meta, [{"records": recs[:3], "outputs": bench.compare_outputs(recs[:3])}], "T")
    assert "Throttled store" not in text and "save of one document" not in text


def test_client_measures_ttft_and_reports_a_streamed_error():
    """The streaming client against a stand-in server (aiohttp.web): TTFT is taken at the first chunk
    that carries a token, after the server's delay; an error object in the stream fails the request."""
    import asyncio
    import json
    import threading

    from aiohttp import web

    async def completions(request):
        body = await request.json()
        resp = web.StreamResponse()
        await resp.prepare(request)
        if body["prompt"][0] == 0:
            await resp.write(b'data: {"error": {"message": "engine dead"}}\n\n')
            return resp
        await resp.write(b'data: {"choices": [{"text": "", "token_ids": []}]}\n\n')
        await asyncio.sleep(0.2)
        for t in body["prompt"][:body["max_tokens"]]:
            await resp.write(f"data: {json.dumps({'choices': [{'token_ids': [t]}]})}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp

    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app)
    port = serve.free_port()
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    th = threading.Thread(target=loop.run_forever, daemon=True)
    th.start()
    try:
        reqs = [workload.Request("ok", 0, 0, [5, 6, 7], 0.0), workload.Request("bad", 0, 1, [0, 1], 0.05)]
        ok, bad = serve.drive(f"http://127.0.0.1:{port}", reqs, max_tokens=2, timeout_s=10)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        th.join(5)
    assert ok["error"] is None and ok["ids"] == [5, 6] and 0.2 <= ok["ttft_s"] <= ok["total_s"]
    assert bad["error"] == "engine dead" and bad["ttft_s"] is None and bad["sent_s"] >= 0.05


def test_router_sends_the_ith_arrival_to_server_i_mod_n():
    """``drive`` with a list of servers is a round-robin router by arrival time (not list order): each
    stand-in server answers with its own id, so where every request went is seen in its tokens."""
    import asyncio
    import threading

    from aiohttp import web

    def app_for(tag):
        async def completions(request):
            resp = web.StreamResponse()
            await resp.prepare(request)
            await resp.write(f'data: {{"choices": [{{"token_ids": [{tag}]}}]}}\n\n'.encode())
            await resp.write(b"data: [DONE]\n\n")
            return resp
        app = web.Application()
        app.router.add_post("/v1/completions", completions)
        return app

    loop = asyncio.new_event_loop()
    ports = [serve.free_port(), serve.free_port()]
    for tag, port in zip((100, 200), ports):
        runner = web.AppRunner(app_for(tag))
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    th = threading.Thread(target=loop.run_forever, daemon=True)
    th.start()
    try:
        # Listed out of arrival order: arrivals are r2 (0.0 s), r0 (0.05), r3 (0.1), r1 (0.15).
        reqs = [workload.Request(f"r{i}", i, 0, [5], at) for i, at in enumerate((0.05, 0.15, 0.0, 0.1))]
        res = serve.drive([f"http://127.0.0.1:{p}" for p in ports], reqs, max_tokens=1, timeout_s=10)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        th.join(5)
    assert [r["key"] for r in res] == ["r0", "r1", "r2", "r3"]
    assert {r["key"]: (r["server"], r["ids"]) for r in res} == {
        "r2": (0, [100]), "r0": (1, [200]), "r3": (0, [100]), "r1": (1, [200])}


def test_shown_command_leaves_out_where_files_go():
    from tutti.bench import shown_command

    argv = ["--quick", "--output", "/tmp/x.md", "--json=/tmp/x.json", "--rates", "1,2", "--workdir", "/w", "a b"]
    assert shown_command("python benchmarks/x.py", argv) == "python benchmarks/x.py --quick --rates 1,2 'a b'"


def test_every_server_gets_the_same_cpu_reservation(tmp_path, monkeypatch):
    """vLLM on CPU reserves one more core when any KV connector is configured; on a small machine that
    gave connector servers more cores to compute on than the no-connector one. The benchmark's servers all
    get one reservation (the connector's environment extras cannot change it), and a caller's value wins."""
    monkeypatch.delenv("VLLM_CPU_NUM_OF_RESERVED_CPU", raising=False)
    plain = serve.server_env(str(tmp_path / "a"))
    tutti = serve.server_env(str(tmp_path / "b"), {"TUTTI_VLLM_STATS_DIR": str(tmp_path)})
    assert plain["VLLM_CPU_NUM_OF_RESERVED_CPU"] == tutti["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "1"
    monkeypatch.setenv("VLLM_CPU_NUM_OF_RESERVED_CPU", "3")
    assert serve.server_env(str(tmp_path / "c"))["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "3"
