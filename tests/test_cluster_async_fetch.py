"""cluster_fetch async: a request whose blocks peers hold waits for them (vLLM asks again each step)
while other requests' steps go on; the workers fetch on a thread of their own and report it.

The scheduler and worker sides are driven as vLLM drives them, with stand-ins for Mooncake (the
real thing: tests/vllm/test_vllm_cluster.py)."""
import threading
import time
from types import SimpleNamespace as NS

import pytest

from tutti.cluster.config import ClusterConfig
from tutti.errors import ClusterError
from tutti.vllm.config import ModelShape, TuttiConfig
from tutti.vllm.metadata import BlockTransfer, SlotEvent, TuttiMetadata, TuttiWorkerMeta
from tutti.vllm.scheduler import SchedulerSide
from tutti.vllm.stats import TuttiStats

BS = 16


def _sched(tmp_path, tp=1, wait_s=30.0, held=None):
    cfg = TuttiConfig.from_extra({"path": str(tmp_path / "kv.img")})
    shape = ModelShape(model_id="tests/async-fetch", dtype="float16", n_layers=4, kv_heads=2, head_dim=16,
                       block_size=BS, tp_size=tp)
    s = SchedulerSide(cfg, shape, NS(cache_config=NS(prefix_caching_hash_algo="sha256")), TuttiStats())
    s.cfg.cluster = ClusterConfig(fetch_wait_s=wait_s)
    s.fetch_async = True
    asked = []

    def remote_prefix(snapshots, keys, owners=None):
        asked.append(len(keys))
        return len(keys) if held is None else min(held, len(keys))
    s.cluster = NS(remote_prefix=remote_prefix, close=lambda: None)
    return s, asked


def _req(name, n_blocks):
    return NS(request_id=name, num_prompt_tokens=n_blocks * BS + 1,
              block_hashes=[f"{name}-h{i}".encode() for i in range(n_blocks)])


def _step(s, **worker_meta):
    """One step: the metadata built, then the workers' answer taken in."""
    empty = NS(req_ids=[], new_block_ids=[], num_computed_tokens=[], resumed_req_ids=set())
    meta = s.build_connector_meta(NS(total_num_scheduled_tokens=0, finished_req_ids=set(), preempted_req_ids=set(),
                                     scheduled_new_reqs=[], scheduled_cached_reqs=empty,
                                     num_scheduled_tokens={}))
    s.update_connector_output(NS(finished_sending=None, kv_connector_worker_meta=TuttiWorkerMeta(**worker_meta)))
    return meta


def _arrived(s, req, rank=0, n=None):
    keys = [s.key(h) for h in req.block_hashes[:n]]
    return {"events": [SlotEvent(rank, 100 + i, k) for i, k in enumerate(keys)],
            "fetched": [(rank, req.request_id)]}


def test_a_remote_hit_waits_for_its_fetch_then_loads_as_a_remote_hit(tmp_path):
    s, asked = _sched(tmp_path)
    req = _req("r", 10)
    assert s.get_num_new_matched_tokens(req, 0) == (None, False)     # not known yet: vLLM skips it
    meta = _step(s)
    assert [(t.req_id, len(t.keys), t.remote) for t in meta.fetches] == [("r", 10, 10)]
    assert s.get_num_new_matched_tokens(req, 0) == (None, False)     # still fetching: no second order
    assert _step(s).fetches == [] and asked == [10]
    _step(s, **_arrived(s, req))                                      # the worker's fetch is done
    tokens, is_async = s.get_num_new_matched_tokens(req, 0)
    assert (tokens, is_async) == (10 * BS, False)                    # now a local hit, loaded in the step
    s.update_state_after_alloc(req, NS(get_block_ids=lambda: [list(range(11))]), tokens)
    assert s.stats.data["remote_hit_tokens"] == 10 * BS              # still counted as from peers
    assert s.stats.data["fetch_requests"] == 1 and s.stats.data["fetch_asked_blocks"] == 10
    load = _step(s).loads
    assert [(t.req_id, len(t.keys)) for t in load] == [("r", 10)] and asked == [10]


def test_blocks_that_did_not_arrive_are_recomputed_and_peers_are_not_asked_again(tmp_path):
    s, asked = _sched(tmp_path)
    req = _req("r", 8)
    assert s.get_num_new_matched_tokens(req, 0)[0] is None
    _step(s)
    _step(s, **_arrived(s, req, n=3))                                 # 3 of 8 arrived
    assert s.get_num_new_matched_tokens(req, 0) == (3 * BS, False)
    assert s.get_num_new_matched_tokens(req, 0) == (3 * BS, False)   # asked again: no new fetch
    assert asked == [8] and s.stats.data["fetch_requests"] == 1


def test_a_fetch_that_outlasts_cluster_fetch_wait_s_is_given_up(tmp_path):
    s, asked = _sched(tmp_path, wait_s=0.05)
    req = _req("r", 4)
    assert s.get_num_new_matched_tokens(req, 0)[0] is None
    _step(s)
    time.sleep(0.1)
    assert s.get_num_new_matched_tokens(req, 0) == (0, False)        # served now, recomputed
    assert s.stats.data["fetch_timeouts"] == 1
    _step(s, **_arrived(s, req))                                      # arrives late: a local block now
    assert s.get_num_new_matched_tokens(req, 0) == (4 * BS, False) and asked == [4]


def test_with_tp_every_rank_must_report_its_fetch(tmp_path):
    s, _ = _sched(tmp_path, tp=2)
    req = _req("r", 4)
    assert s.get_num_new_matched_tokens(req, 0)[0] is None
    _step(s)
    _step(s, **_arrived(s, req, rank=0))
    assert s.get_num_new_matched_tokens(req, 0)[0] is None           # rank 1 still fetching
    _step(s, **_arrived(s, req, rank=1))
    assert s.get_num_new_matched_tokens(req, 0) == (4 * BS, False)


def test_a_request_finished_while_waiting_leaves_nothing_behind(tmp_path):
    s, _ = _sched(tmp_path)
    req = _req("r", 4)
    assert s.get_num_new_matched_tokens(req, 0)[0] is None
    assert s.request_finished(req) == (False, None)
    assert s.fetching == {}
    _step(s, **_arrived(s, req))                                      # the late report is ignored
    assert s.fetching == {}


def test_nothing_held_by_peers_means_no_wait(tmp_path):
    s, asked = _sched(tmp_path, held=0)
    assert s.get_num_new_matched_tokens(_req("r", 4), 0) == (0, False)
    assert _step(s).fetches == [] and asked == [4]


def test_cluster_fetch_is_checked():
    assert ClusterConfig.from_extra_config({"cluster_fetch": "step"}).fetch == "step"
    with pytest.raises(ClusterError, match="cluster_fetch"):
        ClusterConfig.from_extra_config({"cluster_fetch": "later"})
    with pytest.raises(ClusterError, match="cluster_fetch_wait_s"):
        ClusterConfig.from_extra_config({"cluster_fetch_wait_s": 0})


class _SlowCluster:
    """A worker's cluster node whose fetch takes until ``go`` is set; blocks land in the store."""

    def __init__(self, store, go):
        self.store, self.go, self.calls = store, go, []
        self.cfg = NS(call_timeout_s=0.5)

    def fetch(self, keys, wanted_by=(), owners=None):
        self.calls.append(list(keys))
        self.go.wait(10)
        for k in keys:
            self.store.put(k, bytes(self.store.block_bytes))
        self.gone = ["10.0.0.9:17001"]   # a peer this fetch found stuck (not asked here)
        return [True] * len(keys)

    gone: list = []

    def take_unreachable(self):
        out, self.gone = self.gone, []
        return out

    def publish(self, keys):
        pass

    def note_loaded(self, keys, req_id):  # no transient copies here (cluster_replicas unset)
        pass

    def wait_for(self, keys, req_id):
        pass

    def kept(self, keys):
        pass

    def forget(self, req_ids):
        pass

    def drop_used(self):
        return []

    def close(self):
        self.go.set()


def test_the_worker_fetches_on_its_own_thread_and_reports_it(tmp_path):
    from tutti.store import Store
    from tutti.vllm.worker import WorkerSide

    torch = pytest.importorskip("torch")
    shape = ModelShape(model_id="tests/async-fetch", dtype="float16", n_layers=2, kv_heads=2, head_dim=16,
                       block_size=BS, tp_size=1)
    w = WorkerSide(TuttiConfig.from_extra({"path": str(tmp_path / "w.img"), "capacity": "4MiB"}), shape, 0,
                   TuttiStats())
    kv = {f"model.layers.{i}.self_attn.attn": torch.zeros(2, 8, BS, 2, 16, dtype=torch.float16) for i in range(2)}
    w.register_kv_caches(kv, 8)
    go = threading.Event()
    w.cluster = _SlowCluster(w.store, go)
    keys = [b"k%d" % i for i in range(4)]
    assert isinstance(w.store, Store)
    meta = TuttiMetadata(fetches=[BlockTransfer("r", keys, [], remote=3)], step=1)
    t0 = time.perf_counter()
    w.queue_fetches(meta)
    w.queue_fetches(meta)                       # the same step's metadata again: one fetch
    assert time.perf_counter() - t0 < 1         # the step did not wait
    m = w.take_worker_meta()
    assert m is None or not m.fetched           # not done before its blocks are here
    go.set()
    deadline = time.monotonic() + 10
    got = None
    while time.monotonic() < deadline:
        m = w.take_worker_meta()
        if m is not None and m.fetched:
            got = m
            break
        time.sleep(0.01)
    assert got is not None and got.fetched == [(0, "r")]
    assert got.unreachable == ["10.0.0.9:17001"] or w.take_worker_meta().unreachable == ["10.0.0.9:17001"]
    assert w.cluster.calls == [keys[1:]]        # only the remote ones, once
    assert sorted(e.key for e in got.events) == sorted(keys[1:])   # the scheduler's index learns of them
    assert w.stats.data["remote_blocks"] == 3
    assert 0 < w.stats.data["remote_fetch_s"] < time.perf_counter() - t0   # the fetch's time, counted
    w.close()
    assert w._fetch_thread is None


def test_blocks_a_fetch_brought_are_not_priced_as_a_fetch_again(tmp_path):
    """The planner let the fetch go (fetches measured fast); by the time the blocks arrived the measured
    fetch rate had fallen. The fetch is paid: the blocks are local and loaded, not cut as if they were
    still to be fetched."""
    from tutti.sched.online import MIN_SAMPLES, WINDOW

    s, _ = _sched(tmp_path)
    bb = s.shape.block_bytes_per_rank()
    for _ in range(MIN_SAMPLES):
        s.planner.observe_load(10 * bb, 10 * bb / 20e9, stall_s=1.0)    # fast local loads
        s.planner.observe_step(1000, 1000 * 1e-4)                       # 1.6 ms to compute a block
        s.planner.observe_fetch(10 * bb, 10 * bb / 20e9)                # fetches fast: fetching pays
    req = _req("r", 10)
    assert s.get_num_new_matched_tokens(req, 0) == (None, False)
    assert [t.remote for t in _step(s).fetches] == [10]
    for _ in range(WINDOW):
        s.planner.observe_fetch(bb, bb / 1e6)                           # now 8 ms a block: would not pay
    assert s.planner.blocks_to_load(10, 10 * BS + 1, remote_blocks=10) == 0
    _step(s, **_arrived(s, req))
    assert s.get_num_new_matched_tokens(req, 0) == (10 * BS, False)
