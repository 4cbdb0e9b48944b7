"""One TP rank for tests/test_tp_commit.py: its own store, a gloo group with the others.

    python tp_rank.py write|read|loop --rank R --world W --dir D [options]

The reference KV of key k is a pure function of k (``reference_block``): every
layer's K and V are [block_size, kv_heads, head_dim] 2-byte values over *all*
heads; rank r stores its heads (tutti.tp.shard_of).  Stores are formatted by
the test (``D/rank<r>.img``).  Phases of tutti.tp.commit leave marker files
``D/marks/b<batch>.r<rank>.<phase>``, so the test can kill ranks at exact points.

write: batches of --batch keys from --keys; crash options act in batch --at-batch:
  --kill-at-layer L   SIGKILL this rank right after submitting layer L (mid data write)
  --kill-at PHASE     SIGKILL this rank at commit phase PHASE (prepared / agreed / committed)
  --hold PHASE        stop at PHASE and wait to be killed (the test kills the group)
read: group lookup of --keys (after reconcile_group with --reconcile), layer-wise read,
  writes D/read.r<rank>.json (served keys, orphans dropped) and each served key's shard
  to D/shard.r<rank>.k<key>.bin
loop: writes random batches forever (random kill trials), reporting each committed batch.

--gpu: rank r runs on CUDA device r with an NCCL group for tensors and gloo for the
commit votes (as vLLM's device and CPU groups), and its store moves KV between the
member files and that GPU's memory through a data path (tutti.gpu.store, --path
staged or gio): the shard is written from HBM and read back into HBM.
"""
import argparse
import datetime
import json
import os
import random
import signal
import sys
import time

import torch
import torch.distributed as dist

from tutti import Fingerprint, PagedBuffer, Store
from tutti.tp import commit, loaded_everywhere, lookup, reconcile_group, shard_fingerprint, shard_of

MODEL = Fingerprint(model_id="tests/tp", dtype="float16", n_layers=4, kv_heads=6, head_dim=64,
                    block_size=16)


def key_name(k: int) -> str:
    return f"tp-key-{k}"


def reference_block(k: int) -> torch.Tensor:
    """[layers, 2, block_size, kv_heads, head_dim] int16: the whole model's KV of key k."""
    g = torch.Generator().manual_seed(1000003 * k + 17)
    shape = (MODEL.n_layers, 2, MODEL.block_size, MODEL.kv_heads, MODEL.head_dim)
    return torch.randint(-32768, 32768, shape, generator=g, dtype=torch.int16)


def store_path(d, rank):
    return os.path.join(d, f"rank{rank}.img")


def _mark(d, batch, rank, phase):
    os.makedirs(os.path.join(d, "marks"), exist_ok=True)
    with open(os.path.join(d, "marks", f"b{batch}.r{rank}.{phase}"), "w"):
        pass


def _fill(buf, keys, rank, world):
    for b, k in enumerate(keys):
        shard = shard_of(reference_block(k), rank, world).view(MODEL.n_layers, 2, -1)
        for layer in range(MODEL.n_layers):
            for span in range(2):
                buf.block_view(layer, span, b)[:] = shard[layer, span].numpy().tobytes()


class GpuBuf:
    """The rank's paged KV in its GPU's memory: [layers, 2, blocks, block_size, heads, head_dim]."""

    def __init__(self, n_blocks, rank, world):
        from tutti.gpu.store import DeviceKV  # only on GPU ranks

        heads = shard_of(reference_block(0), rank, world).shape[3]
        self.rank, self.world = rank, world
        self.kv = torch.zeros((MODEL.n_layers, 2, n_blocks, MODEL.block_size, heads, MODEL.head_dim),
                              dtype=torch.int16, device=torch.cuda.current_device())
        self.mem = DeviceKV.from_tensor(self.kv)

    def fill(self, keys):
        for b, k in enumerate(keys):
            shard = shard_of(reference_block(k), self.rank, self.world)
            self.kv[:, :, b].copy_(shard)
        torch.cuda.synchronize()

    def block_bytes(self, b):
        return self.kv[:, :, b].contiguous().cpu().numpy().tobytes()


def _fill_any(buf, keys, rank, world):
    if isinstance(buf, GpuBuf):
        buf.fill(keys)
    else:
        _fill(buf, keys, rank, world)


def _new_buf(store, n, args):
    if args.gpu:
        return GpuBuf(n, args.rank, args.world)
    return PagedBuffer.for_geometry(store.geometry, n)


def write_batch(store, buf, keys, args, batch):
    names = [key_name(k) for k in keys]
    at = batch == args.at_batch
    ids = list(range(len(keys)))
    txn = store.write(names, buf.mem, ids) if args.gpu else store.write(names)
    for layer in range(MODEL.n_layers):
        if args.gpu:
            txn.layer(layer)
        else:
            txn.layer(layer, buf, ids)
        if at and args.kill_at_layer == layer:
            os.kill(os.getpid(), signal.SIGKILL)

    def hook(phase):
        _mark(args.dir, batch, args.rank, phase)
        if at and args.kill_at == phase:
            os.kill(os.getpid(), signal.SIGKILL)
        if at and args.hold == phase:
            while True:
                time.sleep(1)

    return commit(txn, None, hook=hook)


def cmd_write(store, args):
    keys = [int(k) for k in args.keys.split(",")]
    buf = _new_buf(store, args.batch, args)
    out = []
    for batch, i in enumerate(range(0, len(keys), args.batch)):
        part = keys[i:i + args.batch]
        _fill_any(buf, part, args.rank, args.world)
        done = write_batch(store, buf, part, args, batch)
        out.append([k for k, ok in zip(part, done) if ok])
    print(json.dumps({"committed": out}))


def cmd_loop(store, args):
    rng = random.Random(args.seed)
    buf = _new_buf(store, args.batch, args)
    batch = 0
    while True:
        part = rng.sample(range(args.n_keys), args.batch)
        _fill_any(buf, part, args.rank, args.world)
        done = write_batch(store, buf, part, args, batch)
        print(json.dumps({"batch": batch, "committed": [k for k, ok in zip(part, done) if ok]}),
              flush=True)
        batch += 1


def cmd_read(store, args):
    keys = [int(k) for k in args.keys.split(",")]
    dropped = reconcile_group(store) if args.reconcile else []
    slots = lookup(store, [key_name(k) for k in keys])
    served = [(k, s) for k, s in zip(keys, slots) if s is not None]
    ok = []
    if served:
        buf = _new_buf(store, len(served), args)
        ids = list(range(len(served)))
        txn = (store.read([s for _, s in served], buf.mem, ids) if args.gpu
               else store.read([s for _, s in served]))
        with txn:
            for layer in range(MODEL.n_layers):
                if args.gpu:
                    txn.layer(layer)
                else:
                    txn.layer(layer, buf, ids)
                txn.wait_layer(layer)
            status = txn.finish()
        good = loaded_everywhere(status)
        for b, ((k, _), g) in enumerate(zip(served, good)):
            if not g:
                continue
            ok.append(k)
            with open(os.path.join(args.dir, f"shard.r{args.rank}.k{k}.bin"), "wb") as f:
                f.write(buf.block_bytes(b) if args.gpu else buf.contiguous_block(b))
    with open(os.path.join(args.dir, f"read.r{args.rank}.json"), "w") as f:
        json.dump({"served": ok, "dropped": [d.hex() for d in dropped]}, f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["write", "read", "loop"])
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--rdv", required=True, help="file for the gloo rendezvous (FileStore)")
    ap.add_argument("--keys", default="")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--at-batch", type=int, default=-1)
    ap.add_argument("--kill-at-layer", type=int, default=-1)
    ap.add_argument("--kill-at", default="")
    ap.add_argument("--hold", default="")
    ap.add_argument("--reconcile", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-keys", type=int, default=24)
    ap.add_argument("--gpu", action="store_true", help="CUDA device = rank, NCCL + gloo groups")
    ap.add_argument("--path", default="staged", choices=["staged", "gio"])
    args = ap.parse_args()
    backend = "gloo"
    if args.gpu:
        torch.cuda.set_device(args.rank)
        backend = "cpu:gloo,cuda:nccl"  # votes are CPU tensors: gloo; device tensors: NCCL
    # A dead peer must fail a collective, not hang it.
    dist.init_process_group(backend, init_method=f"file://{args.rdv}", rank=args.rank,
                            world_size=args.world, timeout=datetime.timedelta(seconds=30))
    fp = shard_fingerprint(MODEL, args.rank, args.world)
    if args.gpu:
        from tutti.gpu.store import GpuStore

        store = GpuStore.open([store_path(args.dir, args.rank)], expect=fp).attach(args.path)
        # The NCCL group carries a device tensor too, so a broken NCCL setup fails here.
        one = torch.ones(1, device="cuda")
        dist.all_reduce(one)
        assert one.item() == args.world, "NCCL all_reduce"
    else:
        store = Store.open([store_path(args.dir, args.rank)], expect=fp)
    with store:
        {"write": cmd_write, "read": cmd_read, "loop": cmd_loop}[args.mode](store, args)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
