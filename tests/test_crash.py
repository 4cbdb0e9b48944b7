"""SIGKILL a writer at random moments: the store must always reopen clean and serve
only blocks exactly as some write stored them.

Writers are forked from this already-initialised interpreter, so a trial costs
the kill delay plus a few milliseconds, not a Python start-up.
"""
import mmap
import multiprocessing
import os
import random
import select
import signal
import struct
import time

from helpers import crash_writer as cw
from tutti import Store

_fork = multiprocessing.get_context("fork")


def _writer(paths, seed, trial, ready_w, counter):
    ops = memoryview(counter).cast("Q")

    def ready():
        os.write(ready_w, b"x")

    def op_done():
        ops[0] += 1

    cw.run(paths, seed, trial, on_ready=ready, on_op=op_done)


def _verify(paths, trial):
    # libtutti itself waits out the killed writer's io_uring teardown.
    with Store.open(paths) as s:
        res = s.check()
        assert (res["bad"], res["bad_records"]) == (0, 0), (trial, res)
        info = s.info()
        assert info["n_bad_records"] == 0
        assert info["n_committed"] + info["n_free"] == cw.N_SLOTS
        present = 0
        for k in range(cw.N_KEYS):
            try:
                data = s.get(cw.key_name(k))
            except KeyError:
                continue
            present += 1
            kk, version = cw.parse_block(data)
            assert kk == k, f"trial {trial}: key {k} holds key {kk}'s block"
            assert version // cw.VERSIONS_PER_TRIAL <= trial, (trial, k, version)
            assert data == cw.block_data(k, version, s.block_bytes), (trial, k, version)
        assert present == info["n_committed"]
        return present


def _crash_trials(paths, n_trials, seed):
    rng = random.Random(seed)
    counter = mmap.mmap(-1, 8)
    ready_r, ready_w = os.pipe()
    presents = []
    try:
        for trial in range(1, n_trials + 1):
            p = _fork.Process(target=_writer, args=(paths, rng.getrandbits(32), trial, ready_w,
                                                    counter))
            p.start()
            # Wait for the writer to have the store open; the kill lands mid-write.
            ready, _, _ = select.select([ready_r, p.sentinel], [], [], 30)
            if ready_r not in ready:
                p.kill()
                p.join()
                raise AssertionError(f"trial {trial}: writer never got ready (exit {p.exitcode})")
            os.read(ready_r, 1)
            time.sleep(rng.uniform(0, 0.150))
            os.kill(p.pid, signal.SIGKILL)
            p.join()
            assert p.exitcode == -signal.SIGKILL, f"writer died by itself: exit {p.exitcode}"
            presents.append(_verify(paths, trial))
        ops = struct.unpack("Q", counter[:8])[0]
    finally:
        os.close(ready_r)
        os.close(ready_w)
        counter.close()
    return ops, presents


def test_sigkill_writer_file(tmp_path):
    paths = [str(tmp_path / "crash0.img"), str(tmp_path / "crash1.img")]
    Store.format(paths, cw.FINGERPRINT, n_slots=cw.N_SLOTS, stripe_objs=1)
    n_trials = 200
    ops, presents = _crash_trials(paths, n_trials, seed=1)
    # The writer really worked between kills, and the store was kept full.
    assert ops >= 5 * n_trials, ops
    assert max(presents) == cw.N_SLOTS


def test_sigkill_writer_loop_device(loop_device):
    dev = loop_device(8 << 20)
    Store.format([dev], cw.FINGERPRINT, n_slots=cw.N_SLOTS)
    n_trials = 40
    ops, presents = _crash_trials([dev], n_trials, seed=2)
    assert ops >= 5 * n_trials, ops
    assert max(presents) == cw.N_SLOTS
