"""A full store loses the tails of prefixes, never their heads (the vLLM worker's commit and lookup order).

A block is useful only with every block before it (vLLM's chained hash), and the store evicts the least
recently used blocks first.  The worker commits a step's blocks tail first and touches them tail first on a
lookup, so a chain's head is its most recently used block; commit order is also the LRU order a store
reopens with.  Driven as vLLM drives the worker side (tests/test_worker_write_policy.py), on a store of 8 slots.
"""
import os

import pytest

torch = pytest.importorskip("torch")

from helpers.pending import settle
from tutti import Store, key_from_bytes
from tutti.vllm.config import ModelShape, TuttiConfig
from tutti.vllm.metadata import BlockTransfer, TuttiMetadata
from tutti.vllm.stats import TuttiStats
from tutti.vllm.worker import WorkerSide

N_LAYERS, KV_HEADS, BLOCK, HEAD_DIM, NUM_BLOCKS = 2, 2, 16, 32, 32
SLOTS = 8


def layer_name(layer):
    return f"model.layers.{layer}.self_attn.attn"


def chain(tag, n):
    return [f"{tag}-block{b}".encode() for b in range(n)]


def worker(path, capacity=None, save_mode="step"):
    extra = {"path": path, "capacity": capacity} if capacity else {"path": path, "create": False}
    # The default bound on pending saves is half the store (4 slots here): allow a whole chain.
    cfg = TuttiConfig.from_extra(dict(extra, save_mode=save_mode, max_pending_bytes="1MiB"))
    shape = ModelShape(model_id="tests/eviction", dtype="float16", n_layers=N_LAYERS,
                       kv_heads=KV_HEADS, head_dim=HEAD_DIM, block_size=BLOCK, tp_size=1)
    w = WorkerSide(cfg, shape, 0, TuttiStats())
    kv = {layer_name(l): torch.zeros(NUM_BLOCKS, KV_HEADS, BLOCK, 2 * HEAD_DIM, dtype=torch.int16)
          for l in range(N_LAYERS)}
    w.register_kv_caches(kv, NUM_BLOCKS)
    return w, kv


def step(w, kv, loads=(), saves=()):
    """One forward: ``loads``/``saves`` are (keys, block ids) of one request each."""
    meta = TuttiMetadata(loads=[BlockTransfer(f"l{i}", k, ids) for i, (k, ids) in enumerate(loads)],
                         saves=[BlockTransfer(f"s{i}", k, ids) for i, (k, ids) in enumerate(saves)])
    w.start_load(meta)
    for l in range(N_LAYERS):
        w.wait_layer(layer_name(l))
        for _keys, ids in saves:
            kv[layer_name(l)][ids] = torch.randint(-9, 9, kv[layer_name(l)][ids].shape, dtype=torch.int16)
        w.save_layer(meta, layer_name(l))
    w.finish_save(meta)
    assert not w.take_load_errors()
    w.take_worker_meta()
    if w._deferred:  # the next (empty) step commits what this one saved
        empty = TuttiMetadata()
        settle(w)
        w.start_load(empty)
        w.finish_save(empty)
        w.take_worker_meta()


def peek(w, keys):
    """Which keys the store holds, from its index listing (a lookup would touch the LRU order)."""
    committed = w.store.committed()
    return [key_from_bytes(k) in committed for k in keys]


def is_prefix(hits):
    return hits == sorted(hits, reverse=True)  # True... then False...


@pytest.mark.parametrize("save_mode", ["step", "deferred"])
def test_full_store_evicts_tails_first_and_keeps_it_across_a_restart(tmp_path, save_mode):
    path = os.path.join(tmp_path, "kv.img")
    w, kv = worker(path, capacity=str(SLOTS * N_LAYERS * KV_HEADS * BLOCK * 2 * HEAD_DIM * 2),
                   save_mode=save_mode)
    assert w.store.geometry.n_slots == SLOTS
    a, b, c, d = chain("a", 6), chain("b", 4), chain("c", 2), chain("d", 5)
    step(w, kv, saves=[(a, list(range(6)))])
    w.note_store()  # what vLLM's metrics get with each interval's stats
    assert (w.stats.data["store_committed_blocks"], w.stats.data["store_slots"]) == (6, SLOTS)
    assert not w.stats.data.get("store_evictions")
    step(w, kv, saves=[(b, list(range(8, 12)))])  # 10 blocks for 8 slots: 2 evicted
    assert peek(w, a) == [True] * 4 + [False] * 2  # a's tail went, its head stayed
    assert peek(w, b) == [True] * 4
    w.note_store()
    w.note_store()  # counted once
    assert (w.stats.data["store_evictions"], w.stats.data["store_committed_blocks"]) == (2, SLOTS)

    # Loading a's prefix touches it head last: a new chain then evicts b's tail, not a's head.
    step(w, kv, loads=[(a[:4], list(range(16, 20)))], saves=[(c, [20, 21])])
    assert peek(w, a) == [True] * 4 + [False] * 2
    assert peek(w, b) == [True, True, False, False] and peek(w, c) == [True, True]
    w.close()

    # Reopened: the LRU order is the commit order, which put heads last too.
    w, kv = worker(path, save_mode=save_mode)
    step(w, kv, saves=[(d, list(range(24, 29)))])
    assert peek(w, d) == [True] * 5
    for ch in (a, b, c):
        assert is_prefix(peek(w, ch)), (ch[0], peek(w, ch))
    w.close()
    with Store.open([path], readonly=True, shared=True) as s:
        assert s.check()["bad"] == 0

