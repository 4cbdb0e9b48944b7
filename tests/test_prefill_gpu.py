"""Layer-wise prefill on the GPU: raw gio_uring (GioKV), the store's gio path (StoreKV), harness modes, SM domains.

The harness runs through GioKV (raw rings) and through StoreKV (a formatted store's gio path, GPU checksums).

Skips without torch, a CUDA device or build/libtutti_gpu.so ($TUTTI_GPU_LIB).  Also runs without
pytest (the GPU machine may not have it): python3 tests/test_prefill_gpu.py
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

try:
    import pytest
except ImportError:  # standalone run
    pytest = None


class Skip(Exception):
    pass


def _skip(reason):
    if pytest is not None:
        pytest.skip(reason)
    raise Skip(reason)


def _need_gpu():
    try:
        import torch
    except ImportError:
        _skip("torch is not installed")
    if not torch.cuda.is_available():
        _skip("no CUDA device")
    from tutti.gpu import GpuLibraryMissing, lib

    try:
        lib()
    except GpuLibraryMissing as e:
        _skip(str(e))
    return torch


def _shape():
    from tutti.sched import ModelShape

    # bf16, 16-token blocks, 2 KV heads x 64: one object = 4 KiB = one LBA
    return ModelShape(3, 256, 4, 2, 64, 512, name="gpu-test")


def _store(shape, n_slots, **kw):
    from tutti.prefill.kvio import open_emulated_store

    return open_emulated_store(shape, dtype="bfloat16", n_slots=n_slots, n_ns=2, n_queues=4, n_threads=2, **kw)


def test_gio_round_trip_bit_exact():
    torch = _need_gpu()
    from tutti.prefill import GioKV, PagedKVCache
    from tutti.prefill.profiling import measure_io

    shape = _shape()
    ctrl, gio, geo = _store(shape, 512)
    try:
        cache = PagedKVCache(shape, 1024, device="cuda", dtype=torch.bfloat16)
        cache.kv.normal_()
        kv = GioKV(gio, geo, cache, 512)
        slots = torch.randperm(512).tolist()
        r = measure_io(kv, cache, 512, slots, under_compute=False)
        assert r["errors"] == 0 and r["bit_exact"], r
        st = ctrl.stats()
        # every object written and read once: blocks x layers x (K, V), both ways
        assert st["cmds"] == 2 * 512 * shape.n_layers * 2 and st["errors"] == 0, st
        # both namespaces hold data (the store is striped over them)
        for ns in (1, 2):
            assert any(ctrl.ns_data(ns)[geo.data_off:geo.data_off + (1 << 20)]), ns
        kv.close()
    finally:
        gio.close()
        ctrl.close()


def test_rate_cap_holds():
    torch = _need_gpu()
    from tutti.prefill import GioKV, PagedKVCache
    from tutti.prefill.profiling import measure_io

    shape = _shape()
    ctrl, gio, geo = _store(shape, 1024, rate_gbps=1.0)
    try:
        cache = PagedKVCache(shape, 2048, device="cuda", dtype=torch.bfloat16)
        kv = GioKV(gio, geo, cache, 1024)
        r = measure_io(kv, cache, 1024, list(range(1024)), under_compute=False)
        assert r["read_gbps"] < 1.1 and r["write_gbps"] < 1.1, r
        assert r["read_gbps"] > 0.5, r  # and the cap is what limits it
        kv.close()
    finally:
        gio.close()
        ctrl.close()


def _store_kv(torch, shape, n_slots, cache, **params):
    import tempfile

    from tutti.prefill.kvio import StoreKV, open_store

    root = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    d = tempfile.mkdtemp(prefix="tutti-prefill-gpu-", dir=root)
    params = params or dict(n_queues=4, n_threads=2)
    s = open_store(shape, d, dtype="bfloat16", n_slots=n_slots, n_members=2, path="gio", **params)
    return s, StoreKV(s, cache), d


def test_store_io_round_trip_verified():
    """measure_io through the store's gio path: committed, read back bit-exact, GPU checksums all ok."""
    torch = _need_gpu()
    import shutil

    from tutti.prefill import PagedKVCache
    from tutti.prefill.profiling import measure_io

    shape = _shape()
    cache = PagedKVCache(shape, 512, device="cuda", dtype=torch.bfloat16)
    cache.kv.normal_()
    s, kv, d = _store_kv(torch, shape, 300, cache)
    try:
        r = measure_io(kv, cache, 256, [f"io-{i}" for i in range(256)], under_compute=False)
        assert r["errors"] == 0 and r["bit_exact"], r
        st = s.emulator_stats()
        assert st["errors"] == 0 and st["cmds"] == 2 * 256 * shape.n_layers * 2, st
        assert s.info()["n_committed"] == 0  # each round drops what it wrote
    finally:
        kv.close()
        s.close()
        shutil.rmtree(d, ignore_errors=True)


def test_harness_tutti_equals_hbm_on_gpu():
    """Mode tutti through raw gio_uring (GioKV, hostmem emulator) against hbm and recompute: the proven kind."""
    torch = _need_gpu()
    from tutti.prefill import Decoder, GioKV, PagedKVCache, PrefillHarness, new_block_table
    from tutti.sched import ComputeProfile, Hardware, SlackScheduler

    shape = _shape()
    T, blocks = 1000, 128
    nb = T // shape.block_size
    ctrl, gio, geo = _store(shape, 2 * nb)
    try:
        model = Decoder(shape, device="cuda", dtype=torch.bfloat16, vocab=500, seed=3)
        cache = PagedKVCache(shape, blocks, device="cuda", dtype=torch.bfloat16)
        kv = GioKV(gio, geo, cache, blocks)
        h = PrefillHarness(model, cache, kv)
        table = new_block_table(-(-T // shape.block_size), blocks, seed=1, device="cuda")
        tok = torch.randint(0, 500, (T,), device="cuda")
        rec = h.run("recompute", tok, table)
        slots = torch.randperm(nb).tolist()
        kv.bind([], [], slots, table[:nb].tolist())
        for l in range(shape.n_layers):
            kv.write(l, None)
        torch.cuda.synchronize()
        assert kv.errors() == 0
        stored = cache.kv.clone()
        sched = SlackScheduler(shape, Hardware(2.0, 2.0), ComputeProfile.analytic(shape, 50.0, 1000.0))
        for hit in (320, 640, T):
            plan = sched.plan_prefill(T, hit)
            ids = table[:plan.load_blocks].long()
            cache.kv[:, :, ids] = 0
            tut = h.run("tutti", tok, table, hit, plan=plan, read_slots=slots, write_slots=list(range(nb, 2 * nb)))
            assert torch.equal(cache.kv[:, :, ids], stored[:, :, ids]), hit  # the prefix came back bit-exact
            hbm = h.run("hbm", tok, table, hit)
            assert tut.io_errors == 0
            assert torch.equal(tut.logits, hbm.logits), hit
            assert torch.allclose(tut.logits, rec.logits, rtol=0.05, atol=0.05 * rec.logits.abs().max().item())
            assert len(tut.layer_load_s) == shape.n_layers and all(t > 0 for t in tut.layer_load_s)
            assert 0 <= tut.bubble_s < tut.ttft_s and tut.compute_s <= tut.ttft_s * 1.001
        kv.close()
    finally:
        gio.close()
        ctrl.close()


def test_harness_tutti_equals_hbm_on_gpu_store():
    """Mode tutti through the store (gio path, GPU checksums verified per load) against hbm and recompute.

    It hung on the H200 until the emulated controller got its own hardware queues (docs/gpu.md)."""
    torch = _need_gpu()
    import shutil

    from tutti.prefill import Decoder, PagedKVCache, PrefillHarness, new_block_table
    from tutti.sched import ComputeProfile, Hardware, SlackScheduler

    shape = _shape()
    T, blocks = 1000, 128
    nb = T // shape.block_size
    model = Decoder(shape, device="cuda", dtype=torch.bfloat16, vocab=500, seed=3)
    cache = PagedKVCache(shape, blocks, device="cuda", dtype=torch.bfloat16)
    s, kv, d = _store_kv(torch, shape, 3 * nb, cache)
    try:
        h = PrefillHarness(model, cache, kv)
        table = new_block_table(-(-T // shape.block_size), blocks, seed=1, device="cuda")
        tok = torch.randint(0, 500, (T,), device="cuda")
        rec = h.run("recompute", tok, table)  # also loads every compute kernel before any I/O is in flight
        keys = [f"prefix-{b}" for b in range(nb)]
        torch.cuda.synchronize()
        kv.bind([], [], keys, table[:nb].tolist())
        for l in range(shape.n_layers):
            kv.write(l)
        assert kv.finish() == 0
        slots = s.lookup(keys)
        stored = cache.kv.clone()
        sched = SlackScheduler(shape, Hardware(2.0, 2.0), ComputeProfile.analytic(shape, 50.0, 1000.0))
        for hit in (320, 640, T):
            plan = sched.plan_prefill(T, hit)
            ids = table[:plan.load_blocks].long()
            cache.kv[:, :, ids] = 0
            hbm = h.run("hbm", tok, table, hit)  # prefix zeroed: only the logits' kernels matter here
            cache.kv[:, :, ids] = 0
            tut = h.run("tutti", tok, table, hit, plan=plan, read_slots=slots,
                        write_slots=[f"run{hit}-{k}" for k in range(nb)])
            assert torch.equal(cache.kv[:, :, ids], stored[:, :, ids]), hit  # the prefix came back bit-exact
            assert tut.io_errors == 0 and kv.last_status["read"] == [0] * plan.load_blocks
            assert len(kv.written_slots) == T // shape.block_size - hit // shape.block_size
            kv.discard_writes()
            hbm = h.run("hbm", tok, table, hit)
            assert torch.equal(tut.logits, hbm.logits), hit
            assert torch.allclose(tut.logits, rec.logits, rtol=0.05, atol=0.05 * rec.logits.abs().max().item())
            assert len(tut.layer_load_s) == shape.n_layers and all(t > 0 for t in tut.layer_load_s)
            assert 0 <= tut.bubble_s < tut.ttft_s and tut.compute_s <= tut.ttft_s * 1.001
        assert s.emulator_stats()["errors"] == 0
    finally:
        kv.close()
        s.close()
        shutil.rmtree(d, ignore_errors=True)


def test_domains_compute_stream_runs_torch():
    torch = _need_gpu()
    from tutti.gpu import Domains

    d = Domains(16)
    try:
        io, comp = d.torch_streams()
        a = torch.randn(512, 512, device="cuda")
        with torch.cuda.stream(comp):
            b = a @ a
        comp.synchronize()
        torch.testing.assert_close(b, a @ a)
        if d.green:
            n_sms = torch.cuda.get_device_properties(0).multi_processor_count
            assert d.io_sms >= 16 and d.io_sms + d.compute_sms <= n_sms
        else:
            assert d.reason
    finally:
        d.close()


if __name__ == "__main__":
    pytest = None  # report skips ourselves
    failed = 0
    for name, fn in list(globals().items()):
        if name.startswith("test_") and callable(fn):
            try:
                fn()
                print(f"ok   {name}", flush=True)
            except Skip as e:
                print(f"skip {name}: {e}", flush=True)
            except Exception as e:  # noqa: BLE001 - the standalone runner reports every failing test and goes on
                import traceback

                traceback.print_exc()
                print(f"FAIL {name}: {e!r}", flush=True)
                failed += 1
    sys.exit(1 if failed else 0)
