#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Layer-wise retrieve of a TP-sharded prefix: N ranks at once vs one rank alone.

  tp_retrieve.py [--ranks N] [--prefix-tokens T] [--dir DIR] [--runs R] [--json OUT]

Each rank is a process with its own store (its shard of the KV heads of a
Llama-3-8B-shaped model: 32 layers, 8 KV heads, head dim 128, bf16, 16-token
blocks) and its own I/O engine queues.  The prefix is written once through
tutti.tp.commit; then every rank loads its shard layer by layer (a layer's
I/O in flight while the previous one is verified), between barriers.  Reported:
one rank alone (the others idle) and all ranks together, GB/s over the ranks'
bytes, median of --runs.

With two or more CUDA devices each rank owns one GPU (NCCL for device
tensors, gloo for the commit votes) and its store moves the shard between its
member file and that GPU's HBM through a GPU data path (tutti.gpu.store,
--path staged: file -> pinned -> HBM; --path gio: GPU threads drive the queue
pairs of the rank's own emulated NVMe controller over its member file): the
prefix is written from HBM, loaded back into a zeroed HBM buffer and compared
there (bit-exact, every run).  --path cpu keeps the host path (CPU engine, then
a copy of each layer into HBM).  Without two GPUs the ranks are CPU processes in
a gloo group and the data stops in host memory.  Stores go through O_DIRECT
where the filesystem has it; on tmpfs (--dir /dev/shm) they are RAM-backed, so
the ranks' own paths are what is measured, not a disk they would share.
"""
import argparse
import datetime
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tutti import Fingerprint, PagedBuffer, Store
from tutti.tp import commit, loaded_everywhere, lookup, rank_paths, shard_fingerprint

MODEL = Fingerprint(model_id="bench/llama3-8b-shape", dtype="bfloat16", n_layers=32, kv_heads=8,
                    head_dim=128, block_size=16)
WRITE_BATCH = 64


def _load(store, buf, slots, device, lookahead=2):
    """Layer-wise read of ``slots`` into ``buf`` (and ``device`` memory); returns status."""
    n_layers = store.geometry.n_layers
    ids = list(range(len(slots)))
    dev_bufs = []
    with store.read(slots) as txn:
        for layer in range(min(lookahead, n_layers)):
            txn.layer(layer, buf, ids)
        for layer in range(n_layers):
            if layer + lookahead < n_layers:
                txn.layer(layer + lookahead, buf, ids)
            txn.wait_layer(layer)
            if device is not None:
                for span in range(store.geometry.n_spans):
                    area = torch.frombuffer(buf.area(layer, span), dtype=torch.uint8)
                    dev_bufs.append(area.to(device, non_blocking=False))
        status = txn.finish()
    if device is not None:
        torch.cuda.synchronize(device)
    return status


def _load_gpu(store, slots, mem, ids, lookahead=2):
    """Layer-wise read of ``slots`` into GPU memory ``mem`` through the store's data path."""
    n_layers = store.geometry.n_layers
    txn = store.read(slots, mem, ids)
    try:
        for layer in range(min(lookahead, n_layers)):
            txn.layer(layer)
        for layer in range(n_layers):
            if layer + lookahead < n_layers:
                txn.layer(layer + lookahead)
            txn.wait_layer(layer)
        return txn.finish()
    except BaseException:
        txn.abort()
        raise


def _rank_gpu(rank, args, world, results):
    """One rank on CUDA device ``rank``: GpuStore + a GPU data path into its own HBM."""
    from tutti.gpu.store import DeviceKV, GpuStore  # needs libtutti_gpu.so

    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group("cpu:gloo,cuda:nccl", init_method=f"file://{args.rdv}",
                            rank=rank, world_size=world, timeout=datetime.timedelta(minutes=5))
    fp = shard_fingerprint(MODEL, rank, world)
    paths = rank_paths(os.path.join(args.dir, "kv{rank}.img"), rank, world)
    n_blocks = args.prefix_tokens // MODEL.block_size
    GpuStore.format(paths, fp, n_slots=n_blocks + 8, force=True)
    keys = [f"prefix-block-{b}" for b in range(n_blocks)]
    g = torch.Generator(device=device).manual_seed(1234 + rank)
    shape = (MODEL.n_layers, 2, n_blocks, MODEL.block_size, fp.kv_heads, MODEL.head_dim)
    src = torch.randint(-32768, 32767, shape, generator=g, dtype=torch.int16, device=device)
    dst = torch.zeros_like(src)
    src_mem, dst_mem = DeviceKV.from_tensor(src), DeviceKV.from_tensor(dst)
    kw = {"n_queues": args.queues, "n_threads": args.threads} if args.path == "gio" else {}
    with GpuStore.open(paths, expect=fp) as s:
        s.attach(args.path, **kw)
        for i in range(0, n_blocks, WRITE_BATCH):
            part = keys[i:i + WRITE_BATCH]
            txn = s.write(part, src_mem, list(range(i, i + len(part))))
            for layer in range(s.geometry.n_layers):
                txn.layer(layer)
            assert all(commit(txn, None)), "prefix not committed on every rank"
        slots = lookup(s, keys)
        assert None not in slots
        ids = list(range(n_blocks))
        shard_bytes = n_blocks * s.block_bytes
        timings = {"alone": [], "together": []}
        exact = True
        for _ in range(args.runs):
            for mode in ("alone", "together"):
                active = mode == "together" or rank == 0
                if active:
                    dst.zero_()
                    torch.cuda.synchronize()
                dist.barrier()
                t0 = time.perf_counter()
                if active:
                    status = _load_gpu(s, slots, dst_mem, ids)
                    torch.cuda.synchronize()
                dt = time.perf_counter() - t0
                if active:
                    assert all(rc == 0 for rc in status), f"rank {rank}: {status[:8]}"
                    exact &= bool(torch.equal(dst, src))
                wall = torch.tensor([dt], dtype=torch.float64, device=device)
                dist.all_reduce(wall, op=dist.ReduceOp.MAX)  # NCCL
                timings[mode].append(dt if mode == "alone" else wall.item())
        ok = torch.tensor([int(exact)], device=device)
        dist.all_reduce(ok, op=dist.ReduceOp.MIN)
        assert ok.item() == 1, "a rank's HBM differs from what it stored"
        if rank == 0:
            alone = statistics.median(timings["alone"])
            together = statistics.median(timings["together"])
            results.put({"ranks": world, "device": "cuda", "engine": f"gpu path {args.path}",
                         "prefix_tokens": args.prefix_tokens, "shard_bytes": shard_bytes,
                         "bit_exact": True, "runs": args.runs,
                         "one_rank_GBps": shard_bytes / alone / 1e9,
                         "all_ranks_GBps": world * shard_bytes / together / 1e9,
                         "one_rank_ms": alone * 1e3, "all_ranks_ms": together * 1e3,
                         "timings_s": timings})
    dist.destroy_process_group()


def _rank(rank, args, world, use_cuda, results):
    hang = float(os.environ.get("TUTTI_HANG_DUMP_S", "0"))
    if hang > 0:  # a rank stuck in C code still shows where Python called it
        import faulthandler

        faulthandler.dump_traceback_later(hang, repeat=False, exit=False)
    if use_cuda and args.path != "cpu":
        return _rank_gpu(rank, args, world, results)
    device = None
    if use_cuda:
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    dist.init_process_group("nccl" if use_cuda else "gloo", init_method=f"file://{args.rdv}",
                            rank=rank, world_size=world, timeout=datetime.timedelta(minutes=5))
    fp = shard_fingerprint(MODEL, rank, world)
    paths = rank_paths(os.path.join(args.dir, "kv{rank}.img"), rank, world)
    n_blocks = args.prefix_tokens // MODEL.block_size
    Store.format(paths, fp, n_slots=n_blocks + 8, force=True)
    keys = [f"prefix-block-{b}" for b in range(n_blocks)]
    with Store.open(paths, expect=fp, engine=args.engine) as s:
        buf = PagedBuffer.for_geometry(s.geometry, n_blocks)
        buf.fill_random(range(n_blocks), rank)
        buf.register(s)
        for i in range(0, n_blocks, WRITE_BATCH):
            part = keys[i:i + WRITE_BATCH]
            pbuf_ids = list(range(i, i + len(part)))
            txn = s.write(part)
            for layer in range(s.geometry.n_layers):
                txn.layer(layer, buf, pbuf_ids)
            assert all(commit(txn, None)), "prefix not committed on every rank"
        slots = lookup(s, keys)
        assert None not in slots
        shard_bytes = n_blocks * s.block_bytes
        timings = {"alone": [], "together": []}
        for _ in range(args.runs):
            for mode in ("alone", "together"):
                dist.barrier()
                t0 = time.perf_counter()
                if mode == "together" or rank == 0:
                    status = _load(s, buf, slots, device)
                    assert all(loaded_everywhere(status) if mode == "together" else
                               [rc == 0 for rc in status])
                dt = time.perf_counter() - t0
                dist.barrier()
                wall = torch.tensor([dt], dtype=torch.float64)
                if use_cuda:
                    wall = wall.to(device)
                dist.all_reduce(wall, op=dist.ReduceOp.MAX)
                timings[mode].append(dt if mode == "alone" else wall.item())
        if rank == 0:
            alone = statistics.median(timings["alone"])
            together = statistics.median(timings["together"])
            results.put({"ranks": world, "device": "cuda" if use_cuda else "cpu",
                         "engine": s.engine, "prefix_tokens": args.prefix_tokens,
                         "shard_bytes": shard_bytes,
                         "one_rank_GBps": shard_bytes / alone / 1e9,
                         "all_ranks_GBps": world * shard_bytes / together / 1e9,
                         "one_rank_ms": alone * 1e3, "all_ranks_ms": together * 1e3})
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=0,
                    help="processes (default: CUDA devices if >= 2, else 2)")
    ap.add_argument("--prefix-tokens", type=int, default=8192)
    ap.add_argument("--dir", default=None, help="where the stores go (default: a temp dir)")
    ap.add_argument("--engine", default="auto", choices=["auto", "uring", "psync"])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--path", default="staged", choices=["staged", "gio", "cpu"],
                    help="with GPUs: the data path into HBM (default staged)")
    ap.add_argument("--queues", type=int, default=16, help="gio: queue pairs per rank")
    ap.add_argument("--threads", type=int, default=8, help="gio: emulated controller threads per rank")
    ap.add_argument("--json", default=None, help="also write the result here")
    args = ap.parse_args()
    n_cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    use_cuda = n_cuda >= 2
    world = args.ranks or (n_cuda if use_cuda else 2)
    if use_cuda and world > n_cuda:
        sys.exit(f"{world} ranks but {n_cuda} CUDA devices")
    own_dir = args.dir is None
    args.dir = args.dir or tempfile.mkdtemp(prefix="tutti-tp-bench-", dir="/var/tmp")
    args.rdv = os.path.join(args.dir, f"rdv-{os.getpid()}")
    results = mp.get_context("spawn").SimpleQueue()
    try:
        mp.spawn(_rank, args=(args, world, use_cuda, results), nprocs=world, join=True)
        res = results.get()
    finally:
        if own_dir:
            shutil.rmtree(args.dir, ignore_errors=True)
    print(f"{res['ranks']} ranks ({res['device']}, engine {res['engine']}), "
          f"{res['prefix_tokens']} tokens, {res['shard_bytes'] / 2**20:.1f} MiB per rank: "
          f"one rank alone {res['one_rank_GBps']:.2f} GB/s ({res['one_rank_ms']:.1f} ms), "
          f"all ranks {res['all_ranks_GBps']:.2f} GB/s ({res['all_ranks_ms']:.1f} ms), "
          f"x{res['all_ranks_GBps'] / res['one_rank_GBps']:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
