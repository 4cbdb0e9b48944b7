"""Layer-wise prefill on the CPU: paged-KV prefill vs recompute, harness modes, tutti-admin profile.

(The GPU binding's struct layouts are checked against the headers in tests/test_cdefs.py.)
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (make vllm installs it)")

from tutti.prefill import TINY_SHAPE, Decoder, HostKV, PagedKVCache, PrefillHarness, attend, new_block_table
from tutti.sched import ComputeProfile, Hardware, SlackScheduler

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BS = TINY_SHAPE.block_size
VOCAB = 97


@pytest.fixture
def model():
    return Decoder(TINY_SHAPE, vocab=VOCAB, seed=7)


def _tokens(n, seed=0):
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed))


def _hidden(model, tokens, cache, table, prefix):
    """Final hidden states of the new tokens (before the LM head)."""
    x = model.embed_tokens(tokens[prefix:])
    for l in range(model.shape.n_layers):
        x = model.layer(l, x, cache, table, prefix)
    return x


def test_attention_is_causal_lower_right():
    g = torch.Generator().manual_seed(1)
    T, S, H, KV, D = 5, 12, 4, 2, 8
    q, k, v = torch.randn(T, H, D, generator=g), torch.randn(S, KV, D, generator=g), torch.randn(S, KV, D, generator=g)
    out = attend(q, k, v)
    kr, vr = k.repeat_interleave(H // KV, 1), v.repeat_interleave(H // KV, 1)
    scores = torch.einsum("thd,shd->hts", q, kr) / D ** 0.5
    visible = torch.arange(S)[None, :] <= (S - T + torch.arange(T))[:, None]  # query i sees keys up to S-T+i
    ref = torch.einsum("hts,shd->thd", scores.masked_fill(~visible, float("-inf")).softmax(-1), vr)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    # and the mask matters: upper-left causal would hide most of the prefix
    assert not torch.allclose(out, attend(q, k[:T], v[:T]), atol=1e-3)


@pytest.mark.parametrize("prefix", [16, 48, 96])
def test_paged_prefix_prefill_matches_recompute(model, prefix):
    T, blocks = 100, 64
    tok = _tokens(T)
    full = PagedKVCache(TINY_SHAPE, blocks)
    t_full = new_block_table(-(-T // BS), blocks, seed=1)
    ref = _hidden(model, tok, full, t_full, 0)

    # Another cache, another shuffled block table: only the prefix's KV is copied over (by position).
    cache = PagedKVCache(TINY_SHAPE, blocks)
    table = new_block_table(-(-T // BS), blocks, seed=2)
    assert not torch.equal(table, t_full)
    for l in range(TINY_SHAPE.n_layers):
        k, v = full.gather(l, t_full, prefix)
        cache.write(l, table, 0, k, v)
    out = _hidden(model, tok, cache, table, prefix)
    torch.testing.assert_close(out, ref[prefix:], rtol=1e-4, atol=1e-4)
    # the suffix's KV landed in the new cache's blocks as recompute put it in its own
    for l in range(TINY_SHAPE.n_layers):
        torch.testing.assert_close(cache.gather(l, table, T)[0], full.gather(l, t_full, T)[0], rtol=1e-4, atol=1e-4)
    # and the prefix's KV is used: without it the result differs
    empty = PagedKVCache(TINY_SHAPE, blocks)
    assert not torch.allclose(_hidden(model, tok, empty, table, prefix), ref[prefix:], atol=1e-2)


def _scheduler():
    prof = ComputeProfile.analytic(TINY_SHAPE, tflops=0.01, mem_gbps=10.0)
    return SlackScheduler(TINY_SHAPE, Hardware(read_gbps=0.05, write_gbps=0.05), prof)


@pytest.mark.parametrize("hit", [0, 40, 64, 100])
def test_harness_modes_agree(model, hit):
    T, blocks = 100, 64
    tok = _tokens(T, seed=3)
    cache = PagedKVCache(TINY_SHAPE, blocks)
    kv = HostKV(cache)
    h = PrefillHarness(model, cache, kv)
    table = new_block_table(-(-T // BS), blocks, seed=4)
    rec = h.run("recompute", tok, table)
    assert rec.new_tokens == T and rec.load_tokens == 0 and len(rec.layer_compute_s) == TINY_SHAPE.n_layers

    # store every full block at shuffled slots, as a previous request would have
    nb = T // BS
    slots = torch.randperm(50, generator=torch.Generator().manual_seed(5))[:nb].tolist()
    kv.bind([], [], slots, table[:nb].tolist())
    for l in range(TINY_SHAPE.n_layers):
        kv.write(l)
    write_slots = list(range(100, 100 + nb))

    plan = _scheduler().plan_prefill(T, hit)
    cache.kv[:, :, table[:plan.load_blocks].long()] = 0  # the prefix can only come from the store
    tut = h.run("tutti", tok, table, hit, plan=plan, read_slots=slots, write_slots=write_slots)
    hbm = h.run("hbm", tok, table, hit)
    assert tut.load_tokens == hbm.load_tokens == plan.load_tokens == min(hit // BS, (T - 1) // BS) * BS
    assert tut.new_tokens == T - tut.load_tokens
    torch.testing.assert_close(tut.logits, rec.logits, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(hbm.logits, tut.logits, rtol=0, atol=0)
    assert tut.io_errors == 0
    assert (len(tut.layer_load_s) == TINY_SHAPE.n_layers) == (plan.load_blocks > 0)
    # every new full block was written, in the prefill or after it, to its slot
    n_writes = T // BS - hit // BS
    assert tut.writes_in_prefill + tut.deferred_writes == (TINY_SHAPE.n_layers if n_writes else 0)
    for k in range(n_writes):
        b = int(table[hit // BS + k])
        torch.testing.assert_close(kv.slots[write_slots[k]], cache.kv[:, :, b])


def test_harness_rejects_plan_of_another_request(model):
    cache = PagedKVCache(TINY_SHAPE, 16)
    h = PrefillHarness(model, cache, HostKV(cache))
    plan = _scheduler().plan_prefill(64, 32)
    with pytest.raises(ValueError, match="plan is for"):
        h.run("tutti", _tokens(80), new_block_table(5, 16), 48, plan=plan)
    with pytest.raises(ValueError, match="mode"):
        h.run("fast", _tokens(80), new_block_table(5, 16))


def _cli(*args):
    from click.testing import CliRunner

    from tutti.cli import main

    return CliRunner().invoke(main, list(args))


def test_profile_cli_tiny(tmp_path):
    out = tmp_path / "profile.json"
    r = _cli("profile", "--device", "cpu", "--tiny", "--repeats", "1", "--out", str(out))
    assert r.exit_code == 0, r.output
    d = json.loads(out.read_text())
    prof = ComputeProfile.from_json(d)  # the scheduler accepts it
    assert d["version"] == 1 and d["model"]["n_layers"] == TINY_SHAPE.n_layers
    assert d["model"]["dtype"] == "float32" and d["model"]["n_kv_heads"] == TINY_SHAPE.n_kv_heads
    assert len(d["compute"]) == 9 and all(p["layer_s"] > 0 for p in d["compute"])
    assert {(p["new_tokens"], p["prefix_tokens"]) for p in d["compute"]} == {
        (n, p) for n in (16, 48, 96) for p in (0, 64, 160)}
    assert "io" not in d and prof.layer_time(48, 64) > 0


def test_profile_cli_errors(tmp_path):
    r = _cli("profile", "--device", "cpu", "--tiny", "--grid", "16:x", "--out", str(tmp_path / "p.json"))
    assert r.exit_code == 2 and "NEW:PREFIX" in r.output
    r = _cli("profile", "--device", "cpu", "--tiny", "--io", "--out", str(tmp_path / "p.json"))
    assert r.exit_code == 2 and "CUDA" in r.output
    assert not (tmp_path / "p.json").exists()


def test_gpu_and_prefill_import_without_the_extension():
    """tutti.gpu (cffi ABI mode) and tutti.prefill must not need tutti._tutti, which GPU machines may lack."""
    code = textwrap.dedent("""
        import sys
        sys.modules["tutti._tutti"] = None  # importing it now fails
        import tutti.gpu, tutti.prefill, tutti.sched
        assert "tutti._tutti" not in sys.modules or sys.modules["tutti._tutti"] is None
        try:
            from tutti import Store
        except ImportError:
            print("lazy ok")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "lazy ok" in r.stdout


def test_gpu_library_missing_is_explained(monkeypatch, tmp_path):
    from tutti.gpu import GpuLibraryMissing, _ffi

    monkeypatch.setattr(_ffi, "_lib", None)
    monkeypatch.setenv("TUTTI_GPU_LIB", str(tmp_path / "nope.so"))
    with pytest.raises(GpuLibraryMissing, match="make gpu-lib"):
        _ffi.lib()


def test_plan_geometry_is_the_formatted_stores(tmp_path, gpu_lib):
    """tutti.gpu.plan_geometry (ABI binding of tt_store_plan) gives the geometry Store.format writes."""
    tutti_store = pytest.importorskip("tutti.store", reason="tutti._tutti extension not built")
    from tutti import LLAMA3_8B
    from tutti.gpu import plan_geometry

    paths = [str(tmp_path / "m0.img"), str(tmp_path / "m1.img")]
    tutti_store.Store.format(paths, LLAMA3_8B, n_slots=96)
    with tutti_store.Store.open(paths, expect=LLAMA3_8B) as s:
        want = s.geometry
    got, need = plan_geometry(n_layers=32, kv_heads=8, head_dim=128, block_size=16, dtype="bfloat16",
                              n_members=2, n_slots=96)
    assert got == want
    assert need >= got.data_off + got.n_slots * got.slot_bytes // 2


def test_harness_tutti_through_the_store_host_path(model, tmp_path, gpu_lib):
    """Mode tutti through StoreKV: a real store (records, checksums, per-block status) with the C reference
    data path over host memory, so the harness's store logic runs without a GPU."""
    from tutti.prefill.kvio import StoreKV, open_store

    T, blocks = 100, 64
    nb = T // BS
    tok = _tokens(T, seed=5)
    cache = PagedKVCache(TINY_SHAPE, blocks)
    s = open_store(TINY_SHAPE, str(tmp_path), dtype="float32", n_slots=64, path="host")
    try:
        kv = StoreKV(s, cache)
        h = PrefillHarness(model, cache, kv)
        table = new_block_table(-(-T // BS), blocks, seed=6)
        rec = h.run("recompute", tok, table)
        keys = [f"prefix-{b}" for b in range(nb)]
        kv.bind([], [], keys, table[:nb].tolist())
        for l in range(TINY_SHAPE.n_layers):
            kv.write(l)
        assert kv.finish() == 0
        slots = s.lookup(keys)
        stored = cache.kv.clone()
        for hit in (40, 64, T):
            plan = _scheduler().plan_prefill(T, hit)
            ids = table[:plan.load_blocks].long()
            cache.kv[:, :, ids] = 0
            wkeys = [f"run{hit}-{k}" for k in range(nb)]
            tut = h.run("tutti", tok, table, hit, plan=plan, read_slots=slots, write_slots=wkeys)
            assert torch.equal(cache.kv[:, :, ids], stored[:, :, ids])
            assert tut.io_errors == 0 and kv.last_status["read"] == [0] * plan.load_blocks
            hbm = h.run("hbm", tok, table, hit)
            torch.testing.assert_close(hbm.logits, tut.logits, rtol=0, atol=0)
            torch.testing.assert_close(tut.logits, rec.logits, rtol=1e-4, atol=1e-4)
            n_writes = T // BS - hit // BS
            assert tut.writes_in_prefill + tut.deferred_writes == (TINY_SHAPE.n_layers if n_writes else 0)
            got = s.lookup(wkeys[:n_writes])
            assert None not in got and len(kv.written_slots) == n_writes
            assert kv.discard_writes() == n_writes and s.lookup(wkeys[:n_writes]) == [None] * n_writes
    finally:
        s.close()


def _prefill_bench():
    """benchmarks/prefill.py as a module, imported by path (its top level needs neither torch nor CUDA)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("prefill_bench", os.path.join(ROOT, "benchmarks", "prefill.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_prefill_bench_kv_choice():
    """--kv gio (default: the published numbers' raw gio_uring over a hostmem emulator) or --kv store."""
    b = _prefill_bench()
    p = b.parser()
    a = p.parse_args(["run"])
    assert a.kv == "gio" and a.fn is b.run
    assert b.command_line(a) == "python3 benchmarks/prefill.py run"
    meta = b.KV_KINDS[a.kv].meta(a)
    assert meta["emulator"]["backing"] == "hostmem" and "store" not in meta
    assert p.parse_args(["run", "--kv", "gio", "--quick"]).kv == "gio"
    s = p.parse_args(["run", "--kv", "store"])
    assert s.kv == "store" and b.command_line(s) == "python3 benchmarks/prefill.py run --kv store"
    assert b.KV_KINDS[s.kv].meta(s)["store"]["path"] == "gio"
    with pytest.raises(SystemExit):
        p.parse_args(["run", "--kv", "gds"])


def test_prefill_bench_render_says_which_store(tmp_path):
    """Results without a "store" key are the raw emulated namespaces on host memory; with one, the real store."""
    src = os.path.join(ROOT, "benchmarks", "prefill_h200.json")
    if not os.path.exists(src):
        pytest.skip("no benchmarks/prefill_h200.json")
    b = _prefill_bench()
    with open(src) as f:
        data = json.load(f)
    data["meta"].pop("store", None)
    data["meta"]["emulator"]["backing"] = "hostmem"
    raw = b.render_section(data)
    assert "raw gio_uring over 2 namespaces" in raw and "pinned host memory" in raw and "GpuStore" not in raw
    data["meta"]["store"] = {"path": "gio", "dir": "/dev/shm", "members": 2, "verify": "GPU XXH3, every load"}
    data["meta"]["emulator"]["backing"] = "file (the store's members in /dev/shm)"
    data["meta"]["command"] += " --kv store"
    st = b.render_section(data)
    assert "formatted Tutti store (`tutti.gpu.GpuStore`)" in st and "--kv store" in st and "raw gio_uring" not in st
