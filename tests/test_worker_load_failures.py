"""Nothing computed over a block that failed to load is ever committed (the worker's fence).

WorkerSide is driven in vLLM's order (start_load_kv, per layer wait_for_layer_load / compute /
save_kv_layer, wait_for_save, then get_block_ids_with_load_errors and the worker metadata).
Step 1 stores a prefix.  Step 2 loads it into other blocks while the model computes new blocks
over it and saves them; one kind of load failure is injected per case.  Step 3 was scheduled
before the scheduler heard of the failure (vLLM schedules a step ahead); step 4 carries the
scheduler's acknowledgement.  Expected: steps 2 and 3 commit nothing, the failure is reported
until acknowledged, the dropped saves are reported for a retry, step 4 commits again.
"""
import errno
import os

import pytest

torch = pytest.importorskip("torch")

from helpers.pending import settle
from test_worker_write_policy import (
    LOAD_IDS,
    N_LAYERS,
    NEW_IDS,
    PREFIX_IDS,
    N,
    keys,
    layer_name,
    make_worker,
    reference,
)
from tutti import Store
from tutti.vllm.metadata import BlockTransfer, TuttiMetadata

OTHER_IDS = list(range(24, 24 + N))


class FailingRead:
    """A read transaction whose layer ``layer`` fails to submit (an I/O error at submission)."""

    def __init__(self, txn, layer):
        self._t, self._layer = txn, layer

    def __getattr__(self, name):
        return getattr(self._t, name)

    def __len__(self):
        return len(self._t)

    def layer(self, layer, *a, **kw):
        if layer == self._layer:
            raise OSError(errno.EIO, "injected: layer submit failed")
        return self._t.layer(layer, *a, **kw)


class EioBlock(FailingRead):
    """A read transaction that reports block ``block`` failed with -EIO at the end."""

    def __init__(self, txn, block):
        super().__init__(txn, None)
        self._block = block

    def finish(self):
        status = list(self._t.finish())
        status[self._block] = -errno.EIO
        return status


def corrupt_block(path, store_geometry_slot_off):
    with open(path, "r+b") as f:
        f.seek(store_geometry_slot_off)
        b = f.read(1)
        f.seek(store_geometry_slot_off)
        f.write(bytes([b[0] ^ 0x5A]))


def forward(w, kv, meta, computed, wait_layers=range(N_LAYERS), errors_first=False):
    """One step as vLLM runs it; ``errors_first``: vLLM's deferred finalize (spec decode) asks
    for the load errors before wait_for_save.  With save_mode deferred an empty step follows
    (the step's save is committed there at the earliest); its commits count as the step's."""
    ids, ref = computed
    w.start_load(meta)
    for l in range(N_LAYERS):
        if l in wait_layers:
            w.wait_layer(layer_name(l))
        kv[layer_name(l)][ids] = ref[l]
        w.save_layer(meta, layer_name(l))
    if errors_first:
        errors = w.take_load_errors()
        w.finish_save(meta)
    else:
        w.finish_save(meta)
        errors = w.take_load_errors()
    wm = w.take_worker_meta()
    events = list(wm.events) if wm else []
    if w._deferred:
        empty = TuttiMetadata(step=meta.step, acked=dict(meta.acked))
        settle(w)
        w.start_load(empty)
        w.finish_save(empty)
        assert not w.take_load_errors()
        more = w.take_worker_meta()
        events += more.events if more else []
    committed = {ev.key for ev in events if ev.key} & set(k for t in meta.saves for k in t.keys)
    return errors, committed, wm


KINDS = ["missing", "checksum", "eio", "submit", "unwaited"]


@pytest.mark.parametrize("policy,save_mode", [("slack", "step"), ("eager", "step"),
                                              ("slack", "deferred")])
@pytest.mark.parametrize("kind", KINDS)
def test_a_failed_load_poisons_no_save(tmp_path, kind, policy, save_mode):
    d = str(tmp_path)
    w, kv, _, stats = make_worker(d, policy, save_mode=save_mode)
    errors, committed, _ = forward(w, kv, TuttiMetadata(
        saves=[BlockTransfer("r1", keys("prefix"), PREFIX_IDS)], step=1), (PREFIX_IDS, reference(1)))
    assert not errors and committed == set(keys("prefix"))

    bad = 1  # the block of the prefix that fails
    slot = w.store.lookup([keys("prefix")[bad]])[0]
    wait_layers = range(N_LAYERS)
    if kind == "missing":  # the scheduler's index is a step stale: the key is gone
        w.store.invalidate([slot])
    elif kind == "checksum":  # a bit flipped on the disk
        member, off = w.store.locate(slot, N_LAYERS - 1, 0)
        corrupt_block(w.store.paths[member], off + 7)
    elif kind == "eio":
        read = w.store.read
        w.store.read = lambda *a: EioBlock(read(*a), bad)
    elif kind == "submit":  # every block of the load fails
        read = w.store.read
        w.store.read = lambda *a: FailingRead(read(*a), 2)
    elif kind == "unwaited":  # the model ran a layer without waiting for its load
        wait_layers = [l for l in range(N_LAYERS) if l != 2]

    step2 = TuttiMetadata(loads=[BlockTransfer("r2", keys("prefix"), LOAD_IDS)],
                          saves=[BlockTransfer("r2", keys("new"), NEW_IDS, 5)], step=2)
    errors, committed, wm = forward(w, kv, step2, (NEW_IDS, reference(2)), wait_layers)
    expect_bad = {LOAD_IDS[bad]} if kind in ("missing", "checksum", "eio") else set(LOAD_IDS)
    assert errors == expect_bad
    assert committed == set(), "blocks computed over a failed load were committed"
    assert [f.block_ids for f in wm.failures] == [sorted(expect_bad)]
    assert wm.failures[0].step == 2 and wm.failures[0].rank == 0
    assert ("r2", 5) in wm.unsaved
    assert stats.data.get("save_fenced", 0) == N

    # Step 3 was scheduled before the scheduler heard of the failure: still fenced.
    step3 = TuttiMetadata(saves=[BlockTransfer("r3", keys("other"), OTHER_IDS, 0)], step=3)
    errors, committed, wm = forward(w, kv, step3, (OTHER_IDS, reference(3)))
    assert not errors and committed == set()
    assert [f.seq for f in wm.failures] == [1]  # sent again until acknowledged
    assert ("r3", 0) in wm.unsaved

    # Step 4 carries the acknowledgement: the scheduler now keeps unsound saves out itself.
    step4 = TuttiMetadata(saves=[BlockTransfer("r3", keys("other"), OTHER_IDS, 0)], step=4,
                          acked={0: 1})
    errors, committed, wm = forward(w, kv, step4, (OTHER_IDS, reference(3)))
    assert not errors and committed == set(keys("other"))
    assert wm is None or not wm.failures
    w.close()
    with Store.open([os.path.join(d, "kv.img")], readonly=True, shared=True) as s:
        assert s.lookup(keys("new")) == [None] * N
        for b, k in enumerate(keys("other")):
            assert s.get(k) == reference(3)[:, b].contiguous().numpy().tobytes()


@pytest.mark.parametrize("save_mode", ["step", "deferred"])
def test_errors_asked_before_wait_for_save_still_fence(tmp_path, save_mode):
    """vLLM's deferred finalize (a draft model) asks for the load errors before wait_for_save."""
    w, kv, _, _ = make_worker(str(tmp_path), "slack", save_mode=save_mode)
    forward(w, kv, TuttiMetadata(saves=[BlockTransfer("r1", keys("prefix"), PREFIX_IDS)], step=1),
            (PREFIX_IDS, reference(1)))
    w.store.invalidate(w.store.lookup([keys("prefix")[0]]))
    step2 = TuttiMetadata(loads=[BlockTransfer("r2", keys("prefix"), LOAD_IDS)],
                          saves=[BlockTransfer("r2", keys("new"), NEW_IDS, 4)], step=2)
    errors, committed, wm = forward(w, kv, step2, (NEW_IDS, reference(2)), errors_first=True)
    assert errors == {LOAD_IDS[0]} and committed == set()
    assert [f.block_ids for f in wm.failures] == [[LOAD_IDS[0]]]
    w.close()


@pytest.mark.parametrize("save_mode", ["step", "deferred"])
def test_an_old_acknowledgement_does_not_lift_a_newer_failure(tmp_path, save_mode):
    w, kv, _, _ = make_worker(str(tmp_path), "slack", save_mode=save_mode)
    forward(w, kv, TuttiMetadata(saves=[BlockTransfer("r1", keys("prefix"), PREFIX_IDS)], step=1),
            (PREFIX_IDS, reference(1)))
    for step, victim in ((2, 0), (3, 1)):  # two failing loads, seq 1 and 2
        w.store.invalidate(w.store.lookup([keys("prefix")[victim]]))
        forward(w, kv, TuttiMetadata(loads=[BlockTransfer("r", keys("prefix"), LOAD_IDS)],
                                     step=step), (NEW_IDS, reference(2)))
    meta = TuttiMetadata(saves=[BlockTransfer("r3", keys("other"), OTHER_IDS, 0)], step=4,
                         acked={0: 1})
    _, committed, wm = forward(w, kv, meta, (OTHER_IDS, reference(3)))
    assert committed == set() and [f.seq for f in wm.failures] == [2]
    meta = TuttiMetadata(saves=[BlockTransfer("r3", keys("other"), OTHER_IDS, 0)], step=5,
                         acked={0: 2, 1: 7})
    _, committed, _ = forward(w, kv, meta, (OTHER_IDS, reference(3)))
    assert committed == set(keys("other"))
    w.close()
