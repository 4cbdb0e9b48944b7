"""Moving one layer of KV blocks between the paged cache and a store.

``StoreKV``: a real store (tutti.gpu.GpuStore) through its data path (gio over
an emulated controller serving the store's member files, or staged): slots,
commit records and GPU checksums verified on every load, per-block status.
What the prefill harness and benchmark use on the GPU.
``GioKV``: raw gio_uring against an EmulatedController laid out like a store,
with no records or checksums (kept for ``tutti-admin profile --io``).
``HostKV``: the same interface over a dict of host tensors (CPU tests).

Interface: ``bind(read_slots, read_ids, write_keys, write_ids)`` once per
request (GioKV/HostKV: the write "keys" are slots), then ``read(l, stream)`` /
``write(l, stream)`` enqueue layer l, ``order(l, stream)`` makes a stream wait
on the GPU for layer l's read, ``fence(stream)`` for everything issued,
``finish()`` returns the number of failed blocks (or commands) of the request.
``host_ready_writes``: the write memory must be complete when write() is
called (the store's data paths do not wait for the caller's streams).
"""
from __future__ import annotations

from typing import Any

import torch

from .paged import PagedKVCache


class StoreKV:
    """Layer-wise reads and writes through a GpuStore's data path, one read and one write transaction per request."""

    host_ready_writes = True
    keyed = True  # writes go to keys (the store picks the slots)

    def __init__(self, store, cache: PagedKVCache):
        from ..gpu.store import DeviceKV

        self.store, self.cache = store, cache
        self.mem = DeviceKV.from_tensor(cache.kv)
        self.mem.check_geometry(store.geometry)
        self._r: Any = None  # the read and write transactions of the bound step
        self._w: Any = None
        self._marks: list = []
        self.read_bytes_per_layer = self.write_bytes_per_layer = 0
        self.last_status: dict = {"read": [], "write": []}
        self.written_slots: list[int] = []
        self._errors = 0
        self._cuda = cache.kv.is_cuda
        if self._cuda:
            # Two marker streams: one never waits (an event on it stamps the GPU time a layer was submitted),
            # the other waits for each layer (its event stamps the time the layer landed and was hashed).
            self._s_start, self._s_done = torch.cuda.Stream(), torch.cuda.Stream()

    def bind(self, read_slots, read_ids, write_keys, write_ids) -> None:
        self.finish()
        read_slots, write_keys = list(read_slots), list(write_keys)
        span = self.store.geometry.n_spans * self.store.geometry.span_bytes
        self.read_bytes_per_layer, self.write_bytes_per_layer = span * len(read_slots), span * len(write_keys)
        self._marks = []
        self.written_slots = []  # the last request's new blocks (discard_writes())
        if read_slots:
            self._r = self.store.read(read_slots, self.mem, read_ids)
        if write_keys:
            self._w = self.store.write(write_keys, self.mem, write_ids)

    def _move(self, kind: str, layer: int, t) -> None:
        a = b = None
        if self._cuda:
            a = torch.cuda.Event(enable_timing=True)
            a.record(self._s_start)
        t.layer(layer, ready=None)  # writes: the harness issues a layer once its compute finished
        if self._cuda:
            t.order(layer, self._s_done)
            b = torch.cuda.Event(enable_timing=True)
            b.record(self._s_done)
        self._marks.append((kind, layer, a, b))

    def read(self, layer: int, stream=None) -> None:
        self._move("read", layer, self._r)

    def write(self, layer: int, stream=None) -> None:
        self._move("write", layer, self._w)

    def order(self, layer: int, stream) -> None:
        self._r.order(layer, stream)

    def fence(self, stream) -> None:
        for t in (self._r, self._w):
            if t is not None and t.submitted:
                t.order(max(t.submitted), stream)  # one I/O stream per path: the last layer lands last

    def spans(self) -> list[tuple[str, int, float]]:
        """(kind, layer, seconds) of every op since bind, in issue order (synchronises): the time the op kept the
        path busy, from its submission or the previous op's landing, whichever was later, to its own landing."""
        out, prev = [], None
        for kind, layer, a, b in self._marks:
            b.synchronize()
            start = a if prev is None or a.elapsed_time(prev) < 0 else prev
            out.append((kind, layer, max(start.elapsed_time(b), 0.0) / 1e3))
            prev = b
        return out

    def finish(self) -> int:
        """Finish the request's transactions: writes commit, reads are verified (GPU checksums against the
        records); failed blocks (-EBADMSG, -EIO, -ENODATA) of this request."""
        bad = 0
        for kind in ("read", "write"):
            t = self._r if kind == "read" else self._w
            if t is None:
                continue
            for l in sorted(t.submitted):  # a layer never submitted leaves its blocks -ENODATA (writes)
                try:
                    t.wait_layer(l)
                except OSError:
                    pass  # shows in the status
            st = t.finish()
            self.last_status[kind] = st
            bad += sum(1 for x in st if x)
            if kind == "write":
                self.written_slots += [s for s, x, p in zip(t.slots, st, t.present) if x == 0 and not p]
        self._r = self._w = None
        self._errors += bad
        return bad

    def errors(self) -> int:
        """Failed blocks since this StoreKV was made."""
        return self._errors

    def discard_writes(self) -> int:
        """Drop the blocks the last request wrote (benchmarks: every run writes fresh blocks into free slots)."""
        n = self.store.invalidate(self.written_slots) if self.written_slots else 0
        self.written_slots = []
        return n

    def close(self) -> None:
        for t in (self._r, self._w):
            if t is not None:
                t.abort()
        self._r = self._w = None


def open_store(shape, directory: str, *, dtype: str, n_slots: int, n_members: int = 2, path: str = "gio",
               **path_params):
    """A fresh store of ``n_slots`` blocks of ``shape`` over ``n_members`` files in ``directory``, opened through
    libtutti_gpu.so with data path ``path`` attached (GpuStore.attach's parameters)."""
    import os

    from ..gpu.store import GpuStore
    from ..model import Fingerprint

    fp = Fingerprint(model_id=f"tutti/prefill/{shape.name}", dtype=dtype, n_layers=shape.n_layers,
                     kv_heads=shape.n_kv_heads, head_dim=shape.head_dim, block_size=shape.block_size)
    paths = [os.path.join(directory, f"member{i}.tutti") for i in range(n_members)]
    GpuStore.format(paths, fp, n_slots=n_slots, force=True)
    s = GpuStore.open(paths, expect=fp)
    try:
        s.attach(path, **path_params)
    except BaseException:
        s.close()
        raise
    return s


class GioKV:
    """Layer-wise reads and writes through raw gio_uring against an EmulatedController (no records, no checksums)."""

    def __init__(self, gio, geo, cache: PagedKVCache, max_blocks: int):
        if geo.span_bytes != cache.span_bytes or geo.n_spans != 2 or geo.n_layers != cache.shape.n_layers:
            raise ValueError(f"store geometry {geo} does not match the cache (span {cache.span_bytes} B, "
                             f"{cache.shape.n_layers} layers, K and V)")
        self.gio, self.geo, self.cache = gio, geo, cache
        L = cache.shape.n_layers
        # One batch per layer and direction: all of a request's descriptors are prepared up front and the
        # per-command status of every layer stays readable until the next request.
        self._read = [gio.batch(2 * max_blocks) for _ in range(L)]
        self._write = [gio.batch(2 * max_blocks) for _ in range(L)]
        self._used: list = []
        self._read_done: dict = {}
        self.read_bytes_per_layer = self.write_bytes_per_layer = 0

    def bind(self, read_slots, read_ids, write_slots, write_ids) -> None:
        """Describe every layer's read of (read_slots[i] -> block read_ids[i]) and write of the reverse."""
        dev = self.cache.kv.device
        self._used = []
        self._tensors = []
        for batches, slots, ids, op in ((self._read, read_slots, read_ids, "read"),
                                        (self._write, write_slots, write_ids, "write")):
            n = len(slots)
            nbytes = n * self.geo.n_spans * self.geo.span_bytes
            if op == "read":
                self.read_bytes_per_layer = nbytes
            else:
                self.write_bytes_per_layer = nbytes
            if n == 0:
                continue
            s = torch.as_tensor(slots, dtype=torch.int64).to(dev).contiguous()
            b = torch.as_tensor(ids, dtype=torch.int32).to(dev).contiguous()
            self._tensors += [s, b]
            for l, batch in enumerate(batches):
                batch.prep_layer(self.geo, l, s, b, base=self.cache.layer_base(l),
                                 block_stride=self.cache.block_stride, span_stride=self.cache.span_stride, op=op)
                self._used.append(batch)

    host_ready_writes = False  # the gio kernel runs on the caller's stream, after what it waits for
    keyed = False

    def read(self, layer: int, stream) -> None:
        self.gio.submit_wait(self._read[layer], stream)
        ev = torch.cuda.Event()
        ev.record(stream)
        self._read_done[layer] = ev

    def write(self, layer: int, stream) -> None:
        self.gio.submit_wait(self._write[layer], stream)

    def order(self, layer: int, stream) -> None:
        stream.wait_event(self._read_done[layer])

    def fence(self, stream) -> None:
        pass  # every op ran on the caller's stream

    def errors(self) -> int:
        """Failed commands over every batch of the last bind (synchronises the device)."""
        return sum(b.errors() for b in self._used)

    def finish(self) -> int:
        return self.errors()

    def close(self) -> None:
        for b in self._read + self._write:
            b.close()


class HostKV:
    """The store as host tensors keyed by slot (CPU tests: same calls, done at once)."""

    def __init__(self, cache: PagedKVCache):
        self.cache = cache
        self.slots: dict[int, torch.Tensor] = {}  # slot -> [n_layers, 2, block_size, kv_heads, head_dim]
        self._r: tuple[list[int], list[int]] = ([], [])
        self._w: tuple[list[int], list[int]] = ([], [])
        self.read_bytes_per_layer = self.write_bytes_per_layer = 0

    def bind(self, read_slots, read_ids, write_slots, write_ids) -> None:
        self._r = ([int(s) for s in read_slots], [int(b) for b in read_ids])
        self._w = ([int(s) for s in write_slots], [int(b) for b in write_ids])
        span = self.cache.span_bytes
        self.read_bytes_per_layer, self.write_bytes_per_layer = 2 * span * len(self._r[0]), 2 * span * len(self._w[0])

    def read(self, layer: int, stream=None) -> None:
        for s, b in zip(*self._r):
            self.cache.kv[layer, :, b] = self.slots[s][layer]

    def write(self, layer: int, stream=None) -> None:
        kv = self.cache.kv
        for s, b in zip(*self._w):
            if s not in self.slots:
                self.slots[s] = torch.zeros((kv.shape[0],) + tuple(kv[0, :, 0].shape), dtype=kv.dtype)
            self.slots[s][layer] = kv[layer, :, b].cpu()

    host_ready_writes = False
    keyed = False

    def order(self, layer: int, stream) -> None:
        pass  # done at read()

    def fence(self, stream) -> None:
        pass

    def errors(self) -> int:
        return 0

    def finish(self) -> int:
        return 0

    def close(self) -> None:
        pass


def open_emulated_store(shape, *, dtype: str, n_slots: int, n_ns: int = 2, rate_gbps: float = 0.0,
                        n_queues: int = 16, n_threads: int = 8, depth: int = 1024):
    """(EmulatedController, Gio, Geometry): a store of ``n_slots`` blocks striped over ``n_ns`` namespaces
    (hostmem backing), laid out as a formatted store would be (tt_store_plan)."""
    from .. import gpu

    geo, need = gpu.plan_geometry(n_layers=shape.n_layers, kv_heads=shape.n_kv_heads, head_dim=shape.head_dim,
                                  block_size=shape.block_size, dtype=dtype, n_members=n_ns, n_slots=n_slots)
    ctrl = gpu.EmulatedController(n_ns=n_ns, ns_bytes=-(-need // 4096) * 4096, n_queues=n_queues, depth=depth,
                                  n_threads=n_threads, backing="hostmem", rate_gbps=rate_gbps)
    try:
        gio = gpu.Gio(ctrl)
    except BaseException:
        ctrl.close()
        raise
    return ctrl, gio, geo
