"""Txn.poll (tt_txn_poll): has a transaction's I/O completed?  Never waits.

The deferred saves of the vLLM connector commit only what poll() says is written, so a step never
waits for a slow store's writes; these tests hold poll() to that: False while writes are in flight
(a store throttled by the fault engine's rate rule), True once they are done, and a finish after it
that waits for no data I/O and commits every block exactly."""
import errno
import time

import pytest

from tutti import Store
from tutti.memory import PagedBuffer

ENGINES = ["fault:uring", "fault:psync"]
N = 8  # blocks of 32 KiB (the tiny model): 256 KiB, about 0.26 s at 1 MB/s


def poll_until_done(txn, limit_s=30.0):
    """Poll until done; (whether the first poll said done, seconds from now to done)."""
    t0 = time.monotonic()
    first = txn.poll()
    done = first
    while not done:
        assert time.monotonic() - t0 < limit_s, "writes never completed"
        time.sleep(0.002)
        done = txn.poll()
    return first, time.monotonic() - t0


@pytest.mark.parametrize("engine", ENGINES)
def test_poll_is_false_while_writes_are_in_flight(make_store, engine):
    with Store.open(make_store(n_slots=2 * N), engine=engine) as s, \
            PagedBuffer.for_geometry(s.geometry, N) as src, PagedBuffer.for_geometry(s.geometry, N) as dst:
        src.fill_random(range(N), seed=7)
        s.set_faults("rate:write:mbps=1")
        keys = [f"k{i}" for i in range(N)]
        txn = s.write(keys)
        t0 = time.monotonic()
        for layer in range(s.geometry.n_layers):
            txn.layer(layer, src, list(range(N)))
        first, _ = poll_until_done(txn)
        done_s = time.monotonic() - t0
        assert not first, "poll() said done right after submitting 256 KiB to a 1 MB/s store"
        assert done_s >= 0.8 * N * s.block_bytes / 1e6, done_s
        t1 = time.monotonic()
        assert txn.finish() == [0] * N
        # the data was written: finish flushed and wrote the records only (4 KiB pages at 1 MB/s)
        assert time.monotonic() - t1 < done_s / 2
        s.set_faults("")
        slots = s.lookup(keys)
        assert None not in slots
        with s.read(slots) as rd:
            for layer in range(s.geometry.n_layers):
                rd.layer(layer, dst, list(range(N)))
        assert [dst.contiguous_block(i) for i in range(N)] == [src.contiguous_block(i) for i in range(N)]


@pytest.mark.parametrize("engine", ["psync", "uring"])
def test_poll_reads_and_layers_waited_for(make_store, engine):
    """A layer waited for is done; a read transaction polls too; nothing submitted is nothing in flight."""
    with Store.open(make_store(n_slots=2 * N), engine=engine) as s, \
            PagedBuffer.for_geometry(s.geometry, N) as src:
        src.fill_random(range(N), seed=3)
        keys = [f"r{i}" for i in range(N)]
        txn = s.write(keys)
        assert txn.poll()  # nothing submitted yet
        for layer in range(s.geometry.n_layers):
            txn.layer(layer, src, list(range(N)))
            txn.wait_layer(layer)
            assert txn.poll()
        assert txn.finish() == [0] * N
        rd = s.read(s.lookup(keys))
        for layer in range(s.geometry.n_layers):
            rd.layer(layer, src, list(range(N)))
        poll_until_done(rd)
        assert rd.finish() == [0] * N
        with pytest.raises(ValueError, match="finished"):
            rd.poll()


def test_poll_on_a_failing_store_reports_done_and_finish_fails_the_blocks(make_store):
    """An I/O error is a completion: poll() says done, finish() fails exactly the blocks it touched."""
    with Store.open(make_store(n_slots=2 * N), engine="fault:psync") as s, \
            PagedBuffer.for_geometry(s.geometry, N) as src:
        src.fill_random(range(N), seed=5)
        s.set_faults("io:write")  # the first write I/O fails with EIO
        keys = [f"e{i}" for i in range(N)]
        txn = s.write(keys)
        for layer in range(s.geometry.n_layers):
            txn.layer(layer, src, list(range(N)))
        poll_until_done(txn)
        status = txn.finish()
        assert -errno.EIO in status, status
        assert [slot is not None for slot in s.lookup(keys)] == [rc == 0 for rc in status]
