"""The scheduler side never offers a save of KV computed over a block that failed to load.

Scheduler outputs are built by hand in the shape vLLM 0.32 hands them to the connector
(new requests with their block tables, running requests with appended blocks, the tokens
computed before the step and scheduled in it).  The case of issue 12: with async scheduling,
step N loads R's prefix (one block fails) and computes R's next blocks; step N+1 is scheduled
before N's output is processed, continuing R and starting Q, which shares R's prefix blocks
through vLLM's prefix cache.  The failure of step N arrives after N+1 was built.
"""
from types import SimpleNamespace as NS

from tutti.vllm.config import ModelShape, TuttiConfig
from tutti.vllm.metadata import LoadFailure, TuttiWorkerMeta
from tutti.vllm.scheduler import SchedulerSide
from tutti.vllm.stats import TuttiStats
from tutti.vllm.taint import KVTaint

BS = 16


def new(req_id, table, computed):
    return NS(req_id=req_id, block_ids=(list(table),), num_computed_tokens=computed)


def output(new_reqs=(), cached=(), sched=None, finished=(), copies=()):
    """cached: (req_id, new block ids, computed before, resumed)."""
    return NS(scheduled_new_reqs=list(new_reqs),
              scheduled_cached_reqs=NS(req_ids=[c[0] for c in cached],
                                       resumed_req_ids={c[0] for c in cached if c[3]},
                                       new_block_ids=[(list(c[1]),) if c[1] else None
                                                      for c in cached],
                                       num_computed_tokens=[c[2] for c in cached]),
              num_scheduled_tokens=dict(sched or {}), finished_req_ids=set(finished),
              preempted_req_ids=set(), kv_connector_block_state=None,
              kv_cache_block_copies=[NS(src_block_id=s, dst_block_id=d) for s, d in copies])


R_TABLE = list(range(100, 112))   # R: 12 blocks; 0..4 loaded, 5..9 computed in step 1
Q_TABLE = R_TABLE[:5] + [200, 201]  # Q shares R's first 5 blocks (vLLM prefix cache)


def test_taint_follows_a_failed_block_through_the_steps_built_before_it_was_known():
    evicted = set()
    t = KVTaint(BS, evict=lambda ids: evicted.update(ids) or True)
    # Step 1: R had 5 blocks loaded (80 tokens computed) and computes 80..160.
    assert t.observe(1, output([new("R", R_TABLE[:10], 80)], sched={"R": 80})) == set()
    # Step 2 (built before step 1's output): R goes on to 192, Q starts after the shared prefix.
    assert t.observe(2, output([new("Q", Q_TABLE, 80)], [("R", R_TABLE[10:12], 160, False)],
                               sched={"R": 32, "Q": 32})) == set()
    # Step 1's output: block 2 of R (id 102) failed to load.
    assert t.fail(1, [102])
    assert t.bad == {102} | set(R_TABLE[5:12]) | {200, 201}
    assert evicted == t.bad  # none of them can be found by its hash any more
    assert t.first_bad("R") == 2 and t.first_bad("Q") == 2
    # Step 3: vLLM truncated R to block 2 and recomputes it; Q goes on (it attends over 200, 201).
    unsound = t.observe(3, output(cached=[("R", [], 32, False), ("Q", [], 112, False)],
                                  sched={"R": 160, "Q": 1}))
    assert unsound == {"Q"}
    assert t.first_bad("R") is None  # rewritten from a sound context: good again
    assert t.bad == {200, 201}
    # Q finishes: its blocks leave every live table and were evicted: forgotten.
    t.drop("Q")
    assert t.bad == set()


def test_a_copy_of_a_bad_block_is_bad_and_a_sound_rewrite_clears_it():
    t = KVTaint(BS, evict=lambda ids: True)
    t.observe(1, output([new("A", [1, 2, 3], 32)], sched={"A": 16}))  # 1, 2 loaded
    t.fail(1, [2])
    assert t.bad == {2, 3}
    # B partly hits block 3's prefix: vLLM copies 3 into B's private block 9 (copy-on-write).
    unsound = t.observe(2, output([new("B", [1, 2, 9], 40)], sched={"B": 8}, copies=[(3, 9)]))
    assert unsound == {"B"} and 9 in t.bad
    # A fresh request that reuses block 2 from its first token writes it soundly.
    t.drop("A")
    t.drop("B")
    t.observe(3, output([new("C", [5, 2], 16)], sched={"C": 16}))
    assert 2 not in t.bad


def test_without_eviction_bad_blocks_are_never_forgotten():
    t = KVTaint(BS, evict=None)  # cannot drop them from vLLM's prefix cache: keep them
    t.observe(1, output([new("A", [1, 2], 16)], sched={"A": 16}))
    t.fail(1, [1])
    t.drop("A")
    assert t.bad == {1, 2}


def test_a_failure_older_than_the_history_taints_every_live_table():
    t = KVTaint(BS, evict=lambda ids: True)
    for s in range(1, 70):
        t.observe(s, output(cached=[("A", [s], (s - 1) * BS, False)] if s > 1 else (),
                            new_reqs=[new("A", [0], 0)] if s == 1 else (), sched={"A": BS}))
    assert not t.fail(1, [0])
    assert set(t.tables["A"]) <= t.bad


class Req:
    def __init__(self, req_id, n_blocks):
        self.request_id = req_id
        self.num_prompt_tokens = n_blocks * BS + 1
        self.block_hashes = [f"{req_id}-h{i}".encode() for i in range(n_blocks)]


def scheduler(tmp_path):
    cfg = TuttiConfig.from_extra({"path": str(tmp_path / "kv.img")})
    shape = ModelShape(model_id="tests/taint", dtype="float16", n_layers=2, kv_heads=1,
                       head_dim=16, block_size=BS, tp_size=1)
    vc = NS(cache_config=NS(prefix_caching_hash_algo="sha256"))
    return SchedulerSide(cfg, shape, vc, TuttiStats())


def saved(meta):
    return {t.req_id: [k.split(b"-h")[-1] for k in t.keys] for t in meta.saves}


def test_scheduler_offers_no_unsound_save_and_saves_again_after_recompute(tmp_path):
    s = scheduler(tmp_path)
    evicted = []
    s.kv_cache_manager = NS(evict_blocks=lambda ids: evicted.append(set(ids)))
    r, q = Req("R", 12), Req("Q", 7)
    s.reqs["R"] = NS(request=r, next_save=5, local_tokens=0, retries=0)  # 0..4 were loaded
    m1 = s.build_connector_meta(output([new("R", R_TABLE[:10], 80)], sched={"R": 80}))
    assert saved(m1) == {"R": [b"5", b"6", b"7", b"8", b"9"]}
    from tutti.vllm.scheduler import _ReqState
    s.reqs["Q"] = _ReqState(q)
    s.reqs["Q"].next_save = 5
    m2 = s.build_connector_meta(output([new("Q", Q_TABLE, 80)], [("R", R_TABLE[10:12], 160, False)],
                                       sched={"R": 32, "Q": 32}))
    assert m2.step == 2 and m2.acked == {}
    # Step 1's worker output: block 102 failed; its saves were fenced (unsaved).
    s.update_connector_output(NS(kv_connector_worker_meta=TuttiWorkerMeta(
        failures=[LoadFailure(0, 1, 1, [102])], unsaved=[("R", 5)])))
    assert s.acked == {0: 1} and s.reqs["R"].next_save == 2 and s.reqs["Q"].next_save == 2
    assert set().union(*evicted) >= {102, 200, 201}
    # The same failure resent (the acknowledgement had not reached the worker): taken once.
    s.update_connector_output(NS(kv_connector_worker_meta=TuttiWorkerMeta(
        failures=[LoadFailure(0, 1, 1, [102])])))
    assert s.stats.data["load_failures"] == 1
    # Step 3: R recomputes from block 2 (sound: its blocks 2..11 are saved), Q is unsound.
    m3 = s.build_connector_meta(output(cached=[("R", [], 32, False), ("Q", [], 112, False)],
                                       sched={"R": 160, "Q": 1}))
    assert m3.acked == {0: 1}
    assert saved(m3) == {"R": [str(i).encode() for i in range(2, 12)]}
    assert s.reqs["Q"].next_save == 2  # kept for when Q's KV is sound again
