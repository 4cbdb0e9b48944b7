#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""How long a load waits for deferred saves' drained writes, by drain rule (issue 13: writes in the
steps' slack, reads first).  CPU only: the worker side driven as vLLM's model runner drives it.

  drain_slack.py [--requests 60] [--write-mbps 80] [--decode-ms 20] [--decode-steps 10]
                 [--rules slack,grow,64MiB] [--table-write-mbps R] [--runs 3] [--dir /dev/shm] [--json OUT]

A store on --dir whose writes are throttled to --write-mbps (libtutti's fault engine rate rule,
``TUTTI_FAULTS=rate:write:mbps=N``: a slow SSD; reads are not throttled).  Requests arrive one after
another: a prefill step (32 layers, 1 ms of "compute" each) saves the request's 16 blocks (1 MiB
each), then decode steps of --decode-ms each until the next request arrives (1 + an exponential
number of steps, mean --decode-steps: Poisson-like arrivals, the same sequence for every rule).
Every second request's prefill also loads 8 blocks of the newest request whose blocks are stored by
then (a prefix hit): with ``write_policy: slack`` the load first waits for writes in flight, and
that wait is the hit's TTFT.  As on a GPU, a layer's KV is final only once the step's kernels are
done (here: at the step's end), so every save is carried over and drained by later steps
(``save_mode: deferred``) under the rule compared:

  slack   drain_bytes_per_step auto as it is (drain.py: the next step's slack, cut when a drain is
          still written two step ends later or a load waited for it, grown while the store keeps
          up); --table-write-mbps: with a profile table's write rate as its seed
  grow    the rule before the slack fit (cut only when a load waited; grown while writes are left
          queued; drains go out behind late ones): the same code, ``DrainBudget.slack_fit`` off
  SIZE    a fixed drain_bytes_per_step

Reported per rule (medians over --runs runs, the rules alternated): the loads' wait for writes (p50,
p90, max ms), the decode step's wall time, the steps from a save to its commit, the blocks committed
per second of the run (MB/s), drops.  Every loaded block is compared with what was saved.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone

import torch

from tutti.vllm.config import ModelShape, TuttiConfig
from tutti.vllm.drain import DrainBudget
from tutti.vllm.metadata import BlockTransfer, TuttiMetadata
from tutti.vllm.stats import TuttiStats
from tutti.vllm.worker import WorkerSide

LAYERS, KV_HEADS, BLOCK, HEAD_DIM = 32, 8, 16, 64   # 32 KiB per layer and block, 1 MiB per block
SAVE_BLOCKS, LOAD_BLOCKS, NUM_BLOCKS = 16, 8, 512
LAYER_S = 0.001


def name(layer: int) -> str:
    return f"model.layers.{layer}.self_attn.attn"


class Lag:
    """A layer's KV is final only at the step's end (the GPU's kernels run behind the host)."""

    def __init__(self, w):
        self.open = []
        w.io.mark, w.io.ready = self.mark, self.ready

    def mark(self):
        m = [False]
        self.open.append(m)
        return m

    @staticmethod
    def ready(m, block=False):
        if m is not None and block:
            m[0] = True
        return m is None or m[0]

    def step_end(self):
        for m in self.open:
            m[0] = True
        self.open.clear()


class _Table:
    """What the worker reads of a profile table (``tutti-admin profile``): the store's write rate."""

    def __init__(self, mbps: float):
        self.io = {"write_gbps": mbps / 1000}


def pct(xs, q):
    if not xs:
        return 0.0
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def run_rule(args, rule: str, d: str) -> dict:
    os.environ["TUTTI_FAULTS"] = f"rate:write:mbps={args.write_mbps}"
    extra = {"path": os.path.join(d, "kv.img"), "capacity": "1GiB", "write_policy": "slack",
             "data_path": "cpu", "save_mode": "deferred"}
    if rule not in ("slack", "grow"):
        extra["drain_bytes_per_step"] = rule
    cfg = TuttiConfig.from_extra(extra)
    if args.table_write_mbps and rule == "slack":
        cfg.profile = _Table(args.table_write_mbps)
    shape = ModelShape(model_id="bench/drain-slack", dtype="float16", n_layers=LAYERS, kv_heads=KV_HEADS,
                       head_dim=HEAD_DIM, block_size=BLOCK, tp_size=1)
    stats = TuttiStats()
    DrainBudget.slack_fit = rule != "grow"
    try:
        w = WorkerSide(cfg, shape, 0, stats)
        kv = {name(layer): torch.zeros(NUM_BLOCKS, KV_HEADS, BLOCK, 2 * HEAD_DIM, dtype=torch.int16)
              for layer in range(LAYERS)}
        w.register_kv_caches(kv, NUM_BLOCKS)
        return drive(args, w, kv, stats, rule)
    finally:
        DrainBudget.slack_fit = True
        os.environ.pop("TUTTI_FAULTS", None)


def drive(args, w, kv, stats, rule) -> dict:
    lag = Lag(w)
    g = torch.Generator().manual_seed(7)
    rng = random.Random(11)   # the same arrivals for every rule
    step_no, next_id = 0, 0
    saved_at, committed_at, ref = {}, {}, {}
    waits, decode_s, load_bad, load_err = [], [], 0, 0

    def step(saves=(), loads=(), compute=None, per_layer_s=0.0, after_s=0.0):
        nonlocal step_no
        step_no += 1
        meta = TuttiMetadata(saves=list(saves), loads=list(loads), step=step_no)
        w.handle_preemptions(meta)
        w0 = stats.data.get("load_write_wait_s", 0.0)
        w.start_load(meta)
        for layer in range(LAYERS):
            w.wait_layer(name(layer))
            if compute is not None:
                ids, x = compute
                kv[name(layer)][ids] = x[layer]
            if per_layer_s:
                time.sleep(per_layer_s)
            w.save_layer(meta, name(layer))
        if after_s:
            time.sleep(after_s)
        lag.step_end()
        w.finish_save(meta)
        w.get_finished(set(), meta)
        errs = w.take_load_errors()
        wm = w.take_worker_meta()
        for ev in (wm.events if wm else []):
            if ev.key and ev.key not in committed_at:
                committed_at[ev.key] = step_no
        return stats.data.get("load_write_wait_s", 0.0) - w0, errs

    t0 = time.perf_counter()
    for r in range(args.requests):
        ids = [(next_id + i) % NUM_BLOCKS for i in range(SAVE_BLOCKS)]
        next_id += SAVE_BLOCKS
        keys = [f"r{r}-b{b}".encode() for b in range(SAVE_BLOCKS)]
        x = torch.randint(-32768, 32768, (LAYERS, SAVE_BLOCKS, KV_HEADS, BLOCK, 2 * HEAD_DIM),
                          generator=g, dtype=torch.int16)
        for i, k in enumerate(keys):
            ref[k] = x[:, i].clone()
            saved_at[k] = step_no + 1
        loads, lids, lkeys = [], [], []
        # A hit on the newest request whose prefix is stored (the scheduler promises stored keys only).
        src = next((q for q in range(r - 1, -1, -1)
                    if all(f"r{q}-b{b}".encode() in committed_at for b in range(LOAD_BLOCKS))), None)
        if r % 2 == 1 and src is not None:
            lkeys = [f"r{src}-b{b}".encode() for b in range(LOAD_BLOCKS)]
            lids = [(next_id + i) % NUM_BLOCKS for i in range(LOAD_BLOCKS)]
            next_id += LOAD_BLOCKS
            loads = [BlockTransfer(f"q{r}", lkeys, lids)]
        waited, errs = step(saves=[BlockTransfer(f"r{r}", keys, ids)], loads=loads, compute=(ids, x),
                            per_layer_s=LAYER_S)
        if loads:
            waits.append(waited)
            bad_ids = set(errs or ())
            load_err += len(bad_ids)
            for k, b in zip(lkeys, lids):
                if b in bad_ids:
                    continue
                got = torch.stack([kv[name(layer)][b] for layer in range(LAYERS)])
                load_bad += int(not torch.equal(got, ref[k]))
        # Arrivals at random (Poisson-like): the decode steps until the next request, mean --decode-steps.
        n_dec = 1 + int(rng.expovariate(1.0 / max(args.decode_steps - 1, 1e-9))) if args.decode_steps > 1 else 1
        for _ in range(n_dec):
            t = time.perf_counter()
            step(after_s=args.decode_ms / 1000)
            decode_s.append(time.perf_counter() - t)
    wall = time.perf_counter() - t0
    delays = [committed_at[k] - s for k, s in saved_at.items() if k in committed_at]
    b = w._drain_budget
    out = {
        "rule": rule, "loads": len(waits),
        "wait_p50_ms": 1000 * pct(waits, 0.5), "wait_p90_ms": 1000 * pct(waits, 0.9),
        "wait_max_ms": 1000 * max(waits or [0.0]),
        "decode_step_ms": 1000 * statistics.median(decode_s),
        "commit_steps_median": statistics.median(delays) if delays else None,
        "committed_blocks": len(delays), "saved_blocks": len(saved_at),
        "dropped": stats.data.get("save_dropped", 0),
        "committed_mbps": len(delays) * (1 << 20) / wall / 1e6,
        "drain_spills": stats.data.get("drain_spills", 0),
        "budget_final": b.bytes if b is not None else None,
        "load_errors": load_err, "load_mismatch": load_bad, "wall_s": wall,
    }
    w.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=60)
    ap.add_argument("--write-mbps", type=int, default=80)
    ap.add_argument("--decode-ms", type=float, default=20.0)
    ap.add_argument("--decode-steps", type=int, default=10)
    ap.add_argument("--rules", default="slack,grow,64MiB")
    ap.add_argument("--table-write-mbps", type=float, default=0,
                    help="give the slack rule a profile table with this write rate (its seed)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rules = [r.strip() for r in args.rules.split(",") if r.strip()]
    runs: dict[str, list] = {r: [] for r in rules}
    for i in range(args.runs):
        for rule in rules:  # alternated: the machine's noise falls on every rule alike
            with tempfile.TemporaryDirectory(dir=args.dir) as d:
                res = run_rule(args, rule, d)
            runs[rule].append(res)
            print(f"run {i + 1} {rule:>6}: load wait p50 {res['wait_p50_ms']:.1f} p90 {res['wait_p90_ms']:.1f} "
                  f"max {res['wait_max_ms']:.1f} ms; decode step {res['decode_step_ms']:.1f} ms; commit after "
                  f"{res['commit_steps_median']} steps; {res['committed_mbps']:.1f} MB/s committed; "
                  f"{res['dropped']} dropped; {res['load_mismatch']} mismatched", file=sys.stderr, flush=True)
    keys = ("wait_p50_ms", "wait_p90_ms", "wait_max_ms", "decode_step_ms", "commit_steps_median",
            "committed_mbps", "dropped", "drain_spills", "load_errors", "load_mismatch")
    summary = {r: {k: statistics.median([x[k] for x in v if x[k] is not None] or [0]) for k in keys}
               for r, v in runs.items()}
    print("| rule | load wait p50 / p90 / max (ms) | decode step (ms) | steps to commit | committed MB/s | "
          "dropped | spills | load errors / mismatches |")
    print("|---|---|---|---|---|---|---|---|")
    for r, s in summary.items():
        print(f"| {r} | {s['wait_p50_ms']:.1f} / {s['wait_p90_ms']:.1f} / {s['wait_max_ms']:.1f} | "
              f"{s['decode_step_ms']:.1f} | {s['commit_steps_median']} | {s['committed_mbps']:.1f} | "
              f"{s['dropped']} | {s['drain_spills']} | {s['load_errors']} / {s['load_mismatch']} |")
    bad = sum(x["load_mismatch"] for v in runs.values() for x in v)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": " ".join(["drain_slack.py"] + sys.argv[1:]),
                       "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                       "host": platform.node(), "cpus": os.cpu_count(), "summary": summary, "runs": runs},
                      f, indent=1)
            f.write("\n")
    if bad:
        print(f"drain_slack: {bad} loaded blocks differ from what was saved", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
