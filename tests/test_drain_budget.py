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
from tutti.vllm.drain import START, DrainBudget
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
    b.step_drained(START // 2, wanted_more=True)   # did not spend it all: no growth
    assert b.bytes == START
    b.step_drained(START, wanted_more=False)       # spent it all but nothing left: no growth
    assert b.bytes == START
    for _ in range(50):
        b.step_drained(b.bytes, wanted_more=True)
    assert b.bytes == 256 << 20                    # capped (the pending bound)


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
