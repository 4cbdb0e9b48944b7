"""cluster_replicas: at most R nodes keep a block — its first holder and the winners of R - 1 claims
that Mooncake's master arbitrates (tutti/cluster/claims.py); a node that won none uses what it fetched
and drops it."""
import time

SEEDS = list(range(9001, 9009))


def _wait(fn, seconds=5.0):
    deadline = time.monotonic() + seconds
    while not fn():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)


def test_two_replicas_one_claim_arbitrated_by_the_master(nodes):
    env = {"NODE_REPLICAS": "2"}
    a, b, c = nodes("a", env=env), nodes("b", env=env), nodes("c", env=env)
    assert a.cmd("put", seeds=SEEDS) == 8
    got_b = b.cmd("replicate", seeds=SEEDS)
    assert got_b["ok"] == [True] * 8 and got_b["exact"] == [True] * 8
    assert got_b["transient"] == []                              # b won the one claim of every block
    got_c = c.cmd("replicate", seeds=SEEDS)
    assert got_c["ok"] == [True] * 8 and got_c["exact"] == [True] * 8   # c still gets exact blocks
    assert got_c["transient"] == SEEDS                           # but a and b already keep two copies
    assert c.cmd("drop", seeds=SEEDS) == 8
    assert c.cmd("holds", seeds=SEEDS) == [False] * 8
    st_b, st_c = b.cmd("info")["stats"], c.cmd("info")["stats"]
    assert st_b["replicas_claimed"] == 8 and st_b.get("replicas_declined", 0) == 0
    assert st_c["replicas_declined"] == 8 and st_c["replicas_dropped"] == 8
    # c's dropped copies were never published: a peer looking up still finds a holder, and gets exact bytes.
    d = nodes("d", env=env)
    assert d.cmd("prefix", seeds=SEEDS) == 8
    assert d.cmd("fetch", seeds=SEEDS)["exact"] == [True] * 8
    # b leaves: its claims go with it, and the next node to fetch takes them.
    b.close()
    got_d = d.cmd("replicate", seeds=SEEDS)
    assert got_d["exact"] == [True] * 8 and got_d["transient"] == []


def test_one_replica_keeps_only_the_first_holder(nodes):
    env = {"NODE_REPLICAS": "1"}
    a, b = nodes("a", env=env), nodes("b", env=env)
    a.cmd("put", seeds=SEEDS[:4])
    got = b.cmd("replicate", seeds=SEEDS[:4])
    assert got["exact"] == [True] * 4 and got["transient"] == SEEDS[:4]
    assert b.cmd("info")["stats"].get("replicas_claimed", 0) == 0


def test_a_claim_is_released_when_its_copy_is_evicted(nodes):
    env = {"NODE_REPLICAS": "2"}
    a = nodes("a", env=env)
    b = nodes("b", env={**env, "NODE_SLOTS": "8"})
    c = nodes("c", env=env)
    a.cmd("put", seeds=SEEDS)
    assert b.cmd("replicate", seeds=SEEDS)["transient"] == []
    b.cmd("put", seeds=list(range(9101, 9104)))                  # evicts 3 of b's copies
    _wait(lambda: b.cmd("info")["stats"].get("replicas_released", 0) == 3)
    got = c.cmd("replicate", seeds=SEEDS)                        # those 3 claims are free again
    assert got["exact"] == [True] * 8 and len(got["transient"]) == 5


def test_a_kept_copy_is_published_once_its_first_holder_is_gone(nodes):
    """Every node keeps what it fetched (no limit): a block stays findable while any node holds it.  B's
    copies are backups while A's descriptors hold their names; A leaves, and B publishes them."""
    a, b = nodes("a"), nodes("b")
    a.cmd("put", seeds=SEEDS)
    assert b.cmd("replicate", seeds=SEEDS)["exact"] == [True] * 8
    c = nodes("c")
    a.close()                                                     # withdraws its descriptors
    _wait(lambda: c.cmd("prefix", seeds=SEEDS) == 8)
    assert b.cmd("info")["stats"]["adopted"] == 8
    assert c.cmd("fetch", seeds=SEEDS)["exact"] == [True] * 8    # from B


def test_a_dead_first_holder_is_replaced_by_a_claimer(nodes):
    env = {"NODE_REPLICAS": "2"}
    a, b, c = nodes("a", env=env), nodes("b", env=env), nodes("c", env=env)
    a.cmd("put", seeds=SEEDS)
    assert b.cmd("replicate", seeds=SEEDS)["transient"] == []
    a.kill()                                                      # its entries go with its segment
    _wait(lambda: b.cmd("info")["stats"].get("adopted", 0) == 8, seconds=15)   # after the master's client_ttl
    assert c.cmd("prefix", seeds=SEEDS) == 8
    assert c.cmd("fetch", seeds=SEEDS)["exact"] == [True] * 8


def test_a_lost_copy_is_made_again_by_the_next_fetcher(nodes):
    """R = 2, first holder A and claimer B; A dies.  B adopts A's names and, now their holder, gives up
    its claims: the next fetcher C wins them and keeps its copies, so the blocks are on two nodes
    again (re-replication at the next fetch; without the release C's copies would all be transient)."""
    env = {"NODE_REPLICAS": "2"}
    a, b, c = nodes("a", env=env), nodes("b", env=env), nodes("c", env=env)
    a.cmd("put", seeds=SEEDS)
    assert b.cmd("replicate", seeds=SEEDS)["transient"] == []
    a.kill()
    _wait(lambda: b.cmd("info")["stats"].get("replicas_released", 0) == 8, seconds=20)
    assert b.cmd("info")["stats"]["adopted"] == 8
    got = c.cmd("replicate", seeds=SEEDS)
    assert got["exact"] == [True] * 8 and got["transient"] == []
    assert c.cmd("holds", seeds=SEEDS) == [True] * 8 and b.cmd("holds", seeds=SEEDS) == [True] * 8
    d = nodes("d", env=env)                                       # two copies again: D keeps none
    assert d.cmd("replicate", seeds=SEEDS)["transient"] == SEEDS


def test_the_ranks_of_a_tp_engine_claim_as_one(nodes):
    """Two TP = 2 engines, B and C, fetch A's blocks at once, their ranks interleaved (B's rank 0, then
    C's ranks, then B's rank 1): with one claim to win per block, every rank of one engine wins it. Per-rank
    claims would give B rank 0's shard and C rank 1's: a block neither engine can serve."""
    def rank(name, r, group):
        return nodes(f"{name}{r}", env={"NODE_REPLICAS": "2", "NODE_TP": f"{r}/2", "NODE_GROUP": group})
    a = [rank("a", r, "a") for r in range(2)]
    b = [rank("b", r, "b") for r in range(2)]
    c = [rank("c", r, "c") for r in range(2)]
    for n in a:
        assert n.cmd("put", seeds=SEEDS) == 8
    got = {}
    for name, n in (("b0", b[0]), ("c0", c[0]), ("c1", c[1]), ("b1", b[1])):
        got[name] = n.cmd("replicate", seeds=SEEDS)
        assert got[name]["exact"] == [True] * 8, name
    assert got["b0"]["transient"] == [] and got["b1"]["transient"] == [], "a rank of B lost its engine's claim"
    assert got["c0"]["transient"] == SEEDS and got["c1"]["transient"] == SEEDS
    for n in c:
        assert n.cmd("drop", seeds=SEEDS) == 8
    assert [n.cmd("holds", seeds=SEEDS) for n in b] == [[True] * 8] * 2
