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


# --- remote blocks (cluster tier): a remote block costs its fetch, then its load -------------------


def test_remote_blocks_are_priced_with_the_default_fetch_rate_until_one_is_measured():
    from tutti.sched.online import DEFAULT_FETCH_BPS

    # A fast local store (a block loads in 52 us) and 1.6 ms to compute a block: every local block pays.
    p = planner(read_bps=20e9, token_s=1e-4)
    assert p.fetch_bps == DEFAULT_FETCH_BPS
    hit, new = 100, 100 * BS + 16
    assert p.blocks_to_load(hit, new) == hit                      # all local: all loaded, as before
    # The default prices a 1 MiB block's fetch at 5.2 ms > 1.6 ms to compute it: the remote 40 are cut.
    assert BLOCK_BYTES / DEFAULT_FETCH_BPS > BS * 1e-4
    assert p.blocks_to_load(hit, new, remote_blocks=40) == 60
    assert p.predict_s(60, new, 60) < p.predict_s(100, new, 60)


def test_a_fast_measured_fetch_loads_remote_blocks_too():
    p = planner(read_bps=20e9, token_s=1e-4)
    for _ in range(3):
        p.observe_fetch(64 * BLOCK_BYTES, 64 * BLOCK_BYTES / 10e9)   # 10 GB/s: 0.1 ms a block
    assert p.fetch_bps == 10e9
    assert p.blocks_to_load(100, 100 * BS + 16, remote_blocks=40) == 100


def test_the_cut_falls_where_fetching_stops_paying():
    # A block computes in 16 ms and loads in 10.5 ms: loading pays up to where load and compute of the
    # rest meet (~75 of 124 blocks).  Fetching a remote block pays while the fetch costs less than
    # computing the block: the cut is at the meeting point when fetches are cheap, at the end of the
    # local part when they are not.
    p = planner(read_bps=100e6, token_s=1e-3)
    new, hit, remote = 2000, 124, 100          # 24 local blocks, then 100 remote
    t_load, t_block = BLOCK_BYTES / 100e6, BS * 1e-3
    meet = new * 1e-3 / (t_load + t_block)
    for _ in range(3):
        p.observe_fetch(BLOCK_BYTES, BLOCK_BYTES / 1e9)           # 1 ms a block: pays
    k = p.blocks_to_load(hit, new, remote_blocks=remote)
    assert abs(k - meet) <= 1.5 and k < hit
    for d in (-1, 1):
        assert p.predict_s(k, new, hit - remote) <= p.predict_s(k + d, new, hit - remote) + 1e-12
    slow = planner(read_bps=100e6, token_s=1e-3)
    for _ in range(3):
        slow.observe_fetch(BLOCK_BYTES, BLOCK_BYTES / 30e6)       # 35 ms a block: more than computing it
    assert slow.blocks_to_load(hit, new, remote_blocks=remote) == hit - remote
    # Without the remote part the same hit is loaded to the meeting point: only fetching was cut.
    assert abs(slow.blocks_to_load(hit, new) - meet) <= 1.5


def test_remote_blocks_cut_for_long_are_fetched_once_to_measure_again():
    from tutti.sched.online import PROBE_EVERY_S

    now = [0.0]
    p = LoadPlanner(BLOCK_BYTES, BS, L, clock=lambda: now[0])
    for _ in range(MIN_SAMPLES):
        p.observe_load(10 * BLOCK_BYTES, 10 * BLOCK_BYTES / 20e9, stall_s=1.0)
        p.observe_step(1000, 1000 * 1e-4)
    new = 100 * BS + 16
    assert p.blocks_to_load(100, new, remote_blocks=40) == 60     # the default: remote cut
    now[0] = PROBE_EVERY_S - 1
    assert p.blocks_to_load(100, new, remote_blocks=40) == 60
    now[0] = PROBE_EVERY_S + 1
    assert p.blocks_to_load(100, new, remote_blocks=40) == 100    # one probe...
    assert p.blocks_to_load(100, new, remote_blocks=40) == 60     # ...then the default again
    p.observe_fetch(40 * BLOCK_BYTES, 40 * BLOCK_BYTES / 10e9)    # the probe measured 10 GB/s
    assert p.blocks_to_load(100, new, remote_blocks=40) == 100


def test_bad_fetch_samples_are_ignored_and_reported():
    p = LoadPlanner(BLOCK_BYTES, BS, L)
    p.observe_fetch(0, 1.0)
    p.observe_fetch(BLOCK_BYTES, 0.0)
    p.observe_fetch(-1, -1.0)
    d = p.describe()
    assert d["fetch_samples"] == 0 and d["fetch_MBps"] == 200.0
    assert p.blocks_to_load(10, 200, remote_blocks=10) == 10       # nothing measured: everything loaded


def test_the_scheduler_prices_remote_hits_with_the_workers_fetch_reports(tmp_path):
    """SchedulerSide (no store, no engine): a hit peers hold is cut at the default fetch rate, and
    loaded whole once rank 0's worker metadata reports fast fetches."""
    from types import SimpleNamespace as NS

    from tutti.vllm.config import ModelShape, TuttiConfig
    from tutti.vllm.metadata import TuttiWorkerMeta
    from tutti.vllm.scheduler import SchedulerSide
    from tutti.vllm.stats import TuttiStats

    cfg = TuttiConfig.from_extra({"path": str(tmp_path / "kv.img")})      # load_policy auto: the default
    shape = ModelShape(model_id="tests/remote", dtype="float16", n_layers=32, kv_heads=8, head_dim=128,
                       block_size=BS, tp_size=1)
    s = SchedulerSide(cfg, shape, NS(cache_config=NS(prefix_caching_hash_algo="sha256")), TuttiStats())
    s.cluster = NS(remote_prefix=lambda snapshots, keys, owners=None: len(keys))  # peers hold every block
    bb = shape.block_bytes_per_rank()                                     # 2 MiB
    for _ in range(MIN_SAMPLES):
        s.planner.observe_load(10 * bb, 10 * bb / 20e9, stall_s=1.0)     # fast local loads
        s.planner.observe_step(1000, 1000 * 1e-4)                        # 1.6 ms to compute a block
    req = NS(request_id="r", num_prompt_tokens=100 * BS + 1, block_hashes=[b"h%d" % i for i in range(100)])
    tokens, _ = s.get_num_new_matched_tokens(req, 0)
    assert tokens == 0       # a 2 MiB fetch at the default 200 MB/s (10 ms) costs more than computing it

    def report(rank, bps):
        meta = TuttiWorkerMeta(fetch_perf=[(rank, 64 * bb, 64 * bb / bps)] * MIN_SAMPLES)
        s.update_connector_output(NS(finished_sending=None, kv_connector_worker_meta=meta))

    report(1, 20e9)          # another rank's reports do not teach the planner
    assert s.get_num_new_matched_tokens(req, 0)[0] == 0
    report(0, 20e9)          # rank 0 fetched at 20 GB/s: every remote block pays
    assert s.get_num_new_matched_tokens(req, 0)[0] == 100 * BS


def test_a_slow_peer_prices_only_its_own_blocks():
    """Fetches from a fast peer and a slow one: each peer's blocks are priced at its own rate, a peer not
    fetched from yet at the median of all; one median over both would price them alike."""
    p = planner(read_bps=20e9, token_s=1e-4)                         # 1.6 ms to compute a block
    for _ in range(3):
        p.observe_fetch(64 * BLOCK_BYTES, 64 * BLOCK_BYTES / 10e9, {"fast:1": 64})   # 0.1 ms a block
        p.observe_fetch(8 * BLOCK_BYTES, 8 * BLOCK_BYTES / 100e6, {"slow:1": 8})     # 10 ms a block
    assert p.peer_fetch_bps("fast:1") == 10e9 and p.peer_fetch_bps("slow:1") == 100e6
    assert p.peer_fetch_bps("new:1") == p.fetch_bps
    new = 100 * BS + 16
    assert p.blocks_to_load(100, new, remote_blocks=40, remote_owners=["fast:1"] * 40) == 100
    assert p.blocks_to_load(100, new, remote_blocks=40, remote_owners=["slow:1"] * 40) == 60
    # Half from each: the slow half costs what it costs, the fast half nearly nothing.
    mixed = ["fast:1"] * 20 + ["slow:1"] * 20
    assert p.predict_s(100, new, 60, mixed) == pytest.approx(
        p.predict_s(100, new, 60, ["fast:1"] * 40) + 20 * BLOCK_BYTES * (1 / 100e6 - 1 / 10e9))
    # Owners named for some blocks only: the rest at the median of all.
    assert p.predict_s(100, new, 60, ["fast:1"] * 10) == pytest.approx(
        p.predict_s(100, new, 60, ["fast:1"] * 40) + 30 * BLOCK_BYTES * (1 / p.fetch_bps - 1 / 10e9))


def test_a_fetch_from_several_peers_counts_for_each_with_its_share():
    p = LoadPlanner(BLOCK_BYTES, BS, L)
    p.observe_fetch(4 * BLOCK_BYTES, 1.0, {"a:1": 3, "b:1": 1})
    assert p.peer_fetch_bps("a:1") == 3 * BLOCK_BYTES and p.peer_fetch_bps("b:1") == BLOCK_BYTES
    assert p.fetch_bps == 4 * BLOCK_BYTES
    assert p.describe()["peer_fetch_MBps"] == {"a:1": round(3 * BLOCK_BYTES / 1e6, 2),
                                               "b:1": round(BLOCK_BYTES / 1e6, 2)}


def test_the_scheduler_prices_each_peers_blocks_with_that_peers_fetches(tmp_path):
    """SchedulerSide: rank 0's fetch reports name their peers; a hit held by the fast peer is loaded
    whole, the same hit held by the slow one is cut to its local part."""
    from types import SimpleNamespace as NS

    from tutti.vllm.config import ModelShape, TuttiConfig
    from tutti.vllm.metadata import TuttiWorkerMeta
    from tutti.vllm.scheduler import SchedulerSide
    from tutti.vllm.stats import TuttiStats

    cfg = TuttiConfig.from_extra({"path": str(tmp_path / "kv.img")})
    shape = ModelShape(model_id="tests/remote-peers", dtype="float16", n_layers=32, kv_heads=8, head_dim=128,
                       block_size=BS, tp_size=1)
    s = SchedulerSide(cfg, shape, NS(cache_config=NS(prefix_caching_hash_algo="sha256")), TuttiStats())
    holder = ["fast:1"]

    def remote_prefix(snapshots, keys, owners=None):
        if owners is not None:
            owners += holder * len(keys)
        return len(keys)
    s.cluster = NS(remote_prefix=remote_prefix)
    bb = shape.block_bytes_per_rank()
    for _ in range(MIN_SAMPLES):
        s.planner.observe_load(10 * bb, 10 * bb / 20e9, stall_s=1.0)
        s.planner.observe_step(1000, 1000 * 1e-4)
    meta = TuttiWorkerMeta(fetch_perf=[(0, 64 * bb, 64 * bb / 20e9, {"fast:1": 64}),
                                       (0, 8 * bb, 8 * bb / 50e6, {"slow:1": 8})] * MIN_SAMPLES)
    s.update_connector_output(NS(finished_sending=None, kv_connector_worker_meta=meta))
    req = NS(request_id="r", num_prompt_tokens=100 * BS + 1, block_hashes=[b"h%d" % i for i in range(100)])
    assert s.get_num_new_matched_tokens(req, 0)[0] == 100 * BS
    holder[0] = "slow:1"
    assert s.get_num_new_matched_tokens(req, 0)[0] == 0


def _profile(read_gbps=None, n_layers=L):
    """A profile table of a Llama-3-8B-shaped model: three measured points of a 1 ms + 0.1 ms/token layer."""
    from tutti.sched.profile import ComputeProfile

    d = {"version": 1, "device": "test", "date": "2026-12-02T00:00:00+00:00",
         "model": {"n_layers": n_layers, "hidden": 4096, "n_heads": 32, "n_kv_heads": 8, "head_dim": 128,
                   "intermediate": 14336, "dtype": "bfloat16", "block_size": BS},
         "compute": [{"new_tokens": n, "prefix_tokens": 0, "layer_s": 1e-3 + n * 1e-4} for n in (256, 1024, 4096)]
         + [{"new_tokens": 1024, "prefix_tokens": 4096, "layer_s": 1e-3 + 1024 * 1e-4}]}
    if read_gbps is not None:
        d["io"] = {"read_gbps": read_gbps, "write_gbps": read_gbps, "n_ssd": 1}
    return ComputeProfile.from_json(d)


def test_a_profile_table_cuts_the_first_hits_before_anything_is_measured():
    new = 100 * BS + 16
    assert LoadPlanner(BLOCK_BYTES, BS, L).blocks_to_load(100, new) == 100       # nothing known: all
    slow = LoadPlanner(BLOCK_BYTES, BS, L, prior=_profile(read_gbps=0.05))       # a 50 MB/s store
    k = slow.blocks_to_load(100, new)
    assert 0 <= k < 100
    assert slow.predict_s(k, new) <= 0.8 * slow.predict_s(100, new)
    assert slow.describe()["profile"] is True and slow.describe()["token_us"] is None
    fast = LoadPlanner(BLOCK_BYTES, BS, L, prior=_profile(read_gbps=50.0))
    assert fast.blocks_to_load(100, new) == 100
    # A table without io rates knows compute only: the read rate must be measured first.
    assert LoadPlanner(BLOCK_BYTES, BS, L, prior=_profile()).blocks_to_load(100, new) == 100


def test_measured_rates_replace_the_profile():
    """The table says the store is fast; this server measures it slow: what is measured wins."""
    p = LoadPlanner(BLOCK_BYTES, BS, L, prior=_profile(read_gbps=50.0))
    new = 100 * BS + 16
    assert p.blocks_to_load(100, new) == 100
    for _ in range(MIN_SAMPLES):
        p.observe_load(10 * BLOCK_BYTES, 10 * BLOCK_BYTES / 50e6, stall_s=0.9 * 10 * BLOCK_BYTES / 50e6)
    assert p.blocks_to_load(100, new) < 100         # measured read rate, profiled compute
    for _ in range(MIN_SAMPLES):
        p.observe_step(1000, 1000 * 1e-2)            # and a very slow model measured: loading pays again
    assert p.blocks_to_load(100, new) == 100


def test_the_profile_key_is_checked_when_the_connector_starts(tmp_path):
    import json
    from types import SimpleNamespace as NS

    from tutti.errors import ConfigError
    from tutti.vllm.config import ModelShape, TuttiConfig
    from tutti.vllm.scheduler import SchedulerSide
    from tutti.vllm.stats import TuttiStats

    for bad, says in ((str(tmp_path / "missing.json"), "missing.json"), (3, "expected the path"),
                      ("", "expected the path")):
        with pytest.raises(ConfigError, match=f"profile: .*{says}"):
            TuttiConfig.from_extra({"profile": bad})
    (tmp_path / "junk.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="profile: .*JSON object"):
        TuttiConfig.from_extra({"profile": str(tmp_path / "junk.json")})
    table = tmp_path / "p.json"
    table.write_text(json.dumps(_profile(read_gbps=0.05, n_layers=40).to_json()))
    cfg = TuttiConfig.from_extra({"path": str(tmp_path / "kv.img"), "profile": str(table)})
    shape = ModelShape(model_id="tests/profile", dtype="bfloat16", n_layers=32, kv_heads=8, head_dim=128,
                       block_size=BS, tp_size=1)
    vcfg = NS(cache_config=NS(prefix_caching_hash_algo="sha256"))
    with pytest.raises(ConfigError, match="profile: measured for a model of 40 layers"):
        SchedulerSide(cfg, shape, vcfg, TuttiStats())
    table.write_text(json.dumps(_profile(read_gbps=0.05).to_json()))
    s = SchedulerSide(TuttiConfig.from_extra({"path": str(tmp_path / "kv.img"), "profile": str(table)}), shape,
                      vcfg, TuttiStats())
    assert s.planner.prior is not None and s.planner.read_bps == 0.05e9


def _io_load(p, bps, blocks=10):
    p.observe_load(blocks * BLOCK_BYTES, blocks * BLOCK_BYTES / bps, stall_s=0.9 * blocks * BLOCK_BYTES / bps)


def test_a_store_cut_whole_is_measured_again_and_a_recovery_loads_again():
    """Hits cut whole measure nothing: once per PROBE_EVERY_S one loads whole; a probe far from the
    estimate starts it anew (a slow spell does not stop loading for good); one close to it keeps the cut."""
    from tutti.sched.online import PROBE_EVERY_S

    now = [0.0]
    p = LoadPlanner(BLOCK_BYTES, BS, L, clock=lambda: now[0])
    for _ in range(MIN_SAMPLES):
        _io_load(p, 1e6)                     # 1 MB/s: loading never pays
        p.observe_step(1000, 1000 * 1e-4)
    new = 100 * BS + 16
    assert p.blocks_to_load(100, new) == 0
    now[0] = PROBE_EVERY_S - 1
    assert p.blocks_to_load(100, new) == 0
    now[0] = PROBE_EVERY_S + 1
    assert p.blocks_to_load(100, new) == 100      # the probe...
    assert p.blocks_to_load(100, new) == 0        # ...one hit only
    _io_load(p, 1.2e6)                            # still slow: the cut stays
    assert p.blocks_to_load(100, new) == 0 and p.describe()["read_samples"] == MIN_SAMPLES + 1
    now[0] = 2 * PROBE_EVERY_S + 3
    assert p.blocks_to_load(100, new) == 100      # the next probe finds the store fast again
    _io_load(p, 20e9)
    assert p.describe()["read_samples"] == 1      # the slow window is dropped, the rate measured anew
    assert p.blocks_to_load(100, new) == 100
    for _ in range(MIN_SAMPLES):
        _io_load(p, 20e9)
    assert p.read_bps == pytest.approx(20e9) and p.blocks_to_load(100, new) == 100


def test_a_store_that_became_slow_is_not_taken_for_fast_for_good():
    """A load compute hid once says the store was at least that fast then, not forever: once the window
    holds only slow I/O-bound loads, hits are cut."""
    p = planner(read_bps=20e9, token_s=1e-4, hidden_bps=20e9)
    assert p.blocks_to_load(100, 1616) == 100
    from tutti.sched.online import WINDOW
    for _ in range(WINDOW):
        _io_load(p, 1e6)
    assert p.read_bps == pytest.approx(1e6) and p.blocks_to_load(100, 1616) < 100
