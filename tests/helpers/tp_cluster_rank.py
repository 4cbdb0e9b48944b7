"""One process of the cluster tier with TP = 2, without an engine (tests/vllm/test_vllm_tp_cluster.py).

    python tp_cluster_rank.py rank --rank R --world W --dir D --rdv FILE --ctl SOCK --port P ...
    python tp_cluster_rank.py sched --dir D --ctl SOCK --port P ...

``rank``: one TP rank's worker side (tutti.vllm.worker.WorkerSide over a gloo group, its own store
D/kv<R>.img holding its heads of tp_worker_rank's reference KV; the KV cache moved by --data-path, on
the CUDA device for staged / gio / gds) with the cluster configured, so its
WorkerCluster runs a ClusterNode at P + R.  ``sched``: the scheduler side (SchedulerSide, whose
SchedulerCluster looks up peers' blocks for every rank at P + 1000), over the read-only snapshots of
D's rank stores.  Each process connects to the test's Unix socket SOCK, says {"ready": ..., "pid": N}
once set up, then answers each JSON line it is sent with one JSON line ({"ok": ...} or {"error": ...}).
Metadata travels pickled (base64), as vLLM carries it between its processes.

The worker hooks are called in vLLM's order and under the worker's store_lock, as the connector facade
(connector.py) does: start_load_kv (fetch_remote and queue_fetches without the lock, then start_load),
per layer wait_for_layer_load and save_kv_layer, wait_for_save, get_finished,
get_block_ids_with_load_errors, build_connector_worker_meta.
"""
import argparse
import base64
import datetime
import json
import os
import pickle
import socket
import sys
import time
from types import SimpleNamespace as NS

import tp_worker_rank as wr
from tutti.tp import head_range
from tutti.vllm.metadata import BlockTransfer, TuttiMetadata

MODEL = "tests/tp-cluster"
WORLD = 2
NUM_BLOCKS = 16


def shape():
    from tutti.vllm.config import ModelShape
    first, end = head_range(wr.KV_HEADS, 0, WORLD)
    return ModelShape(model_id=MODEL, dtype="float16", n_layers=wr.N_LAYERS, kv_heads=end - first,
                      head_dim=wr.HEAD_DIM, block_size=wr.BLOCK, tp_size=WORLD)


def config(args):
    from tutti.vllm.config import TuttiConfig
    return TuttiConfig.from_extra({
        "path": os.path.join(args.dir, "kv{rank}.img"), "capacity": "4MiB", "max_pending_bytes": "1MiB",
        "load_policy": "all",   # the whole hit: what is tested here is the cluster, not the planner
        "cluster_master": args.master, "cluster_metadata": args.metadata, "cluster_port": args.port,
        "cluster_fetch": args.fetch, "cluster_call_timeout_s": 5, "cluster_fetch_timeout_s": 5,
        "cluster_keeper_interval_s": 0.5, "cluster_index_bytes": 16 << 20, "cluster_fetch_wait_s": 20,
        "data_path": args.data_path})


def block_hash(i: int) -> bytes:
    """vLLM's hash of prompt block i (any bytes: the connector only prefixes them)."""
    return f"tp-cluster-prompt-block-{i}".encode()


def enc(obj) -> str:
    return base64.b64encode(pickle.dumps(obj)).decode()


def dec(text):
    return pickle.loads(base64.b64decode(text)) if text else None


class Rank:
    def __init__(self, args):
        import torch
        import torch.distributed as dist

        from tutti.vllm.stats import TuttiStats
        from tutti.vllm.worker import WorkerSide

        self.torch = torch
        self.rank = args.rank
        dist.init_process_group("gloo", init_method=f"file://{args.rdv}", rank=args.rank, world_size=WORLD,
                                timeout=datetime.timedelta(seconds=30))
        self.first, self.end = head_range(wr.KV_HEADS, args.rank, WORLD)
        self.shape = shape()
        # cpu / host: the KV cache in host memory (host: the GPU-memory data path's code on CPU tensors);
        # staged, gio, gds: on the CUDA device, moved by that data path.
        self.device = "cpu" if args.data_path in ("cpu", "host") else "cuda"
        self.w = WorkerSide(config(args), self.shape, args.rank, TuttiStats(), group=dist.group.WORLD)
        self.kv = {wr.layer_name(l): torch.zeros(NUM_BLOCKS, self.end - self.first, wr.BLOCK, 2 * wr.HEAD_DIM,
                                                 dtype=torch.int16, device=self.device)
                   for l in range(wr.N_LAYERS)}
        self.w.register_kv_caches(self.kv, NUM_BLOCKS)  # opens the store, reconciles, joins the cluster

    def key(self, i):
        return self.shape.key_prefix() + block_hash(i)

    def ready(self):
        node = self.w.cluster.node
        return {"rank": self.rank, "heads": [self.first, self.end], "endpoint": self.w.cluster.cfg.endpoint,
                "joined": node is not None, "claims_as": node.claims._mine.decode() if node else None}

    def op_save(self, steps):
        """Prompt blocks 3s..3s+2 computed and saved in step s (the TP commit), the commits published."""
        w, committed = self.w, []
        for step in steps:
            ref = wr.reference(step)
            ids = list(range(wr.BLOCKS_PER_STEP))
            for l in range(wr.N_LAYERS):
                self.kv[wr.layer_name(l)][ids] = ref[l, :, self.first:self.end].to(self.device)
            keys = [self.key(step * wr.BLOCKS_PER_STEP + b) for b in range(wr.BLOCKS_PER_STEP)]
            meta = TuttiMetadata(saves=[BlockTransfer("writer", keys, ids)], step=step + 1)
            with w.store_lock:
                w.start_load(meta)
                for l in range(wr.N_LAYERS):
                    w.save_layer(meta, wr.layer_name(l))
                w.finish_save(meta)
                # take_worker_meta hands the step's commits to the node's publisher (settle calls it)
                committed += [ev.key for ev in wr.settle(w, meta) if ev.key]
        # On a GPU data path a layer's writes go once its kernels are done: a save whose layers were not
        # done by its step's end is carried over and committed at a later step.  Empty steps, as many on
        # every rank (the commit is agreed), until no rank has a save pending.
        import torch.distributed as dist
        for _ in range(200):
            pending = self.torch.tensor([len(w._fifo)])
            dist.all_reduce(pending, op=dist.ReduceOp.MAX)
            if not pending.item():
                break
            time.sleep(0.01)
            with w.store_lock:
                committed += [ev.key for ev in wr.settle(w, meta) if ev.key]
        return {"committed": len(committed)}

    def _node_stats_when(self, key, n, timeout):
        """This rank's node stats once its counter ``key`` reaches ``n``, or at the timeout."""
        end = time.monotonic() + timeout
        while True:
            st = self.w.cluster.stats()
            if st.get(key, 0) >= n or time.monotonic() > end:
                return st
            time.sleep(0.02)

    def op_published(self, n, timeout=20):
        """Until this rank's node has published ``n`` blocks (its publisher thread, after the commits)."""
        return self._node_stats_when("published", n, timeout)

    def op_served(self, n, timeout=10):
        """Until it counts ``n`` blocks served (an owner counts a batch once its send returned, so the
        requester may hold the blocks a moment earlier)."""
        return self._node_stats_when("blocks_served", n, timeout)

    def op_step(self, meta):
        """One vLLM step of this worker with the scheduler's metadata ``meta``."""
        w, meta = self.w, dec(meta)
        w.fetch_remote(meta)        # cluster_fetch step: the step's remote blocks, before its read
        w.queue_fetches(meta)       # cluster_fetch async: to this rank's fetch thread
        with w.store_lock:
            w.start_load(meta)
        for l in range(wr.N_LAYERS):
            with w.store_lock:
                w.wait_layer(wr.layer_name(l))
            for t in meta.saves:  # the model computes the layer: prompt block t.first + j into vLLM block b
                for j, b in enumerate(t.block_ids):
                    i = t.first + j
                    self.kv[wr.layer_name(l)][b] = wr.reference(i // wr.BLOCKS_PER_STEP)[
                        l, i % wr.BLOCKS_PER_STEP, self.first:self.end].to(self.device)
            with w.store_lock:
                w.save_layer(meta, wr.layer_name(l))
        with w.store_lock:
            w.finish_save(meta)
            w.get_finished(set(), meta)
            errors = sorted(w.take_load_errors())
            wm = w.take_worker_meta()
        loaded = {}
        for t in meta.loads:
            for b in t.block_ids:
                loaded[b] = enc(self.torch.stack([self.kv[wr.layer_name(l)][b] for l in range(wr.N_LAYERS)]).cpu())
        with w.store_lock:
            held = [k.hex() for k in self.held_keys()]
        return {"errors": errors, "worker_meta": enc(wm) if wm is not None else None,
                "fetched": list(wm.fetched) if wm else [],
                "events": len(wm.events) if wm else 0,
                "failures": [(f.rank, f.seq, f.block_ids) for f in wm.failures] if wm else [],
                "unreachable": list(wm.unreachable) if wm else [],
                "loaded": loaded, "held": held, "stats": dict(w.stats.data),
                "node": w.cluster.stats() if w.cluster else {}}

    def held_keys(self):
        """Connector keys of the prompt's blocks (0..15) committed in this rank's store."""
        keys = [self.key(i) for i in range(16)]
        return [k for k, s in zip(keys, self.w.store.lookup(keys)) if s is not None]

    def close(self):
        import torch.distributed as dist
        self.w.close_cluster()   # first, without the lock, as the connector's shutdown does
        with self.w.store_lock:
            self.w.close()
        dist.destroy_process_group()


class Sched:
    def __init__(self, args):
        from tutti.vllm.scheduler import SchedulerSide
        from tutti.vllm.stats import TuttiStats

        self.s = SchedulerSide(config(args), shape(), NS(cache_config=NS(prefix_caching_hash_algo="sha256")),
                               TuttiStats())
        self.reqs = {}

    def ready(self):
        return {"client": self.s.cluster.cfg.endpoint, "joined": self.s.cluster.link is not None}

    def req(self, req_id, n_blocks):
        r = self.reqs.get(req_id)
        if r is None:
            r = self.reqs[req_id] = NS(request_id=req_id, num_prompt_tokens=n_blocks * wr.BLOCK + 1,
                                      block_hashes=[block_hash(i) for i in range(n_blocks)])
        return r

    def op_match(self, req_id, n_blocks):
        """vLLM's get_num_new_matched_tokens (nothing in vLLM's own prefix cache): None = ask again."""
        tokens, is_async = self.s.get_num_new_matched_tokens(self.req(req_id, n_blocks), 0)
        return {"tokens": tokens, "async": is_async}

    def op_alloc(self, req_id, n_blocks, block_ids, tokens):
        """vLLM allocated the request's blocks (update_state_after_alloc) and schedules it this step."""
        self.s.update_state_after_alloc(self.req(req_id, n_blocks), NS(get_block_ids=lambda: [list(block_ids)]),
                                        tokens)
        return None

    def op_build(self, new=(), cached=()):
        """build_connector_meta of a step scheduling ``new`` ([req_id, block_ids, computed, scheduled]) and
        ``cached`` ([req_id, computed, scheduled]: running requests, no new blocks) as vLLM's
        SchedulerOutput names them."""
        cached_reqs = NS(req_ids=[c[0] for c in cached], new_block_ids=[None for _ in cached],
                         num_computed_tokens=[c[1] for c in cached], resumed_req_ids=set())
        so = NS(total_num_scheduled_tokens=sum(n[3] for n in new) + sum(c[2] for c in cached),
                finished_req_ids=set(),
                preempted_req_ids=set(), scheduled_cached_reqs=cached_reqs,
                scheduled_new_reqs=[NS(req_id=r, block_ids=(list(b),), num_computed_tokens=c) for r, b, c, _ in new],
                num_scheduled_tokens={**{r: n for r, _, _, n in new}, **{r: n for r, _, n in cached}})
        meta = self.s.build_connector_meta(so)
        return {"meta": enc(meta), "loads": [(t.req_id, len(t.keys), list(t.block_ids), t.remote) for t in meta.loads],
                "saves": [(t.req_id, len(t.keys), list(t.block_ids), t.first) for t in meta.saves],
                "fetches": [(t.req_id, len(t.keys), t.remote) for t in meta.fetches]}

    def op_output(self, worker_metas):
        """update_connector_output with the ranks' worker metadata aggregated as vLLM's
        KVOutputAggregator does (the first as accumulator, then .aggregate of each other)."""
        agg = None
        for m in map(dec, worker_metas):
            if agg is None:
                agg = m
            elif m is not None:
                agg = agg.aggregate(m)
        self.s.update_connector_output(NS(finished_sending=None, kv_connector_worker_meta=agg))
        return {"acked": dict(self.s.acked), "quarantined": self.s.cluster.quarantine.active()}

    def op_stats(self):
        return dict(self.s.stats.data)

    def close(self):
        self.s.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("role", choices=["rank", "sched"])
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--rdv", default="")
    ap.add_argument("--ctl", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--master", required=True)
    ap.add_argument("--metadata", required=True)
    ap.add_argument("--fetch", default="async", choices=["async", "step"])
    ap.add_argument("--data-path", default="cpu", choices=["cpu", "host", "staged", "gio", "gds"])
    args = ap.parse_args()
    ctl = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    ctl.settimeout(30)
    ctl.connect(args.ctl)
    ctl.settimeout(None)  # commands come when the test sends them; the test bounds its own waits
    f = ctl.makefile("rw")

    def say(msg):
        f.write(json.dumps(msg) + "\n")
        f.flush()

    try:
        me = Rank(args) if args.role == "rank" else Sched(args)
    except Exception as e:  # noqa: BLE001 - said to the test, which fails with it
        say({"error": f"{type(e).__name__}: {e}", "pid": os.getpid()})
        raise
    say({"ready": me.ready(), "pid": os.getpid()})
    for line in f:
        cmd = json.loads(line)
        op = cmd.pop("op")
        if op == "close":
            me.close()
            say({"ok": "closed"})
            # Everything is closed (the store durable, the node withdrawn): skip the interpreter's
            # teardown, where Mooncake's and torch's destructors take seconds on 2 cores.
            sys.stderr.flush()
            os._exit(0)
        try:
            say({"ok": getattr(me, "op_" + op)(**cmd)})
        except Exception as e:  # noqa: BLE001 - said to the test, which fails with it
            import traceback
            traceback.print_exc()
            say({"error": f"{op}: {type(e).__name__}: {e}"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
