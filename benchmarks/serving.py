#!/usr/bin/env python3
"""Serving benchmark (CPU): vLLM's OpenAI server, Poisson arrivals, a document workload; TTFT vs rate.

Each configuration runs in a fresh server process (vLLM's API server, multiprocess mode), same
model, same prompts, one after the other:

  none        no connector, vLLM's prefix caching on
  example     vLLM's ExampleConnector (per-request safetensors files)
  offloading  vLLM's OffloadingConnector (CPU tier): refuses CPU-only platforms; the reason
              is recorded instead of numbers
  tutti       TuttiConnector, store file on the machine's disk
  tutti-slow  the same with the store's writes throttled (libtutti's fault engine rate rule,
              TUTTI_FAULTS=rate:write:mbps=N) so that a synchronous save of one document costs
              --save-share of the no-connector cold TTFT

Per configuration: a warm-up, then a cold phase (fresh documents, one request at a time: the
unloaded TTFT of a request whose prefix nobody holds, including any save), then a sweep of
Poisson arrival rates.  Each rate sends its own documents (the same for every configuration),
each asked --questions questions, (document, question) pairs in a seeded random order (--order
shuffled), or documents opening at a steady pace with each one's questions spread after it
(--order sessions: the load is steady; TTFT statistics over tutti.bench.workload.steady_window); vLLM's
KV cache is sized (--kv-cache-mib) so the documents of one rate hold several times more KV
than it does.  TTFT is measured by the client (streaming): send → first token.  Outputs
(greedy, --max-tokens) are compared with the no-connector run's, request by request.

    python benchmarks/serving.py            # the full run (37 min on 2 busy cores, load 11-13)
    python benchmarks/serving.py --quick    # smoke test: none and tutti, a small sweep (~5 min)
    python benchmarks/serving.py --render benchmarks/serving_cpu.json   # re-write the section only

Writes benchmarks/serving_cpu.json (raw) and the section TITLE of docs/benchmarks.md.
"""
import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from tutti.bench import cpu_model, replace_section, serve, workload
from tutti.bench import shown_command as report_command
from tutti.bench.serving_report import render

ROOT = Path(__file__).resolve().parent.parent
TITLE = "vLLM serving: TTFT vs request rate on a document workload (CPU)"
CONFIGS = ("none", "example", "offloading", "tutti", "tutti-slow")
BLOCK = 128


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: configs none,tutti; 4 documents x 2 questions of 512 tokens; 2 rates")
    ap.add_argument("--configs", default=None, help=f"comma-separated, from {', '.join(CONFIGS)} "
                    "(default: all; none must come first when rates or the throttle are 'auto')")
    ap.add_argument("--model-size", default="small", help="tutti.tiny_model size (default small)")
    ap.add_argument("--docs", type=int, default=None,
                    help="documents per rate (default 12; 30 with --order sessions)")
    ap.add_argument("--questions", type=int, default=None, help="questions per document (default 4)")
    ap.add_argument("--doc-tokens", type=int, default=None,
                    help="tokens per document, a multiple of the block size 128 (default 1536)")
    ap.add_argument("--question-tokens", type=int, default=32)
    ap.add_argument("--cold", type=int, default=None, help="cold-phase requests (default 4)")
    ap.add_argument("--order", choices=("shuffled", "sessions"), default="shuffled",
                    help="shuffled (default): (document, question) pairs in a random order, first "
                         "sightings crowd the start; sessions: documents open at a steady pace, each "
                         "one's questions about --reuse requests apart; statistics over the steady window")
    ap.add_argument("--reuse", type=float, default=16.0,
                    help="--order sessions: mean requests between two questions about one document "
                         "(default 16)")
    ap.add_argument("--rates", default="auto",
                    help="requests/s, comma-separated, or 'auto' (default): --rate-multiples of "
                         "1 / the no-connector cold TTFT")
    ap.add_argument("--rate-multiples", default=None, help="for --rates auto (default 0.25,0.5,1,2)")
    ap.add_argument("--slo-factor", type=float, default=3.0,
                    help="TTFT SLO = this x the no-connector cold TTFT (p50) (default 3)")
    ap.add_argument("--slo-ms", type=float, default=None, help="an absolute TTFT SLO instead")
    ap.add_argument("--slo-quantile", type=float, default=0.9,
                    help="the SLO holds at a rate when this quantile of TTFT is within it (default 0.9)")
    ap.add_argument("--throttle-mbps", default="auto",
                    help="tutti-slow's write rate cap in MB/s, or 'auto' (default): a synchronous "
                         "save of one document costs --save-share of the no-connector cold TTFT")
    ap.add_argument("--save-share", type=float, default=0.5)
    ap.add_argument("--kv-cache-mib", type=int, default=None,
                    help="vLLM's KV cache (default: 1/3 of one rate's documents' KV, at least 2 "
                         "requests' worth)")
    ap.add_argument("--max-tokens", type=int, default=2)
    ap.add_argument("--write-budget", default=None,
                    help="TuttiConnector's write_budget for the tutti configurations (e.g. 300MiB/day)")
    ap.add_argument("--write-admission", default=None, help="TuttiConnector's write_admission")
    ap.add_argument("--runs", type=int, default=1, help="repeat every configuration; medians reported")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", default=None, help="default: a temporary directory on /var/tmp (removed)")
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "serving_cpu.json"))
    ap.add_argument("--output", default=str(ROOT / "docs" / "benchmarks.md"))
    ap.add_argument("--section", default=TITLE)
    ap.add_argument("--render", metavar="JSON", default=None,
                    help="measure nothing: write the --output section from a JSON this script wrote")
    args = ap.parse_args(argv)
    q = args.quick
    defaults = dict(docs=4 if q else (30 if args.order == "sessions" else 12), questions=2 if q else 4,
                    doc_tokens=512 if q else 1536,
                    cold=2 if q else 4, rate_multiples="1,3" if q else "0.25,0.5,1,2",
                    configs="none,tutti" if q else ",".join(CONFIGS))
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    validate(ap, args)
    return args


def validate(ap, args):
    """Refuse what would make a meaningless run, before minutes of server starts."""
    args.configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    bad = [c for c in args.configs if c not in CONFIGS]
    if bad or not args.configs or len(set(args.configs)) != len(args.configs):
        ap.error(f"--configs: expected distinct names from {', '.join(CONFIGS)}, got {args.configs}")
    for name in ("docs", "questions", "doc_tokens", "question_tokens", "cold", "max_tokens", "runs"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.doc_tokens % BLOCK:
        ap.error(f"--doc-tokens must be a multiple of the block size {BLOCK} (the document's KV is "
                 "then whole blocks a store can hold)")
    needs_ref = args.rates == "auto" or args.throttle_mbps == "auto" or args.slo_ms is None
    if needs_ref and args.configs[0] != "none":
        ap.error("--rates auto, --throttle-mbps auto and a relative SLO are measured against the "
                 "no-connector run: put 'none' first in --configs or give absolute values")
    try:
        args.rate_list = None if args.rates == "auto" else sorted(float(x) for x in args.rates.split(","))
        args.multiples = sorted(float(x) for x in args.rate_multiples.split(","))
    except ValueError:
        ap.error("--rates / --rate-multiples: comma-separated numbers")
    if any(r <= 0 for r in (args.rate_list or []) + args.multiples):
        ap.error("rates must be > 0")
    if args.throttle_mbps != "auto":
        try:
            args.throttle_mbps = float(args.throttle_mbps)
        except ValueError:
            ap.error("--throttle-mbps: a number of MB/s or 'auto'")
        if args.throttle_mbps < 1:
            ap.error("--throttle-mbps must be >= 1 (the rate rule counts whole MB/s)")
    if not 0 < args.slo_quantile <= 1:
        ap.error("--slo-quantile must be in (0, 1]")
    if not 0 < args.save_share:
        ap.error("--save-share must be > 0")
    if not 0 < args.reuse < 1e6:
        ap.error("--reuse must be > 0")
    if args.order == "sessions":
        # Scale-free: the window holds the same requests at every rate (times scale with 1/rate).
        reqs = workload.document_requests("x", docs=args.docs, questions=args.questions, doc_tokens=1,
                                          question_tokens=1, vocab_size=8, seed=args.seed)
        sched = workload.session_schedule(reqs, 1.0, seed=args.seed * 1000, reuse=args.reuse)
        lo, hi = workload.steady_window(sched, 1.0, args.reuse)
        n = sum(lo <= r.at_s <= hi for r in sched)
        if n < 20:
            ap.error(f"--order sessions: only {n} of {len(sched)} requests fall in the steady window; "
                     f"give more --docs (or a smaller --reuse)")


def model_shape(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        mc = json.load(f)
    head_dim = mc["hidden_size"] // mc["num_attention_heads"]
    per_token = mc["num_hidden_layers"] * 2 * mc["num_key_value_heads"] * head_dim * 2  # bf16
    return mc, per_token


def kv_config(name, work, capacity, admission=None):
    if name == "none":
        return None
    if name == "example":
        return {"kv_connector": "ExampleConnector", "kv_role": "kv_both",
                "kv_connector_extra_config": {"shared_storage_path": os.path.join(work, "example")}}
    if name == "offloading":
        return {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                "kv_connector_extra_config": {"cpu_bytes_to_use": 1 << 30}}
    return {"kv_connector": "TuttiConnector", "kv_connector_module_path": "tutti.vllm", "kv_role": "kv_both",
            "kv_connector_extra_config": {"path": os.path.join(work, "store", "kv.img"),
                                          "capacity": f"{capacity >> 20}MiB", **(admission or {})}}


def key_list(results):
    return {r["key"]: r["ids"] for r in results}


def run_config(name, ctx, work):
    """One fresh server: warm-up, cold phase, the sweep.  Returns the configuration's record."""
    args = ctx["args"]
    env_extra = {}
    if name.startswith("tutti"):
        env_extra["TUTTI_VLLM_STATS_DIR"] = os.path.join(work, "stats")
        os.makedirs(env_extra["TUTTI_VLLM_STATS_DIR"], exist_ok=True)
    if name == "tutti-slow":
        env_extra["TUTTI_FAULTS"] = f"rate:write:mbps={int(ctx['throttle_mbps'])}"
    rec = {"config": name, "env": env_extra}
    print(f"serving: {name}: starting the server ...", file=sys.stderr, flush=True)
    srv = serve.Server(model=ctx["model"], log_path=os.path.join(work, "server.log"),
                       env=serve.server_env(work, env_extra),
                       kv_transfer_config=kv_config(name, work, ctx["capacity"], ctx["admission"]),
                       block_size=BLOCK,
                       max_model_len=ctx["max_model_len"], kv_cache_bytes=ctx["kv_cache_bytes"],
                       extra_args=["--max-num-batched-tokens", str(ctx["max_batched"])])
    try:
        with srv:
            rec["ready_s"] = srv.ready_s
            print(f"serving: {name}: ready in {srv.ready_s:.0f} s", file=sys.stderr, flush=True)
            serve.drive_sequential(srv.url, ctx["warmup"], max_tokens=args.max_tokens)
            rec["cold"] = serve.drive_sequential(srv.url, ctx["cold"], max_tokens=args.max_tokens)
            rec["cold_p50"] = statistics.median(r["ttft_s"] or float("inf") for r in rec["cold"])
            if srv.died():
                raise serve.ServerFailed("the server died in the cold phase", srv.died(), srv.log_path)
            print(f"serving: {name}: cold TTFT p50 {rec['cold_p50']:.3f} s", file=sys.stderr, flush=True)
            if name == "none":
                ctx.setdefault("reference", rec["cold_p50"])
            resolve_auto(ctx)
            rec["rates"] = []
            for i, rate in enumerate(ctx["rates"]):
                entry = {"rate": rate}
                if args.order == "sessions":
                    reqs = workload.session_schedule(ctx["sweep"][i], rate, seed=args.seed * 1000 + i,
                                                     reuse=args.reuse)
                    entry["window_s"] = list(workload.steady_window(reqs, rate, args.reuse))
                else:
                    reqs = workload.poisson_schedule(ctx["sweep"][i], rate, seed=args.seed * 1000 + i)
                res = serve.drive(srv.url, reqs, max_tokens=args.max_tokens)
                ttfts = [r["ttft_s"] for r in res]
                if "window_s" in entry:
                    lo, hi = entry["window_s"]
                    entry["summary_all"] = workload.summarize(ttfts, args.slo_quantile)
                    ttfts = [r["ttft_s"] for r in res if lo <= r["scheduled_s"] <= hi]
                summ = entry["summary"] = workload.summarize(ttfts, args.slo_quantile)
                entry["requests"] = res
                rec["rates"].append(entry)
                print(f"serving: {name}: {rate:.3f} req/s: TTFT p50 {summ['p50']:.3f} s, p99 "
                      f"{summ['p99']:.3f} s, failed {summ['failed']}", file=sys.stderr, flush=True)
                died = srv.died()
                if died:
                    raise serve.ServerFailed(f"the server died during the sweep at {rate:.3f} req/s",
                                             died, srv.log_path)
    except serve.ServerFailed as e:
        rec["failed"], rec["failed_when"] = e.reason, e.msg
        print(f"serving: {name}: {e}", file=sys.stderr, flush=True)
    if name.startswith("tutti"):
        from tutti.vllm.runner import _stats_totals  # the connector's own counters (TUTTI_VLLM_STATS_DIR)
        rec["stats"] = _stats_totals(env_extra["TUTTI_VLLM_STATS_DIR"])
    return rec


def resolve_auto(ctx):
    """Rates, SLO and throttle that were 'auto', from the no-connector cold TTFT (once)."""
    args = ctx["args"]
    if "rates" in ctx:
        return
    ref = ctx.get("reference")
    ctx["rates"] = args.rate_list or [round(m / ref, 3) for m in args.multiples]
    ctx["slo_s"] = args.slo_ms / 1e3 if args.slo_ms is not None else args.slo_factor * ref
    if args.throttle_mbps == "auto":
        ctx["throttle_mbps"] = max(1, int(ctx["doc_bytes"] / (args.save_share * ref) / 1e6))
    else:
        ctx["throttle_mbps"] = args.throttle_mbps


def build_context(args, tmp):
    from tutti import tiny_model
    model = tiny_model.create(os.path.join(tmp, "model"), args.model_size, seed=0)
    mc, per_token = model_shape(model)
    vocab = mc["vocab_size"]
    common = dict(questions=args.questions, doc_tokens=args.doc_tokens,
                  question_tokens=args.question_tokens, vocab_size=vocab, seed=args.seed)
    n_rates = len(args.rate_list or args.multiples)
    doc_bytes = args.doc_tokens * per_token
    prompt_tokens = args.doc_tokens + args.question_tokens
    request_bytes = -(-(prompt_tokens + args.max_tokens) // BLOCK) * BLOCK * per_token
    kv_cache = (args.kv_cache_mib << 20 if args.kv_cache_mib else
                max(2 * request_bytes, args.docs * doc_bytes // 3))
    stored_docs = args.cold + n_rates * args.docs
    admission = {k: v for k, v in (("write_budget", args.write_budget),
                                   ("write_admission", args.write_admission)) if v is not None}
    ctx = dict(args=args, model=model, model_config=mc, kv_per_token=per_token, doc_bytes=doc_bytes,
               admission=admission,
               kv_cache_bytes=kv_cache, max_model_len=prompt_tokens + args.max_tokens + BLOCK,
               # a whole prompt in one step, in every configuration (no chunked prefill)
               max_batched=max(2048, prompt_tokens + args.max_tokens + BLOCK),
               capacity=((stored_docs * doc_bytes * 3 // 2 + (64 << 20)) >> 20) << 20,
               warmup=workload.document_requests("warmup", docs=2, **dict(common, questions=1)),
               cold=workload.document_requests("cold", docs=args.cold, **dict(common, questions=1)),
               sweep=[workload.document_requests(f"rate{i}", docs=args.docs, **common)
                      for i in range(n_rates)])
    if args.rate_list is not None and args.slo_ms is not None and args.throttle_mbps != "auto":
        resolve_auto(ctx)
    return ctx


def compare_outputs(records, ref_name="none"):
    """Per configuration: requests whose tokens differ from the reference's (key list)."""
    ref = next((r for r in records if r["config"] == ref_name and "failed" not in r), None)
    if ref is None:
        return {}
    want = key_list(ref["cold"] + [q for x in ref["rates"] for q in x["requests"]])
    out = {}
    for rec in records:
        if rec is ref or "failed" in rec:
            continue
        got = key_list(rec["cold"] + [q for x in rec["rates"] for q in x["requests"]])
        out[rec["config"]] = {"compared": sum(k in want for k in got),
                              "differ": sorted(k for k in got if k in want and got[k] != want[k])}
    return out


def shown_command(argv):
    """The command line without the options that only say where files go (same measurement)."""
    return report_command("python benchmarks/serving.py", argv)


def prompts_by_key(meta, model_config):
    """Every prompt of a run, by key, rebuilt from the workload parameters (they are deterministic)."""
    w = meta["workload"]
    common = dict(doc_tokens=w["doc_tokens"], question_tokens=w["question_tokens"],
                  vocab_size=model_config["vocab_size"], seed=w["seed"])
    reqs = workload.document_requests("cold", docs=w["cold"], questions=1, **common)
    for i in range(len(meta["rates"])):
        reqs += workload.document_requests(f"rate{i}", docs=w["docs"], questions=w["questions"], **common)
    return {r.key: r.prompt for r in reqs}


def recheck_outputs(meta, runs, model, tmp):
    """Requests whose tokens differ from the concurrent no-connector run, computed again alone.

    Batches of different shapes give slightly different bf16 logits on CPU, so two servers under load
    may pick another greedy token where two are nearly tied.  Each differing prompt is run once more in
    a fresh engine (no connector, no prefix caching, one request at a time): ``alone`` counts the
    configuration's outputs equal to that batch-free reference.
    """
    from tutti.vllm.runner import launch
    keys = sorted({k for run in runs for o in run["outputs"].values() for k in o["differ"]})
    if not keys:
        return
    with open(os.path.join(model, "config.json")) as f:
        prompts = prompts_by_key(meta, json.load(f))
    res = launch(tmp, "recheck", dict(model=model, connector="none", prompts=[prompts[k] for k in keys],
                                      max_tokens=meta["workload"]["max_tokens"], block_size=BLOCK,
                                      max_model_len=meta["workload"]["doc_tokens"] + 512, concurrent=False,
                                      prefix_caching=False, kv_cache_gib=1))
    alone = dict(zip(keys, res["outputs"]))
    for run in runs:
        got = {r["config"]: {q["key"]: q["ids"] for x in r.get("rates", []) for q in x["requests"]} |
               {q["key"]: q["ids"] for q in r.get("cold", [])} for r in run["records"]}
        for name, o in run["outputs"].items():
            o["alone"] = {k: {"alone": alone[k], "config": got[name][k], "none": got["none"][k]}
                          for k in o["differ"]}


def main(argv=None):
    args = parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    if args.render:
        with open(args.render) as f:
            data = json.load(f)
        data["meta"]["command"] = shown_command(data["meta"].get("argv", data["meta"]["command"].split()[2:]))
        text = render(data["meta"], data["runs"], args.section)
        print(text)
        replace_section(args.output, args.section, text)
        return 0
    import vllm
    tmp = args.workdir or tempfile.mkdtemp(prefix="tutti-serving-", dir="/var/tmp")
    runs = []
    try:
        ctx = build_context(args, tmp)
        for run in range(args.runs):
            records = []
            for name in args.configs:
                work = os.path.join(tmp, f"run{run}", name)
                records.append(run_config(name, ctx, work))
            runs.append({"records": records, "outputs": compare_outputs(records)})
            meta_w = {"workload": {k: getattr(args, k) for k in ("docs", "questions", "doc_tokens",
                                                                  "question_tokens", "cold", "max_tokens",
                                                                  "seed")}, "rates": ctx.get("rates") or []}
            recheck_outputs(meta_w, runs[-1:], ctx["model"], os.path.join(tmp, f"run{run}"))
            if args.workdir is None:  # stores and logs of one run can be large
                shutil.rmtree(os.path.join(tmp, f"run{run}"), ignore_errors=True)
    finally:
        if args.workdir is None:
            shutil.rmtree(tmp, ignore_errors=True)
    meta = {"command": shown_command(argv), "argv": list(argv),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": {"node": platform.node(), "cpu": cpu_model(), "cores": os.cpu_count(),
                        "kernel": platform.release(), "python": platform.python_version(),
                        "vllm": vllm.__version__, "loadavg_end": os.getloadavg()},
            "model": {"size": args.model_size, **{k: ctx["model_config"][k] for k in (
                "num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads")}},
            "kv_per_token": ctx["kv_per_token"], "doc_bytes": ctx["doc_bytes"],
            "kv_cache_bytes": ctx["kv_cache_bytes"], "block": BLOCK,
            "workload": {k: getattr(args, k) for k in ("docs", "questions", "doc_tokens", "question_tokens",
                                                       "cold", "max_tokens", "seed", "runs", "order",
                                                       "reuse")},
            "rates": ctx.get("rates"), "slo_s": ctx.get("slo_s"), "slo_quantile": args.slo_quantile,
            "throttle_mbps": ctx.get("throttle_mbps"), "reference_cold_s": ctx.get("reference")}
    with open(args.json, "w") as f:
        json.dump({"meta": meta, "runs": runs}, f, indent=1)
    text = render(meta, runs, args.section)
    print(text)
    replace_section(args.output, args.section, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
