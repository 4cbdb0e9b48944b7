"""Peers that fail: a stuck owner (alive, its answers late) is skipped for cluster_peer_quarantine_s
after one fetch timed out, and a node that holds the block itself publishes over its entries; a store
restarted at once under a new endpoint is published again even while the master still refuses its
names (a killed process's metadata, until the master drops it).  On a master with a 60 s client_ttl,
as in a deployment."""
import time

import pytest

from .conftest import Master


@pytest.fixture(scope="module")
def master(tmp_path_factory):
    """This module's master (conftest's ``nodes`` start nodes on it): a deployment's client_ttl."""
    m = Master(tmp_path_factory.mktemp("master-ttl"), client_ttl=60).start()
    yield m
    m.kill()


STUCK = {"TUTTI_CLUSTER_FAULTS": "serve_delay_s=30"}  # alive, in the index, answers 30 s late


def test_a_stuck_peer_is_skipped_then_asked_again(nodes):
    a = nodes("a", env=STUCK)
    b = nodes("b", env={"NODE_FETCH_TIMEOUT": "2", "NODE_QUARANTINE": "4"})
    seeds = [801, 802, 803]
    assert a.cmd("put", seeds=seeds) == 3
    assert b.cmd("prefix", seeds=seeds) == 3
    t0 = time.monotonic()
    assert b.cmd("fetch", seeds=seeds)["ok"] == [False] * 3
    first = time.monotonic() - t0
    info = b.cmd("info")
    assert info["quarantined"] == [f"127.0.0.1:{a.port}"], (first, info["stats"])
    # Skipped: misses at once instead of another fetch timeout per request.
    t0 = time.monotonic()
    assert b.cmd("prefix", seeds=seeds) == 0
    assert b.cmd("fetch", seeds=seeds)["ok"] == [False] * 3
    assert time.monotonic() - t0 < 1.0, f"a quarantined peer was waited for ({first:.1f} s the first time)"
    assert first >= 2.0                       # the first fetch did wait for its timeout
    assert b.cmd("info")["stats"]["misses_quarantined"] >= 3
    # Afterwards the peer is asked again.
    deadline = time.monotonic() + 10
    while b.cmd("prefix", seeds=seeds) != 3:
        assert time.monotonic() < deadline, "the peer stayed skipped past its quarantine"
        time.sleep(0.3)
    assert b.cmd("info")["quarantined"] == []


def test_a_holder_publishes_over_a_stuck_peer_it_skips(nodes):
    a = nodes("a", env=STUCK)
    b = nodes("b", env={"NODE_FETCH_TIMEOUT": "2"})
    c = nodes("c")
    seeds = [901, 902]
    assert a.cmd("put", seeds=seeds) == 2
    assert b.cmd("put", seeds=seeds) == 0  # A published first: its descriptors stay
    a_entry = c.cmd("raw_get", seed=901)
    assert b.cmd("fetch", seeds=[901])["ok"] == [False]  # B finds A stuck...
    assert b.cmd("put", seeds=seeds) == 2                 # ...and its own copies replace A's entries
    assert c.cmd("raw_get", seed=901) != a_entry
    t0 = time.monotonic()
    got = c.cmd("fetch", seeds=seeds)                     # C never talked to A: it is sent to B
    assert got == {"ok": [True, True], "exact": [True, True]}, got
    assert time.monotonic() - t0 < 2.0
    assert b.served("blocks_served", 2) == 2


def test_a_store_restarted_at_once_is_published_again(nodes):
    a = nodes("a")
    b = nodes("b")
    seeds = [1001, 1002, 1003]
    assert a.cmd("put", seeds=seeds) == 3
    a.kill()
    a2 = nodes("a")  # the same store file at once, on a new port
    assert a2.port != a.port
    deadline = time.monotonic() + 20
    while b.cmd("prefix", seeds=seeds) != 3:
        assert time.monotonic() < deadline, ("the restarted store's blocks were never published",
                                             a2.cmd("info")["stats"])
        time.sleep(0.3)
    got = b.cmd("fetch", seeds=seeds)
    assert got == {"ok": [True] * 3, "exact": [True] * 3}, got
    assert a2.served("blocks_served", 3) == 3


def test_a_publish_refused_for_a_killed_owners_names_is_retried(nodes):
    a, b, c = nodes("a"), nodes("b"), nodes("c")
    seeds = [1101, 1102, 1103]
    assert a.cmd("put", seeds=seeds) == 3
    a.kill()
    b.cmd("put", seeds=seeds)  # at once: the master may still hold A's names (a failed get or upsert)
    deadline = time.monotonic() + 20
    while c.cmd("prefix", seeds=seeds) != 3:
        assert time.monotonic() < deadline, ("B's blocks were never published", b.cmd("info")["stats"])
        time.sleep(0.3)
    assert c.cmd("fetch", seeds=seeds) == {"ok": [True] * 3, "exact": [True] * 3}


def test_a_node_restarted_at_once_under_its_own_endpoint_is_told_why(nodes):
    """Killed, the node's registration stays with the metadata server until the master drops it: a new
    process under the same endpoint at once does not start, and says why and what to do in one line."""
    a = nodes("a")
    a.kill()
    with pytest.raises(RuntimeError, match="exited"):
        nodes("a-again", port=a.port)
    err = open(a.err.name.replace("a.err", "a-again.err")).read()
    assert "still registered by a node that ended without closing" in err and "another cluster_port" in err
    assert nodes("a-elsewhere").cmd("info")  # under another endpoint at once: starts


def test_a_second_live_node_under_the_same_endpoint_is_refused_in_one_line(nodes):
    a = nodes("a")
    with pytest.raises(RuntimeError, match="exited"):
        nodes("a-twin", port=a.port)
    err = open(a.err.name.replace("a.err", "a-twin.err")).read()
    assert "another live node is registered as" in err and "cluster_host:cluster_port" in err
    assert a.cmd("info")  # the first one unharmed

