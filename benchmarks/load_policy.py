#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Loads only where they pay: TTFT of reused documents with ``load_policy`` all vs auto, on stores whose reads
the fault engine paces, against recomputing (no connector).  Real vLLM on CPU, the tiny local model.

  load_policy.py [--docs 3] [--rounds 4] [--doc-blocks 64] [--mbps 1,8,0] [--json F] [--md docs/benchmarks.md]

Per store read rate (MB/s; 0 = unthrottled) one engine per policy: the documents cold, then ``--rounds`` rounds
of each document with a new tail, one request at a time, max_tokens 1 (the runner's ``ttft``).  Reported:
the median TTFT of the last two rounds (the planner has measured by then), the tokens loaded and cut, as
ratios to no connector measured in the same run.  vLLM's own prefix cache is off.  Nothing is asserted.
"""
import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "vllm"))
from tutti import tiny_model  # noqa: E402
from vllm_engine import BLOCK, run_engine  # noqa: E402


def workload(vocab, docs, rounds, doc_blocks, seed=11):
    rng = random.Random(seed)
    ds = [[rng.randrange(3, vocab) for _ in range(doc_blocks * BLOCK)] for _ in range(docs)]
    out = []
    for _ in range(rounds + 1):
        out += [d + [rng.randrange(3, vocab) for _ in range(rng.randrange(20, 40))] for d in ds]
    return out


def one(work, name, model, prompts, docs, rounds, connector="tutti", mbps=0, policy="auto"):
    extra = {"path": os.path.join(work, name, "kv.img"), "capacity": "256MiB", "load_policy": policy}
    env = {"TUTTI_FAULTS": f"rate:read:mbps={mbps}"} if mbps else {}
    res = run_engine(work, name, model=model, prompts=prompts, connector=connector,
                     extra=extra if connector == "tutti" else None, max_tokens=1, concurrent=False,
                     prefix_caching=False, ttft=True, env_extra=env, timeout=900)
    planned = res["ttft_s"][-2 * docs:]  # the last two rounds
    sched = res["stats"].get("scheduler", {})
    return {"ttft_ms": round(1e3 * statistics.median(planned), 2),
            "hit_tokens": sched.get("hit_tokens", 0), "cut_tokens": sched.get("load_cut_tokens", 0)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--doc-blocks", type=int, default=64)
    ap.add_argument("--mbps", default="1,8,0", help="store read rates, MB/s, comma separated; 0: unthrottled")
    ap.add_argument("--json")
    ap.add_argument("--md", help="append a section to this markdown file")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="loadpol-")
    model = tiny_model.create(os.path.join(work, "tiny-llama"), "tiny", seed=0)
    with open(os.path.join(model, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    prompts = workload(vocab, a.docs, a.rounds, a.doc_blocks)
    rows = []
    base = one(work, "none", model, prompts, a.docs, a.rounds, connector="none")
    print(f"no connector: {base['ttft_ms']} ms", flush=True)
    for mbps in [int(x) for x in a.mbps.split(",")]:
        for policy in ("all", "auto"):
            r = one(work, f"{policy}-{mbps}", model, prompts, a.docs, a.rounds, mbps=mbps, policy=policy)
            r.update(mbps=mbps, policy=policy, vs_recompute=round(r["ttft_ms"] / base["ttft_ms"], 3))
            rows.append(r)
            print(json.dumps(r), flush=True)
    out = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.node()} ({os.cpu_count()} CPUs)",
           "command": "python3 benchmarks/load_policy.py " + " ".join(sys.argv[1:]),
           "doc_tokens": a.doc_blocks * BLOCK, "recompute_ttft_ms": base["ttft_ms"], "rows": rows}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    if a.md:
        lines = [f"\n## Loads only where they pay (vLLM on CPU, {out['date']})\n",
                 f"`{out['command']}` on {out['machine']}: tiny local model, documents of {out['doc_tokens']} "
                 f"tokens reused with new tails one at a time, TTFT median of the last two rounds; store reads "
                 f"paced by the fault engine (`TUTTI_FAULTS=rate:read:mbps=N`). No connector (recompute): "
                 f"{base['ttft_ms']} ms.\n",
                 "| store reads | load_policy | TTFT ms | × recompute | tokens loaded | tokens cut |",
                 "|---|---|---|---|---|---|"]
        for r in rows:
            rate = f"{r['mbps']} MB/s" if r["mbps"] else "unthrottled"
            lines.append(f"| {rate} | {r['policy']} | {r['ttft_ms']} | {r['vs_recompute']} | {r['hit_tokens']} "
                         f"| {r['cut_tokens']} |")
        with open(a.md, "a") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
