#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""What the vLLM connector's worker side costs on top of its data path: a stored prefix loaded through
``WorkerSide`` (as vLLM's model runner drives it) vs the same blocks read by a bare store transaction.

  connector_load.py [--data-path staged|gds|gio|host|cpu] [--prefix-tokens T] [--dir DIR] [--runs R] [--json OUT]

KV cache shaped like one TP rank of Llama-3-8B (32 layers, 8 KV heads, head dim 128, bf16, 16-token blocks,
vLLM's flash layout: per layer [2, blocks, 16, 8, 128]); on the GPU for staged/gds/gio, in host memory for
host/cpu.  The prefix is saved once through the worker (save_kv_layer per layer, committed at the step's
end), then each run: the worker loads it into other blocks of the cache (start_load_kv, wait_for_layer_load
per layer, the step's end) and, in the same run, a bare transaction on the worker's own store and path reads
the same slots into a third set of blocks (layer by layer, ``lookahead`` layers in flight); which goes first
alternates between runs.  Both loads are
compared with the saved blocks.  Reported: GB/s of each (median of --runs) and their ratio; no vLLM needed.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch

import tutti.gpu  # noqa: F401 - before CUDA starts: it asks CUDA for the hardware queues the gio path needs
from tutti.vllm.config import ModelShape, TuttiConfig
from tutti.vllm.metadata import BlockTransfer, TuttiMetadata
from tutti.vllm.stats import TuttiStats
from tutti.vllm.worker import WorkerSide

LAYERS, KV_HEADS, HEAD_DIM, BLOCK = 32, 8, 128, 16


def layer_name(l):
    return f"model.layers.{l}.self_attn.attn"


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def run(args) -> dict:
    gpu = args.data_path in ("staged", "gds", "gio")
    if gpu and not torch.cuda.is_available():
        raise SystemExit(f"--data-path {args.data_path} needs a CUDA device")
    dev = torch.device("cuda", 0) if gpu else torch.device("cpu")
    n = args.prefix_tokens // BLOCK
    layers, heads = args.layers, args.kv_heads
    num_blocks = 3 * n
    saved, loaded, bare = list(range(n)), list(range(n, 2 * n)), list(range(2 * n, 3 * n))
    kv = {layer_name(l): torch.zeros(2, num_blocks, BLOCK, heads, HEAD_DIM, dtype=torch.bfloat16, device=dev)
          for l in range(layers)}
    block_bytes = layers * 2 * BLOCK * heads * HEAD_DIM * 2
    d = tempfile.mkdtemp(prefix="connector-load-", dir=args.dir)
    path = os.path.join(d, "kv.img")
    cfg = TuttiConfig.from_extra({"path": path, "capacity": str(block_bytes * (n + 8)),
                                  "data_path": args.data_path, "lookahead_layers": args.lookahead,
                                  "save_mode": "step"})  # the seed save is timed within its step
    shape = ModelShape(model_id="bench/llama-3-8b-shaped", dtype="bfloat16", n_layers=layers, kv_heads=heads,
                       head_dim=HEAD_DIM, block_size=BLOCK, tp_size=1)
    w = WorkerSide(cfg, shape, 0, TuttiStats())
    w.register_kv_caches(kv, num_blocks)
    keys = [f"prefix-{b}".encode() for b in range(n)]
    try:
        g = torch.Generator(device=dev).manual_seed(7)
        meta = TuttiMetadata(saves=[BlockTransfer("seed", keys, saved)])
        t0 = time.perf_counter()
        for l in range(layers):
            t = kv[layer_name(l)]
            t[:, saved] = torch.randn(t[:, saved].shape, generator=g, device=dev, dtype=torch.float32).to(t.dtype)
            w.save_layer(meta, layer_name(l))
        w.finish_save(meta)
        sync(dev)
        save_s = time.perf_counter() - t0
        w.take_worker_meta()
        slots = w.store.lookup(keys)
        assert None not in slots, "the prefix was not committed"

        def through_worker():
            meta = TuttiMetadata(loads=[BlockTransfer("r", keys, loaded)])
            t0 = time.perf_counter()
            w.start_load(meta)
            for l in range(layers):
                w.wait_layer(layer_name(l))
            errors = w.take_load_errors()
            sync(dev)
            worker_s.append(time.perf_counter() - t0)
            assert not errors, f"{len(errors)} blocks failed to load"

        def bare_txn():
            t0 = time.perf_counter()
            txn = w.io.read(slots, bare)
            for l in range(min(args.lookahead, layers)):
                txn.layer(l)
            for l in range(layers):
                if l + args.lookahead < layers:
                    txn.layer(l + args.lookahead)
                txn.wait_layer(l)
            status = txn.finish()
            sync(dev)
            bare_s.append(time.perf_counter() - t0)
            assert status == [0] * n, "bare read failed"

        worker_s, bare_s, exact = [], [], True
        for i in range(args.runs):
            for l in range(layers):
                kv[layer_name(l)][:, loaded] = 0
                kv[layer_name(l)][:, bare] = 0
            sync(dev)
            # Alternate which goes first: a cache below the store (the host's, under a virtual disk)
            # would otherwise favour the second read of the same bytes.
            for f in ((through_worker, bare_txn) if i % 2 == 0 else (bare_txn, through_worker)):
                f()
            for l in range(layers):
                t = kv[layer_name(l)]
                exact &= torch.equal(t[:, loaded], t[:, saved]) and torch.equal(t[:, bare], t[:, saved])
    finally:
        w.close()
        for f in os.listdir(d):
            os.unlink(os.path.join(d, f))
        os.rmdir(d)
    total = n * block_bytes
    wk, br = statistics.median(worker_s), statistics.median(bare_s)
    return {"data_path": args.data_path, "device": torch.cuda.get_device_name(0) if gpu else "cpu",
            "prefix_tokens": args.prefix_tokens, "blocks": n, "bytes": total, "layers": layers, "kv_heads": heads,
            "runs": args.runs, "lookahead": args.lookahead, "save_gbps": total / save_s / 1e9,
            "worker_gbps": total / wk / 1e9, "bare_gbps": total / br / 1e9, "worker_over_bare": br / wk,
            "worker_s": worker_s, "bare_s": bare_s, "bit_exact": bool(exact), "dir": args.dir or tempfile.gettempdir()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-path", default="staged", choices=["staged", "gds", "gio", "host", "cpu"])
    ap.add_argument("--prefix-tokens", type=int, default=32768)
    ap.add_argument("--layers", type=int, default=LAYERS)
    ap.add_argument("--kv-heads", type=int, default=KV_HEADS)
    ap.add_argument("--lookahead", type=int, default=2)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--dir", default=None, help="where the store file goes (default: $TMPDIR; /dev/shm: RAM)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    r = run(args)
    print(f"{r['data_path']} on {r['device']}: {r['prefix_tokens']} tokens ({r['bytes'] / 2**30:.2f} GiB), "
          f"through the worker {r['worker_gbps']:.2f} GB/s, bare transaction {r['bare_gbps']:.2f} GB/s "
          f"(ratio {r['worker_over_bare']:.3f}), saved at {r['save_gbps']:.2f} GB/s, bit-exact {r['bit_exact']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f, indent=2)
    return 0 if r["bit_exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
