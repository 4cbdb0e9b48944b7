#!/usr/bin/env python3
"""Two vLLM nodes behind a round-robin router: the cluster tier vs two independent nodes (CPU).

Two vLLM OpenAI servers (each its own process, KV cache and Tutti store file) receive the document
workload of benchmarks/serving.py: documents each asked several questions, Poisson arrivals; the
client is the router and sends the i-th request to arrive to server i mod 2, so a document's questions
land on both nodes.  Configurations, each with fresh servers and stores:

  independent  TuttiConnector on each node, no cluster: a node reuses only what it computed itself
  cluster      the same plus the cluster tier (a real mooncake_master on loopback): a node also
               loads what the other node computed (fetched, verified against the owner's checksums);
               cluster_fetch async, the default: a request waits for its fetch, the steps do not
  cluster-step the same with cluster_fetch step: the fetch runs inside the step (every request waits)

Per configuration: a warm-up, a cold phase (fresh documents one at a time: the unloaded TTFT), then
a sweep of Poisson rates (each rate its own documents, the same for both configurations).  Reported:
TTFT p50/p99 per rate, the tokens each node took from its own store and from the other node, and
outputs compared request by request with the independent run's.

    .venv/bin/python benchmarks/cluster_serving.py            # ~15 min on 2 cores
    .venv/bin/python benchmarks/cluster_serving.py --quick    # smoke test

Writes benchmarks/cluster_serving_cpu.json (raw) and the section TITLE of docs/benchmarks.md.
"""
import argparse
import concurrent.futures
import datetime
import json
import os
import statistics
import sys
from pathlib import Path

from tutti.bench import replace_section, scratch_dir, serve, shown_command, vllm_cpu_machine, workload
from tutti.cluster.local_master import LocalMaster, free_port_pair
from tutti.errors import ClusterError
from tutti.vllm.cluster import SCHEDULER_PORT_OFFSET

ROOT = Path(__file__).resolve().parent.parent
TITLE = "Cluster tier: two nodes behind a round-robin router (CPU)"
CONFIGS = ("independent", "cluster", "cluster-step")
BLOCK = 128
NODES = 2
OUTPUT_OPTIONS = ("--workdir", "--json", "--output", "--section")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a small run: 3 documents x 2 questions, 2 rates")
    ap.add_argument("--model-size", default="small", help="tutti.tiny_model size (default small)")
    ap.add_argument("--docs", type=int, default=None, help="documents per rate (default 8)")
    ap.add_argument("--questions", type=int, default=None, help="questions per document (default 4)")
    ap.add_argument("--doc-tokens", type=int, default=2048)
    ap.add_argument("--question-tokens", type=int, default=32)
    ap.add_argument("--cold", type=int, default=4, help="cold-phase documents (default 4)")
    ap.add_argument("--rate-multiples", default=None,
                    help="rates as multiples of 1 / (cold TTFT p50 of the independent nodes) (default 0.5,1,2)")
    ap.add_argument("--max-tokens", type=int, default=2)
    ap.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, from {', '.join(CONFIGS)}")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", default=None, help="default: a temporary directory on /var/tmp (removed)")
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "cluster_serving_cpu.json"))
    ap.add_argument("--output", default=str(ROOT / "docs" / "benchmarks.md"))
    ap.add_argument("--section", default=TITLE)
    a = ap.parse_args(argv)
    a.docs = a.docs or (3 if a.quick else 8)
    a.questions = a.questions or (2 if a.quick else 4)
    a.rate_multiples = a.rate_multiples or ("1,2" if a.quick else "0.5,1,2")
    try:
        a.multiples = [float(x) for x in a.rate_multiples.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--rate-multiples: not a list of numbers: {a.rate_multiples!r}")
    if not a.multiples or not all(0 < m <= 100 for m in a.multiples):
        ap.error("--rate-multiples: each > 0 and <= 100")
    a.configs = [c for c in a.configs.split(",") if c]
    if not a.configs or any(c not in CONFIGS for c in a.configs):
        ap.error(f"--configs: a comma-separated list from {', '.join(CONFIGS)}")
    for name in ("docs", "questions", "doc_tokens", "question_tokens", "cold", "max_tokens"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')}: must be >= 1")
    if a.doc_tokens > 65536:
        ap.error("--doc-tokens: at most 65536")
    return a



def bind(node):
    """Each node's vLLM compute threads on cores of their own (two machines' worth on one): vLLM on CPU
    binds its OpenMP threads to every core by default, and two servers doing so spin against each other
    and starve everything else (the first run here: Mooncake's transfer threads, so cross-node fetches
    stalled until their timeouts)."""
    cores = os.cpu_count() or 1
    if cores < NODES:
        return {}
    per = cores // NODES
    return {"VLLM_CPU_OMP_THREADS_BIND": f"{node * per}-{node * per + per - 1}" if per > 1 else str(node * per)}


def start_servers(name, ctx, work, master, fetch="async"):
    """Both nodes' servers, started side by side; their stats directories."""
    servers, stats = [], []
    for n in range(NODES):
        d = os.path.join(work, f"node{n}")
        stats.append(os.path.join(d, "stats"))
        os.makedirs(stats[-1], exist_ok=True)
        extra = {"path": os.path.join(d, "kv.img"), "capacity": f"{ctx['capacity'] >> 20}MiB"}
        if master is not None:  # the cluster's default timeouts (a fetch batch: 10 s)
            extra.update(cluster_master=master.address, cluster_metadata=master.metadata,
                         cluster_port=free_port_pair(SCHEDULER_PORT_OFFSET), cluster_fetch=fetch)
        kv = {"kv_connector": "TuttiConnector", "kv_connector_module_path": "tutti.vllm", "kv_role": "kv_both",
              "kv_connector_extra_config": extra}
        servers.append(serve.Server(model=ctx["model"], log_path=os.path.join(d, "server.log"),
                                    env=serve.server_env(d, {"TUTTI_VLLM_STATS_DIR": stats[-1], **bind(n)}),
                                    kv_transfer_config=kv, block_size=BLOCK, max_model_len=ctx["max_model_len"],
                                    kv_cache_bytes=ctx["kv_cache_bytes"],
                                    extra_args=["--max-num-batched-tokens", str(ctx["max_batched"])]))
    print(f"cluster_serving: {name}: starting {NODES} servers ...", file=sys.stderr, flush=True)
    with concurrent.futures.ThreadPoolExecutor(NODES) as pool:
        futs = [pool.submit(s.__enter__) for s in servers]
        errs = [f.exception() for f in futs]
    if any(errs):
        for s in servers:
            s.stop()
        raise next(e for e in errs if e)
    return servers, stats


def run_config(name, ctx, work):
    args = ctx["args"]
    from tutti.vllm.runner import _stats_totals
    rec = {"config": name}
    master = LocalMaster(work, client_ttl=10).start() if name.startswith("cluster") else None
    try:
        servers, stats = start_servers(name, ctx, work, master, "step" if name == "cluster-step" else "async")
        urls = [s.url for s in servers]
        try:
            rec["ready_s"] = [s.ready_s for s in servers]
            serve.drive_sequential(urls[0], ctx["warmup"], max_tokens=args.max_tokens)
            serve.drive_sequential(urls[1], ctx["warmup"], max_tokens=args.max_tokens)
            # Cold: fresh documents one at a time, alternating nodes (what the router does).
            rec["cold"] = []
            for i, r in enumerate(ctx["cold"]):
                rec["cold"] += serve.drive_sequential(urls[i % NODES], [r], max_tokens=args.max_tokens)
            rec["cold_p50"] = statistics.median(r["ttft_s"] or float("inf") for r in rec["cold"])
            print(f"cluster_serving: {name}: cold TTFT p50 {rec['cold_p50']:.3f} s", file=sys.stderr, flush=True)
            if "rates" not in ctx:
                ctx["reference"] = rec["cold_p50"]
                ctx["rates"] = [round(m / rec["cold_p50"], 3) for m in args.multiples]
            rec["rates"] = []
            for i, rate in enumerate(ctx["rates"]):
                reqs = workload.poisson_schedule(ctx["sweep"][i], rate, seed=args.seed * 1000 + i)
                res = serve.drive(urls, reqs, max_tokens=args.max_tokens)
                summ = workload.summarize([r["ttft_s"] for r in res])
                rec["rates"].append({"rate": rate, "summary": summ, "requests": res})
                print(f"cluster_serving: {name}: {rate:.3f} req/s: TTFT p50 {summ['p50']:.3f} s, "
                      f"p99 {summ['p99']:.3f} s, failed {summ['failed']}", file=sys.stderr, flush=True)
                died = [s.died() for s in servers if s.died()]
                if died:
                    raise serve.ServerFailed(f"a server died at {rate:.3f} req/s", died[0], servers[0].log_path)
        except serve.ServerFailed as e:
            rec["failed"], rec["failed_when"] = e.reason, e.msg
            print(f"cluster_serving: {name}: {e}", file=sys.stderr, flush=True)
        finally:
            for s in servers:
                s.stop()
        rec["stats"] = [_stats_totals(d) for d in stats]
    finally:
        if master is not None:
            master.kill()
    return rec


def build_context(args, tmp):
    from tutti import tiny_model
    model = tiny_model.create(os.path.join(tmp, "model"), args.model_size, seed=0)
    with open(os.path.join(model, "config.json")) as f:
        mc = json.load(f)
    head_dim = mc["hidden_size"] // mc["num_attention_heads"]
    per_token = mc["num_hidden_layers"] * 2 * mc["num_key_value_heads"] * head_dim * 2  # bf16
    common = dict(questions=args.questions, doc_tokens=args.doc_tokens, question_tokens=args.question_tokens,
                  vocab_size=mc["vocab_size"], seed=args.seed)
    doc_bytes = args.doc_tokens * per_token
    prompt_tokens = args.doc_tokens + args.question_tokens
    request_bytes = -(-(prompt_tokens + args.max_tokens) // BLOCK) * BLOCK * per_token
    stored_docs = args.cold + len(args.multiples) * args.docs
    return dict(args=args, model=model, model_config=mc, kv_per_token=per_token, doc_bytes=doc_bytes,
                # each node's KV cache holds a third of a rate's documents: reuse has to come from a store
                kv_cache_bytes=max(2 * request_bytes, args.docs * doc_bytes // 3),
                max_model_len=prompt_tokens + args.max_tokens + BLOCK,
                max_batched=max(2048, prompt_tokens + args.max_tokens + BLOCK),
                capacity=((stored_docs * doc_bytes * 3 // 2 + (64 << 20)) >> 20) << 20,
                warmup=workload.document_requests("warmup", docs=1, **dict(common, questions=1)),
                cold=workload.document_requests("cold", docs=args.cold, **dict(common, questions=1)),
                sweep=[workload.document_requests(f"rate{i}", docs=args.docs, **common)
                       for i in range(len(args.multiples))])


def hits(rec):
    """Per node: prompt tokens asked, tokens promised from its own store, from the other node."""
    out = []
    for st in rec.get("stats", []):
        s = st.get("scheduler", {})
        remote = s.get("remote_hit_tokens", 0)
        out.append({"query": s.get("query_tokens", 0), "local": s.get("hit_tokens", 0) - remote,
                    "remote": remote, "remote_blocks": st.get("worker0", {}).get("remote_blocks", 0),
                    "remote_errors": st.get("worker0", {}).get("remote_errors", 0),
                    "load_errors": st.get("worker0", {}).get("load_errors", 0)})
    return out


def compare(records):
    ref = next((r for r in records if r["config"] == "independent" and "failed" not in r), None)
    if ref is None:
        return {}

    def ids(rec):
        return {q["key"]: q["ids"] for q in rec["cold"] + [q for x in rec["rates"] for q in x["requests"]]}
    want = ids(ref)
    out = {}
    for rec in records:
        if rec is ref or "failed" in rec:
            continue
        got = ids(rec)
        out[rec["config"]] = {"compared": sum(k in want for k in got),
                              "differ": sorted(k for k in got if k in want and got[k] != want[k])}
    return out


def render(meta, records, outputs, section=TITLE):
    w, mc = meta["workload"], meta["model"]
    lines = [f"## {section}", "", f"Measured {meta['date']} with:", "", "```", meta["command"], "```", "",
             f"- Machine: {meta['machine']}; load average at the end {meta['loadavg']:.1f}",
             f"- Model: `tutti.tiny_model` size `{mc['size']}` ({mc['num_hidden_layers']} layers, hidden "
             f"{mc['hidden_size']}), vLLM block {BLOCK} tokens; each node's KV cache {meta['kv_cache_bytes'] >> 20} "
             f"MiB (a third of one rate's documents), its store a file on this machine's disk",
             f"- Workload: per rate {w['docs']} documents of {w['doc_tokens']} tokens, each asked {w['questions']} "
             f"questions of {w['question_tokens']} tokens, Poisson arrivals, the i-th arrival to node i mod 2; "
             f"rates are multiples {meta['multiples']} of 1 / the independent nodes' cold TTFT p50 "
             f"({meta['reference_cold_s']:.3f} s). Cold = fresh documents one at a time.",
             "- Outputs (greedy) compared with the independent run's, request by request: "
             + (", ".join(f"{k}: {len(v['differ'])} of {v['compared']} differ" for k, v in outputs.items())
                or "not compared (a configuration failed)"),
             "", "| configuration | rate (req/s) | TTFT p50 | TTFT p99 | failed |", "|---|---|---|---|---|"]
    for rec in records:
        if "failed" in rec:
            lines.append(f"| {rec['config']} | — | failed: {rec['failed_when']} | | |")
            continue
        lines.append(f"| {rec['config']} | cold (one at a time) | {rec['cold_p50']:.3f} s | "
                     f"{max(r['ttft_s'] or float('inf') for r in rec['cold']):.3f} s (max) | "
                     f"{sum(r['ttft_s'] is None for r in rec['cold'])} |")
        for x in rec["rates"]:
            s = x["summary"]
            lines.append(f"| {rec['config']} | {x['rate']:.3f} | {s['p50']:.3f} s | {s['p99']:.3f} s | "
                         f"{s['failed']} |")
    lines += ["", "| configuration | node | prompt tokens | from its own store | from the other node | "
              "cluster hit rate | remote blocks fetched / errors | load errors |", "|---|---|---|---|---|---|---|---|"]
    for rec in records:
        for n, h in enumerate(hits(rec)):
            rate = h["remote"] / h["query"] if h["query"] else 0.0
            lines.append(f"| {rec['config']} | {n} | {h['query']} | {h['local']} | {h['remote']} | {rate:.1%} | "
                         f"{h['remote_blocks']} / {h['remote_errors']} | {h['load_errors']} |")
    lines.append("")
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    import vllm  # noqa: F401 - vLLM missing: fail here, not after the set-up
    try:
        with scratch_dir(args.workdir, "tutti-cluster-serving-") as tmp:
            ctx = build_context(args, tmp)
            records = [run_config(name, ctx, os.path.join(tmp, name)) for name in args.configs]
    except ClusterError as e:
        raise SystemExit(f"cluster_serving: {e}") from None
    meta = {"command": shown_command(".venv/bin/python benchmarks/cluster_serving.py", argv, OUTPUT_OPTIONS),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": vllm_cpu_machine(), "loadavg": os.getloadavg()[0],
            "model": {"size": args.model_size, **{k: ctx["model_config"][k] for k in (
                "num_hidden_layers", "hidden_size")}},
            "kv_cache_bytes": ctx["kv_cache_bytes"], "multiples": args.multiples,
            "reference_cold_s": ctx.get("reference") or 0.0,
            "workload": {k: getattr(args, k) for k in ("docs", "questions", "doc_tokens", "question_tokens",
                                                       "cold", "max_tokens", "seed")}}
    outputs = compare(records)
    with open(args.json, "w") as f:
        json.dump({"meta": meta, "records": records, "outputs": outputs}, f, indent=1)
    text = render(meta, records, outputs, args.section)
    print(text)
    replace_section(args.output, args.section, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
