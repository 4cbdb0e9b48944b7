"""tutti.sched: the layer pipeline, the analytic model, and the profile table (format, validation, fit)."""
import json
import math
import random

import pytest

from tutti.sched import (
    LLAMA3_8B,
    ComputePoint,
    ComputeProfile,
    Hardware,
    ModelShape,
    ProfileError,
    TokenSplit,
    best_load_blocks,
    crossover_hit_rate,
    fit_layer_time,
    loading_stops_paying,
    place_writes,
    predict,
    simulate_pipeline,
)
from tutti.sched.model import _balance

H200 = ComputeProfile.analytic(LLAMA3_8B, 989 * 0.5, 4800)
FAST = Hardware.per_ssd(7.0, 4)


# ------------------------------------------------------------------ shapes and hardware

def test_llama_kv_sizes():
    assert LLAMA3_8B.kv_bytes_per_token_layer == 2 * 8 * 128 * 2
    assert LLAMA3_8B.block_layer_io_bytes == 16 * 4096  # 32 KiB objects: no padding


def test_small_objects_are_padded_to_4k_like_the_store():
    s = ModelShape(2, 128, 2, 1, 64, 256, dtype_bytes=2, block_size=16)
    assert s.span_bytes == 2048
    assert s.block_layer_io_bytes == 2 * 4096


def test_shape_from_profile_dict_and_back():
    d = LLAMA3_8B.to_dict()
    assert d["dtype"] == "bfloat16"
    assert ModelShape.from_dict(d) == ModelShape(**{**LLAMA3_8B.__dict__, "name": ""})
    with pytest.raises(ValueError, match="head_dim"):
        ModelShape.from_dict({k: v for k, v in d.items() if k != "head_dim"})
    with pytest.raises(ValueError, match="unknown dtype"):
        ModelShape.from_dict({**d, "dtype": "float13"})


def test_hardware_rates_add_up_and_link_caps_reads():
    hw = Hardware.per_ssd(7.0, 4, write_gbps=3.0)
    assert hw.read_bps == pytest.approx(28e9) and hw.write_bps == pytest.approx(12e9)
    capped = Hardware.per_ssd(7.0, 8, pcie_gbps=50.0)
    assert capped.read_bps == pytest.approx(50e9)
    with pytest.raises(ValueError, match="n_ssd"):
        Hardware(1.0, 1.0, 0)
    with pytest.raises(ValueError, match="read_gbps"):
        Hardware(0.0, 1.0)


def test_token_split_whole_blocks_and_at_least_one_computed_token():
    s = TokenSplit.of(LLAMA3_8B, 1000, 999)  # 62 full blocks stored
    assert (s.hit_blocks, s.load_blocks, s.new_tokens, s.write_blocks) == (62, 62, 8, 0)
    full = TokenSplit.of(LLAMA3_8B, 1024, 1024)  # a full hit still computes the last block
    assert (full.load_blocks, full.new_tokens, full.write_blocks) == (63, 16, 0)
    cold = TokenSplit.of(LLAMA3_8B, 1030, 0)
    assert (cold.load_blocks, cold.new_tokens, cold.write_blocks) == (0, 1030, 64)
    with pytest.raises(ValueError):
        TokenSplit.of(LLAMA3_8B, 100, 101)


# ------------------------------------------------------------------ pipeline

def test_pipeline_hand_computed_io_bound():
    tl = simulate_pipeline(3, 2.0, 1.0, prefetch_depth=1)
    assert tl.read_start == (0, 2, 4) and tl.read_end == (2, 4, 6)
    assert tl.compute_start == (2, 4, 6) and tl.ttft == 7


def test_pipeline_hand_computed_compute_bound_depth_limits_reads():
    tl = simulate_pipeline(3, 1.0, 2.0, prefetch_depth=1)
    # read i+1 may start only when compute i starts
    assert tl.read_start == (0, 1, 3) and tl.compute_start == (1, 3, 5) and tl.ttft == 7
    assert tl.write_windows() == [(2, 3, 1), (4, 7, 2)]
    tl2 = simulate_pipeline(3, 1.0, 2.0, prefetch_depth=2)
    assert tl2.read_start == (0, 1, 2) and tl2.ttft == 7
    assert tl2.write_windows() == [(3, 7, 2)]


def test_pipeline_without_reads_is_compute_only():
    tl = simulate_pipeline(4, 0.0, 1.5)
    assert tl.read_start == () and tl.ttft == 6.0 and tl.write_windows() == [(0.0, 6.0, -1)]


def test_io_much_smaller_than_compute_only_fill_is_exposed():
    L, io, c = 32, 1e-4, 1e-2
    tl = simulate_pipeline(L, io, c, 2)
    assert tl.ttft == pytest.approx(io + L * c, rel=1e-12)


def test_io_much_larger_than_compute_reads_back_to_back():
    L, io, c = 32, 1e-2, 1e-4
    for depth in (1, 2, 8):
        tl = simulate_pipeline(L, io, c, depth)
        assert tl.ttft == pytest.approx(L * io + c, rel=1e-12)


@pytest.mark.parametrize("seed", range(20))
def test_pipeline_invariants_random(seed):
    r = random.Random(seed)
    L = r.randint(1, 40)
    io = [r.uniform(0.01, 2) for _ in range(L)]
    c = [r.uniform(0.01, 2) for _ in range(L)]
    prev = None
    for depth in (1, 2, 3, 5, L + 1):
        tl = simulate_pipeline(L, io, c, depth)
        for i in range(L):
            assert tl.compute_start[i] >= tl.read_end[i]
            assert tl.read_end[i] == pytest.approx(tl.read_start[i] + io[i])
            if i:
                assert tl.read_start[i] >= tl.read_end[i - 1]
                assert tl.compute_start[i] >= tl.compute_end[i - 1]
            if i >= depth:
                assert tl.read_start[i] >= tl.compute_start[i - depth]
        assert tl.ttft >= max(sum(c), sum(io) + c[-1]) - 1e-9
        if prev is not None:  # a deeper prefetch never makes the prefill slower
            assert tl.ttft <= prev + 1e-9
        prev = tl.ttft


def test_place_writes_hand_computed():
    tl = simulate_pipeline(3, 1.0, 2.0, prefetch_depth=1)
    assert place_writes(tl, 0.5) == [(4.0, 4.5, 2), (5.0, 5.5, 2), None]
    assert place_writes(tl, 1.0) == [(4.0, 5.0, 2), (5.0, 6.0, 2), None]
    # compute-bound, depth 1: read i+2 is allowed when compute i+1 starts, so write i can use the
    # gap after read i+2 (it is ready only when the gap after read i+1 closes)
    tl3 = simulate_pipeline(4, 1.0, 3.0, prefetch_depth=1)
    assert tl3.write_windows() == [(2.0, 4.0, 1), (5.0, 7.0, 2), (8.0, 13.0, 3)]
    assert place_writes(tl3, 0.5) == [(5.0, 5.5, 2), (8.0, 8.5, 3), (10.0, 10.5, 3), None]
    assert place_writes(tl3, 2.5) == [(8.0, 10.5, 3), (10.5, 13.0, 3), None, None]  # too long for [5, 7]


# ------------------------------------------------------------------ predict

def test_predict_no_hit_is_recompute():
    p = predict(LLAMA3_8B, FAST, H200, 32768, 0.0)
    assert p.io_s == 0 and p.bubble_s == pytest.approx(0, abs=1e-12) and p.ttft_s == pytest.approx(p.recompute_ttft_s)
    assert p.deferred_layers == [31] and 0 < p.write_in_slack_s < p.write_s


def test_predict_matches_the_pipeline_and_the_equations():
    T, h = 65536, 0.9
    p = predict(LLAMA3_8B, FAST, H200, T, h)
    hit = int(h * T) // 16 * 16
    io = hit * LLAMA3_8B.kv_bytes_per_token_layer / FAST.read_bps
    c = H200.layer_time(T - hit, hit)
    assert p.load_tokens == hit and p.new_tokens == T - hit
    assert p.layer_io_s == pytest.approx(io) and p.layer_compute_s == pytest.approx(c)
    assert p.ttft_s == pytest.approx(simulate_pipeline(32, io, c, 2).ttft)
    assert p.hbm_ttft_s == pytest.approx(32 * c) and p.bubble_s == pytest.approx(p.ttft_s - p.compute_s)
    assert p.fill_s == pytest.approx(io) and p.stall_s == pytest.approx(0, abs=1e-12)  # below the crossover
    assert p.hbm_ttft_s < p.ttft_s < p.recompute_ttft_s
    assert p.write_bytes == 32 * (T - hit) // 16 * 65536


def test_full_hit_on_slow_ssd_is_io_bound():
    slow = Hardware.per_ssd(2.5, 1)
    p = predict(LLAMA3_8B, slow, H200, 131072, 1.0)
    assert p.ttft_s == pytest.approx(32 * p.layer_io_s + p.layer_compute_s)
    assert p.stall_s > 0.9 * p.io_s - p.fill_s


# ------------------------------------------------------------------ crossover

def test_crossover_balances_io_and_compute():
    for hw in (FAST, Hardware.per_ssd(2.5, 1), Hardware.per_ssd(3.5, 2)):
        for T in (8192, 32768, 131072):
            h = crossover_hit_rate(LLAMA3_8B, hw, H200, T)
            assert 0 < h < 1
            hit = h * T
            io = hit / 16 * LLAMA3_8B.block_layer_io_bytes / hw.read_bps
            assert io == pytest.approx(H200.layer_time(T - hit, hit), rel=1e-6)
            assert _balance(LLAMA3_8B, hw, H200, T, h - 1e-3) < 0 < _balance(LLAMA3_8B, hw, H200, T, h + 1e-3)


def test_crossover_is_where_stalls_start():
    hw = Hardware.per_ssd(2.5, 1)
    T = 131072
    h = crossover_hit_rate(LLAMA3_8B, hw, H200, T)
    assert predict(LLAMA3_8B, hw, H200, T, h - 0.02).stall_s == pytest.approx(0, abs=1e-9)
    assert predict(LLAMA3_8B, hw, H200, T, h + 0.02).stall_s > 0


def test_crossover_monotonic_in_bandwidth_and_length():
    hs = [crossover_hit_rate(LLAMA3_8B, Hardware.per_ssd(g, 1), H200, 32768) for g in (1, 2, 4, 8, 16, 64)]
    assert all(a < b for a, b in zip(hs, hs[1:])), hs
    ls = [crossover_hit_rate(LLAMA3_8B, Hardware.per_ssd(2.5, 1), H200, T) for T in (4096, 16384, 65536, 262144)]
    assert all(a < b for a, b in zip(ls, ls[1:])), ls


def test_crossover_is_one_when_loading_never_outlasts_compute():
    assert crossover_hit_rate(LLAMA3_8B, Hardware.per_ssd(10000, 8), H200, 32768) == 1.0


def test_loading_stops_paying():
    T = 32768
    assert loading_stops_paying(LLAMA3_8B, FAST, H200, T) is None
    slow = Hardware.per_ssd(0.3, 1)
    h = loading_stops_paying(LLAMA3_8B, slow, H200, T)
    assert h is not None and crossover_hit_rate(LLAMA3_8B, slow, H200, T) <= h < 1
    recompute = 32 * H200.layer_time(T, 0)
    at = predict(LLAMA3_8B, slow, H200, T, 0.0, hit_tokens=round(h * T)).ttft_s
    below = predict(LLAMA3_8B, slow, H200, T, 0.0, hit_tokens=round(h * T) - 16).ttft_s
    assert below < recompute <= at


def test_best_load_blocks_matches_brute_force():
    slow = Hardware.per_ssd(1.0, 1)
    T = 4096
    k = best_load_blocks(LLAMA3_8B, slow, H200, T, T)
    times = [predict(LLAMA3_8B, slow, H200, T, 0.0, hit_tokens=T, load_blocks=b).ttft_s for b in range(256)]
    assert times[k] == pytest.approx(min(times), rel=1e-9)
    assert 0 < k < 255  # loading everything is I/O-bound here, loading nothing is recompute


# ------------------------------------------------------------------ profile table

def _table(a=2e-4, b=1.5e-7, c=3e-12, noise=0.0, seed=0, io=True):
    r = random.Random(seed)
    pts = []
    for n in (512, 2048, 8192, 32768):
        for p in (0, 8192, 32768, 98304):
            t = (a + b * n + c * n * (p + n / 2)) * (1 + r.uniform(-noise, noise))
            pts.append({"new_tokens": n, "prefix_tokens": p, "layer_s": t})
    d = {"version": 1, "device": "NVIDIA H200", "date": "2026-11-29T15:00:00+00:00",
         "model": LLAMA3_8B.to_dict(), "compute": pts}
    if io:
        d["io"] = {"read_gbps": 26.0, "write_gbps": 20.0, "n_ssd": 4}
    return d


def test_fit_recovers_known_coefficients():
    prof = ComputeProfile.from_json(_table())
    f = prof.fit
    assert (f.a, f.b, f.c) == pytest.approx((2e-4, 1.5e-7, 3e-12), rel=1e-6)
    assert f.max_rel_err < 1e-9
    assert prof.layer_time(4096, 50000) == pytest.approx(2e-4 + 1.5e-7 * 4096 + 3e-12 * 4096 * (50000 + 2048))


def test_fit_with_noise_reports_its_error():
    f = ComputeProfile.from_json(_table(noise=0.03, seed=7)).fit
    assert 0 < f.rms_rel_err <= f.max_rel_err <= 0.06
    assert f.b == pytest.approx(1.5e-7, rel=0.1) and f.c == pytest.approx(3e-12, rel=0.1)
    assert f.worst is not None


def test_fit_never_returns_negative_coefficients():
    # Times with no fixed cost, slightly below the linear trend at short lengths: unconstrained
    # least squares would make a negative.
    pts = [ComputePoint(n, 0, 1e-7 * n * (1 - 2e3 / (n + 2e3) * 0.2)) for n in (256, 512, 1024, 4096, 16384)]
    f = fit_layer_time(pts)
    assert min(f.a, f.b, f.c) >= 0
    assert f.a == 0.0


def test_profile_json_round_trip(tmp_path):
    d = _table(noise=0.01)
    prof = ComputeProfile.from_json(d)
    path = tmp_path / "prof.json"
    prof.save(path)
    assert json.loads(path.read_text()) == d
    again = ComputeProfile.from_json(str(path))
    assert again.to_json() == d and again.shape == prof.shape and again.io == d["io"]
    assert again.layer_time(1000, 20000) == prof.layer_time(1000, 20000)
    assert again.measured_range() == {"new_tokens": [512, 32768], "prefix_tokens": [0, 98304]}


def _mutate(d, path, value):
    d = json.loads(json.dumps(d))
    obj = d
    for k in path[:-1]:
        obj = obj[k]
    if value is KeyError:
        del obj[path[-1]]
    else:
        obj[path[-1]] = value
    return d


@pytest.mark.parametrize("path,value,match", [
    (("version",), 2, "unsupported profile version 2"),
    (("device",), KeyError, "missing 'device'"),
    (("date",), 5, "'date' must be a string"),
    (("model",), [], "'model' must be an object"),
    (("model", "head_dim"), KeyError, "missing head_dim"),
    (("model", "n_layers"), 0, "n_layers must be an integer >= 1"),
    (("model", "dtype"), "float13", "unknown dtype"),
    (("compute",), [], "non-empty list"),
    (("compute", 3, "layer_s"), -1.0, r"compute\[3\]: 'layer_s' must be a number > 0"),
    (("compute", 0, "layer_s"), "fast", r"compute\[0\]: 'layer_s' must be a number"),
    (("compute", 1, "new_tokens"), 0, r"compute\[1\]: 'new_tokens' must be an integer >= 1"),
    (("compute", 1, "new_tokens"), True, r"'new_tokens' must be an integer"),
    (("compute", 2, "prefix_tokens"), 1.5, r"'prefix_tokens' must be an integer >= 0"),
    (("compute", 2), "x", r"compute\[2\]: must be an object"),
    (("io", "n_ssd"), 0, r"io: 'n_ssd' must be an integer >= 1"),
    (("io", "read_gbps"), KeyError, r"io: missing 'read_gbps'"),
])
def test_profile_validation_errors(path, value, match):
    with pytest.raises(ProfileError, match=match):
        ComputeProfile.from_json(_mutate(_table(), path, value))


def test_profile_needs_three_points_and_readable_json(tmp_path):
    d = _table()
    d["compute"] = d["compute"][:2]
    with pytest.raises(ProfileError, match="at least 3 distinct"):
        ComputeProfile.from_json(d)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ProfileError, match="not valid JSON"):
        ComputeProfile.from_json(bad)
    with pytest.raises(ProfileError, match="No such file"):
        ComputeProfile.from_json(tmp_path / "missing.json")


def test_analytic_profile_counts_flops():
    s = LLAMA3_8B
    p = ComputeProfile.analytic(s, 500.0, 4800.0)
    params = 4096 * 48 * 128 + 4096 * 4096 + 3 * 4096 * 14336  # QKV, O, gated MLP
    assert s.layer_weight_params == params
    n, pre = 4096, 28672
    want = params * 2 / 4.8e12 + 2 * params * n / 5e14 + 4 * 32 * 128 * n * (pre + n / 2) / 5e14
    assert p.layer_time(n, pre) == pytest.approx(want, rel=1e-12)
    with pytest.raises(ValueError, match="no measured points"):
        p.to_json()
    assert math.isclose(p.layer_time(0, 1000), 0.0)
