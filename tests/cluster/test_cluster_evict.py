"""A block the store evicts (LRU, inside libtutti) leaves the cluster index promptly: peers stop finding
it instead of asking for it and being told "stale"."""
import time


def _gone_within(peer, seeds, seconds):
    deadline = time.monotonic() + seconds
    while any(peer.cmd("prefix", seeds=[s]) for s in seeds):
        assert time.monotonic() < deadline, f"evicted blocks {seeds} still in the index after {seconds} s"
        time.sleep(0.2)


def test_blocks_evicted_for_published_ones_are_withdrawn_at_once(nodes):
    a = nodes("a", env={"NODE_SLOTS": "8"})
    b = nodes("b")
    first = list(range(7001, 7009))
    assert a.cmd("put", seeds=first) == 8                     # the store is full
    assert b.cmd("prefix", seeds=first) == 8
    assert a.cmd("put", seeds=[7101, 7102, 7103]) == 3        # evicts the 3 least recently used: 7001-7003
    # Withdrawn by the publish that took their slots, before it returned: no wait.
    assert [b.cmd("prefix", seeds=[s]) for s in first] == [0, 0, 0, 1, 1, 1, 1, 1]
    st = a.cmd("info")["stats"]
    assert st["withdrawn_evicted"] == 3
    got = b.cmd("fetch", seeds=[7004, 7101, 7001])
    assert got["ok"] == [True, True, False] and got["exact"] == [True, True, False]
    assert b.cmd("info")["stats"].get("misses_stale", 0) == 0   # never asked for an evicted block
    # An evicted block stored again (in another evicted slot) is published again and stays.
    assert a.cmd("put", seeds=[7001]) == 1                    # evicts 7004
    assert b.cmd("prefix", seeds=[7001]) == 1 and b.cmd("prefix", seeds=[7004]) == 0
    assert b.cmd("fetch", seeds=[7001])["exact"] == [True]


def test_blocks_evicted_without_a_publish_are_withdrawn_by_the_keeper(nodes):
    a = nodes("a", env={"NODE_SLOTS": "8"})
    b = nodes("b")
    first = list(range(8001, 8009))
    a.cmd("put", seeds=first)
    assert b.cmd("prefix", seeds=first) == 8
    a.cmd("put", seeds=[8101, 8102], publish=False)          # evicts 8001, 8002; nothing published
    _gone_within(b, [8001, 8002], 5)                          # keeper: every 0.5 s in these nodes
    assert b.cmd("prefix", seeds=first[2:]) == 6
    st = a.cmd("info")["stats"]
    assert st["withdrawn_evicted"] == 2 and st["reconciled"] >= 1
    assert b.cmd("fetch", seeds=first[2:])["exact"] == [True] * 6
