"""The master killed and restarted: meanwhile lookups are misses at once (never a hang); afterwards
nodes re-publish from their stores' slot tables and remote hits come back."""
import time

import pytest

from .conftest import Master, Node


@pytest.fixture
def own_master(tmp_path):
    m = Master(tmp_path).start()
    yield m
    m.kill()


def test_master_restart_republish(tmp_path, own_master):
    a = Node(tmp_path, "a", own_master)
    b = Node(tmp_path, "b", own_master, env={"NODE_CALL_TIMEOUT": "1"})
    try:
        a.cmd("put", seeds=[1, 2, 3, 4])
        assert b.cmd("prefix", seeds=[1, 2, 3, 4]) == 4
        own_master.kill()
        time.sleep(1.5)  # the keepers notice
        t0 = time.monotonic()
        assert b.cmd("prefix", seeds=[1, 2, 3, 4]) == 0
        assert b.cmd("fetch", seeds=[1, 2])["ok"] == [False, False]
        assert time.monotonic() - t0 < 5, "lookups with the master down must fail fast"
        own_master.start()
        deadline = time.monotonic() + 40
        while b.cmd("prefix", seeds=[1, 2, 3, 4]) != 4:
            assert time.monotonic() < deadline, "nodes did not re-publish after the master restarted"
            time.sleep(0.5)
        got = b.cmd("fetch", seeds=[1, 2, 3, 4])
        assert got["ok"] == [True] * 4 and got["exact"] == [True] * 4
        assert a.cmd("info")["stats"]["republished"] >= 2
    finally:
        a.close()
        b.close()
