"""The cluster tier through the connector (docs/cluster.md), with a real mooncake_master on loopback.

Node A (a vLLM engine, its own process and store) computes the prompts and stores them.  Its engine
then exits (its node withdraws its entries), so an owner process keeps A's store reachable:
``tutti-admin cluster serve``.  Node B (another engine process, its own empty store) answers the same
prompts: the prefix comes from A's store through the cluster, verified, and its outputs equal those
of a run without any connector.  An owner that dies when B's fetch reaches it costs B a recompute,
never a wrong output.
"""
import os
import random
import signal

import pytest

pytest.importorskip("mooncake.store", reason="Mooncake is not installed (pip install 'tutti[cluster]')")

from helpers.mooncake_master import Master
from tutti import Store
from tutti.cluster.local_master import StoreOwner, free_port_pair
from tutti.vllm.cluster import SCHEDULER_PORT_OFFSET
from vllm_engine import TP, run_engine, run_tp, scheduler_stats, tp_ranks, tp_shard, worker_stats


def _port_with_scheduler() -> int:
    return free_port_pair(SCHEDULER_PORT_OFFSET)


def _tp_ports() -> int:
    """cluster_port for a TP engine: rank r's node listens on it + r, the scheduler's on it + 1000."""
    return free_port_pair(SCHEDULER_PORT_OFFSET, run=TP)


@pytest.fixture(scope="module")
def master(tmp_path_factory):
    # client_ttl long: a dead owner's entries outlive it, so B is really sent to it (and gets nothing).
    m = Master(tmp_path_factory.mktemp("master"), client_ttl=60).start()
    yield m
    m.kill()


def cluster_keys(master, port=None):
    # A node's first Mooncake calls pay its first connections (here a first fetch took 11.6 s: the first
    # lookup 1.4 s, the first transfer 5.6 s, the first publish 4.6 s; later ones 0.01-0.02 s), and on a
    # loaded 2-core CI machine a first lookup took over 5 s and a first fetch over 30 s. A call that times
    # out, or a fetch the request stops waiting for, is a miss (recomputed), which the tests that expect a
    # fetch count: calls get 15 s, a request waits up to 120 s for its fetch.
    return {"cluster_master": master.address, "cluster_metadata": master.metadata,
            "cluster_fetch_wait_s": 120,
            "cluster_port": port or _port_with_scheduler(), "cluster_call_timeout_s": 15,
            "cluster_fetch_timeout_s": 4, "cluster_keeper_interval_s": 0.5, "cluster_index_bytes": 16 << 20}


def Owner(tmp, path, master, env=None):
    """A's store served by ``tutti-admin cluster serve`` (its own process), ready."""
    return StoreOwner(tmp, path, master, env=env, options=["cluster_keeper_interval_s=0.5"])


@pytest.fixture(scope="module")
def node_a(vtmp, model, prompts, master):
    """A's store, written by an engine with the cluster on (its node publishes, then leaves)."""
    path = os.path.join(vtmp, "cluster-a", "kv.img")
    res = run_engine(vtmp, "cluster-a", model=model, prompts=prompts, store=path,
                     extra={"capacity": "32MiB", **cluster_keys(master)})
    return path, res


def _blocks(path):
    with Store.open([path], readonly=True, shared=True, engine="psync") as s:
        return s.info()["n_committed"]


def test_node_b_loads_what_node_a_computed(vtmp, model, prompts, baseline, block, master, node_a):
    path_a, res_a = node_a
    assert res_a["outputs"] == baseline
    assert worker_stats(res_a)["save_blocks"] >= len(prompts[0]) // block
    owner = Owner(vtmp, path_a, master)
    try:
        assert owner.blocks == _blocks(path_a)
        path_b = os.path.join(vtmp, "cluster-b", "kv.img")
        res = run_engine(vtmp, "cluster-b", model=model, prompts=prompts, store=path_b,
                         extra={"capacity": "32MiB", **cluster_keys(master)})
    finally:
        assert owner.stop() == 0  # SIGTERM: withdraws and exits 0
    assert res["outputs"] == baseline
    sched, work = scheduler_stats(res), worker_stats(res)
    assert sched["remote_hit_tokens"] >= len(prompts[0]) - block
    assert work["remote_blocks"] * block >= len(prompts[0]) - block
    assert work.get("remote_errors", 0) == 0
    assert work.get("load_errors", 0) == 0 and work.get("corrupt_blocks", 0) == 0
    # The fetched blocks went through B's store (a local replica): loaded from there, verified.
    assert work["load_blocks"] >= work["remote_blocks"]
    assert _blocks(path_b) >= work["remote_blocks"]


def test_one_replica_node_b_uses_what_it_fetched_and_keeps_none(vtmp, model, prompts, baseline, block, master,
                                                                 node_a):
    """cluster_replicas 1: only the first holder keeps a block.  B loads A's blocks through its own
    store (verified), gets the same outputs, then drops every copy: its store ends with only what it
    computed itself."""
    path_a, _ = node_a
    owner = Owner(vtmp, path_a, master)
    try:
        path_b = os.path.join(vtmp, "cluster-b-one-replica", "kv.img")
        res = run_engine(vtmp, "cluster-b-one-replica", model=model, prompts=prompts, store=path_b,
                         extra={"capacity": "32MiB", **cluster_keys(master), "cluster_replicas": 1})
    finally:
        assert owner.stop() == 0
    assert res["outputs"] == baseline
    work = worker_stats(res)
    assert work["remote_blocks"] * block >= len(prompts[0]) - block
    assert work.get("remote_errors", 0) == 0 and work.get("load_errors", 0) == 0
    # Copies go once every request that waited for them loaded them or finished (the last ones at
    # shutdown: vLLM reports a request finished in the next step, and there is none): after it, B's
    # store holds exactly what B computed.
    assert 0 < work["remote_dropped"] <= work["remote_blocks"]
    assert _blocks(path_b) == work.get("save_blocks", 0)


@pytest.mark.parametrize("fetch", ["async", "step"])
def test_owner_killed_before_the_fetch_means_recompute(vtmp, model, prompts, baseline, block, master, node_a, fetch):
    path_a, _ = node_a
    # The owner publishes, then dies (SIGKILL) when B's first fetch request reaches it: B's worker
    # gets nothing within its fetch timeout.
    owner = Owner(vtmp, path_a, master, env={"TUTTI_CLUSTER_FAULTS": "kill_on_serve"})
    try:
        path_b = os.path.join(vtmp, f"cluster-b-dead-owner-{fetch}", "kv.img")
        res = run_engine(vtmp, f"cluster-b-dead-owner-{fetch}", model=model, prompts=prompts, store=path_b,
                         extra={"capacity": "32MiB", **cluster_keys(master), "cluster_fetch": fetch})
    finally:
        owner.kill()
    assert owner.proc.returncode == -signal.SIGKILL
    assert res["outputs"] == baseline
    sched, work = scheduler_stats(res), worker_stats(res)
    assert work.get("remote_blocks", 0) == 0
    assert work["remote_errors"] * block >= len(prompts[0]) - block
    if fetch == "step":
        # Counted as remote hits, fetched inside the step: missing at the load, recomputed.
        assert sched["remote_hit_tokens"] >= len(prompts[0]) - block
        assert work["load_errors"] >= work["remote_errors"]
    else:
        # The request waited for its fetch; nothing arrived, so nothing was promised to vLLM.
        assert sched["fetch_asked_blocks"] * block >= len(prompts[0]) - block
        assert sched.get("remote_hit_tokens", 0) == 0 and work.get("load_errors", 0) == 0


@pytest.mark.parametrize("fetch", ["async", "step"])
def test_a_slow_peer_holds_back_only_its_own_request(vtmp, model, prompts, vocab, baseline, block, master, node_a,
                                                     fetch):
    """The owner answers each batch 2.5 s late. B gets the remote prompt and a cold one at once: with
    cluster_fetch async only the remote prompt waits for its fetch, the cold one's first token does
    not; with step the fetch holds up the step both are in."""
    path_a, _ = node_a
    delay = 2.5
    # A master of its own: the killed owners of the tests above leave entries for A's keys in the
    # module's master until its client_ttl (60 s) expires, and a new owner's entries do not replace them.
    own = Master(os.path.join(vtmp, f"master-slow-{fetch}"), client_ttl=60).start()
    try:
        owner = Owner(vtmp, path_a, own, env={"TUTTI_CLUSTER_FAULTS": f"serve_delay_s={delay}"})
        rng = random.Random(11)
        cold = [rng.randrange(3, vocab) for _ in range(len(prompts[0]))]
        try:
            path_b = os.path.join(vtmp, f"cluster-b-slow-owner-{fetch}", "kv.img")
            res = run_engine(vtmp, f"cluster-b-slow-owner-{fetch}", model=model, prompts=[prompts[0], cold],
                             store=path_b, first_token_times=True,
                             extra={"capacity": "32MiB", **cluster_keys(own), "cluster_fetch": fetch,
                                    "cluster_fetch_timeout_s": 2 * delay + 2})
        finally:
            assert owner.stop() == 0
    finally:
        own.kill()
    remote_s, cold_s = res["first_token_s"]
    work = worker_stats(res)
    seen = (res["first_token_s"], res["stats"])
    print(f"cluster_fetch {fetch}: first token of the remote prompt {remote_s} s, of the cold one {cold_s} s")
    assert work.get("remote_blocks", 0) * block >= len(prompts[0]) - block, seen   # the fetch did succeed
    assert res["outputs"][0] == baseline[0]                           # the fetched prefix, served exact
    assert remote_s >= delay, seen
    if fetch == "async":
        assert cold_s < delay - 0.5 < remote_s, seen
    else:
        assert cold_s >= delay, seen


@pytest.fixture(scope="module")
def tp_master(tmp_path_factory):
    """The TP tests' own master: the owners SIGKILLed by the tests above expire from the module's master
    during them (client_ttl 60 s), and once that stalled it for 48 s (docs/cluster.md#first-fetch)."""
    m = Master(tmp_path_factory.mktemp("tp-master"), client_ttl=60).start()
    yield m
    m.kill()


@pytest.fixture(scope="module")
def tp_node_a(vtmp, model, prompts, tp_master):
    """A TP = 2 engine's store shards, written with the cluster on (its nodes publish, then leave)."""
    path = os.path.join(vtmp, "cluster-tp-a", "kv.img")
    res = run_tp(vtmp, "cluster-tp-a", model=model, prompts=prompts, store=path,
                 extra={"capacity": "32MiB", **cluster_keys(tp_master, _tp_ports())})
    return path, res


def test_tp2_engines_node_b_loads_on_each_rank_what_node_a_computed(vtmp, model, prompts, block, tp_master,
                                                                    tp_node_a):
    """vLLM itself with tensor_parallel_size=2 on both nodes. A's engine computes and stores the
    prompts (each rank its own heads, its own store shard) and exits; an owner per shard keeps them
    reachable. B's ranks each fetch their own heads from the owner of A's shard of the same rank
    (the keys carry the rank) and load them: outputs identical to A's, which recomputed everything."""
    path_a, res_a = tp_node_a
    owners = []
    try:
        for r in range(TP):
            owners.append(Owner(vtmp, tp_shard(path_a, r), tp_master))
        path_b = os.path.join(vtmp, "cluster-tp-b", "kv.img")
        res = run_tp(vtmp, "cluster-tp-b", model=model, prompts=prompts, store=path_b,
                     extra={"capacity": "32MiB", **cluster_keys(tp_master, _tp_ports())})
    finally:
        rcs = [o.stop() for o in owners]
    assert rcs == [0] * TP
    assert res["outputs"] == res_a["outputs"]
    want = len(prompts[0]) - block
    assert scheduler_stats(res)["remote_hit_tokens"] >= want
    for r, work in enumerate(tp_ranks(res)):
        assert work["remote_blocks"] * block >= want, f"rank {r}"
        assert work.get("remote_errors", 0) == 0 and work.get("load_errors", 0) == 0, f"rank {r}"
        assert work["load_blocks"] >= work["remote_blocks"], f"rank {r}"
        assert _blocks(tp_shard(path_b, r)) >= work["remote_blocks"], f"rank {r}"


def test_tp2_an_owner_rank_dying_when_fetched_means_recompute_on_both_ranks(vtmp, model, prompts, block, tp_master,
                                                                          tp_node_a):
    """The owner of A's rank-1 shard dies (SIGKILL) when B's rank 1 asks it for blocks; rank 0's owner
    serves. B's rank 0 gets its heads, rank 1 none: no block is whole on B, so nothing is promised to
    vLLM (cluster_fetch async) and every rank recomputes; outputs identical to A's. (Runs last: the
    dead owner's entries stay in the TP tests' master until its client_ttl.)"""
    path_a, res_a = tp_node_a
    owners = [Owner(vtmp, tp_shard(path_a, 0), tp_master),
              Owner(vtmp, tp_shard(path_a, 1), tp_master, env={"TUTTI_CLUSTER_FAULTS": "kill_on_serve"})]
    try:
        path_b = os.path.join(vtmp, "cluster-tp-b-dead-rank", "kv.img")
        res = run_tp(vtmp, "cluster-tp-b-dead-rank", model=model, prompts=prompts, store=path_b,
                     extra={"capacity": "32MiB", **cluster_keys(tp_master, _tp_ports())})
    finally:
        assert owners[0].stop() == 0
        owners[1].kill()
    assert owners[1].proc.returncode == -signal.SIGKILL
    assert res["outputs"] == res_a["outputs"]
    w0, w1 = tp_ranks(res)
    sched = scheduler_stats(res)
    assert w1.get("remote_blocks", 0) == 0 and w1["remote_errors"] * block >= len(prompts[0]) - block
    assert w0["remote_blocks"] * block >= len(prompts[0]) - block      # rank 0's heads did arrive
    assert sched.get("remote_hit_tokens", 0) == 0                        # but no block was whole on B
    for w in (w0, w1):
        assert w.get("load_errors", 0) == 0 and w.get("corrupt_blocks", 0) == 0
    # Recomputed and saved on both ranks: B's shards end with the same blocks; rank 1 stored them (each
    # counted once, though requests in flight together saved the shared prefix more than once), rank 0
    # had them already.
    assert _blocks(tp_shard(path_b, 0)) == _blocks(tp_shard(path_b, 1)) == w1["save_blocks"] > 0
    assert w0.get("save_blocks", 0) == 0
