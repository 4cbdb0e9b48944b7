#!/usr/bin/env python3
"""TTFT of a prefix another node holds (remote hit) vs one this node holds (local hit) vs recompute.

One machine, loopback TCP, a real mooncake_master; every engine is vLLM on CPU in a fresh process with
its own store (tutti.vllm.runner):

  A        cluster on, own store: computes every prompt and stores it (its TTFT is a cold one);
           then ``tutti-admin cluster serve`` keeps A's store reachable;
  none     no connector: recompute, and the reference outputs;
  remote   node B, cluster on, own empty store: the prefixes come from A through the cluster
           (fetched, verified against A's committed checksums, kept as a local replica), then loaded;
  local    node B again, a fresh process: the same prefixes from its own store.

Each prompt has its own prefix (vLLM's in-memory prefix cache never helps); TTFT of one request =
wall time of a 1-token greedy generation, requests one at a time; medians per prefix length.

    .venv/bin/python benchmarks/cluster_ttft.py                       # 4K 8K 16K 32K, 2 prompts each
    .venv/bin/python benchmarks/cluster_ttft.py --lengths 4096 --requests 1 --model-size tiny

Writes the section "Cluster tier: TTFT of a remote hit (CPU)" of docs/benchmarks.md and the raw results
to benchmarks/cluster_ttft_cpu.json.
"""
import argparse
import datetime
import json
import os
import statistics
import sys
from pathlib import Path

from tutti.bench import replace_section, scratch_dir, shown_command, vllm_cpu_machine
from tutti.cluster.local_master import LocalMaster, StoreOwner, free_port_pair
from tutti.errors import ClusterError, RunnerFailed
from tutti.vllm.cluster import SCHEDULER_PORT_OFFSET
from tutti.vllm.runner import launch

ROOT = Path(__file__).resolve().parent.parent
TITLE = "Cluster tier: TTFT of a remote hit (CPU)"
BLOCK = 128
CONFIGS = ("A", "none", "remote", "local")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", default="4096,8192,16384,32768", help="prefix tokens, comma-separated")
    ap.add_argument("--requests", type=int, default=2, help="prompts per length (each its own prefix)")
    ap.add_argument("--model-size", default="tiny", help="tutti.tiny_model size (default tiny: 32K-token "
                    "prefills of the larger ones take minutes on 2 cores)")
    ap.add_argument("--workdir", default=None, help="default: a temporary directory on /var/tmp (removed)")
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "cluster_ttft_cpu.json"))
    ap.add_argument("--output", default=str(ROOT / "docs" / "benchmarks.md"))
    ap.add_argument("--section", default=TITLE)
    args = ap.parse_args(argv)
    try:
        args.lengths = sorted({int(x) for x in args.lengths.split(",") if x.strip()})
    except ValueError:
        ap.error(f"--lengths: not a list of integers: {args.lengths!r}")
    if not args.lengths or args.lengths[0] < BLOCK or args.lengths[-1] > 131072:
        ap.error(f"--lengths: each between {BLOCK} and 131072 tokens")
    if not 1 <= args.requests <= 16:
        ap.error("--requests: 1 to 16")
    return args


def run(work, name, spec):
    print(f"cluster_ttft: {name} ...", file=sys.stderr, flush=True)
    try:
        res = launch(work, name, spec, timeout=3600)
    except RunnerFailed as e:
        raise SystemExit(f"cluster_ttft: {e}") from None
    print(f"cluster_ttft: {name}: TTFT {[round(t, 3) for t in res['ttft_s']]}", file=sys.stderr, flush=True)
    return res


def measure(args, work):
    from tutti import tiny_model

    longest = args.lengths[-1]
    model = tiny_model.create(os.path.join(work, "model"), args.model_size, seed=0, max_positions=longest + 256)
    with open(os.path.join(model, "config.json")) as f:
        mc = json.load(f)
    # A first short prompt of its own, left out of the medians: a process's first request pays one-time costs.
    prompts = [tiny_model.make_prompt_ids(BLOCK + 17, seed=7, vocab_size=mc["vocab_size"])]
    lengths = [0]
    for n in args.lengths:
        for i in range(args.requests):
            prompts.append(tiny_model.make_prompt_ids(n + 17, seed=1000 * n + i, vocab_size=mc["vocab_size"]))
            lengths.append(n)
    n_layers, kvh = mc["num_hidden_layers"], mc["num_key_value_heads"]
    head_dim = mc["hidden_size"] // mc["num_attention_heads"]
    block_bytes = n_layers * 2 * BLOCK * kvh * head_dim * 2
    kv_bytes = sum(n // BLOCK for n in lengths) * block_bytes
    capacity = f"{max(64, 2 * kv_bytes // (1 << 20) + 64)}MiB"
    base = dict(model=model, prompts=prompts, max_tokens=4, block_size=BLOCK, max_model_len=longest + 256,
                ttft=True, concurrent=False, kv_cache_gib=max(1, -(-4 * (longest + 256) // BLOCK * block_bytes
                                                                    // (1 << 30))))
    results = {}
    with LocalMaster(work, client_ttl=10) as master:
        def keys(store):
            return {"path": store, "capacity": capacity, "cluster_master": master.address,
                    "cluster_metadata": master.metadata, "cluster_port": free_port_pair(SCHEDULER_PORT_OFFSET),
                    "cluster_fetch_timeout_s": 60}
        store_a, store_b = os.path.join(work, "a", "kv.img"), os.path.join(work, "b", "kv.img")
        results["A"] = run(work, "A", dict(base, connector="tutti", extra=keys(store_a)))
        results["none"] = run(work, "none", dict(base, connector="none"))
        owner = StoreOwner(work, store_a, master)
        try:
            results["remote"] = run(work, "remote", dict(base, connector="tutti", extra=keys(store_b)))
            results["local"] = run(work, "local", dict(base, connector="tutti", extra=keys(store_b)))
        finally:
            owner.stop()
    return dict(model_size=args.model_size, model=mc, block=BLOCK, block_bytes=block_bytes, lengths=lengths,
                results=results)


def render(data, cmd):
    res, lengths = data["results"], data["lengths"]
    mc = data["model"]
    same = {k: res[k]["outputs"] == res["none"]["outputs"] for k in CONFIGS if k != "none"}

    def med(cfg, n):
        return statistics.median(t for t, ln in zip(res[cfg]["ttft_s"], lengths) if ln == n)

    measured = sorted(set(lengths) - {0})

    def stat(cfg, role, key):
        return res[cfg]["stats"].get(role, {}).get(key, 0)

    lines = [f"## {data.get('section', TITLE)}", "",
             f"Measured {data['date']} with:", "", "```", cmd, "```", "",
             f"- Machine: {data['machine']}",
             f"- Model: Llama-style, random weights made locally (`tutti.tiny_model` size `{data['model_size']}`): "
             f"{mc['num_hidden_layers']} layers, hidden {mc['hidden_size']}, {mc['num_key_value_heads']} KV heads, "
             f"bf16; vLLM block {data['block']} tokens = {data['block_bytes'] / 2**10:.0f} KiB of KV",
             "- One machine, TCP loopback, a real `mooncake_master`; each engine a fresh vLLM (CPU) process "
             "with its own store file on this machine's disk. A computes and stores; `none` recomputes; "
             "`remote` is node B (own empty store) served by A's store through the cluster (`tutti-admin "
             "cluster serve`), verified against A's checksums; `local` is B again, from the replica it kept.",
             f"- Requests one at a time, each its own prefix, {lengths.count(measured[0])} per length after a "
             "short warm-up request (not counted); TTFT = wall time of a 1-token greedy generation; medians.",
             "- Greedy outputs identical to recompute: "
             + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in same.items()),
             f"- Remote (B, first run): {stat('remote', 'scheduler', 'remote_hit_tokens')} tokens promised from the "
             f"cluster, {stat('remote', 'worker0', 'remote_blocks')} blocks fetched verified, "
             f"{stat('remote', 'worker0', 'remote_errors')} remote errors, "
             f"{stat('remote', 'worker0', 'load_errors')} load errors; local (B again): "
             f"{stat('local', 'scheduler', 'hit_tokens')} tokens from its own store.",
             f"- Load average at the end: {data['loadavg']:.1f}.", "",
             "| prefix tokens | recompute (no connector) | remote hit | local hit | remote / recompute | "
             "remote / local | A (computes + saves) |", "|---|---|---|---|---|---|---|"]
    for n in measured:
        r, rem, loc, a = med("none", n), med("remote", n), med("local", n), med("A", n)
        lines.append(f"| {n} | {r:.3f} s | {rem:.3f} s | {loc:.3f} s | {rem / r:.2f} | {rem / loc:.2f} | "
                     f"{a:.3f} s |")
    lines.append("")
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    try:
        with scratch_dir(args.workdir, "tutti-cluster-ttft-") as tmp:
            data = measure(args, tmp)
    except ClusterError as e:
        raise SystemExit(f"cluster_ttft: {e}") from None
    data.update(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                machine=vllm_cpu_machine(), loadavg=os.getloadavg()[0], section=args.section)
    cmd = shown_command(".venv/bin/python benchmarks/cluster_ttft.py", sys.argv[1:] if argv is None else argv)
    with open(args.json, "w") as f:
        json.dump({k: v for k, v in data.items()}, f, indent=1)
    text = render(data, cmd)
    print(text)
    replace_section(args.output, args.section, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
