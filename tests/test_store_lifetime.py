"""Objects that own C resources: a dropped one releases them (finalizers), a closed one refuses every use
with a clear error instead of touching freed memory.  Both libraries: tutti.Store (the extension) and
tutti.gpu.GpuStore (libtutti_gpu.so, whose "host" data path runs the device-memory code on CPU tensors)."""
import errno
import gc

import pytest

from tutti import PagedBuffer, Store, TuttiError


def _host_kv(torch, g, fill, n_blocks=4):
    """A paged KV cache of ``n_blocks`` blocks in host memory, shaped for geometry ``g``."""
    return fill((g.n_layers, g.n_spans, n_blocks, g.span_bytes // 2), dtype=torch.float16)


@pytest.fixture(params=["cpu", "gpu"])
def store_cls(request):
    """tutti.Store (the extension), and tutti.gpu.GpuStore where libtutti_gpu.so loads."""
    if request.param == "cpu":
        return Store
    request.getfixturevalue("gpu_lib")
    from tutti.gpu import GpuStore

    return GpuStore


def test_a_dropped_store_releases_its_members(make_store, store_cls):
    paths = make_store(n_slots=8)
    s = store_cls.open(paths)
    finalizer = s._finalizer
    with pytest.raises(TuttiError) as e:
        store_cls.open(paths)  # the members' lock
    assert e.value.errno == errno.EBUSY
    del s
    gc.collect()
    assert not finalizer.alive
    store_cls.open(paths).close()  # the lock went with the dropped store


def test_a_dropped_store_with_a_data_path_and_a_transaction_releases_them(make_store, gpu_lib):
    """The old GpuStore had no finalizer: dropped, it kept the members' lock until the process exited."""
    torch = pytest.importorskip("torch")
    from tutti.gpu import GpuStore
    from tutti.gpu.store import DeviceKV

    paths = make_store(n_slots=8)
    s = GpuStore.open(paths).attach("host")
    kv = DeviceKV.from_tensor(_host_kv(torch, s.geometry, torch.zeros))
    t = s.write(["k"], kv, [1])
    t.layer(0)
    del s, t
    gc.collect()
    with GpuStore.open(paths) as again:
        assert again.lookup(["k"]) == [None]  # the write was aborted, nothing committed


def test_a_dropped_transaction_is_aborted_and_its_slots_freed(make_store, store_cls):
    paths = make_store(n_slots=4)
    with store_cls.open(paths) as s:
        buf = PagedBuffer.for_geometry(s.geometry, 4)
        t = s.write([f"a{i}" for i in range(4)])  # every slot pinned
        t.layer(0, buf, range(4))
        del t
        gc.collect()
        # the next call aborts it: its slots are free again, and nothing of it was committed
        with s.write([f"b{i}" for i in range(4)]) as t2:
            for layer in range(s.geometry.n_layers):
                t2.layer(layer, buf, range(4))
        assert s.lookup([f"a{i}" for i in range(4)]) == [None] * 4
        assert None not in s.lookup([f"b{i}" for i in range(4)])
        buf.close()


def test_memory_of_a_dropped_transaction_lives_until_its_abort(make_store):
    """The C transaction may still be moving bytes: its memory must not go with the Python object."""
    paths = make_store(n_slots=4)
    with Store.open(paths) as s:
        buf = PagedBuffer.for_geometry(s.geometry, 4)
        t = s.write(["x"])
        t.layer(0, buf, [0])
        ref = t._ref
        del t
        gc.collect()
        assert ref.h is not None and ref.keep and ref in s._owned.dropped
        s.lookup(["x"])  # the store's next call aborts it
        assert ref.h is None and not ref.keep and not s._owned.txns


def test_a_closed_paged_buffer_is_refused_not_a_crash(make_store, store_cls):
    """Before: the transaction took the unmapped areas' addresses and the process died (SIGSEGV)."""
    paths = make_store(n_slots=4)
    with store_cls.open(paths) as s:
        buf = PagedBuffer.for_geometry(s.geometry, 2)
        buf.close()
        buf.close()  # idempotent
        t = s.write(["k"])
        with pytest.raises(ValueError, match="PagedBuffer is closed"):
            t.layer(0, buf, [0])
        t.abort()
        for call in (lambda: buf.memmap, lambda: buf.block_view(0, 0, 0), lambda: buf.area(0, 0),
                     lambda: buf.fill_random([0], 1), lambda: buf.contiguous_block(0),
                     lambda: buf.set_contiguous_block(0, bytes(buf.block_bytes)), lambda: buf.register(s)):
            with pytest.raises(ValueError, match="PagedBuffer is closed"):
                call()


def test_a_paged_buffer_in_use_cannot_be_closed(make_store, store_cls):
    paths = make_store(n_slots=4)
    with store_cls.open(paths) as s:
        buf = PagedBuffer.for_geometry(s.geometry, 2)
        buf.fill_random([0], seed=3)
        t = s.write(["k"])
        for layer in range(s.geometry.n_layers):
            t.layer(layer, buf, [0])
        with pytest.raises(BufferError, match="open transaction"):
            buf.close()
        assert t.finish() == [0]
        assert s.get("k") == buf.contiguous_block(0)
        buf.close()
        assert buf.closed


def test_every_method_of_a_closed_store_raises(make_store, store_cls):
    paths = make_store(n_slots=4)
    s = store_cls.open(paths)
    blk = bytes(s.block_bytes)
    s.put("k", blk)
    t = s.read(s.lookup(["k"]))
    s.close()
    s.close()  # idempotent
    assert s.closed and "closed" in repr(s)
    calls = {
        "put": lambda: s.put("k", blk), "get": lambda: s.get("k"), "readinto": lambda: s.readinto("k", bytearray(blk)),
        "lookup": lambda: s.lookup(["k"]), "contains": lambda: "k" in s, "invalidate": lambda: s.invalidate([0]),
        "locate": lambda: s.locate(0, 0, 0), "committed": lambda: s.committed(), "info": lambda: s.info(),
        "stats": lambda: s.stats(), "read": lambda: s.read([0]), "write": lambda: s.write(["k"]),
        "register_memory": lambda: s.register_memory(bytearray(4096)), "check": lambda: s.check(),
        "attach": lambda: s.attach("host"),
    }
    for call in calls.values():
        with pytest.raises(ValueError, match="closed"):
            call()
    # its transactions were aborted with it
    for call in (lambda: t.layer(0, None, [0]), lambda: t.wait_layer(0), lambda: t.finish()):
        with pytest.raises(ValueError, match="store closed"):
            call()
    t.abort()  # idempotent


def test_every_method_of_a_finished_device_transaction_raises(make_store, gpu_lib):
    torch = pytest.importorskip("torch")
    from tutti.gpu import GpuStore
    from tutti.gpu.store import DeviceKV

    paths = make_store(n_slots=4)
    with GpuStore.open(paths).attach("host") as s:
        kv = DeviceKV.from_tensor(_host_kv(torch, s.geometry, torch.ones))
        t = s.write(["k"], kv, [2])
        assert t.transfer() == [0]
        for call in (lambda: t.layer(0), lambda: t.order(0, 0), lambda: t.wait_layer(0), lambda: t.finish(),
                     lambda: t.prepare(), lambda: t.veto(0), lambda: t.transfer()):
            with pytest.raises(ValueError, match="finished"):
                call()
        t.abort()
        assert s.info()["path"] == "host" and s.lookup(["k"]) != [None]
