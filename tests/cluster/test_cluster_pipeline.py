"""The pipelined fetch: several batches in flight per owner, the owner reading the next batch while it
sends one; every block still verified against its owner's checksum, every wait still bounded."""
import time


def test_many_batches_from_two_owners_arrive_byte_exact(nodes):
    # 8 blocks a batch, 3 batches in flight: 37 blocks of A (5 batches) and 21 of B (3) in one fetch.
    a, b = nodes("a"), nodes("b")
    c = nodes("c", env={"NODE_INFLIGHT": "3"})
    sa, sb = list(range(1000, 1037)), list(range(2000, 2021))
    assert a.cmd("put", seeds=sa) == len(sa)
    assert b.cmd("put", seeds=sb) == len(sb)
    seeds = [s for pair in zip(sa, sb) for s in pair] + sa[len(sb):]  # owners mixed in one fetch
    got = c.cmd("fetch", seeds=seeds)
    assert got["ok"] == [True] * len(seeds) and got["exact"] == [True] * len(seeds)
    st = c.cmd("info")["stats"]
    assert st["remote_hits"] == len(seeds) and st.get("misses_timeout", 0) == 0
    assert a.served("blocks_served", len(sa)) == len(sa)
    assert b.served("blocks_served", len(sb)) == len(sb)


def test_owners_sending_several_batches_at_once_deliver_each_byte_exact(nodes):
    # 3 senders per owner (what 12+ CPUs get by default; CI's 2 get 1): batches of 8 leave A and B
    # concurrently into C's 4 landing slots, evicted blocks split A's batches into several transfers.
    a, b = nodes("a", env={"NODE_SENDS": "3"}), nodes("b", env={"NODE_SENDS": "3"})
    c = nodes("c")
    sa, sb = list(range(4000, 4045)), list(range(5000, 5030))
    assert a.cmd("put", seeds=sa) == len(sa)
    assert b.cmd("put", seeds=sb) == len(sb)
    gone = sa[3::7]
    a.cmd("evict", seeds=gone)           # stale descriptors: not served, the runs around them are
    seeds = sa + sb
    got = c.cmd("fetch", seeds=seeds)
    want = [s not in gone for s in seeds]
    assert got["ok"] == want and got["exact"] == want, got
    st = c.cmd("info")["stats"]
    assert st["remote_hits"] == len(seeds) - len(gone) and st["misses_stale"] == len(gone)
    assert st.get("misses_timeout", 0) == 0 and st.get("misses_corrupt", 0) == 0


def test_a_node_busy_serving_still_gets_its_own_answers(nodes):
    # A holds each answer 3 s (its sender is busy); its dispatcher must still take C's answer to A's own
    # fetch at once: serving never blocks the thread that delivers replies.
    a = nodes("a", env={"TUTTI_CLUSTER_FAULTS": "serve_delay_s=3"})
    b, c = nodes("b"), nodes("c")
    a.cmd("put", seeds=[3001, 3002])
    c.cmd("put", seeds=[3101, 3102, 3103])
    b.send("fetch", seeds=[3001, 3002])      # A is now serving B, slowly
    time.sleep(0.5)
    t0 = time.monotonic()
    got = a.cmd("fetch", seeds=[3101, 3102, 3103])
    assert got["ok"] == [True] * 3 and got["exact"] == [True] * 3
    assert time.monotonic() - t0 < 2.0, "A's own fetch waited for A's serving"
    slow = b.read(timeout=20)["ok"]
    assert slow["ok"] == [True, True] and slow["exact"] == [True, True]


def test_a_late_answer_never_changes_a_later_fetch(nodes):
    # A's first answer comes 3 s late; B gives up after 2 s (a miss), then fetches again at once with its
    # only landing slot still targeted by A's late write: the slot is reused, the late write lands in it
    # first, and the second fetch's blocks are still exactly A's (checked on B's copy, not the slot).
    a = nodes("a", env={"TUTTI_CLUSTER_FAULTS": "serve_delay_first_s=3"})
    b = nodes("b", env={"NODE_FETCH_TIMEOUT": "2", "NODE_INFLIGHT": "1", "NODE_QUARANTINE": "0"})
    a.cmd("put", seeds=[4001, 4002, 4003])
    t0 = time.monotonic()
    first = b.cmd("fetch", seeds=[4001, 4002])
    assert first["ok"] == [False, False]
    assert time.monotonic() - t0 < 2 + 1.5, "a timed-out batch must end the wait"
    second = b.cmd("fetch", seeds=[4003, 4002], timeout=20)
    assert second["ok"] == [True, True] and second["exact"] == [True, True]
    st = b.cmd("info")["stats"]
    assert st["misses_timeout"] == 2 and st["landing_reused_late"] == 1
    deadline = time.monotonic() + 10
    while b.cmd("info")["stats"].get("late_answers", 0) < 1:   # A's late answer came and was dropped
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert b.cmd("fetch", seeds=[4001])["exact"] == [True]


def test_an_owner_that_timed_out_is_not_asked_again_in_the_same_fetch(nodes):
    # 6 batches for A, 2 in flight, each held 30 s: the fetch ends after one timeout, not six.
    a = nodes("a", env={"TUTTI_CLUSTER_FAULTS": "serve_delay_s=30"})
    b = nodes("b", env={"NODE_FETCH_TIMEOUT": "2", "NODE_INFLIGHT": "2", "NODE_BATCH": "2"})
    seeds = list(range(5001, 5013))
    a.cmd("put", seeds=seeds)
    t0 = time.monotonic()
    got = b.cmd("fetch", seeds=seeds, timeout=30)
    assert got["ok"] == [False] * len(seeds)
    assert time.monotonic() - t0 < 2 + 3
    assert b.cmd("info")["stats"]["misses_timeout"] == len(seeds)
    a.kill()
