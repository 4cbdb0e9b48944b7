"""drain_bytes_per_step auto (tutti/vllm/drain.py): carried-over writes shrink when they held up a load and grow
while nothing waits for them."""
import os
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))
pytest.importorskip("torch")

from test_worker_deferred import Driver, Kernels, block_bytes, stored
from test_worker_write_policy import (
    LOAD_IDS,
    NEW_IDS,
    PREFIX_IDS,
    N,
    keys,
    make_worker,
    reference,
)
from tutti.vllm.config import TuttiConfig
from tutti.vllm.drain import START, DrainBudget, DrainRate
from tutti.vllm.metadata import BlockTransfer


def test_a_held_up_load_halves_the_budget_once_a_step():
    b = DrainBudget(floor=1 << 20, ceiling=1 << 30)
    assert b.bytes == START
    b.load_waited(0.0005)                 # under a millisecond: not held up
    assert b.bytes == START and b.held_up == 0
    b.load_waited(0.010)
    b.load_waited(0.010)                  # the same step: halved once
    assert b.bytes == START // 2 and b.held_up == 2
    b.step_drained(START // 2, wanted_more=True)   # no growth in a step that was cut
    assert b.bytes == START // 2
    for _ in range(40):
        b.load_waited(1.0)
        b.step_drained(0, False)
    assert b.bytes == 1 << 20             # never under the floor


def test_budget_grows_while_writes_are_left_queued_and_nothing_waits():
    b = DrainBudget(floor=1 << 20, ceiling=256 << 20)
    b.step_drained(START, wanted_more=False)       # spent it all but nothing left: no growth
    assert b.bytes == START
    b.step_drained(START - 1000, wanted_more=True)  # the next layer did not fit: the budget bound
    assert b.bytes == START + START // 4
    b = DrainBudget(floor=1 << 20, ceiling=256 << 20)
    for _ in range(50):
        b.step_drained(b.bytes, wanted_more=True)
    assert b.bytes == 256 << 20                    # capped (the pending bound)


def test_a_fixed_size_is_a_rate_a_large_layer_waits_for_saved_up_steps():
    r = DrainRate(8)
    # A 20-byte layer at 8 a step: two steps save up, the third sends it (credit capped at the layer).
    assert [r.budget(20) for _ in range(3)] == [0, 0, 20]
    r.spent(20)
    assert r.credit == 0
    # Layers that fit go every step with the step's own bytes; what is left unspent is not carried.
    assert r.budget(4) == 8
    r.spent(4)
    assert r.credit == 4 and r.budget(4) == 8       # min(4 + 8, max(8, 4)): never above one step's
    # Nothing final queued: no credit saved up for a burst later.
    r.budget(None)
    assert r.credit == 0 and r.budget(20) == 0
    # A budget nothing could use (the drain sent 0) keeps its credit for the next step.
    r = DrainRate(8)
    assert r.budget(8) == 8
    r.spent(0)
    assert r.credit == 8


def test_auto_is_the_default_and_a_size_still_fixes_it():
    assert TuttiConfig.from_extra({}).drain_bytes_per_step is None
    assert TuttiConfig.from_extra({"drain_bytes_per_step": "auto"}).drain_bytes_per_step is None
    assert TuttiConfig.from_extra({"drain_bytes_per_step": "8MiB"}).drain_bytes_per_step == 8 << 20


class SlowWrites:
    """Each write layer takes ``s`` to finish (a slow SSD): a load after a drain waits for it."""

    def __init__(self, w, s):
        write = w.store.write

        def slow(*a):
            t = write(*a)
            inner = t.wait_layer

            def wait_layer(layer):
                time.sleep(s)
                return inner(layer)
            t.wait_layer = wait_layer
            return t
        w.store.write = slow


def test_a_load_held_up_by_drained_writes_is_counted_and_shrinks_the_next_drain(tmp_path):
    d = str(tmp_path)
    w, kv, _, stats = make_worker(d, "slack", save_mode="deferred")
    SlowWrites(w, 0.01)
    run = Driver(w, kv)
    run.step(saves=[BlockTransfer("r0", keys("other"), NEW_IDS)], computed=(NEW_IDS, reference(3)))
    run.step()  # commits r0
    k = Kernels(w)  # r1's KV is final only after the step: every layer is carried over and drained
    run.step(saves=[BlockTransfer("r1", keys("prefix"), PREFIX_IDS)], computed=(PREFIX_IDS, reference(1)))
    k.run()
    before = w._drain_budget.bytes
    run.step()                                    # drains r1's layers at its end (writes in flight)
    run.step(loads=[BlockTransfer("r2", keys("other"), LOAD_IDS)])   # the load waits for them
    assert stats.data["load_write_wait_s"] > 0.005
    assert w._drain_budget.held_up >= 1 and w._drain_budget.bytes == max(before // 2, w._drain_budget.floor)
    for _ in range(3):
        run.step()
    assert set(keys("prefix")) <= set().union(*run.committed)
    w.close()
    assert stored(d, keys("prefix")) == [block_bytes(reference(1), b) for b in range(N)]


def test_a_drain_still_in_flight_at_the_next_step_end_shrinks_the_budget_once_a_step():
    b = DrainBudget(floor=1 << 20, ceiling=1 << 30)
    b.spilled()
    assert b.bytes == START - START // 4 and b.spills == 1
    b.load_waited(0.010)                  # the same step: no second cut
    assert b.bytes == START - START // 4
    b.step_drained(b.bytes, wanted_more=True)      # no growth in a step that was cut
    assert b.bytes == START - START // 4
    b.step_drained(b.bytes, wanted_more=True)      # a step that fit: grows again
    assert b.bytes == (START - START // 4) * 5 // 4
    for _ in range(60):
        b.spilled()
        b.step_drained(b.bytes, True)
    assert b.bytes == 1 << 20             # never under the floor


def test_a_profile_write_rate_sizes_the_drain_to_one_step_once():
    b = DrainBudget(floor=1 << 20, ceiling=1 << 30, write_bps=2e9)
    assert b.bytes == START               # until a step's duration is known
    b.step_time(0.010)
    assert b.bytes == 20_000_000          # 2 GB/s for 10 ms
    b.step_time(0.5)                      # seeded once: measurements rule from then on
    assert b.bytes == 20_000_000
    c = DrainBudget(floor=1 << 20, ceiling=1 << 30, write_bps=1e12)
    c.step_time(1.0)
    assert c.bytes == 1 << 30             # within the pending bound
    d = DrainBudget(floor=1 << 20, ceiling=1 << 30)
    d.step_time(0.010)
    assert d.bytes == START               # no profile: nothing seeds it


class LateWrites:
    """Writes that complete ``lag`` steps after they were submitted: ``poll`` says False until the
    driver has ticked that often since (a store slower than the steps), True after."""

    def __init__(self, w, lag=2):
        self.tick = 0
        write = w.store.write

        def late(*a):
            t = write(*a)
            inner, born = t.poll, [None]
            layer = t.layer

            def layer_(*la, **kw):
                born[0] = self.tick
                return layer(*la, **kw)

            def poll():
                if born[0] is not None and self.tick <= born[0] + lag:
                    return False
                end = time.monotonic() + 10  # by then the real store has finished too
                while not inner() and time.monotonic() < end:
                    time.sleep(0.001)
                return inner()
            t.layer, t.poll = layer_, poll
            return t
        w.store.write = late


def test_a_drain_still_written_two_steps_later_is_cut_once_and_nothing_queues_behind_it(tmp_path, monkeypatch):
    import test_worker_deferred
    monkeypatch.setattr(test_worker_deferred, "settle", lambda w: None)  # the late writes are the point
    d = str(tmp_path)
    w, kv, log, stats = make_worker(d, "slack", save_mode="deferred", max_pending_bytes="1MiB")
    late = LateWrites(w, lag=2)
    run = Driver(w, kv)
    k = Kernels(w)  # a save's KV is final only after its step: every layer is carried over and drained

    def step(**kw):
        run.step(**kw)
        k.run()
        late.tick += 1

    b = w._drain_budget
    before = b.bytes
    step(saves=[BlockTransfer("r1", keys("prefix"), PREFIX_IDS)], computed=(PREFIX_IDS, reference(1)))
    step(saves=[BlockTransfer("r2", keys("other"), NEW_IDS)], computed=(NEW_IDS, reference(2)))  # drains r1
    step(saves=[BlockTransfer("r3", keys("third"), LOAD_IDS)], computed=(LOAD_IDS, reference(3)))  # drains r2
    assert b.spills == 0                  # r1's drain has had one step: in time
    submits = len(log.of("W", "submit"))
    step()                                # r1's drain is still written two step ends later: spilled
    assert b.spills == 1 and stats.data["drain_spills"] == 1
    assert b.bytes == max(before - before // 4, b.floor)
    assert len(log.of("W", "submit")) == submits   # r3 (ready) did not go out behind it
    step()                                # r1 written: r3 drains (r2's one step old is in time)
    assert len(log.of("W", "submit")) > submits and b.spills == 1
    for _ in range(4):
        step()
    committed = set().union(*run.committed)
    assert set(keys("prefix")) | set(keys("other")) | set(keys("third")) <= committed
    assert b.spills == 1                  # one cut for the one late drain
    assert stats.data.get("save_dropped", 0) == 0
    w.close()
    assert stored(d, keys("prefix")) == [block_bytes(reference(1), b) for b in range(N)]
    assert stored(d, keys("third")) == [block_bytes(reference(3), b) for b in range(N)]


def test_the_worker_seeds_the_drain_from_the_profile_tables_write_rate(tmp_path):
    from test_worker_write_policy import NUM_BLOCKS

    class Table:  # what the worker reads of a profile table (tutti.sched.profile.ComputeProfile)
        io = {"read_gbps": 2.0, "write_gbps": 0.0002}

    w, kv, _, _ = make_worker(str(tmp_path), "slack", save_mode="deferred")
    w.cfg.profile = Table()
    w._set_pending_bound(NUM_BLOCKS)
    run = Driver(w, kv)
    b = w._drain_budget
    start = b.bytes                            # START within the pending bound
    t0 = time.perf_counter()                   # before the first step's end: the worker's step is within
    run.step()
    assert b.bytes == start                    # one step end seen: no duration yet
    time.sleep(0.05)
    run.step()
    took = time.perf_counter() - t0
    # 200 kB/s for one step of 50 ms and more: what the table's rate writes in one step
    assert max(b.floor, 10_000) <= b.bytes <= max(b.floor, 2e5 * took + 1)
    assert b.bytes < start or took > 0.6
    w.close()


def test_the_slack_fit_runs_on_every_data_path_but_gio(tmp_path, request):
    from test_worker_write_policy import gpu_store_lib
    from tutti.vllm.drain import slack_fit_for
    w, _, _, _ = make_worker(str(tmp_path / "cpu"), "slack", save_mode="deferred")
    assert w._drain_budget.slack_fit
    w.close()
    assert slack_fit_for("staged") and slack_fit_for("gds") and slack_fit_for("cpu")
    assert not slack_fit_for("gio")     # the emulated controller's writes: measured, not fitted
    gpu_store_lib(request, "host")
    w, _, _, _ = make_worker(str(tmp_path / "host"), "slack", save_mode="deferred", data_path="host")
    assert w._drain_budget.slack_fit    # GpuStore's data-path code, as staged runs it
    w.close()


def test_a_gpu_data_path_keeps_each_drain_under_the_gpu_ceiling(tmp_path):
    # The drain's work runs beside the next steps' kernels on a GPU path: the size never exceeds
    # GPU_STEP_CEILING there, whatever the pending bound; the host paths go up to the bound.
    from types import SimpleNamespace

    from test_worker_write_policy import NUM_BLOCKS
    from tutti.vllm.drain import GPU_STEP_CEILING
    w, _, _, _ = make_worker(str(tmp_path), "slack", save_mode="deferred")
    w.cfg.max_pending_bytes = 4 << 30
    w._set_pending_bound(NUM_BLOCKS)
    assert w._drain_budget.ceiling == 4 << 30
    host_io = w.io
    try:
        for path, fit in (("staged", True), ("gio", False)):
            w.io = SimpleNamespace(on_gpu=True, path=path)
            w._set_pending_bound(NUM_BLOCKS)
            b = w._drain_budget
            assert b.ceiling == GPU_STEP_CEILING and b.slack_fit is fit
            for _ in range(40):                    # the store keeps up: grown to the ceiling, no further
                b.step_drained(b.bytes, wanted_more=True)
            assert b.bytes == GPU_STEP_CEILING
    finally:
        w.io = host_io
        w.close()
