#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Where a save's cost lands: ``wait_for_save`` of the step that saves vs of the steps after it, with
``save_mode`` step and deferred (the vLLM connector's worker side driven as vLLM's model runner drives it).

  connector_save_step.py [--dir /dev/shm] [--blocks 64] [--requests 8] [--engine psync|uring|auto]
                         [--throttle-mbps N] [--after-steps 2]

Host-memory KV cache (16 layers, 8 KV heads, head dim 128, fp16, 16-token blocks); each request is one step
that saves ``--blocks`` new blocks followed by ``--after-steps`` steps without saves (decode).  Reported:
medians over the requests (the first left out) of the ``wait_for_save`` time of the saving step, of the
next step and of the slowest step after it, and the steps a save took to be committed.  With ``step``
the wait for the writes, the flush and the commit land in the saving step (a cold request's TTFT); with
``deferred`` no step waits for the writes: the flush and the commit land in the first step after they
completed.  ``--throttle-mbps``: the store's writes held to N MB/s (libtutti's fault engine rate rule,
as the serving benchmark's slow store).  No vLLM needed; no speed is asserted anywhere.
"""
import argparse
import os
import statistics
import tempfile
import time

import torch

from tutti.vllm.config import ModelShape, TuttiConfig
from tutti.vllm.metadata import BlockTransfer, TuttiMetadata
from tutti.vllm.stats import TuttiStats
from tutti.vllm.worker import WorkerSide

L, H, B, D = 16, 8, 16, 128


def run(mode, args):
    n = args.blocks
    nb = 4 * n
    d = tempfile.mkdtemp(prefix="save-step-", dir=args.dir)
    cfg = TuttiConfig.from_extra({"path": os.path.join(d, "kv.img"), "capacity": "1GiB",
                                  "save_mode": mode, "engine": args.engine})
    shape = ModelShape(model_id="bench/save-step", dtype="float16", n_layers=L, kv_heads=H, head_dim=D,
                       block_size=B, tp_size=1)
    w = WorkerSide(cfg, shape, 0, TuttiStats())
    names = [f"model.layers.{layer}.self_attn.attn" for layer in range(L)]
    kv = {name: torch.randn(nb, H, B, 2 * D).half() for name in names}
    w.register_kv_caches(kv, nb)
    saving, after, worst, to_commit, step = [], [], [], [], 0
    for r in range(args.requests):
        ids = list(range((r % 4) * n, (r % 4) * n + n))
        keys = {f"{mode}{r}-{b}".encode() for b in range(n)}
        committed, took, rest = set(), None, []
        k = 0
        while k <= args.after_steps or (took is None and k <= 1000):
            step += 1
            saves = [BlockTransfer(f"r{r}", sorted(keys), ids)] if k == 0 else []
            meta = TuttiMetadata(saves=saves, step=step)
            w.start_load(meta)
            for name in names:
                w.save_layer(meta, name)
            t = time.perf_counter()
            w.finish_save(meta)
            dt = time.perf_counter() - t
            wm = w.take_worker_meta()
            committed |= {ev.key for ev in (wm.events if wm else []) if ev.key in keys}
            if took is None and committed == keys:
                took = k
            if k == 0:
                saving.append(dt)
            elif k == 1:
                after.append(dt)
            if k >= 1:
                rest.append(dt)
            if took is None and k >= args.after_steps:
                time.sleep(0.001)  # an idle engine's next step
            k += 1
        worst.append(max(rest))
        to_commit.append(took)
    w.close()
    return (statistics.median(saving[1:]) * 1e3, statistics.median(after[1:]) * 1e3,
            statistics.median(worst[1:]) * 1e3, to_commit)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/dev/shm")
    ap.add_argument("--blocks", type=int, default=64)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--engine", default="psync")
    ap.add_argument("--throttle-mbps", type=float, default=None)
    ap.add_argument("--after-steps", type=int, default=2)
    args = ap.parse_args()
    if args.throttle_mbps:
        os.environ["TUTTI_FAULTS"] = f"rate:write:mbps={args.throttle_mbps:g}"
    for mode in ("step", "deferred"):
        s, a, worst, took = run(mode, args)
        print(f"{mode:9s} wait_for_save: saving step {s:8.2f} ms, next step {a:8.2f} ms, slowest step after "
              f"{worst:8.2f} ms; committed in step +{took} (0: the saving step)")


if __name__ == "__main__":
    main()
