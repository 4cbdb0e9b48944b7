"""tutti.cluster.quarantine: a peer that failed a fetch is skipped for a while, then asked again; the
vLLM scheduler learns of it from its workers' metadata."""
from types import SimpleNamespace as NS

from test_cluster_async_fetch import _sched, _step
from tutti.cluster.quarantine import Quarantine


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_skipped_until_its_deadline_then_asked_again():
    clock = Clock()
    q = Quarantine(30, clock=clock)
    assert not q.holds("10.0.0.1:17001")
    q.add("10.0.0.1:17001")
    clock.t += 29.9
    assert q.holds("10.0.0.1:17001") and q.active() == ["10.0.0.1:17001"]
    clock.t += 0.2
    assert not q.holds("10.0.0.1:17001") and q.active() == []


def test_a_second_failure_extends_it_and_is_reported_once():
    clock = Clock()
    q = Quarantine(10, clock=clock)
    q.add("a:1")
    clock.t += 5
    q.add("a:1")   # failed again while skipped (another fetch already under way)
    q.add("b:2")
    assert q.take_new() == ["a:1", "b:2"] and q.take_new() == []
    clock.t += 9
    assert q.holds("a:1")              # 14 s after the first failure, 9 after the second
    clock.t += 2
    assert not q.holds("a:1")
    q.add("a:1")                       # gone again after it was let out: news again
    assert q.take_new() == ["a:1"]


def test_zero_seconds_skips_nothing():
    q = Quarantine(0)
    q.add("a:1")
    assert not q.holds("a:1") and q.take_new() == [] and q.active() == []


def test_the_scheduler_skips_peers_its_workers_found_gone(tmp_path):
    s, _ = _sched(tmp_path)
    s.cluster = NS(remote_prefix=s.cluster.remote_prefix, close=lambda: None, quarantine=Quarantine(30))
    _step(s, unreachable=["127.0.0.1:17005"])
    assert s.cluster.quarantine.holds("127.0.0.1:17005")
    assert not s.cluster.quarantine.holds("127.0.0.1:17006")


class _FakeMooncake:
    """A master that refuses any upsert_batch holding a name in ``refuse`` (as Mooncake refuses names a
    killed node's metadata still holds) and stores the rest."""

    def __init__(self):
        self.kv: dict = {}
        self.refuse: set = set()
        self.batches = 0

    def get_batch(self, names):
        return [self.kv.get(n, b"") for n in names]

    def upsert_batch(self, names, values, cfg):
        self.batches += 1
        if self.refuse & set(names):
            return -704
        self.kv.update(zip(names, values))
        return 0


def _index(make_store):
    import collections
    import threading

    from tutti import Store
    from tutti.cluster.index import ClusterIndex

    store = Store.open(make_store(n_slots=32))
    mc = _FakeMooncake()
    link = NS(store=mc, cfg=NS(endpoint="127.0.0.1:17001"), replicate_here=lambda: None,
              call=lambda fn, *a, what="", timeout_s=None: fn(*a))
    return store, mc, ClusterIndex(store, link, threading.RLock(), collections.Counter())


def test_refused_names_do_not_hold_back_the_rest_and_are_retried(make_store):
    store, mc, idx = _index(make_store)
    keys = [f"k{i}".encode() for i in range(16)]
    for k in keys:
        store.put(k, bytes(store.block_bytes))
    names = [idx.name_of(idx.store_key(k)) for k in keys]
    mc.refuse = {names[3], names[11]}
    assert idx.publish(keys) == 14                      # the other 14 landed
    assert set(mc.kv) == set(names) - mc.refuse
    assert mc.batches <= 1 + 2 * 2 * 4                  # found by halving, not one call per name
    assert idx.retry_publish() == 0                     # still refused: kept
    mc.refuse = set()                                   # the master dropped the dead node's names
    assert idx.retry_publish() == 2 and set(mc.kv) == set(names)
    assert idx.retry_publish() == 0 and idx.stats["published"] == 16
    store.close()


def test_a_master_refusing_everything_costs_a_few_calls_not_one_per_name(make_store):
    from tutti.cluster.index import UPSERT_CALLS

    store, mc, idx = _index(make_store)
    keys = [f"k{i}".encode() for i in range(30)]
    for k in keys:
        store.put(k, bytes(store.block_bytes))
    mc.refuse = {idx.name_of(idx.store_key(k)) for k in keys}
    assert idx.publish(keys) == 0 and mc.batches <= UPSERT_CALLS
    mc.refuse = set()
    assert idx.retry_publish() == 30    # every one kept for the keeper
    store.close()


def test_a_publish_the_master_did_not_answer_is_retried(make_store):
    store, mc, idx = _index(make_store)
    store.put(b"x", bytes(store.block_bytes))
    idx.master_up.clear()                               # lookups (and so publishes) cannot be asked
    assert idx.publish([b"x"]) == 0 and mc.kv == {}
    idx.master_up.set()
    assert idx.retry_publish() == 1 and len(mc.kv) == 1
    store.close()


def test_status_keeps_only_tutti_names():
    from tutti.cluster.status import parse_names

    fp = "ab" * 16
    got = parse_names([f"tutti/v1/{fp}/node/127.0.0.1:17001", f"tutti/v1/{fp}/" + "cd" * 16,
                       "tutti/v1/not-hex/node/x:1", f"tutti/v1/{fp}/short", "someone/else/key", ""])
    assert got == {fp: {"nodes": ["127.0.0.1:17001"], "descriptors": 1}}
