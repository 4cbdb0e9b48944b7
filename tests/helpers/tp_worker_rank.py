"""One TP rank of TuttiConnector's worker side (tutti.vllm.worker.WorkerSide), no engine.

    python tp_worker_rank.py save|load --rank R --world W --dir D --rdv FILE --steps 0,1 ...

The KV cache is vLLM's CPU layout ([num_blocks, kv_heads, block_size, 2 * head_dim]
per layer) holding this rank's heads of a reference KV (``reference``, all
heads).  save: one step per entry of --steps, each saving BLOCKS_PER_STEP blocks
layer by layer, then wait_for_save (the TP commit).  load: every step's keys
into fresh blocks; writes D/load.r<rank>.json (the block ids that failed) and
the cache to D/kv.r<rank>.pt.  loadsave --steps A,B: step A's blocks are saved,
then one forward loads them and saves step B's (write_policy slack: the writes
wait for the reads).  The store is opened (and reconciled) by
register_kv_caches, as in vLLM.  --save-mode deferred (the default, as in the
connector): each step is followed by an empty one, where its save is committed
at the earliest; its commits count as the step's.  lag: deferred saves, rank 1's
"kernels" finish a step late, so the ranks are ready to commit at different
steps: prints per step the keys committed.  shutdown --steps A,B: A saved and committed, B's save
still pending when the worker closes (vLLM's shutdown); with --gone-rank R that rank exits without
closing: prints the keys this rank holds after close and how long close took.
"""
import argparse
import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist

from tutti.tp import head_range
from tutti.vllm.config import ModelShape, TuttiConfig
from tutti.vllm.metadata import BlockTransfer, TuttiMetadata
from tutti.vllm.stats import TuttiStats
from tutti.vllm.worker import WorkerSide

N_LAYERS, KV_HEADS, BLOCK, HEAD_DIM = 3, 4, 16, 32
NUM_BLOCKS, BLOCKS_PER_STEP = 16, 3


def reference(step: int) -> torch.Tensor:
    """[layers, BLOCKS_PER_STEP, KV_HEADS, BLOCK, 2 * HEAD_DIM] int16: all heads of a step."""
    g = torch.Generator().manual_seed(7919 * step + 1)
    return torch.randint(-32768, 32768, (N_LAYERS, BLOCKS_PER_STEP, KV_HEADS, BLOCK, 2 * HEAD_DIM),
                         generator=g, dtype=torch.int16)


def step_keys(step):
    return [f"conn-step{step}-block{b}".encode() for b in range(BLOCKS_PER_STEP)]


def layer_name(layer):
    return f"model.layers.{layer}.self_attn.attn"


def make_worker(args):
    first, end = head_range(KV_HEADS, args.rank, args.world)
    cfg = TuttiConfig.from_extra({"path": os.path.join(args.dir, "kv{rank}.img"),
                                  "capacity": "4MiB", "save_mode": args.save_mode,
                                  "max_pending_bytes": "1MiB", "shutdown_drain_s": args.drain_s})
    shape = ModelShape(model_id="tests/tp-connector", dtype="float16", n_layers=N_LAYERS,
                       kv_heads=end - first, head_dim=HEAD_DIM, block_size=BLOCK,
                       tp_size=args.world)
    w = WorkerSide(cfg, shape, args.rank, TuttiStats(), group=dist.group.WORLD)
    kv = {layer_name(l): torch.zeros(NUM_BLOCKS, end - first, BLOCK, 2 * HEAD_DIM,
                                     dtype=torch.int16) for l in range(N_LAYERS)}
    w.register_kv_caches(kv, NUM_BLOCKS)
    return w, kv, (first, end)


def wait_written(w, timeout_s=30.0):
    """Until the writes of every pending save have completed: a deferred save is committed at the first
    step after that (tests/helpers/pending.py; this script runs without tests/ on its path)."""
    from tutti.vllm.saves import SavesMixin
    end = time.monotonic() + timeout_s
    for e in list(w._fifo):
        while not e.void and not SavesMixin._written(e):
            if time.monotonic() > end:
                raise SystemExit("the writes of a pending save did not complete")
            time.sleep(0.001)


def settle(w, meta):
    """Deferred saves: an empty step after ``meta``'s, once their writes are done; returns the events
    of both."""
    wm = w.take_worker_meta()
    events = list(wm.events) if wm else []
    if w._deferred:
        empty = TuttiMetadata(step=meta.step, acked=dict(meta.acked))
        wait_written(w)
        w.start_load(empty)
        w.finish_save(empty)
        more = w.take_worker_meta()
        events += more.events if more else []
    return events


def cmd_save(args):
    w, kv, (first, end) = make_worker(args)
    committed = []
    for step in map(int, args.steps.split(",")):
        ref = reference(step)
        ids = list(range(BLOCKS_PER_STEP))
        for l in range(N_LAYERS):
            kv[layer_name(l)][ids] = ref[l, :, first:end]
        meta = TuttiMetadata(saves=[BlockTransfer(f"req{step}", step_keys(step), ids)])
        for l in range(N_LAYERS):  # the model computes a layer, then the connector saves it
            w.save_layer(meta, layer_name(l))
        w.finish_save(meta)
        committed.append(sorted(ev.key.decode() for ev in settle(w, meta) if ev.key))
    w.close()
    print(json.dumps({"committed": committed}))


def cmd_load(args):
    w, kv, _ = make_worker(args)
    steps = list(map(int, args.steps.split(",")))
    loads = [BlockTransfer(f"req{s}", step_keys(s),
                           [i * BLOCKS_PER_STEP + b for b in range(BLOCKS_PER_STEP)])
             for i, s in enumerate(steps)]
    meta = TuttiMetadata(loads=loads)
    w.start_load(meta)
    for l in range(N_LAYERS):
        w.wait_layer(layer_name(l))
    errors = sorted(w.take_load_errors())
    w.close()
    torch.save({n: t for n, t in kv.items()}, os.path.join(args.dir, f"kv.r{args.rank}.pt"))
    with open(os.path.join(args.dir, f"load.r{args.rank}.json"), "w") as f:
        json.dump({"errors": errors}, f)


def cmd_loadsave(args):
    """Step A's blocks are saved; then one forward loads them and computes and saves B's."""
    w, kv, (first, end) = make_worker(args)
    old, new = map(int, args.steps.split(","))
    ids = list(range(BLOCKS_PER_STEP))
    load_ids = [BLOCKS_PER_STEP + b for b in range(BLOCKS_PER_STEP)]
    for meta in (TuttiMetadata(saves=[BlockTransfer(f"req{old}", step_keys(old), ids)]),
                 TuttiMetadata(loads=[BlockTransfer(f"req{old}", step_keys(old), load_ids)],
                               saves=[BlockTransfer(f"req{new}", step_keys(new), ids)])):
        settle(w, meta)
        w.stats.reset()
        ref = reference(new if meta.loads else old)
        w.start_load(meta)
        for l in range(N_LAYERS):
            w.wait_layer(layer_name(l))
            kv[layer_name(l)][ids] = ref[l, :, first:end]  # the layer's compute
            w.save_layer(meta, layer_name(l))
        w.finish_save(meta)
    errors = sorted(w.take_load_errors())
    stats = dict(w.stats.data)
    events = settle(w, meta)
    loaded = all(torch.equal(kv[layer_name(l)][load_ids], reference(old)[l, :, first:end])
                 for l in range(N_LAYERS))
    w.close()
    print(json.dumps({"committed": sorted(ev.key.decode() for ev in events if ev.key),
                      "errors": errors, "loaded": loaded, "stats": stats}))


def cmd_poison(args):
    """A load fails on rank --fail-rank only: the key of step A's block 1 is gone from its store
    (a stale index).  Step 1 loads A and computes B, step 2 (scheduled before the scheduler heard
    of it: no acknowledgement) computes C, step 3 (acknowledged) computes D.  Prints per step
    the keys committed on this rank and the load errors."""
    w, kv, (first, end) = make_worker(args)
    a, b, c, d = map(int, args.steps.split(","))
    ids = list(range(BLOCKS_PER_STEP))
    load_ids = [BLOCKS_PER_STEP + i for i in range(BLOCKS_PER_STEP)]
    plan = [TuttiMetadata(saves=[BlockTransfer(f"req{a}", step_keys(a), ids)], step=1),
            TuttiMetadata(loads=[BlockTransfer(f"req{a}", step_keys(a), load_ids)],
                          saves=[BlockTransfer(f"req{b}", step_keys(b), ids)], step=2),
            TuttiMetadata(saves=[BlockTransfer(f"req{c}", step_keys(c), ids)], step=3),
            TuttiMetadata(saves=[BlockTransfer(f"req{d}", step_keys(d), ids)], step=4,
                          acked={args.fail_rank: 1})]
    out = []
    for i, meta in enumerate(plan):
        if i == 1 and args.rank == args.fail_rank:
            w.store.invalidate(w.store.lookup([step_keys(a)[1]]))
        ref = reference([a, b, c, d][i])
        w.start_load(meta)
        for l in range(N_LAYERS):
            w.wait_layer(layer_name(l))
            kv[layer_name(l)][ids] = ref[l, :, first:end]
            w.save_layer(meta, layer_name(l))
        w.finish_save(meta)
        errors = sorted(w.take_load_errors())
        wm = w.take_worker_meta()
        failures = [f.seq for f in (wm.failures if wm else [])]
        w._events = list(wm.events) if wm else []  # settle() returns them with the empty step's
        saved = set(meta.saves[0].keys)
        out.append({"committed": sorted(ev.key.decode() for ev in settle(w, meta)
                                        if ev.key in saved),
                    "errors": errors, "failures": failures})
    w.close()
    print(json.dumps(out))


def cmd_lag(args):
    """Deferred saves of --steps, one a step; rank 1's layer KV becomes final a step late (its
    marks complete at the next step), so rank 0 is ready to commit a step before rank 1.  Then
    three empty steps.  Prints per step the keys committed on this rank."""
    w, kv, (first, end) = make_worker(args)
    marks = []

    class Mark:
        done = False

    def mark():
        m = Mark()
        m.done = args.rank != 1
        marks.append(m)
        return m

    def ready(m, block=False):
        if block:
            m.done = True
        return m is None or m.done

    w.io.mark, w.io.ready = mark, ready
    steps = list(map(int, args.steps.split(",")))
    out = []
    for i, step in enumerate(steps + [None] * 3):
        for m in marks:  # the previous step's kernels have run by now
            m.done = True
        saves = []
        if step is not None:
            ids = [i * BLOCKS_PER_STEP + b for b in range(BLOCKS_PER_STEP)]
            ref = reference(step)
            for l in range(N_LAYERS):
                kv[layer_name(l)][ids] = ref[l, :, first:end]
            saves = [BlockTransfer(f"req{step}", step_keys(step), ids)]
        meta = TuttiMetadata(saves=saves, step=i + 1)
        w.start_load(meta)
        for l in range(N_LAYERS):
            w.save_layer(meta, layer_name(l))
        wait_written(w)
        w.finish_save(meta)
        wm = w.take_worker_meta()
        out.append(sorted(ev.key.decode() for ev in (wm.events if wm else []) if ev.key))
    w.close()
    print(json.dumps(out))


def cmd_shutdown(args):
    w, kv, (first, end) = make_worker(args)
    old, new = map(int, args.steps.split(","))
    for step in (old, new):
        ids = list(range(step * BLOCKS_PER_STEP % NUM_BLOCKS, step * BLOCKS_PER_STEP % NUM_BLOCKS + BLOCKS_PER_STEP))
        ref = reference(step)
        for l in range(N_LAYERS):
            kv[layer_name(l)][ids] = ref[l, :, first:end]
        meta = TuttiMetadata(saves=[BlockTransfer(f"req{step}", step_keys(step), ids)], step=step + 1)
        w.start_load(meta)
        for l in range(N_LAYERS):
            w.save_layer(meta, layer_name(l))
        w.finish_save(meta)
        if step == old:
            settle(w, meta)
    assert len(w._fifo) == 1, "the second step's save is not pending"
    if args.rank == args.gone_rank:
        sys.stdout.flush()
        os._exit(0)  # gone without a word, as a worker killed during shutdown
    t = time.monotonic()
    w.close()
    close_s = time.monotonic() - t
    from tutti import Store
    with Store.open([os.path.join(args.dir, f"kv{args.rank}.img")], readonly=True, shared=True) as s:
        held = s.lookup(step_keys(old) + step_keys(new))
    print(json.dumps({"held": [h is not None for h in held], "close_s": close_s,
                      "dropped": w.stats.data.get("save_dropped", 0)}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["save", "load", "loadsave", "poison", "lag", "shutdown"])
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--rdv", required=True)
    ap.add_argument("--steps", default="0")
    ap.add_argument("--fail-rank", type=int, default=1)
    ap.add_argument("--save-mode", default="deferred", choices=["deferred", "step"])
    ap.add_argument("--drain-s", type=float, default=10.0)
    ap.add_argument("--gone-rank", type=int, default=-1)
    args = ap.parse_args()
    dist.init_process_group("gloo", init_method=f"file://{args.rdv}", rank=args.rank,
                            world_size=args.world, timeout=datetime.timedelta(seconds=30))
    {"save": cmd_save, "load": cmd_load, "loadsave": cmd_loadsave,
     "poison": cmd_poison, "lag": cmd_lag, "shutdown": cmd_shutdown}[args.mode](args)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
