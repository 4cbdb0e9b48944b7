"""tutti.sched.online.LoadPlanner: how much of a hit the connector loads (issue 13, loads only where they pay)."""
import pytest

from tutti.sched.online import MIN_SAMPLES, LoadPlanner

BLOCK_BYTES, BS, L = 1 << 20, 16, 32   # a 1 MiB block of 16 tokens, 32 layers


def planner(read_bps=None, token_s=None, hidden_bps=None):
    p = LoadPlanner(BLOCK_BYTES, BS, L)
    for _ in range(MIN_SAMPLES):
        if read_bps:
            p.observe_load(10 * BLOCK_BYTES, 10 * BLOCK_BYTES / read_bps, stall_s=0.9 * 10 * BLOCK_BYTES / read_bps)
        if token_s:
            p.observe_step(1000, 1000 * token_s)
    if hidden_bps:
        p.observe_load(10 * BLOCK_BYTES, 10 * BLOCK_BYTES / hidden_bps, stall_s=0.0)
    return p


def test_loads_everything_until_it_has_measured():
    p = LoadPlanner(BLOCK_BYTES, BS, L)
    assert p.blocks_to_load(100, 1616) == 100
    p = planner(read_bps=1e6)  # a very slow store, but no compute rate yet
    assert p.blocks_to_load(100, 1616) == 100
    p = planner(token_s=1e-3)
    assert p.blocks_to_load(100, 1616) == 100


def test_a_slow_store_loads_part_of_the_hit_and_beats_recompute():
    # 50 MB/s: a block loads in 21 ms; 16 tokens compute in 1.6 ms: loading barely pays at all.
    p = planner(read_bps=50e6, token_s=1e-4)
    hit, new = 100, 100 * BS + 16
    k = p.blocks_to_load(hit, new)
    assert 0 <= k < hit
    recompute = p.predict_s(0, new)
    assert p.predict_s(k, new) <= recompute
    assert p.predict_s(k, new) <= 0.8 * p.predict_s(hit, new)


def test_a_fast_store_loads_all_of_it():
    p = planner(read_bps=20e9, token_s=1e-4)   # a block in 52 us vs 1.6 ms to compute it
    assert p.blocks_to_load(100, 1616) == 100
    assert p.blocks_to_load(3, 64) == 3


def test_the_cut_sits_where_load_and_compute_meet():
    # t_load = 1 MiB / 100 MB/s = 10.5 ms; t_block = 16 * 1 ms = 16 ms: meet at new * 1 ms / 26.5 ms.
    p = planner(read_bps=100e6, token_s=1e-3)
    new = 2000
    k = p.blocks_to_load(125, new)
    meet = new * 1e-3 / (BLOCK_BYTES / 100e6 + BS * 1e-3)
    assert abs(k - meet) <= 1.5
    # Predicted time is no worse at the cut than one block either side.
    for d in (-1, 1):
        assert p.predict_s(k, new) <= p.predict_s(k + d, new) + 1e-12


def test_hidden_loads_raise_the_read_rate_and_a_marginal_gain_loads_all():
    slow = planner(read_bps=100e6, token_s=1e-3)
    assert slow.blocks_to_load(125, 2000) < 125
    # Loads compute hid ran at 10 GB/s: the store is at least that fast.
    fast = planner(read_bps=100e6, token_s=1e-3, hidden_bps=10e9)
    assert fast.read_bps == 10e9
    assert fast.blocks_to_load(125, 2000) == 125


def test_one_slow_sample_does_not_swing_it():
    p = planner(read_bps=20e9, token_s=1e-4)
    p.observe_load(BLOCK_BYTES, 10.0, stall_s=10.0)   # one load stuck 10 s (a hiccup)
    assert p.blocks_to_load(100, 1616) == 100


def test_decode_steps_and_bad_samples_are_ignored():
    p = LoadPlanner(BLOCK_BYTES, BS, L)
    for _ in range(10):
        p.observe_step(1, 0.05)        # decode: one token, mostly fixed cost
        p.observe_step(1000, 0.0)
        p.observe_load(0, 1.0, 1.0)
        p.observe_load(BLOCK_BYTES, 0.0, 0.0)
    assert p.token_s is None and p.read_bps is None
    with pytest.raises(ValueError):
        LoadPlanner(0, BS, L)
