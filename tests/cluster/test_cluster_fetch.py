"""Blocks stored on one node are fetched by another through a real mooncake_master, byte-exact and
verified against the owner's committed checksum; a block that is not exactly that is a miss."""
import time


def test_prefix_stored_on_a_is_fetched_by_b_byte_exact(nodes):
    a, b = nodes("a"), nodes("b")
    assert a.cmd("put", seeds=[1, 2, 3, 4, 5]) == 5
    assert b.cmd("prefix", seeds=[1, 2, 3, 4, 5, 6]) == 5
    got = b.cmd("fetch", seeds=[1, 2, 3, 4, 5, 6])
    assert got["ok"] == [True] * 5 + [False]
    assert got["exact"] == [True] * 5 + [False]
    info = b.cmd("info")["stats"]
    assert info["remote_hits"] == 5 and info["bytes_fetched"] == 5 * b.block_bytes
    assert a.served("blocks_served", 5) == 5
    # A's own blocks are not remote hits for A.
    assert a.cmd("prefix", seeds=[1, 2]) == 0


def test_block_altered_after_the_owner_read_it_is_a_miss(nodes):
    a, b = nodes("a", env={"TUTTI_CLUSTER_FAULTS": "flip_served"}), nodes("b")
    a.cmd("put", seeds=[101, 102, 103])
    got = b.cmd("fetch", seeds=[101, 102, 103])
    assert got["ok"] == [False, True, True], got  # the first block of each answer has one bit flipped
    assert got["exact"] == [False, True, True]
    assert b.cmd("info")["stats"]["misses_corrupt"] == 1


def test_stale_descriptors_are_misses(nodes):
    a, b = nodes("a"), nodes("b")
    a.cmd("put", seeds=[201, 202, 203])
    a.cmd("evict", seeds=[201])          # evicted, not withdrawn: the descriptor is stale
    a.cmd("overwrite", seeds=[202])      # same key stored again with other bytes: another generation
    got = b.cmd("fetch", seeds=[201, 202, 203])
    assert got["ok"] == [False, False, True], got
    assert b.cmd("info")["stats"]["misses_stale"] == 2
    assert a.cmd("info")["stats"]["stale_requests"] == 2
    # Re-publishing replaces A's own stale descriptor: the new generation's bytes are served, verified
    # against the new checksum (they are the overwrite's bytes, not seed 202's block).
    assert a.cmd("put", seeds=[202]) == 1
    again = b.cmd("fetch", seeds=[202])
    assert again == {"ok": [True], "exact": [False]}
    assert a.cmd("withdraw", seeds=[201, 202]) == 2
    assert b.cmd("prefix", seeds=[202]) == 0


def test_blocks_around_a_stale_one_arrive_byte_exact(nodes):
    # The owner sends each run of consecutive good blocks as one transfer: a stale block in the middle
    # of a batch splits it, and every block on either side must still land where it belongs.
    a, b = nodes("a"), nodes("b")
    a.cmd("put", seeds=[211, 212, 213, 214, 215])
    a.cmd("evict", seeds=[212, 214])
    got = b.cmd("fetch", seeds=[211, 212, 213, 214, 215])
    assert got == {"ok": [True, False, True, False, True], "exact": [True, False, True, False, True]}, got
    assert b.cmd("info")["stats"]["misses_stale"] == 2


def test_hostile_values_under_a_block_name_are_rejected(nodes):
    a, b = nodes("a"), nodes("b")
    a.cmd("put", seeds=[301, 302, 303, 304, 305])
    good = bytes.fromhex(b.cmd("raw_get", seed=301))
    bad = {
        302: good[:-1],                                  # truncated: the length check
        303: good[:40] + bytes([good[40] ^ 1]) + good[41:],  # one bit of the fields: the check
        304: good[:4] + b"\x09\x00" + good[6:],          # another version
        305: b"not a descriptor at all",
    }
    for seed, value in bad.items():
        assert b.cmd("raw_put", seed=seed, value=value.hex()) == 0
    assert b.cmd("prefix", seeds=[301, 302]) == 1
    got = b.cmd("fetch", seeds=[301, 302, 303, 304, 305])
    assert got["ok"] == [True, False, False, False, False]
    assert b.cmd("info")["stats"]["rejected"] >= 4
    # A descriptor copied under another block's name names another key: rejected too.
    assert b.cmd("raw_put", seed=302, value=good.hex()) == 0
    assert b.cmd("fetch", seeds=[302])["ok"] == [False]


def test_two_nodes_publishing_the_same_blocks_give_one_answer(nodes):
    a, b, c = nodes("a"), nodes("b"), nodes("c")
    seeds = list(range(401, 409))
    a.send("put", seeds=seeds)
    b.send("put", seeds=seeds)
    assert "error" not in a.read() and "error" not in b.read()
    first = [c.cmd("raw_get", seed=s) for s in seeds]
    assert [c.cmd("raw_get", seed=s) for s in seeds] == first  # one value per block, stable
    got = c.cmd("fetch", seeds=seeds)
    assert got["ok"] == [True] * len(seeds) and got["exact"] == [True] * len(seeds)


def test_a_node_of_another_model_is_never_asked(nodes):
    a, other = nodes("a"), nodes("other", model="m2")
    other.cmd("put", seeds=[501, 502, 503])
    # The same token prefix under m1's keys, and m2's keys asked by an m1 node: both are no one's.
    assert a.cmd("prefix", seeds=[501, 502, 503]) == 0
    assert a.cmd("prefix", seeds=[501, 502, 503], model="m2") == 0
    assert a.cmd("fetch", seeds=[501, 502, 503], model="m2")["ok"] == [False] * 3
    assert other.cmd("info")["stats"].get("blocks_served", 0) == 0


def test_owner_killed_mid_fetch_gives_misses_and_its_entries_go_away(nodes):
    a = nodes("a", env={"TUTTI_CLUSTER_FAULTS": "serve_delay_s=30"})
    b = nodes("b", env={"NODE_FETCH_TIMEOUT": "4", "NODE_QUARANTINE": "0"})  # lookups still ask the master
    a.cmd("put", seeds=[601, 602, 603])
    assert b.cmd("prefix", seeds=[601, 602, 603]) == 3
    t0 = time.monotonic()
    b.send("fetch", seeds=[601, 602, 603])
    time.sleep(1.0)  # A has the request and is "reading"
    a.kill()
    out = b.read(timeout=20)
    assert out["ok"]["ok"] == [False] * 3
    assert time.monotonic() - t0 < 4 + 6  # the fetch timeout, plus slack: never a hang
    # The master drops A's segment (client_ttl 2 s) and its descriptors with it.
    deadline = time.monotonic() + 30
    while b.cmd("prefix", seeds=[601]) != 0:
        assert time.monotonic() < deadline, "a dead node's entries stayed in the index"
        time.sleep(0.5)


def test_fetched_blocks_are_kept_in_chunks_of_one_commit_each(nodes):
    """fetch_into_store (the connector's path): verified blocks are written to the requester's own store
    with one transaction per chunk (not a commit per block), read back exact; a block no peer has is not."""
    a, b = nodes("a"), nodes("b")
    seeds = list(range(7000, 7010))
    assert a.cmd("put", seeds=seeds + [7100]) == len(seeds) + 1
    before = b.cmd("replicate", seeds=[])["flushes"]
    one = b.cmd("replicate", seeds=[7100])                                # one block: one commit's flushes
    assert one["exact"] == [True]
    per_commit = one["flushes"] - before
    assert per_commit >= 1
    got = b.cmd("replicate", seeds=seeds + [7999], chunk_bytes=4 * b.block_bytes)   # 11 keys: 4, 4, 3
    assert got["ok"] == [True] * len(seeds) + [False]
    assert got["exact"] == [True] * len(seeds) + [False]
    assert got["flushes"] - one["flushes"] == 3 * per_commit, (per_commit, got["flushes"] - one["flushes"])
