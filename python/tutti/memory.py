"""Host memory laid out like vLLM's paged KV cache, for layer-wise transfers.

vLLM keeps one tensor per layer (and per K/V span on GPUs) holding every
block; libtutti's tt_memmap describes exactly that: a base address and a
block stride per (layer, span).  PagedBuffer builds it from page-aligned
anonymous mmaps, so transfers need no bounce copies and no numpy.
"""
import mmap
import random
import weakref

from ._cconv import whole
from ._tutti import ffi
from .errors import TuttiError


class PagedBuffer:
    """``n_blocks`` KV blocks as one page-aligned area per (layer, span).

    Object (layer, span) of block b is at ``base[layer * n_spans + span] +
    b * block_stride``; ``memmap`` hands that map to Txn.layer().  A closed
    buffer refuses every use (ValueError), and it cannot be closed while an
    open transaction has it (the library may still be moving its bytes).
    """

    def __init__(self, n_layers, n_spans, n_blocks, span_bytes, block_stride=None):
        n_layers, n_spans, n_blocks, span_bytes = (whole(v, name) for v, name in (
            (n_layers, "n_layers"), (n_spans, "n_spans"), (n_blocks, "n_blocks"), (span_bytes, "span_bytes")))
        block_stride = span_bytes if block_stride is None else whole(block_stride, "block_stride")
        if min(n_layers, n_spans, n_blocks, span_bytes) < 1:
            raise ValueError("n_layers, n_spans, n_blocks and span_bytes must be >= 1")
        if block_stride < span_bytes:
            raise ValueError(f"block_stride {block_stride} < span_bytes {span_bytes}")
        self.n_layers, self.n_spans, self.n_blocks = n_layers, n_spans, n_blocks
        self.span_bytes, self.block_stride = span_bytes, block_stride
        size = n_blocks * block_stride
        self._areas = [mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
                       for _ in range(n_layers * n_spans)]
        # The cffi views pin the mmaps' addresses (an exported mmap cannot be closed).
        self._views = [ffi.from_buffer(a, require_writable=True) for a in self._areas]
        self._base = ffi.new("uint64_t[]", [int(ffi.cast("uintptr_t", v)) for v in self._views])
        self._stride = ffi.new("uint64_t[]", [block_stride] * len(self._areas))
        self._memmap = ffi.new("struct tt_memmap *")
        self._memmap.n_layers, self._memmap.n_spans = n_layers, n_spans
        self._memmap.base, self._memmap.stride = self._base, self._stride
        self._other_maps = {}  # id(ffi) -> (ffi, memmap, arrays): the same map for libtutti_gpu.so's binding
        self._users = weakref.WeakSet()  # open transactions that moved this memory

    @property
    def closed(self) -> bool:
        return not self._areas

    def _open(self):
        if not self._areas:
            raise ValueError("PagedBuffer is closed")

    @property
    def memmap(self):
        """The ``struct tt_memmap *`` of this buffer (tutti._tutti's binding)."""
        self._open()
        return self._memmap

    def memmap_for(self, other_ffi, user=None):
        """The memmap as a ``struct tt_memmap *`` of ``other_ffi`` (the store's binding); ``user``: the
        transaction that will move this memory (close() refuses while it is open)."""
        self._open()
        if user is not None:
            self._users.add(user)
        if other_ffi is ffi:
            return self._memmap
        got = self._other_maps.get(id(other_ffi))
        if got is None:
            base = other_ffi.new("uint64_t[]", list(self._base))
            stride = other_ffi.new("uint64_t[]", list(self._stride))
            m = other_ffi.new("struct tt_memmap *")
            m.n_layers, m.n_spans, m.base, m.stride = self.n_layers, self.n_spans, base, stride
            got = self._other_maps[id(other_ffi)] = (other_ffi, m, (base, stride))
        return got[1]

    @classmethod
    def for_geometry(cls, geometry, n_blocks, block_stride=None) -> "PagedBuffer":
        """A buffer of ``n_blocks`` blocks shaped for a store's Geometry."""
        return cls(geometry.n_layers, geometry.n_spans, n_blocks, geometry.span_bytes,
                   block_stride)

    @property
    def block_bytes(self) -> int:
        return self.n_layers * self.n_spans * self.span_bytes

    def _check(self, layer, span, block):
        self._open()
        if not (0 <= layer < self.n_layers and 0 <= span < self.n_spans
                and 0 <= block < self.n_blocks):
            raise IndexError(f"({layer}, {span}, {block}) outside {self.n_layers} layers x "
                             f"{self.n_spans} spans x {self.n_blocks} blocks")

    def block_view(self, layer, span, block) -> memoryview:
        """Writable view of one object of one block."""
        self._check(layer, span, block)
        off = block * self.block_stride
        return memoryview(self._areas[layer * self.n_spans + span])[off:off + self.span_bytes]

    def area(self, layer, span) -> memoryview:
        """Writable view of one (layer, span) for every block: n_blocks x block_stride bytes."""
        self._check(layer, span, 0)
        return memoryview(self._areas[layer * self.n_spans + span])

    def _objects(self, block):
        return (self.block_view(layer, span, block)
                for layer in range(self.n_layers) for span in range(self.n_spans))

    def fill_random(self, blocks, seed) -> None:
        """Fill ``blocks`` with pseudo-random bytes determined by ``seed`` and block order."""
        rng = random.Random(seed)
        for block in blocks:
            for view in self._objects(block):
                view[:] = rng.randbytes(self.span_bytes)

    def contiguous_block(self, block) -> bytes:
        """Block ``block`` as Store.put()/get() lay it out: objects in (layer, span) order."""
        return b"".join(self._objects(block))

    def set_contiguous_block(self, block, data) -> None:
        """Scatter a Store.get()-layout block into ``block``."""
        data = memoryview(data).cast("B")
        if len(data) != self.block_bytes:
            raise ValueError(f"block data is {len(data)} bytes, expected {self.block_bytes}")
        for i, view in enumerate(self._objects(block)):
            view[:] = data[i * self.span_bytes:(i + 1) * self.span_bytes]

    def register(self, store) -> int:
        """Register the areas with ``store`` for fixed-buffer I/O; returns how many.

        Registration only saves page pinning, so it stops quietly at the first
        area the engine refuses (psync has none, io_uring a limited number).
        """
        self._open()
        for n, area in enumerate(self._areas):
            try:
                store.register_memory(area)
            except TuttiError:
                return n
        return len(self._areas)

    def close(self) -> None:
        """Unmap the areas.  Idempotent; BufferError while an open transaction has the buffer.

        Areas registered with a store that is still open stay mapped until it closes.
        """
        busy = [t for t in self._users if t._h is not None]
        if busy:
            raise BufferError(f"PagedBuffer is in use by {len(busy)} open transaction(s): finish or abort "
                              "them before closing it")
        for view in self._views:
            ffi.release(view)
        for area in self._areas:
            try:
                area.close()
            except BufferError:
                pass  # exported by a store's registration; unmapped when that is released
        self._views, self._areas = [], []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
