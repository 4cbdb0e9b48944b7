"""Saves that outlive their step (save_mode deferred): the worker side driven in vLLM's call order.

Per step, as vLLM's model runner: handle_preemptions, start_load_kv, per layer wait_for_layer_load /
the layer's compute / save_kv_layer, wait_for_save, get_finished, get_block_ids_with_load_errors,
the worker metadata.  GPU memory's "the model's kernels that wrote a layer have not run yet" is
played by marks the test completes (``Kernels``), so the carried-over part of a save is visible on
the CPU path too.  Every store transaction is logged (tests/test_worker_write_policy.py).
"""
import os

import pytest

torch = pytest.importorskip("torch")

from helpers.pending import settle
from test_worker_write_policy import (
    DATA_PATHS,
    LOAD_IDS,
    N_LAYERS,
    NEW_IDS,
    PREFIX_IDS,
    N,
    gpu_store_lib,
    keys,
    layer_name,
    make_worker,
    reference,
)
from tutti import Store
from tutti.vllm.metadata import BlockTransfer, TuttiMetadata

BLOCK_BYTES = reference(1)[:, 0].numel() * 2   # one block, every layer (int16)
LAYER_BYTES = N * BLOCK_BYTES // N_LAYERS        # one layer of a 4-block save


class Kernels:
    """Marks of layers whose KV the "GPU" has not finished writing until ``run()``."""

    class Mark:
        done = False

    def __init__(self, w):
        self.marks = []
        w.io.mark = self.mark
        w.io.ready = self.ready

    def mark(self):
        m = self.Mark()
        self.marks.append(m)
        return m

    @staticmethod
    def ready(mark, block=False):
        if block:
            mark.done = True  # a blocking wait (shutdown, preemption): the kernels finish
        return mark is None or mark.done

    def run(self):
        for m in self.marks:
            m.done = True


class Driver:
    """Runs steps on a worker and remembers what each step committed and reported finished."""

    def __init__(self, w, kv):
        self.w, self.kv, self.step_no = w, kv, 0
        self.committed, self.finished, self.unsaved = [], [], []

    def step(self, saves=(), loads=(), computed=None, held=(), preempted=(), bad=(), acked=None):
        self.step_no += 1
        meta = TuttiMetadata(saves=list(saves), loads=list(loads), step=self.step_no,
                             held=list(held), preempted=list(preempted), bad_blocks=list(bad),
                             acked=dict(acked or {}))
        w = self.w
        w.handle_preemptions(meta)
        w.start_load(meta)
        for l in range(N_LAYERS):
            w.wait_layer(layer_name(l))
            if computed is not None:
                ids, ref = computed
                self.kv[layer_name(l)][ids] = ref[l].to(self.kv[layer_name(l)].device)
            w.save_layer(meta, layer_name(l))
        settle(w)
        w.finish_save(meta)
        done, _ = w.get_finished(set(held), meta)
        errors = w.take_load_errors()
        wm = w.take_worker_meta()
        self.committed.append({ev.key for ev in (wm.events if wm else []) if ev.key})
        self.finished.append(done or set())
        self.unsaved.append(list(wm.unsaved) if wm else [])
        return errors, wm


def stored(d, ks):
    with Store.open([os.path.join(d, "kv.img")], readonly=True, shared=True) as s:
        return [s.get(k) if s.lookup([k])[0] is not None else None for k in ks]


def block_bytes(ref, b):
    return ref[:, b].contiguous().numpy().tobytes()


def submits_until_committed(run, log, most):
    """Empty steps until one commits; the layer writes each submitted (at most ``most`` steps)."""
    per_step = []
    while not run.committed[-1]:
        n0 = len(log.of("W", "submit"))
        run.step()
        per_step.append(len(log.of("W", "submit")) - n0)
        assert len(per_step) <= most
    return per_step


def test_a_save_is_committed_in_a_later_step(tmp_path):
    d = str(tmp_path)
    w, kv, log, stats = make_worker(d, "slack", save_mode="deferred")
    run = Driver(w, kv)
    run.step(saves=[BlockTransfer("r1", keys("prefix"), PREFIX_IDS)], computed=(PREFIX_IDS, reference(1)))
    assert run.committed[-1] == set()  # the step returned without committing
    assert log.of("W", "finish") == [] and sorted(log.of("W", "submit")) == list(range(N_LAYERS))
    run.step()                         # the next step (a decode step) commits it
    assert run.committed[-1] == set(keys("prefix"))
    assert stats.data["save_carried"] == N and stats.data["save_blocks"] == N
    w.close()
    assert stored(d, keys("prefix")) == [block_bytes(reference(1), b) for b in range(N)]


def test_unwritten_layers_are_carried_over_within_the_step_budget(tmp_path):
    """A save whose layers' KV was not final by the step's end (GPU kernels still running):
    its writes go out in later steps, at most ``drain_bytes_per_step`` a step, then it commits."""
    d = str(tmp_path)
    w, kv, log, stats = make_worker(d, "slack", save_mode="deferred",
                                    drain_bytes_per_step=LAYER_BYTES)
    k = Kernels(w)
    run = Driver(w, kv)
    run.step(saves=[BlockTransfer("r1", keys("prefix"), PREFIX_IDS)], computed=(PREFIX_IDS, reference(1)))
    assert log.of("W", "submit") == []  # nothing final yet: all carried over
    k.run()
    per_step = submits_until_committed(run, log, N_LAYERS + 1)
    assert per_step == [1] * N_LAYERS + [0]  # one layer a step, then the commit
    assert run.committed[-1] == set(keys("prefix"))
    assert stats.data.get("save_parts", 0) == 0     # its layer fits the budget: one transaction
    w.close()
    assert stored(d, keys("prefix")) == [block_bytes(reference(1), b) for b in range(N)]


class FirstLayerFinal(Kernels):
    """The first layer's kernels are done within the step: the save's transaction begins in its step
    and only later layers are carried over (what a GPU does with a long prefill)."""

    def mark(self):
        m = super().mark()
        m.done = len(self.marks) == 1
        return m


def test_a_fixed_drain_smaller_than_a_layer_is_a_rate(tmp_path):
    """drain_bytes_per_step below one layer of a begun save (its left-over layers cannot be cut into
    parts): a layer goes once the steps' unspent bytes add up to it — every second step at half a
    layer, every fourth at a quarter — not one every step; the store exact."""
    for div in (2, 4):
        d = str(tmp_path / str(div))
        os.makedirs(d)
        w, kv, log, stats = make_worker(d, "slack", save_mode="deferred",
                                        drain_bytes_per_step=LAYER_BYTES // div)
        k = FirstLayerFinal(w)
        run = Driver(w, kv)
        run.step(saves=[BlockTransfer("r1", keys("prefix"), PREFIX_IDS)], computed=(PREFIX_IDS, reference(1)))
        assert log.of("W", "submit") == [0] and not stats.data.get("save_parts")  # begun: not cut
        k.run()
        per_step = submits_until_committed(run, log, div * N_LAYERS + 1)
        assert per_step == ([0] * (div - 1) + [1]) * (N_LAYERS - 1) + [0]
        assert run.committed[-1] == set(keys("prefix"))
        w.close()
        assert stored(d, keys("prefix")) == [block_bytes(reference(1), b) for b in range(N)]


@pytest.mark.parametrize("data_path", DATA_PATHS)
def test_a_carried_save_larger_than_the_budget_is_drained_in_parts(tmp_path, data_path, request):
    """A save carried over whole whose layer is twice the step's drain: cut into two transactions of two
    blocks, a part's layer a step (not a whole layer of the save), each part committed once written, the
    tail first; the store exact; a budget of one block's layer cuts it into four."""
    if data_path != "cpu":
        gpu_store_lib(request, data_path)
    for budget, parts in ((LAYER_BYTES // 2, 2), (LAYER_BYTES // N, N)):
        d = str(tmp_path / str(parts))
        os.makedirs(d)
        w, kv, log, stats = make_worker(d, "slack", save_mode="deferred", drain_bytes_per_step=budget,
                                        data_path=data_path)
        k = Kernels(w)
        run = Driver(w, kv)
        run.step(saves=[BlockTransfer("r1", keys("prefix"), PREFIX_IDS)], computed=(PREFIX_IDS, reference(1)))
        assert log.of("W", "submit") == [] and stats.data.get("save_parts") == parts
        k.run()
        per_step, commits = [], []
        while set().union(*run.committed) != set(keys("prefix")):
            n0 = len(log.of("W", "submit"))
            run.step()
            per_step.append(len(log.of("W", "submit")) - n0)
            if run.committed[-1]:
                commits.append(run.committed[-1])
            assert len(per_step) <= parts * N_LAYERS + 1
        assert per_step == [1] * (parts * N_LAYERS) + [0]   # a part's layer a step
        size = N // parts
        tail_first = keys("prefix")[::-1]
        assert commits == [set(tail_first[i:i + size]) for i in range(0, N, size)]
        assert len(log.of("W", "finish")) == parts
        w.close()
        assert stored(d, keys("prefix")) == [block_bytes(reference(1), b) for b in range(N)]


def test_a_request_finishing_while_its_save_is_pending_keeps_its_blocks(tmp_path):
    """The request is named held; get_finished reports it only once its save has been written and
    committed.  vLLM then frees the blocks and another request overwrites them: the store still
    holds what was computed."""
    d = str(tmp_path)
    w, kv, log, stats = make_worker(d, "slack", save_mode="deferred",
                                    drain_bytes_per_step=LAYER_BYTES)
    k = Kernels(w)
    run = Driver(w, kv)
    run.step(saves=[BlockTransfer("r1", keys("prefix"), PREFIX_IDS)], computed=(PREFIX_IDS, reference(1)))
    run.step(held=["r1"])  # r1 finished after step 1: vLLM keeps its blocks
    assert run.finished[-1] == set()
    k.run()
    while not run.finished[-1]:
        run.step()
        assert run.step_no < 10
    assert run.finished[-1] == {"r1"}
    assert run.committed[-1] == set(keys("prefix")) and not w._fifo
    # vLLM frees r1's blocks; the next request computes over them.
    run.step(saves=[BlockTransfer("r2", keys("new"), PREFIX_IDS)], computed=(PREFIX_IDS, reference(2)))
    k.run()
    while not run.committed[-1]:
        run.step()
        assert run.step_no < 20
    assert run.committed[-1] == set(keys("new"))
    w.close()
    assert stored(d, keys("prefix")) == [block_bytes(reference(1), b) for b in range(N)]
    assert stored(d, keys("new")) == [block_bytes(reference(2), b) for b in range(N)]


def test_a_held_request_without_pending_saves_is_released_at_once(tmp_path):
    w, kv, _, _ = make_worker(str(tmp_path), "slack", save_mode="deferred")
    run = Driver(w, kv)
    run.step(saves=[BlockTransfer("r1", keys("prefix"), PREFIX_IDS)], computed=(PREFIX_IDS, reference(1)))
    run.step(held=["r1"])  # committed in this step's wait_for_save: released in the same step
    assert run.committed[-1] == set(keys("prefix")) and run.finished[-1] == {"r1"}
    w.close()


def test_preemption_writes_the_blocks_out_before_the_forward(tmp_path):
    """A preempted request's blocks are free once the step starts: its pending writes go out in
    handle_preemptions, before the forward overwrites the blocks."""
    d = str(tmp_path)
    w, kv, log, _ = make_worker(d, "slack", save_mode="deferred", drain_bytes_per_step=LAYER_BYTES)
    Kernels(w)  # never completed by the test: only a blocking wait finishes them
    run = Driver(w, kv)
    run.step(saves=[BlockTransfer("r1", keys("prefix"), PREFIX_IDS)], computed=(PREFIX_IDS, reference(1)))
    assert log.of("W", "submit") == []
    # r1 is preempted; r2 gets its blocks and computes over them in the same step.
    run.step(preempted=["r1"], saves=[BlockTransfer("r2", keys("new"), PREFIX_IDS)],
             computed=(PREFIX_IDS, reference(2)))
    assert sorted(log.of("W", "submit"))[:N_LAYERS] == list(range(N_LAYERS))
    run.step()
    run.step()
    w.close()
    assert stored(d, keys("prefix")) == [block_bytes(reference(1), b) for b in range(N)]


def test_the_pending_bound_drops_the_oldest_saves_and_never_waits(tmp_path):
    d = str(tmp_path)
    w, kv, log, stats = make_worker(d, "slack", save_mode="deferred",
                                    max_pending_bytes=int(1.5 * N * BLOCK_BYTES))
    k = Kernels(w)  # the first saves' kernels "run late": nothing is written meanwhile
    run = Driver(w, kv)
    run.step(saves=[BlockTransfer("r1", keys("prefix"), PREFIX_IDS)], computed=(PREFIX_IDS, reference(1)))
    run.step(saves=[BlockTransfer("r2", keys("new"), NEW_IDS)], computed=(NEW_IDS, reference(2)),
             held=["r1"])
    # Two saves pending, 2 x N blocks > 1.5 x N: the oldest went, its request is released.
    assert stats.data["save_dropped"] == N
    assert run.finished[-1] == {"r1"}
    assert log.of("W", "submit") == [] and log.of("W", "finish") == []
    k.run()
    for _ in range(3):
        run.step()
    assert set(keys("new")) <= set().union(*run.committed)
    w.close()
    assert stored(d, keys("prefix")) == [None] * N
    assert stored(d, keys("new")) == [block_bytes(reference(2), b) for b in range(N)]


def test_a_save_larger_than_the_whole_bound_is_written_in_its_step_not_dropped(tmp_path):
    """Dropped, a prompt longer than max_pending_bytes would never be stored (seen: serving.py --quick,
    every document's save over an automatic bound of a quarter of a small KV cache, 0 hits)."""
    d = str(tmp_path)
    w, kv, log, stats = make_worker(d, "slack", save_mode="deferred", max_pending_bytes=N * BLOCK_BYTES // 2)
    k = Kernels(w)  # its kernels run late: the write waits for them, as save_mode step would
    run = Driver(w, kv)
    run.step(saves=[BlockTransfer("r1", keys("prefix"), PREFIX_IDS)], computed=(PREFIX_IDS, reference(1)))
    assert run.committed[-1] == set(keys("prefix"))  # in its own step
    assert stats.data["save_over_bound"] == N and stats.data.get("save_dropped", 0) == 0
    k.run()
    w.close()
    assert stored(d, keys("prefix")) == [block_bytes(reference(1), b) for b in range(N)]


def test_shutdown_commits_what_it_can_in_time_and_drops_the_rest(tmp_path):
    d = str(tmp_path)
    w, kv, _, stats = make_worker(d, "slack", save_mode="deferred")
    Kernels(w)
    run = Driver(w, kv)
    run.step(saves=[BlockTransfer("r1", keys("prefix"), PREFIX_IDS)], computed=(PREFIX_IDS, reference(1)))
    w.close()  # shutdown_drain_s 10 s: the blocking wait finishes the kernels, it commits
    assert stats.data.get("save_dropped", 0) == 0
    assert stored(d, keys("prefix")) == [block_bytes(reference(1), b) for b in range(N)]

    w, kv, _, stats = make_worker(str(tmp_path / "b"), "slack", save_mode="deferred",
                                  shutdown_drain_s=0)
    run = Driver(w, kv)
    run.step(saves=[BlockTransfer("r1", keys("prefix"), PREFIX_IDS)], computed=(PREFIX_IDS, reference(1)))
    w.close()
    assert stats.data["save_dropped"] == N
    assert stored(str(tmp_path / "b"), keys("prefix")) == [None] * N


def test_blocks_found_bad_after_the_save_was_queued_are_never_committed(tmp_path):
    """The scheduler's taint (TuttiMetadata.bad_blocks) reaches a pending save before its
    commit: those keys are vetoed, the others committed."""
    d = str(tmp_path)
    w, kv, _, stats = make_worker(d, "slack", save_mode="deferred")
    k = Kernels(w)
    run = Driver(w, kv)
    run.step(saves=[BlockTransfer("r1", keys("prefix"), PREFIX_IDS)], computed=(PREFIX_IDS, reference(1)))
    k.run()
    run.step(bad=PREFIX_IDS[2:])   # its last two blocks turned out computed over a bad block
    run.step()
    assert set().union(*run.committed) == set(keys("prefix")[:2])
    w.close()
    got = stored(d, keys("prefix"))
    assert got[2:] == [None, None] and got[:2] == [block_bytes(reference(1), b) for b in range(2)]


def test_a_failed_load_fences_pending_saves_and_voids_those_computed_over_it(tmp_path):
    """Step 1's save is pending; step 2 loads (a block fails) and computes r2's save over it.
    Nothing is committed while the failure is unacknowledged; afterwards step 1's save (computed
    before the failure) commits, step 2's never does, and it is reported unsaved."""
    d = str(tmp_path)
    w, kv, _, stats = make_worker(d, "slack", save_mode="deferred")
    run = Driver(w, kv)
    run.step(saves=[BlockTransfer("r0", keys("other"), NEW_IDS)], computed=(NEW_IDS, reference(3)))
    run.step()
    assert run.committed[-1] == set(keys("other"))
    k = Kernels(w)
    run.step(saves=[BlockTransfer("r1", keys("prefix"), PREFIX_IDS)], computed=(PREFIX_IDS, reference(1)))
    w.store.invalidate(w.store.lookup([keys("other")[1]]))  # the index is a step stale
    errors, wm = run.step(loads=[BlockTransfer("r2", keys("other"), LOAD_IDS)],
                          saves=[BlockTransfer("r2", keys("new"), NEW_IDS, 4)],
                          computed=(NEW_IDS, reference(2)))
    assert errors == {LOAD_IDS[1]} and [f.seq for f in wm.failures] == [1]
    assert ("r2", 4) in run.unsaved[-1] and stats.data["save_fenced"] == N
    k.run()
    run.step(held=["r1", "r2"])    # still unacknowledged: nothing committed
    assert run.committed[-1] == set()
    assert run.finished[-1] == {"r2"}  # its save is void: nothing reads its blocks any more
    run.step(acked={0: 1})
    run.step(acked={0: 1})
    assert set().union(*run.committed[-2:]) == set(keys("prefix"))
    assert "r1" in set().union(*run.finished[-2:])
    w.close()
    assert stored(d, keys("new")) == [None] * N
    assert stored(d, keys("prefix")) == [block_bytes(reference(1), b) for b in range(N)]


@pytest.mark.parametrize("bad", ["later", "", 1.5])
def test_save_mode_is_validated(bad):
    from tutti.vllm.config import ConfigError, TuttiConfig
    c = TuttiConfig.from_extra({})
    assert c.save_mode == "deferred" and c.max_pending_bytes is None
    assert TuttiConfig.from_extra({"save_mode": "step", "max_pending_bytes": "1GiB"}).max_pending_bytes == 1 << 30
    with pytest.raises(ConfigError, match="save_mode: expected 'deferred'"):
        TuttiConfig.from_extra({"save_mode": bad})
    with pytest.raises(ConfigError, match="shutdown_drain_s"):
        TuttiConfig.from_extra({"shutdown_drain_s": -1})


def test_scheduler_holds_a_finished_request_only_while_a_save_may_be_pending(tmp_path):
    """request_finished returns True (vLLM keeps the blocks) when the request's last save was
    offered after the step the workers last reported drained; the next metadata names it held;
    finished_sending releases it.  With save_mode step it never holds."""
    from types import SimpleNamespace as NS

    from test_scheduler_taint import Req, new, output, scheduler
    from tutti.vllm.metadata import TuttiWorkerMeta
    from tutti.vllm.scheduler import _ReqState
    s = scheduler(tmp_path)
    r = Req("R", 4)
    s.reqs["R"] = _ReqState(r)
    m1 = s.build_connector_meta(output([new("R", [10, 11, 12, 13], 0)], sched={"R": 65}))
    assert [t.req_id for t in m1.saves] == ["R"]
    assert s.request_finished(r) == (True, None) and s.is_holding()
    m2 = s.build_connector_meta(output(finished=["R"]))
    assert m2.held == ["R"]
    s.update_connector_output(NS(finished_sending={"R"}, kv_connector_worker_meta=None))
    assert not s.is_holding()
    # Saved in step 3; the workers report everything up to step 3 drained: freed at once.
    q = Req("Q", 4)
    s.reqs["Q"] = _ReqState(q)
    s.build_connector_meta(output([new("Q", [20, 21, 22, 23], 0)], sched={"Q": 65}))
    s.update_connector_output(NS(kv_connector_worker_meta=TuttiWorkerMeta(drained=[(0, 3)])))
    assert s.request_finished(q) == (False, None)
    s.deferred = False  # save_mode step
    s.reqs["R"] = _ReqState(r)
    s.build_connector_meta(output([new("R", [10, 11, 12, 13], 0)], sched={"R": 65}))
    assert s.request_finished(r) == (False, None)


def test_a_block_two_pending_saves_write_is_counted_once(tmp_path):
    """Two requests save the same prefix in consecutive steps, the second before the first's save is
    committed (deferred): both are written, the first commit keeps its slot and the second finds the
    keys stored. save_blocks counts the blocks stored (N), not the writes (2N); the store is exact."""
    d = str(tmp_path)
    w, kv, _, stats = make_worker(d, "slack", save_mode="deferred")
    run = Driver(w, kv)
    run.step(saves=[BlockTransfer("r1", keys("prefix"), PREFIX_IDS)], computed=(PREFIX_IDS, reference(1)))
    run.step(saves=[BlockTransfer("r2", keys("prefix"), NEW_IDS)], computed=(NEW_IDS, reference(1)))
    assert run.committed[-1] == set(keys("prefix"))   # r1's save, committed in r2's step
    run.step()
    run.step()
    assert not w._fifo
    assert stats.data["save_blocks"] == N and stats.data["save_bytes"] == N * BLOCK_BYTES
    w.close()
    assert stored(d, keys("prefix")) == [block_bytes(reference(1), b) for b in range(N)]
    with Store.open([os.path.join(d, "kv.img")], readonly=True, shared=True) as s:
        assert s.info()["n_committed"] == N
