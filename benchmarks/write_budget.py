#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A write budget in steady state: hits lost against bytes saved, over simulated days.

  write_budget.py [--hours 48] [--docs-per-hour 25] [--budgets 1.0,0.6,0.4] [--policies expected_value,second_hit]
                  [--seed 0] [--dir DIR] [--json OUT]

The connector's scheduler side (``SchedulerSide``: lookups, write admission with its token bucket, the
head/tail split) and worker side (``WorkerSide``: loads and saves through a real store, psync engine) are
driven as vLLM drives them, one request per step, on a fake clock; no model runs (the KV bytes are whatever
is in the cache: only which blocks are stored and found matters here).

Workload (the document workload of benchmarks/serving.py, stretched over days): documents of ``--doc-blocks``
blocks arrive as a Poisson process; a share ``--once`` of them is asked one question, the others 2 + a
geometric number (mean ``--extra-questions``) of questions, spaced by exponential gaps (mean ``--gap-min``
minutes) after the document arrives.  A question adds ``--question-blocks`` blocks of its own.

First run: no budget; its bytes written per day (W) and hits (tokens loaded from the store) are the
reference.  Then, per policy, a budget of each ``--budgets`` fraction of W (the bucket holds an hour of it,
as the connector's): hits lost against the reference, bytes written per day against the budget.  Every run
replays the same request sequence.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import shutil
import tempfile
import time
from types import SimpleNamespace as NS

import torch

from tutti.vllm.config import ModelShape, TuttiConfig
from tutti.vllm.scheduler import SchedulerSide
from tutti.vllm.stats import TuttiStats
from tutti.vllm.worker import WorkerSide

BS, LAYERS = 16, 2
DAY_S = 86400.0


def name(layer):
    return f"model.layers.{layer}.self_attn.attn"


def workload(args) -> list[tuple[float, int, int, int]]:
    """(time s, document, question index, question id) in time order."""
    rnd = random.Random(args.seed)
    horizon = args.hours * 3600.0
    t, doc, qid, events = 0.0, 0, 0, []
    while True:
        t += rnd.expovariate(args.docs_per_hour / 3600.0)
        if t >= horizon:
            break
        n = 1 if rnd.random() < args.once else 2 + int(rnd.expovariate(1.0 / args.extra_questions))
        tq = t
        for j in range(n):
            events.append((tq, doc, j, qid))
            qid += 1
            tq += rnd.expovariate(1.0 / (args.gap_min * 60.0))
        doc += 1
    events.sort()
    return [e for e in events if e[0] < horizon]


class Req:
    def __init__(self, req_id, hashes):
        self.request_id = req_id
        self.block_hashes = hashes
        self.num_prompt_tokens = len(hashes) * BS + 1


def output(new_reqs=(), sched=None, finished=()):
    return NS(scheduled_new_reqs=list(new_reqs),
              scheduled_cached_reqs=NS(req_ids=[], resumed_req_ids=set(), new_block_ids=[], num_computed_tokens=[]),
              num_scheduled_tokens=dict(sched or {}), finished_req_ids=set(finished), preempted_req_ids=set(),
              kv_connector_block_state=None, kv_cache_block_copies=[], total_num_scheduled_tokens=0)


class Clock:
    t = 0.0

    def __call__(self):
        return self.t


def run(args, events, budget: float | None, policy: str) -> dict:
    d = tempfile.mkdtemp(prefix="write-budget-", dir=args.dir)
    extra = {"path": os.path.join(d, "kv.img"), "capacity": args.capacity, "engine": "psync", "save_mode": "step"}
    if budget is not None:
        extra.update(write_budget=budget, write_admission=policy)
    cfg = TuttiConfig.from_extra(extra)
    shape = ModelShape(model_id="bench/write-budget", dtype="float16", n_layers=LAYERS, kv_heads=1, head_dim=16,
                       block_size=BS, tp_size=1)
    per_req = args.doc_blocks + args.question_blocks + 1
    nb = 4 * per_req
    w = WorkerSide(cfg, shape, 0, TuttiStats())
    w.register_kv_caches({name(l): torch.zeros(2, nb, BS, 1, 16, dtype=torch.float16) for l in range(LAYERS)}, nb)
    s = SchedulerSide(cfg, shape, NS(cache_config=NS(prefix_caching_hash_algo="sha256")), TuttiStats())
    clock = Clock()
    if s.admission is not None:
        s.admission.clock, s.admission.last = clock, clock()
    hits, asked, finished, t0 = 0, 0, set(), time.perf_counter()
    try:
        for i, (t, doc, _j, qid) in enumerate(events):
            clock.t = t
            hashes = [f"d{doc}-{b}".encode() for b in range(args.doc_blocks)]
            hashes += [f"d{doc}q{qid}-{b}".encode() for b in range(args.question_blocks)]
            rid = f"r{i}"
            req = Req(rid, hashes)
            n_ext, _ = s.get_num_new_matched_tokens(req, 0)
            table = [(i % 4) * per_req + b for b in range(per_req)]
            s.update_state_after_alloc(req, NS(get_block_ids=lambda table=table: (table,)), n_ext)
            meta = s.build_connector_meta(output([NS(req_id=rid, block_ids=(table,), num_computed_tokens=n_ext)],
                                                 {rid: req.num_prompt_tokens - n_ext}, finished))
            w.start_load(meta)
            for l in range(LAYERS):
                w.wait_layer(name(l))
                w.save_layer(meta, name(l))
            w.finish_save(meta)
            errors = w.take_load_errors()
            assert not errors, f"load errors {errors}"
            s.update_connector_output(NS(kv_connector_worker_meta=w.take_worker_meta(), finished_sending=None,
                                         finished_recving=None, invalid_block_ids=set()))
            hold, _ = s.request_finished(req)
            assert not hold, "save_mode step: nothing is held"
            finished = {rid}
            hits += n_ext
            asked += args.doc_blocks * BS
    finally:
        w.close()
        shutil.rmtree(d, ignore_errors=True)
    st = s.stats.data
    ws = w.stats.data
    days = args.hours / 24.0
    return {"budget_bytes_per_day": budget, "policy": policy if budget is not None else None,
            "requests": len(events), "hit_tokens": hits, "doc_tokens_asked": asked,
            "written_bytes": ws.get("save_bytes", 0), "written_bytes_per_day": ws.get("save_bytes", 0) / days,
            "save_blocks": ws.get("save_blocks", 0), "skipped_blocks": st.get("save_skipped", 0),
            "skipped_unseen_blocks": st.get("save_skipped_unseen", 0),
            "pressure_steps": st.get("admission_pressure_steps", 0), "wall_s": time.perf_counter() - t0}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hours", type=float, default=48.0)
    ap.add_argument("--docs-per-hour", type=float, default=25.0)
    ap.add_argument("--doc-blocks", type=int, default=32)
    ap.add_argument("--question-blocks", type=int, default=2)
    ap.add_argument("--once", type=float, default=0.4, help="share of documents asked one question only")
    ap.add_argument("--extra-questions", type=float, default=3.0, help="mean questions beyond two, for the rest")
    ap.add_argument("--gap-min", type=float, default=20.0, help="mean minutes between a document's questions")
    ap.add_argument("--budgets", default="0.6,0.4", help="fractions of the unbudgeted bytes written per day")
    ap.add_argument("--policies", default="expected_value,second_hit")
    ap.add_argument("--capacity", default="2GiB", help="per store: large enough that eviction loses no hit")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    events = workload(args)
    res = {"command": "write_budget.py " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()
                                                    if v is not None and k not in ("json", "dir")),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "host": platform.node(), "cpus": os.cpu_count(), "runs": []}
    ref = run(args, events, None, "none")
    res["runs"].append(ref)
    print(f"no budget: {ref['requests']} requests over {args.hours:g} h, {ref['hit_tokens']} hit tokens of "
          f"{ref['doc_tokens_asked']} document tokens asked, {ref['written_bytes_per_day'] / 2**20:.1f} MiB/day "
          f"written ({ref['wall_s']:.1f} s)", flush=True)
    for policy in args.policies.split(","):
        for frac in (float(x) for x in args.budgets.split(",")):
            r = run(args, events, frac * ref["written_bytes_per_day"], policy)
            r["fraction"] = frac
            r["hits_lost"] = 1 - r["hit_tokens"] / ref["hit_tokens"] if ref["hit_tokens"] else 0.0
            r["written_over_budget"] = r["written_bytes_per_day"] / r["budget_bytes_per_day"]
            res["runs"].append(r)
            print(f"{policy:15s} budget {frac:.2f} W: hits lost {100 * r['hits_lost']:5.1f} %, written "
                  f"{r['written_over_budget']:.3f} of the budget, {r['skipped_blocks']} blocks refused "
                  f"({r['skipped_unseen_blocks']} unseen) ({r['wall_s']:.1f} s)", flush=True)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(res, f, indent=1)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
