"""tutti.gpu.store: the store through libtutti_gpu.so, transactions into GPU memory through its data paths.

CPU parts (argument checks, the reference "host" path, errors, the members' lock) run wherever the
library is built; GPU parts skip without torch, a CUDA device or build/libtutti_gpu.so ($TUTTI_GPU_LIB).
Blocks cross over to the CPU path: tutti.Store (the cffi extension) where it is built, else the same C
store's host-memory path in libtutti_gpu.so (GpuStore.put/get: CPU engine, CPU XXH3).
Also runs without pytest (the GPU machine may not have it): python3 tests/test_gpu_store_py.py
"""
import errno
import os
import shutil
import sys
import tempfile
import time

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


def _torch():
    try:
        import torch
    except ImportError:
        _skip("torch is not installed")
    return torch


def _need_lib():
    _torch()  # first: one CUDA runtime in the process
    from tutti.gpu import GpuLibraryMissing, lib

    try:
        lib()
    except GpuLibraryMissing as e:
        _skip(str(e))
    except OSError as e:
        _skip(f"libtutti_gpu.so not loadable here: {e}")


def _need_gpu():
    torch = _torch()
    if not torch.cuda.is_available():
        _skip("no CUDA device")
    _need_lib()
    return torch


L, S, KVH, HD, BS = 4, 2, 2, 64, 16  # bf16: one object = 16 x 2 x 64 x 2 B = 4 KiB


def _fp():
    from tutti.model import Fingerprint

    return Fingerprint(model_id="tests/gpu-store-py", dtype="bfloat16", n_layers=L, kv_heads=KVH, head_dim=HD,
                       block_size=BS)


class _Dir:
    """Member files in a fresh directory (/dev/shm when there: a RAM-speed store), removed at exit."""

    def __init__(self, n=2, root=None):
        root = root or ("/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None)
        self.dir = tempfile.mkdtemp(prefix="tutti-gpu-py-", dir=root)
        self.paths = [os.path.join(self.dir, f"m{i}") for i in range(n)]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        shutil.rmtree(self.dir, ignore_errors=True)


def _format(paths, n_slots=128, stripe_objs=5):
    from tutti.gpu import GpuStore

    GpuStore.format(paths, _fp(), n_slots=n_slots, stripe_objs=stripe_objs)  # a layer spread over members


def _cache(torch, device, nb=64, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    return torch.randn((L, S, nb, BS, KVH, HD), generator=g, device=device).to(torch.bfloat16)


def _block_bytes(cache, b) -> bytes:
    """Block b as the store holds it: objects in (layer, span) order."""
    return cache[:, :, b].contiguous().view(-1).view(__import__("torch").uint8).cpu().numpy().tobytes()


class _CpuPath:
    """tutti.Store (cffi extension) if built, else GpuStore's host-memory path: both are the C store's CPU engine."""

    def __init__(self, paths):
        self.paths = paths
        try:
            from tutti.store import Store
        except ImportError:
            Store = None
        self.kind = "tutti.Store" if Store is not None else "GpuStore host path"
        if Store is not None:
            self.s = Store.open(paths, expect=_fp())
        else:
            from tutti.gpu import GpuStore

            self.s = GpuStore.open(paths, expect=_fp())

    def __enter__(self):
        return self.s

    def __exit__(self, *exc):
        self.s.close()


def _flip_bit(store, slot, layer, span):
    member, off = store.locate(slot, layer, span)
    with open(store.paths[member], "r+b") as f:
        f.seek(off + 1234)
        b = f.read(1)
        f.seek(off + 1234)
        f.write(bytes([b[0] ^ 0x10]))
        f.flush()
        os.fsync(f.fileno())


# ------------------------------------------------------------------ CPU: no GPU needed


def test_devicekv_forms_and_checks():
    torch = _torch()
    from tutti.gpu.store import DeviceKV
    from tutti.model import Geometry

    c = torch.zeros((L, S, 8, BS, KVH, HD), dtype=torch.bfloat16)
    a = DeviceKV.from_tensor(c)
    assert (a.n_layers, a.n_spans, a.num_blocks, a.obj_bytes, a.device) == (L, S, 8, 4096, None)
    assert a.bases[1] - a.bases[0] == c.stride(1) * 2 and a.strides[0] == c.stride(2) * 2
    assert a.uniform_layers() is None
    # vLLM per layer [2, blocks, ...] and separate K/V tensors give the same addresses
    b = DeviceKV.from_tensor([c[l] for l in range(L)])
    kv = DeviceKV.from_tensor([(c[l, 0], c[l, 1]) for l in range(L)])
    assert a.bases == b.bases == kv.bases and a.strides == b.strides == kv.strides
    assert a.memmap.n_layers == L and a.memmap.base[3] == a.bases[3]
    geo = Geometry(n_layers=L, n_spans=S, span_bytes=4096, obj_stride=4096, n_members=1, stripe_objs=1, n_slots=8,
                   data_off=1 << 20)
    a.check_geometry(geo)
    for bad in (dict(n_layers=L + 1), dict(span_bytes=8192)):
        try:
            a.check_geometry(Geometry(**{**geo.to_dict(), **bad}))
            raise AssertionError(bad)
        except ValueError as e:
            assert "store" in str(e)
    assert a.block_ids([0, 7, 3], unique=True) == [0, 7, 3]
    assert a.block_ids(torch.tensor([1, 2]), unique=True) == [1, 2]
    for ids, exc, msg in (([8], IndexError, "outside"), ([1, 1], ValueError, "twice"), ([None], TypeError, "ints")):
        try:
            a.block_ids(ids, unique=True)
            raise AssertionError(ids)
        except exc as e:
            assert msg in str(e), e
    assert a.block_ids([1, 1], unique=False) == [1, 1]  # a write may store one block twice
    # K and V of separate allocations still make one descriptor per layer (any span stride) ...
    assert DeviceKV.from_tensor([(c[l, 0], c[l, 1].clone()) for l in range(L)]).uniform_layers() is None
    # ... unless their block strides differ: fine for the memmap, not for the gio path
    wide = torch.zeros((16, BS, KVH, HD), dtype=torch.bfloat16)[::2]
    sep = DeviceKV.from_tensor([(c[l, 0], wide) for l in range(L)])
    assert "block stride" in sep.uniform_layers()
    for bad, msg in (([c[0], c[1][:1]], "spans"), ([c[0, :, :4], c[1]], "blocks"),
                     ([c[l, :, :, ::2] for l in range(L)], "contiguous"), ([[1, 2]], "tensors")):
        try:
            DeviceKV.from_tensor(bad)
            raise AssertionError(msg)
        except (ValueError, TypeError) as e:
            assert msg in str(e), e


def test_store_errors_and_lock():
    _need_lib()
    torch = _torch()
    from tutti.gpu import GpuStore, StoreBusyError, StoreError
    from tutti.gpu.store import DeviceKV, FingerprintMismatch
    from tutti.model import Fingerprint

    with _Dir() as d:
        try:
            GpuStore.open(d.paths)
            raise AssertionError("opened missing members")
        except StoreError as e:
            assert d.paths[0] in str(e) or "member" in str(e), e
        _format(d.paths)
        try:
            GpuStore.open(d.paths, expect=Fingerprint("other", "bfloat16", L, KVH, HD, BS))
            raise AssertionError("fingerprint")
        except FingerprintMismatch as e:
            assert "other" in str(e)
            # One hierarchy for both bindings: code written against tutti.errors catches it.
            import tutti.errors
            assert isinstance(e, tutti.errors.FingerprintMismatch) and isinstance(e, tutti.errors.TuttiError)
        with GpuStore.open(d.paths, expect=_fp()) as s:
            try:
                GpuStore.open(d.paths)  # the members' lock: also in one process
                raise AssertionError("opened twice")
            except StoreBusyError as e:
                assert e.errno == errno.EBUSY
            kv = DeviceKV.from_tensor(torch.zeros((L, S, 4, BS, KVH, HD), dtype=torch.bfloat16))
            for call, exc, msg in ((lambda: s.read([0], kv, [0]), RuntimeError, "attach"),
                                   (lambda: s.attach("nvme"), ValueError, "one of"),
                                   (lambda: s.attach("gio", backing="hostmem"), ValueError, "file"),
                                   (lambda: s.attach("staged", rate_gbps=3.0), ValueError, "gio parameters"),
                                   (lambda: s.attach("gio", depth=16), ValueError, "64"),
                                   (lambda: s.invalidate([10 ** 9]), StoreError, "slot"),
                                   (lambda: s.put("k", b"short"), ValueError, "bytes"),
                                   (lambda: s.get("missing"), KeyError, "missing")):
                try:
                    call()
                    raise AssertionError(msg)
                except exc as e:
                    assert msg in str(e), (msg, e)
            s.attach("host")
            try:
                s.read([5], kv, [0])  # slot 5 holds nothing
                raise AssertionError("read an empty slot")
            except StoreError as e:
                assert e.errno == errno.ENOENT and "5" in str(e), e
            try:
                s.write(["a", "b"], kv, [0])
                raise AssertionError("ids")
            except ValueError as e:
                assert "2 blocks" in str(e)
        assert s.closed


def test_host_path_round_trip_corruption_and_tp_calls():
    """The store's data-path code with the C reference path over host memory: everything but the GPU."""
    _need_lib()
    torch = _torch()
    from tutti.gpu import GpuStore, StoreError
    from tutti.gpu.store import DeviceKV

    with _Dir() as d:
        _format(d.paths)
        cache = _cache(torch, "cpu")
        with GpuStore.open(d.paths, expect=_fp()) as s:
            s.attach("host")
            kv = DeviceKV.from_tensor(cache)
            ids = [9, 3, 40, 17, 22]
            keys = [f"h{i}" for i in range(len(ids))]
            with s.write(keys, kv, ids) as t:
                assert not any(t.present)
                st = t.transfer()
            assert st == [0] * len(ids)
            for k, b in zip(keys, ids):
                assert s.get(k) == _block_bytes(cache, b)
            # stored again: present, nothing moves; prepare/veto as tutti.tp.commit calls them
            t = s.write(keys[:2] + ["h-new", "h-vetoed"], kv, [1, 2, 5, 6])
            assert t.present == [True, True, False, False]
            for l in range(L):
                t.layer(l)
            assert t.prepare() == [0, 0, 0, 0]
            t.veto(3)
            assert t.finish() == [0, 0, 0, -errno.ECANCELED]
            assert s.lookup(["h-new", "h-vetoed"])[1] is None
            slots = s.lookup(keys)
            out = torch.zeros_like(cache)
            dst = [0, 1, 2, 3, 4]
            _flip_bit(s, slots[2], L - 1, 1)
            with s.read(slots, DeviceKV.from_tensor(out), dst) as t:
                for l in range(L):
                    t.layer(l)
                    t.wait_layer(l)
                try:
                    t.order(0, 0)
                    raise AssertionError("host path ordered a stream")
                except StoreError as e:
                    assert e.errno == errno.EOPNOTSUPP
                st = t.finish()
            assert st == [0, 0, -errno.EBADMSG, 0, 0], st
            for i in (0, 1, 3, 4):
                assert torch.equal(out[:, :, dst[i]], cache[:, :, ids[i]])
            assert s.lookup(keys)[2] is None and s.stats()["corrupt_blocks"] == 1
            t = s.read([slots[0]], kv, [0])
            t.layer(0)
        assert t._h is None  # close() aborted it


def test_gpu_binding_covers_the_store_structs():
    """The store's structs come with their fields from the headers (tutti._cdefs); tests/test_cdefs.py
    compares every struct of the binding with the compiler's layout."""
    from tutti.gpu._ffi import ffi

    for s in ("tt_open_params", "tt_store_info", "tt_memmap", "tt_gio_path_params", "tt_file_path_params",
              "tt_devpath_ops", "tt_engine_params", "tt_store_stats"):
        assert ffi.typeof(f"struct {s}").fields, s
        ffi.sizeof(f"struct {s}")


# ------------------------------------------------------------------ GPU


def _round_trips(torch, path, **params):
    """GPU write through ``path`` -> CPU read; CPU write -> GPU read into other blocks; corruption."""
    from tutti.gpu import GpuStore
    from tutti.gpu.store import DeviceKV

    out = {}
    with _Dir() as d:
        _format(d.paths)
        cache = _cache(torch, "cuda", seed=1)
        nb = 24
        ids = torch.randperm(64, generator=torch.Generator().manual_seed(2))[:nb].tolist()
        keys = [f"g{i}" for i in range(nb)]
        with GpuStore.open(d.paths, expect=_fp()) as s:
            s.attach(path, **params)
            kv = DeviceKV.from_tensor(cache)
            torch.cuda.synchronize()
            t = s.write(keys, kv, ids)
            for layer in range(L):
                t.layer(layer)
            # poll() (tt_txn_poll through the path's poll): never waits, true once every layer is done
            end, out["polls"] = time.monotonic() + 60, 1
            while not t.poll():
                assert time.monotonic() < end, f"{path}: poll() never saw the write complete"
                out["polls"] += 1
                time.sleep(0.0005)
            st = t.finish()
            assert st == [0] * nb, st
            if path == "gio":
                out["emu"] = s.emulator_stats()
        with _CpuPath(d.paths) as c:
            out["cpu"] = type(c).__name__
            for k, b in zip(keys, ids):
                assert c.get(k) == _block_bytes(cache, b), (path, k)
            # the CPU path stores other blocks' bytes under new keys
            keys2 = [f"c{i}" for i in range(nb)]
            for k, b in zip(keys2, ids):
                c.put(k, _block_bytes(cache, (b + 1) % 64))
        with GpuStore.open(d.paths, expect=_fp()) as s:
            s.attach(path, **params)
            slots = s.lookup(keys2)
            dst = torch.randperm(64, generator=torch.Generator().manual_seed(3))[:nb].tolist()
            into = torch.zeros_like(cache)
            with s.read(slots, DeviceKV.from_tensor(into), dst) as t:
                st = t.transfer()
            assert st == [0] * nb, st
            for i in range(nb):
                assert torch.equal(into[:, :, dst[i]], cache[:, :, (ids[i] + 1) % 64]), (path, i)
            # one flipped bit on disk: that block alone is -EBADMSG, and dropped
            _flip_bit(s, slots[5], 2, 0)
            with s.read(slots, DeviceKV.from_tensor(into), dst) as t:
                st = t.transfer()
            assert st == [0] * 5 + [-errno.EBADMSG] + [0] * (nb - 6), st
            assert s.lookup(keys2)[5] is None and s.stats()["corrupt_blocks"] == 1
    return out


def test_gio_round_trips_with_the_cpu_path():
    torch = _need_gpu()
    r = _round_trips(torch, "gio", n_queues=4, depth=64, n_threads=2)
    assert r["emu"]["errors"] == 0 and r["emu"]["cmds"] >= 24 * L * S, r


def test_staged_round_trips_with_the_cpu_path():
    torch = _need_gpu()
    _round_trips(torch, "staged", n_threads=2, chunk_bytes=64 << 10)


class LayerOrderRig:
    """A store of ``nb`` blocks written through the gio path (slow enough to be caught out), and a read whose
    layers a compute stream consumes after ``order()``, no host wait (hang_probe.py and
    test_gpu_controller_context.py run it too)."""

    def __init__(self, torch, paths, compute, nb=96, seed=4):
        from tutti.gpu import GpuStore
        from tutti.gpu.store import DeviceKV

        self.torch, self.compute, self.nb = torch, compute, nb
        _format(paths, n_slots=256)
        self.cache = _cache(torch, "cuda", nb=2 * nb, seed=seed)
        self.src, self.dst = list(range(nb)), list(range(nb, 2 * nb))
        self.got = torch.zeros((L, S, nb, BS, KVH, HD), dtype=torch.bfloat16, device="cuda")
        self.idx = torch.tensor(self.dst, device="cuda")
        with torch.cuda.stream(compute):  # load the copy kernels now: lazy loading waits for an idle device
            self.got[0].copy_(self.cache[0].index_select(1, self.idx))
        torch.cuda.synchronize()
        self.store = GpuStore.open(paths, expect=_fp())
        self.store.attach("gio", n_queues=4, depth=64, n_threads=2, rate_gbps=2.0)
        self.kv = DeviceKV.from_tensor(self.cache)
        self.keys = [f"o{i}" for i in range(nb)]
        assert self.store.write(self.keys, self.kv, self.src).transfer() == [0] * nb

    def read_round(self):
        """One layer-ordered read; True if every layer landed before compute used it."""
        torch, nb = self.torch, self.nb
        self.cache[:, :, nb:] = 0
        torch.cuda.synchronize()
        t = self.store.read(self.store.lookup(self.keys), self.kv, self.dst)
        for layer in range(L):
            t.layer(layer)
            t.order(layer, self.compute)
            with torch.cuda.stream(self.compute):
                self.got[layer].copy_(self.cache[layer].index_select(1, self.idx))
        self.compute.synchronize()
        assert t.finish() == [0] * nb
        return torch.equal(self.got, self.cache[:, :, :nb])

    def close(self):
        self.store.close()


def test_layer_order_compute_waits_on_the_gpu():
    """Per layer: order(l, compute) then a copy on compute, no host wait: every layer must have landed."""
    torch = _need_gpu()
    with _Dir() as d:
        rig = LayerOrderRig(torch, d.paths, torch.cuda.Stream())
        try:
            assert rig.read_round(), "compute ran before its layer landed"
        finally:
            rig.close()


def test_current_device_is_respected():
    torch = _need_gpu()
    from tutti.gpu import GpuStore

    n = torch.cuda.device_count()
    with _Dir() as d:
        _format(d.paths)
        with GpuStore.open(d.paths) as s:
            with torch.cuda.device(n - 1):
                s.attach("staged", n_threads=1)
            assert s.device == n - 1
            cache = _cache(torch, "cuda:0", nb=4)
            if n > 1:  # memory on another device than the path's: refused before anything moves
                from tutti.gpu.store import DeviceKV

                try:
                    s.write(["x"], DeviceKV.from_tensor(cache), [0])
                    raise AssertionError("wrong device accepted")
                except ValueError as e:
                    assert "cuda:0" in str(e)


def test_gpu_objects_refuse_use_when_closed_and_free_when_dropped():
    """Every object owning C resources: a closed one raises ValueError (no call with a freed handle), a dropped
    one is freed by its finalizer; a GpuStore dropped with a GPU path attached releases its members' lock."""
    import gc

    _need_gpu()
    from tutti.gpu import Domains, EmulatedController, Gio, GpuStore

    ctrl = EmulatedController(n_ns=1, ns_bytes=1 << 20, n_queues=2, depth=64, n_threads=1)
    gio = Gio(ctrl)
    batch = gio.batch(16)
    finalizers = [o._finalizer for o in (batch, gio, ctrl)]
    batch.close()
    batch.close()  # idempotent
    # F821: ruff sees the del below; these closures run before it, and must not keep the objects alive.
    for call in (lambda: batch.size, lambda: batch.result(), lambda: batch.errors(),  # noqa: F821
                 lambda: gio.submit_wait(batch), lambda: gio.issue(batch), lambda: gio.wait_cqe(batch)):  # noqa: F821
        try:
            call()
            raise AssertionError("a closed batch was used")
        except ValueError as e:
            assert "closed" in str(e), e
    gio.close()
    for call in (lambda: gio.batch(4), lambda: gio.handle):  # noqa: F821 - as above
        try:
            call()
            raise AssertionError("a closed gio handle was used")
        except ValueError as e:
            assert "closed" in str(e), e
    del batch, gio, ctrl  # the controller was never closed: its finalizer stops it
    gc.collect()
    assert not any(f.alive for f in finalizers)

    d = Domains(8)
    f = d._finalizer
    d.close()
    try:
        d.torch_streams()
        raise AssertionError("streams of closed domains")
    except ValueError as e:
        assert "closed" in str(e), e
    del d
    gc.collect()
    assert not f.alive

    with _Dir() as dr:
        _format(dr.paths)
        s = GpuStore.open(dr.paths).attach("staged", n_threads=1)
        del s
        gc.collect()
        GpuStore.open(dr.paths).close()  # the dropped store's lock (and its path's threads) are gone


def test_gds_round_trip_or_clear_refusal():
    """Last: cuFile is the least predictable library here (a crash must not hide the other results)."""
    torch = _need_gpu()
    from tutti.gpu import GdsUnavailable, StoreError

    try:
        _round_trips(torch, "gds", n_threads=2)
    except GdsUnavailable as e:
        _skip(f"cuFile unavailable here: {e}")
    except StoreError as e:
        if "cuFile" in str(e) or "gds" in str(e):  # cuFile 1.15 without nvidia-fs: registering the files fails
            _skip(f"cuFile refused the store's files: {e}")
        raise


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


def test_errors_import_without_the_cpu_extension():
    """The GPU machine's binding raises tutti.errors' classes, so that module must not need tutti._tutti."""
    import subprocess
    import sys
    code = (
        "import sys, importlib.abc\n"
        "class NoExt(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name == 'tutti._tutti': raise ImportError('no extension here')\n"
        "sys.meta_path.insert(0, NoExt())\n"
        "import tutti.errors as e\n"
        "assert issubclass(e.CorruptBlockError, OSError)\n"
        "print('ok')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
