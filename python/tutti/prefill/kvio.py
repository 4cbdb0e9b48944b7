"""Moving one layer of KV blocks between the paged cache and a store.

``GioKV``: the store lives on the emulated NVMe controller (namespaces =
members, objects where tt_locate() puts them); GPU threads build the NVMe
commands from one descriptor per layer (tutti.gpu).  ``HostKV``: the same
interface over a dict of host tensors, so the harness's ordering logic runs
in CPU tests.

Both are bound once per request to (slot, paged block) pairs for reads and
for writes; ``read(l, stream)`` / ``write(l, stream)`` then enqueue layer l.
"""
from __future__ import annotations

import torch

from .paged import PagedKVCache


class GioKV:
    """Layer-wise reads and writes through gio_uring against an EmulatedController."""

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

    def read(self, layer: int, stream) -> None:
        self.gio.submit_wait(self._read[layer], stream)

    def write(self, layer: int, stream) -> None:
        self.gio.submit_wait(self._write[layer], stream)

    def errors(self) -> int:
        """Failed commands over every batch of the last bind (synchronises the device)."""
        return sum(b.errors() for b in self._used)

    def close(self) -> None:
        for b in self._read + self._write:
            b.close()


class HostKV:
    """The store as host tensors keyed by slot (CPU tests: same calls, done at once)."""

    def __init__(self, cache: PagedKVCache):
        self.cache = cache
        self.slots: dict[int, torch.Tensor] = {}  # slot -> [n_layers, 2, block_size, kv_heads, head_dim]
        self._r = self._w = ((), ())
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

    def errors(self) -> int:
        return 0

    def close(self) -> None:
        pass


def open_emulated_store(shape, *, dtype: str, n_slots: int, n_ns: int = 2, rate_gbps: float = 0.0,
                        n_queues: int = 16, n_threads: int = 8, depth: int = 1024):
    """(EmulatedController, Gio, Geometry): a store of ``n_slots`` blocks striped over ``n_ns`` namespaces
    (hostmem backing), laid out as a formatted store would be (tt_store_plan)."""
    from .. import gpu  # noqa: PLC0415

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
