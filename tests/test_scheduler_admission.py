"""Write admission in the scheduler side (write_budget, write_admission): which saves a step offers.

Scheduler outputs are built by hand (the shape of tests/test_scheduler_taint.py) and the budget's
bucket runs on a fake clock.  No store exists, so a block costs what the model's KV shape says:
2 (K, V) x 2 layers x 1 head x 16 dims x 16 tokens x 2 bytes = 2 KiB.
"""
from types import SimpleNamespace as NS

import pytest

from tutti.errors import ConfigError
from tutti.vllm.config import ModelShape, TuttiConfig
from tutti.vllm.metadata import TuttiWorkerMeta
from tutti.vllm.scheduler import SchedulerSide
from tutti.vllm.stats import TuttiStats

BS = 16
BB = 2 * 2 * 1 * 16 * BS * 2
BUCKET_BLOCKS = 10                   # the bucket holds an hour of the budget: 10 blocks
BUDGET = 24 * BUCKET_BLOCKS * BB     # bytes per day
REFILL_S = 3600 / BUCKET_BLOCKS      # seconds the bucket takes to gain one block


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


class Req:
    def __init__(self, req_id, n_blocks, chain=None):
        self.request_id = req_id
        self.num_prompt_tokens = n_blocks * BS + 1
        self.block_hashes = [f"{chain or req_id}-h{i}".encode() for i in range(n_blocks)]


def new(req_id, n_blocks):
    return NS(req_id=req_id, block_ids=(list(range(100 * len(req_id), 100 * len(req_id) + n_blocks + 1)),),
              num_computed_tokens=0)


def output(new_reqs=(), cached=(), sched=None):
    """cached: (req_id, tokens computed before the step)."""
    return NS(scheduled_new_reqs=list(new_reqs),
              scheduled_cached_reqs=NS(req_ids=[c[0] for c in cached], resumed_req_ids=set(),
                                       new_block_ids=[None for _ in cached],
                                       num_computed_tokens=[c[1] for c in cached]),
              num_scheduled_tokens=dict(sched or {}), finished_req_ids=set(), preempted_req_ids=set(),
              kv_connector_block_state=None, kv_cache_block_copies=[])


def scheduler(tmp_path, **extra):
    cfg = TuttiConfig.from_extra({"path": str(tmp_path / "kv.img"), **extra})
    shape = ModelShape(model_id="tests/admission", dtype="float16", n_layers=2, kv_heads=1,
                       head_dim=16, block_size=BS, tp_size=1)
    s = SchedulerSide(cfg, shape, NS(cache_config=NS(prefix_caching_hash_algo="sha256")), TuttiStats())
    clock = Clock()
    if s.admission is not None:
        s.admission.clock, s.admission.last = clock, clock()
    return s, clock


def saved(meta):
    return {t.req_id: [int(k.split(b"-h")[-1]) for k in t.keys] for t in meta.saves}


def prefill(s, reqs):
    """Every request looked up, then one step computing all their prompts."""
    for r in reqs:
        s.get_num_new_matched_tokens(r, 0)
        s.update_state_after_alloc(r, None, 0)
    return s.build_connector_meta(output([new(r.request_id, len(r.block_hashes)) for r in reqs],
                                         sched={r.request_id: r.num_prompt_tokens for r in reqs}))


def test_spent_budget_admits_only_the_saves_worth_most(tmp_path):
    s, clock = scheduler(tmp_path, write_budget=BUDGET)
    assert s.block_bytes() == BB
    # A full bucket: no pressure, A's 8 blocks are offered (2 blocks' bytes left: below half).
    assert saved(prefill(s, [Req("A", 8)])) == {"A": list(range(8))}
    clock.t += 2 * REFILL_S  # 4 blocks in the bucket: still below half
    # C's prefix was asked for by an earlier request too (D, waiting); B's by nobody else.
    s.get_num_new_matched_tokens(Req("D", 3, chain="C"), 0)
    b, c = Req("B", 3), Req("C", 3)
    meta = prefill(s, [b, c])
    assert saved(meta) == {"C": [0, 1, 2]}  # seen before: first; B's 3 blocks no longer fit
    st = s.stats.data
    assert st["save_skipped"] == 3 and st["save_skipped_bytes"] == 3 * BB
    assert st["save_skipped_unseen"] == 3 and st["save_admitted"] == 11
    assert st["admission_pressure_steps"] == 1
    assert st["write_budget_bytes_per_day"] == BUDGET and st["write_budget_left_bytes"] == BB
    # A refused save is not offered again, in the next step or ever: B decodes on.
    assert s.reqs["B"].next_save == 3
    clock.t += 3600
    meta = s.build_connector_meta(output(cached=[("B", b.num_prompt_tokens), ("C", c.num_prompt_tokens)],
                                         sched={"B": 1, "C": 1}))
    assert meta.saves == [] and s.stats.data["save_skipped"] == 3
    # It is not lost data: no error, no drop, and B's blocks are not held when it finishes.
    assert st.get("save_errors", 0) == 0 and st.get("save_dropped", 0) == 0
    assert s.request_finished(b) == (False, None)
    # A save the workers could not commit is offered again, through admission again.
    s.update_connector_output(NS(kv_connector_worker_meta=TuttiWorkerMeta(unsaved=[("C", 0)])))
    assert s.reqs["C"].next_save == 0
    meta = s.build_connector_meta(output(cached=[("C", c.num_prompt_tokens + 1)], sched={"C": 1}))
    assert saved(meta) == {"C": [0, 1, 2]} and s.stats.data["save_admitted"] == 14


def mixed(req_id, shared, own):
    """A request whose first ``shared`` blocks are chain P's (a document), then ``own`` of its own."""
    r = Req(req_id, shared + own)
    r.block_hashes = [f"P-h{i}".encode() for i in range(shared)] + r.block_hashes[shared:]
    return r


def test_a_shared_head_is_saved_without_its_own_tail(tmp_path):
    s, clock = scheduler(tmp_path, write_budget=BUDGET)
    prefill(s, [Req("A", 8)])
    clock.t += 2 * REFILL_S  # 4 blocks
    s.get_num_new_matched_tokens(Req("D", 3, chain="P"), 0)
    meta = prefill(s, [mixed("E", 3, 2)])
    assert saved(meta) == {"E": [0, 1, 2]}
    assert s.stats.data["save_skipped"] == 2 and s.stats.data["save_skipped_unseen"] == 2


def test_a_tail_is_not_saved_after_a_refused_head(tmp_path):
    s, clock = scheduler(tmp_path, write_budget=BUDGET)
    prefill(s, [Req("A", 8)])
    clock.t += 2 * REFILL_S  # 4 blocks: the 5 shared do not fit, the one of E's own would
    s.get_num_new_matched_tokens(Req("D", 5, chain="P"), 0)
    meta = prefill(s, [mixed("E", 5, 1)])
    assert meta.saves == [] and s.stats.data["save_skipped"] == 6


def test_second_hit_never_writes_a_first_sighting_under_pressure(tmp_path):
    s, clock = scheduler(tmp_path, write_budget=BUDGET, write_admission="second_hit")
    prefill(s, [Req("A", 8)])
    clock.t += 2 * REFILL_S
    s.get_num_new_matched_tokens(Req("D", 3, chain="C"), 0)
    assert saved(prefill(s, [Req("B", 1), Req("C", 3)])) == {"C": [0, 1, 2]}  # B fits, but unseen


def test_a_request_looked_up_again_is_one_sighting(tmp_path):
    s, clock = scheduler(tmp_path, write_budget=BUDGET)
    prefill(s, [Req("A", 9)])
    clock.t += 1.5 * REFILL_S  # 2.5 blocks: a first sighting may use 1.25 (the eighth of 10 is kept)
    b, c = Req("B", 1), Req("C", 1)
    for _ in range(3):  # waiting for memory: vLLM asks again every step
        s.get_num_new_matched_tokens(c, 0)
    # One first sighting fits; C is not "seen before" (counted so, it would go first and B not at all).
    assert saved(prefill(s, [b, c])) == {"B": [0]}


def test_policy_all_offers_everything_and_only_counts(tmp_path):
    reqs = lambda: [Req("A", 8), Req("B", 6)]  # noqa: E731
    s, _ = scheduler(tmp_path, write_budget=BUDGET, write_admission="all")
    free, _ = scheduler(tmp_path)
    assert saved(prefill(s, reqs())) == saved(prefill(free, reqs())) == {"A": list(range(8)),
                                                                         "B": list(range(6))}
    st = s.stats.data
    assert st["save_skipped"] == 0 and st["save_admitted"] == 14
    assert st["write_budget_left_bytes"] == (BUCKET_BLOCKS - 14) * BB  # overdrawn: what a budget cuts


def test_no_budget_is_the_unchanged_behaviour(tmp_path):
    s, _ = scheduler(tmp_path)
    assert s.admission is None
    a, b = Req("A", 4), Req("B", 4, chain="A")  # the same blocks, computed in the same step
    meta = prefill(s, [a, b])
    assert saved(meta) == {"A": [0, 1, 2, 3]}  # each key once
    assert not any(s.stats.data.get(k) for k in ("save_admitted", "save_skipped"))
    assert "write_budget_bytes_per_day" not in s.stats.data
    assert not s.reqs["A"].observed


def test_same_blocks_in_two_requests_go_with_the_admitted_one(tmp_path):
    s, clock = scheduler(tmp_path, write_budget=BUDGET)
    prefill(s, [Req("X", 8)])
    clock.t += 4 * REFILL_S  # 6 blocks of 10: no pressure
    meta = prefill(s, [Req("A", 2, chain="B"), Req("B", 2)])
    assert saved(meta) == {"A": [0, 1]}  # both offered: the shared keys once


@pytest.mark.parametrize("extra, word", [
    ({"write_budget": "fast"}, "write_budget: 'fast' is not a write budget"),
    ({"write_budget": "0GB/day"}, "write_budget: .* above zero"),
    ({"write_budget": True}, "write_budget"),
    ({"write_admission": "lru"}, "write_admission: expected one of expected_value, second_hit, all"),
])
def test_bad_admission_options_are_named(extra, word):
    with pytest.raises(ConfigError, match=word):
        TuttiConfig.from_extra(extra)


def test_budget_in_drive_writes_per_day_is_of_the_store_capacity(tmp_path):
    s, _ = scheduler(tmp_path, write_budget="0.5dwpd", capacity="1GiB")
    assert s.admission.rate * 86400 == pytest.approx(0.5 * (1 << 30))
    c = TuttiConfig.from_extra({"write_budget": "10GiB/h", "write_admission": "second_hit"})
    assert c.write_budget == "10GiB/h" and c.write_admission == "second_hit"


def test_later_blocks_wait_behind_a_refused_one_until_it_is_stored(tmp_path):
    s, clock = scheduler(tmp_path, write_budget=BUDGET)
    prefill(s, [Req("A", 8)])
    clock.t += 2 * REFILL_S  # 4 blocks
    f = Req("F", 8)
    s.get_num_new_matched_tokens(f, 0)
    s.update_state_after_alloc(f, None, 0)
    # Chunked prefill: the first chunk (6 blocks) does not fit and is refused.
    assert s.build_connector_meta(output([new("F", 10)], sched={"F": 6 * BS})).saves == []
    clock.t += 3600  # a full bucket again: no pressure
    # The next chunk alone would be found by nobody (blocks 0..5 are not stored): not offered.
    meta = s.build_connector_meta(output(cached=[("F", 6 * BS)], sched={"F": f.num_prompt_tokens - 6 * BS}))
    assert meta.saves == [] and s.stats.data["save_skipped"] == 8
    # Another request stores that prefix (its commit reported): F's blocks after it go again.
    s.update_connector_output(NS(kv_connector_worker_meta=TuttiWorkerMeta(
        events=[NS(rank=0, slot=i, key=s.key(h)) for i, h in enumerate(f.block_hashes[:8])])))
    f.num_prompt_tokens += 2 * BS
    f.block_hashes += [b"F-h8", b"F-h9"]
    meta = s.build_connector_meta(output(cached=[("F", 8 * BS + 1)], sched={"F": 2 * BS}))
    assert saved(meta) == {"F": [8, 9]} and s.reqs["F"].gap is None
