"""The slack-aware scheduler: static plans and the online state never mix reads with writes,
never delay a read, and write every layer's new KV exactly once (in slack or deferred to decode)."""
import heapq
import random

import pytest

from tutti.sched import LLAMA3_8B, QWEN25_7B, ComputeProfile, Hardware, ModelShape, ScheduleState, SlackScheduler

PROF = {s.name: ComputeProfile.analytic(s, 989 * 0.5, 4800) for s in (LLAMA3_8B, QWEN25_7B)}
CASES = [(shape, hw, T, h, depth)
         for shape in (LLAMA3_8B, QWEN25_7B)
         for hw in (Hardware.per_ssd(7.0, 4), Hardware.per_ssd(2.5, 1, write_gbps=1.5), Hardware.per_ssd(0.8, 1))
         for T in (4096, 32768, 131072)
         for h in (0.0, 0.5, 0.9, 1.0)
         for depth in (1, 2, 4)]


def _overlap(a, b):
    return a[0] < b[1] - 1e-12 and b[0] < a[1] - 1e-12


def replay(plan, L, io, c, w):
    """Execute io_ops on one serial queue with their waits; compute follows the reads. Returns intervals."""
    cs, ce = [None] * L, [None] * L
    re = {}
    reads, writes = [], []
    q = 0.0  # when the queue is free
    ops = list(plan.io_ops)

    def compute_until(limit_layer):
        # compute every layer whose inputs are known, up to limit_layer
        for i in range(limit_layer + 1):
            if ce[i] is None:
                if plan.read_order and i not in re:
                    return
                cs[i] = max(re.get(i, 0.0), ce[i - 1] if i else 0.0)
                ce[i] = cs[i] + c

    for op in ops:
        if op.wait is not None:
            kind, k = op.wait
            compute_until(k)
            dep = cs[k] if kind == "compute_start" else ce[k]
            assert dep is not None, f"{op} waits for an event that cannot have happened"
        else:
            dep = 0.0
        start = max(q, dep)
        end = start + (io if op.kind == "read" else w)
        q = end
        if op.kind == "read":
            re[op.layer] = end
            reads.append((start, end))
        else:
            writes.append((start, end, op.layer))
    compute_until(L - 1)
    return reads, writes, ce[-1]


@pytest.mark.parametrize("shape,hw,T,h,depth", CASES)
def test_static_plan_replays_as_predicted(shape, hw, T, h, depth):
    s = SlackScheduler(shape, hw, PROF[shape.name], prefetch_depth=depth)
    plan = s.plan_prefill(T, int(h * T))
    p = plan.predicted
    L = shape.n_layers
    reads, writes, ttft = replay(plan, L, p.layer_io_s, p.layer_compute_s, p.layer_write_s)
    # reads first: replaying the writes where the plan put them delays no read and no compute
    assert ttft == pytest.approx(p.ttft_s, rel=1e-9)
    assert [r[0] for r in reads] == pytest.approx(list(plan.timeline.read_start), rel=1e-9, abs=1e-15)
    for wr in writes:
        assert not any(_overlap(wr, rd) for rd in reads), (wr, reads)
        assert wr[1] <= p.ttft_s * (1 + 1e-9)  # writes in the plan are done by the end of prefill
    # every layer's write exactly once: in slack or deferred (none when nothing is new)
    written = [wr[2] for wr in writes]
    assert sorted(written + plan.deferred_writes) == (list(range(L)) if plan.write_blocks else [])
    assert len(set(written)) == len(written)
    assert sorted(j for ws in plan.writes_after_layer for j in ws) == sorted(written)
    for i, ws in enumerate(plan.writes_after_layer):
        assert all(j <= i for j in ws)  # a layer's KV is written only after it is computed
    assert plan.read_order == (list(range(L)) if plan.load_blocks else [])
    assert p.deferred_write_bytes == len(plan.deferred_writes) * plan.write_bytes_per_layer


def test_plan_orders_reads_with_their_waits():
    s = SlackScheduler(LLAMA3_8B, Hardware.per_ssd(7.0, 4), PROF["llama3-8b"], prefetch_depth=2)
    plan = s.plan_prefill(32768, 16384)
    reads = [o for o in plan.io_ops if o.kind == "read"]
    assert [o.layer for o in reads] == list(range(32))
    assert [o.wait for o in reads[:3]] == [None, None, ("compute_start", 0)]
    assert all(o.wait == ("compute_done", o.layer) for o in plan.io_ops if o.kind == "write")
    # compute-bound at 50% hit: every write but the last layer's fits between reads
    assert plan.deferred_writes == [31]
    d = plan.to_dict()
    assert d["io_ops"][2] == ["read", 2, ["compute_start", 0]] and d["predicted"]["ttft_s"] == plan.predicted.ttft_s


def test_io_bound_plan_defers_writes_until_the_reads_are_done():
    slow = Hardware.per_ssd(2.5, 1)
    s = SlackScheduler(LLAMA3_8B, slow, PROF["llama3-8b"])
    plan = s.plan_prefill(131072, int(0.9 * 131072))
    assert plan.predicted.stall_s > 0
    last_read = max(o.end_s for o in plan.io_ops if o.kind == "read")
    assert all(o.start_s >= last_read for o in plan.io_ops if o.kind == "write")
    assert len(plan.deferred_writes) > 16  # the last compute leaves room for few writes


def test_full_hit_writes_nothing():
    s = SlackScheduler(LLAMA3_8B, Hardware.per_ssd(7.0, 4), PROF["llama3-8b"])
    plan = s.plan_prefill(32768, 32768)
    assert plan.write_blocks == 0 and plan.deferred_writes == [] and not any(o.kind == "write" for o in plan.io_ops)
    assert plan.new_tokens == 16


def test_limit_load_never_predicts_slower():
    slow = Hardware.per_ssd(1.0, 1)
    full = SlackScheduler(LLAMA3_8B, slow, PROF["llama3-8b"]).plan_prefill(32768, 32768)
    lim = SlackScheduler(LLAMA3_8B, slow, PROF["llama3-8b"], limit_load=True).plan_prefill(32768, 32768)
    assert lim.load_blocks < full.load_blocks
    assert lim.predicted.ttft_s < full.predicted.ttft_s
    assert lim.write_blocks == 0  # the blocks not loaded are stored already: recomputed, not rewritten


def test_decode_budget():
    hw = Hardware.per_ssd(3.0, 2, write_gbps=2.0)  # 4 GB/s of writes
    s = SlackScheduler(LLAMA3_8B, hw, PROF["llama3-8b"])
    assert s.decode_budget(0.010) == 40_000_000
    assert s.decode_budget(0.010, read_busy_s=0.004) == 24_000_000
    assert s.decode_budget(0.010, read_busy_s=0.02) == 0
    # I/O-bound at 50% hit on one slow SSD: almost every layer's write is left for decode
    slow = SlackScheduler(LLAMA3_8B, Hardware.per_ssd(2.5, 1), PROF["llama3-8b"])
    plan = slow.plan_prefill(32768, 16384)
    assert len(plan.deferred_writes) > 20
    steps = slow.decode_write_steps(plan, 0.1)  # 250 MB per step, 64 MiB per layer: 3 layers a step
    assert [j for st in steps for j in st] == plan.deferred_writes
    assert all(len(st) * plan.write_bytes_per_layer <= slow.decode_budget(0.1) for st in steps)
    assert [len(st) for st in steps[:-1]] == [3] * (len(steps) - 1)  # a step is full before the next opens
    assert slow.decode_write_steps(plan, 0.01) == [[j] for j in plan.deferred_writes]  # a layer is never split
    with pytest.raises(ValueError, match="no write budget"):
        slow.decode_write_steps(plan, 0.010, read_busy_s=0.010)


# ------------------------------------------------------------------ online state, simulated

def simulate_online(plan, L, io, c, w, rng, jitter):
    """Discrete-event run: one SSD queue (serial), one compute engine; actual times jittered."""
    st = ScheduleState(plan, clock=lambda: pytest.fail("the simulation passes now explicitly"))
    ev = []  # (time, seq, kind, layer)
    seq = 0
    ssd_free = 0.0
    intervals = {"read": [], "write": []}
    issued_reads, issued_writes = [], []
    computing = None
    next_compute = 0
    compute_start = {}

    def actual(x):
        return x * rng.uniform(1 - jitter, 1 + jitter)

    def push(t, kind, layer):
        nonlocal seq
        heapq.heappush(ev, (t, seq, kind, layer))
        seq += 1

    def issue(now):
        # the harness's loop: start what can be computed (an event: it may allow a read), then reads, then writes
        nonlocal ssd_free, computing, next_compute
        if computing is None and next_compute < L and st.can_compute(next_compute):
            computing = next_compute
            next_compute += 1
            st.on_compute_start(computing, now)
            compute_start[computing] = now
            push(now + actual(c), "compute_done", computing)
        for i in st.next_reads():
            assert not st.writes_in_flight
            start = max(now, ssd_free)
            issued_reads.append((i, now, start))
            ssd_free = start + actual(io)
            intervals["read"].append((now, ssd_free))
            push(ssd_free, "read_done", i)
        for j in st.next_writes(now):
            assert not st.reads_in_flight
            issued_writes.append(j)
            start = max(now, ssd_free)
            ssd_free = start + actual(w)
            intervals["write"].append((now, ssd_free))
            push(ssd_free, "write_done", j)

    now, ttft, deferred = 0.0, None, []
    issue(now)
    while ev:
        now, _, kind, layer = heapq.heappop(ev)
        if kind == "read_done":
            st.on_read_done(layer)
        elif kind == "write_done":
            st.on_write_done(layer)
        else:
            st.on_compute_done(layer, now)
            computing = None
            if layer == L - 1:
                ttft = now
                deferred = st.finish()
        issue(now)
    return intervals, issued_reads, issued_writes, deferred, ttft, compute_start


@pytest.mark.parametrize("seed", range(12))
def test_online_state_never_mixes_and_writes_each_layer_once(seed):
    rng = random.Random(seed)
    shape = rng.choice([LLAMA3_8B, QWEN25_7B, ModelShape(6, 1024, 8, 2, 128, 4096, name="small")])
    prof = PROF.get(shape.name) or ComputeProfile.analytic(shape, 400, 4000)
    hw = Hardware.per_ssd(rng.choice([0.5, 2.5, 7.0]), rng.choice([1, 2, 4]))
    T = rng.choice([4096, 32768, 65536])
    plan = SlackScheduler(shape, hw, prof, prefetch_depth=rng.choice([1, 2, 3])).plan_prefill(
        T, int(rng.choice([0.0, 0.3, 0.7, 0.95, 1.0]) * T))
    p = plan.predicted
    L = shape.n_layers
    iv, reads, writes, deferred, ttft, cstart = simulate_online(plan, L, p.layer_io_s, p.layer_compute_s,
                                                                p.layer_write_s, rng, jitter=0.3)
    assert ttft is not None
    for wr in iv["write"]:
        assert not any(_overlap(wr, rd) for rd in iv["read"])
    assert [r[0] for r in reads] == plan.read_order
    for i, t, _ in reads:  # prefetch depth respected
        if i >= plan.prefetch_depth:
            assert t >= cstart[i - plan.prefetch_depth]
    assert sorted(writes + deferred) == (list(range(L)) if plan.write_blocks else [])
    assert len(set(writes)) == len(writes)


@pytest.mark.parametrize("h", [0.0, 0.5, 0.9, 1.0])
def test_online_state_with_exact_times_matches_the_prediction(h):
    hw = Hardware.per_ssd(2.5, 2)
    plan = SlackScheduler(LLAMA3_8B, hw, PROF["llama3-8b"]).plan_prefill(65536, int(h * 65536))
    p = plan.predicted
    _, reads, writes, deferred, ttft, _ = simulate_online(plan, 32, p.layer_io_s, p.layer_compute_s, p.layer_write_s,
                                                          random.Random(0), jitter=0.0)
    assert ttft == pytest.approx(p.ttft_s, rel=1e-9)  # writes never delayed a read
    assert [r[2] for r in reads] == pytest.approx(list(plan.timeline.read_start), rel=1e-9, abs=1e-15)
    if plan.write_blocks:
        assert deferred and deferred[-1] == 31
    # what the static plan fits into slack, the online state issues during prefill too
    assert {o.layer for o in plan.io_ops if o.kind == "write"} <= set(writes)
