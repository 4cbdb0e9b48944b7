"""LMCache's chunk layouts and the memory areas the LMCache comparison moves (lmcache_compare.py).

A prefix of KV is cut into LMCache's 256-token ``KV_2LTD`` chunks; ``ChunkLayout`` says where each chunk sits in
a raw-block slot or a chunk file, ``SharedArea`` holds the prefix (one area the source, one the destination, both
mappable by a child process), and ``ChunkPagedBuffer`` shows the same bytes to Tutti as a paged KV cache.
"""
from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import importlib
import importlib.metadata
import mmap
import os
import random
import time
import weakref
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ..errors import TuttiError
from ..memory import PagedBuffer, ffi
from .common import (
    GB,
    BenchError,
    cpu_seconds,
)

if TYPE_CHECKING:
    from ..model import Geometry


# LMCache's defaults (lmcache 0.5.6: config chunk_size, rust_raw_block.* extra_config, disk_io_threads).
CHUNK_TOKENS = 256
RB_ALIGN = 4096
RB_HEADER = 4096
RB_META = 128 << 20
RB_BATCH_KEYS = 64
RB_QUEUE_DEPTH = 256
RB_MAGIC = b"LMCBLK01"
DISK_THREADS = 4
FIXED_REGION_MAX = 1 << 30  # io_uring: at most 1 GiB per registered buffer


def round_up(x: int, align: int) -> int:
    return (x + align - 1) // align * align


@dataclasses.dataclass(frozen=True)
class ChunkLayout:
    """The prefix as Tutti's blocks and as LMCache's chunks, and LMCache's raw-block file around them."""

    n_layers: int
    n_spans: int            # K and V
    span_bytes: int         # one object: block_tokens tokens of one layer's K or V
    block_tokens: int
    prefix_tokens: int
    chunk_tokens: int = CHUNK_TOKENS

    @classmethod
    def for_geometry(cls, geo: Geometry, block_tokens: int, prefix_tokens: int,
                     chunk_tokens: int = CHUNK_TOKENS) -> ChunkLayout:
        if chunk_tokens % block_tokens:
            raise BenchError(f"--compare lmcache: LMCache's {chunk_tokens}-token chunks need a block size "
                             f"dividing {chunk_tokens} (got {block_tokens})", 2)
        if prefix_tokens % chunk_tokens or prefix_tokens < chunk_tokens:
            raise BenchError(f"--compare lmcache: --prefix-tokens must be a multiple of LMCache's "
                             f"{chunk_tokens}-token chunk (got {prefix_tokens})", 2)
        if geo.span_bytes % block_tokens:
            raise BenchError(f"--compare lmcache: objects of {geo.span_bytes} bytes do not split into "
                             f"{block_tokens} tokens", 2)
        return cls(geo.n_layers, geo.n_spans, geo.span_bytes, block_tokens, prefix_tokens, chunk_tokens)

    @property
    def n_blocks(self) -> int:
        return self.prefix_tokens // self.block_tokens

    @property
    def blocks_per_chunk(self) -> int:
        return self.chunk_tokens // self.block_tokens

    @property
    def n_chunks(self) -> int:
        return self.prefix_tokens // self.chunk_tokens

    @property
    def part_bytes(self) -> int:
        """One (K/V, layer) part of a chunk: chunk_tokens tokens of one layer's K or V."""
        return self.blocks_per_chunk * self.span_bytes

    @property
    def chunk_bytes(self) -> int:
        return self.n_spans * self.n_layers * self.part_bytes

    @property
    def total_bytes(self) -> int:
        return self.n_chunks * self.chunk_bytes

    @property
    def ids_per_chunk(self) -> int:
        return self.chunk_bytes // self.span_bytes

    def block_ids(self) -> list[int]:
        """Tutti's view of a chunk area: the block id of every object slot that holds KV.

        Area (layer, span) starts at (span * n_layers + layer) * part_bytes with a stride of one object, so
        block id c * ids_per_chunk + j is tokens j of chunk c, exactly where KV_2LTD puts them."""
        return [c * self.ids_per_chunk + j for c in range(self.n_chunks) for j in range(self.blocks_per_chunk)]

    @property
    def slot_bytes(self) -> int:
        return round_up(RB_HEADER + self.chunk_bytes, RB_ALIGN)

    @property
    def raw_file_bytes(self) -> int:
        return RB_META + self.n_chunks * self.slot_bytes

    def slot_offset(self, chunk: int) -> int:
        return RB_META + chunk * self.slot_bytes

    def to_dict(self) -> dict:
        return {"chunk_tokens": self.chunk_tokens, "chunks": self.n_chunks, "chunk_bytes": self.chunk_bytes,
                "memory_format": "KV_2LTD [K/V, layer, token, hidden]",
                "raw_block": {"meta_bytes": RB_META, "header_bytes": RB_HEADER, "slot_bytes": self.slot_bytes,
                              "file_bytes": self.raw_file_bytes, "align": RB_ALIGN,
                              "batch_keys": RB_BATCH_KEYS, "queue_depth": RB_QUEUE_DEPTH},
                "local_disk": {"files": self.n_chunks, "file_bytes": self.chunk_bytes, "threads": DISK_THREADS}}


def slot_header(identity: int, payload_len: int) -> bytes:
    """A raw-block slot header: magic, 64-bit key identity, payload length (little endian), zero padded."""
    return (RB_MAGIC + (identity & (2**64 - 1)).to_bytes(8, "little") + payload_len.to_bytes(8, "little")
            ).ljust(RB_HEADER, b"\0")


def chunk_identity(run: int, chunk: int) -> int:
    return int.from_bytes(hashlib.blake2b(f"tutti-bench/{run}/chunk/{chunk}".encode(), digest_size=8).digest(),
                          "little")


class SharedArea:
    """Page-aligned memory in a memfd, so a child process (``--lmcache-python``) can map the same pages."""

    def __init__(self, size: int, name: str):
        self.size = size
        self.fd = os.memfd_create(name, os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, size)
            self.mm = mmap.mmap(self.fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(self.fd)
            raise
        probe = ctypes.c_char.from_buffer(self.mm)
        self.address = ctypes.addressof(probe)
        del probe

    def view(self, off: int, n: int) -> memoryview:
        return memoryview(self.mm)[off:off + n]

    def fill_random(self, seed: int, piece: int = 32 << 20) -> None:
        """Pseudo-random bytes (``piece`` of them, repeated) with every 4 KiB page stamped with its offset:
        no two pages alike, so a read landing in the wrong place fails verification."""
        base = random.Random(seed).randbytes(piece)
        mm = self.mm
        for off in range(0, self.size, piece):
            n = min(piece, self.size - off)
            mm[off:off + n] = base[:n]
            for page in range(off, off + n - 7, 4096):
                mm[page:page + 8] = page.to_bytes(8, "little")

    def fill_byte(self, byte: int, piece: int = 32 << 20) -> None:
        pattern = bytes([byte & 0xFF]) * piece
        for off in range(0, self.size, piece):
            n = min(piece, self.size - off)
            self.mm[off:off + n] = pattern[:n]

    def fixed_regions(self) -> tuple[list[int], list[int]]:
        """(addresses, sizes) of the area in pieces io_uring can register (at most 1 GiB each)."""
        ptrs, sizes = [], []
        for off in range(0, self.size, FIXED_REGION_MAX):
            ptrs.append(self.address + off)
            sizes.append(min(FIXED_REGION_MAX, self.size - off))
        return ptrs, sizes

    def close(self) -> None:
        try:
            self.mm.close()
        except BufferError:
            pass  # still exported (a store's registration): unmapped when the last export goes
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class ChunkPagedBuffer(PagedBuffer):
    """A chunk area seen as a paged KV cache (see ChunkLayout.block_ids); no memory of its own."""

    def __init__(self, area: SharedArea, layout: ChunkLayout):
        # Not super().__init__(): that maps memory of its own; this one describes ``area``.
        L, S = layout.n_layers, layout.n_spans
        self.n_layers, self.n_spans, self.span_bytes = L, S, layout.span_bytes
        self.block_stride = layout.span_bytes
        self.n_blocks = (layout.n_chunks - 1) * layout.ids_per_chunk + layout.blocks_per_chunk
        self._area = area
        offs = [(span * L + layer) * layout.part_bytes for layer in range(L) for span in range(S)]
        whole = ffi.from_buffer(area.mm, require_writable=True)
        addr = int(ffi.cast("uintptr_t", whole))
        self._views = [whole]
        self._areas = [memoryview(area.mm)[off:] for off in offs]
        self._base = ffi.new("uint64_t[]", [addr + off for off in offs])
        self._stride = ffi.new("uint64_t[]", [layout.span_bytes] * len(offs))
        self._memmap = ffi.new("struct tt_memmap *")
        self._memmap.n_layers, self._memmap.n_spans = L, S
        self._memmap.base, self._memmap.stride = self._base, self._stride
        self._other_maps = {}
        self._users = weakref.WeakSet()

    def register(self, store) -> int:
        try:
            store.register_memory(self._area.mm)
        except (TuttiError, OSError):
            return 0
        return 1

    def close(self) -> None:
        busy = [t for t in self._users if t._h is not None]
        if busy:
            raise BufferError(f"ChunkPagedBuffer is in use by {len(busy)} open transaction(s)")
        for v in self._areas:
            v.release()
        for view in self._views:
            ffi.release(view)
        self._views, self._areas = [], []


def rate_of(nbytes: int, seconds: float, cpu: float) -> dict:
    return {"bytes": nbytes, "seconds": seconds, "cpu_seconds": cpu, "gbps": nbytes / seconds / GB,
            "cpu_s_per_gb": cpu / (nbytes / GB)}


def timed_call(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    """(fn's result, wall seconds, CPU seconds of this process)."""
    c0, t0 = cpu_seconds(), time.perf_counter()
    out = fn()
    t1, c1 = time.perf_counter(), cpu_seconds()
    return out, t1 - t0, c1 - c0


def equal_fn() -> Callable[[memoryview, memoryview], bool]:
    """Byte equality of two views: numpy's when it is installed (no copies), else through bytes."""
    try:
        np: Any = importlib.import_module("numpy")
    except ImportError:
        return lambda a, b: bytes(a) == bytes(b)
    return lambda a, b: bool(np.array_equal(np.frombuffer(a, dtype=np.uint8), np.frombuffer(b, dtype=np.uint8)))


def verify_chunks(src: SharedArea, dst: SharedArea, layout: ChunkLayout, what: str) -> None:
    equal = equal_fn()
    for c in range(layout.n_chunks):
        a, b = src.view(c * layout.chunk_bytes, layout.chunk_bytes), dst.view(c * layout.chunk_bytes,
                                                                              layout.chunk_bytes)
        try:
            if not equal(a, b):
                raise BenchError(f"{what}: chunk {c} read back differs from the chunk stored", 1)
        finally:
            a.release()
            b.release()


def verify_paged(src: PagedBuffer, dst: PagedBuffer, layout: ChunkLayout, src_ids: Sequence[int],
                 dst_ids: Sequence[int], what: str) -> None:
    equal = equal_fn()
    for layer in range(layout.n_layers):
        for span in range(layout.n_spans):
            for i, (a, b) in enumerate(zip(src_ids, dst_ids)):
                if not equal(src.block_view(layer, span, a), dst.block_view(layer, span, b)):
                    raise BenchError(f"{what}: block {i} (layer {layer}, span {span}) read back differs "
                                     "from the block stored", 1)


def fdatasync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
    finally:
        os.close(fd)


def unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def prefill_file(path: str, size: int) -> None:
    """Write ``size`` bytes once (O_DIRECT), so timed writes overwrite allocated blocks."""
    piece = 8 << 20
    buf = mmap.mmap(-1, piece)
    buf.write(os.urandom(4096) * (piece // 4096))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644)
    try:
        for off in range(0, size, piece):
            n = min(piece, size - off)
            os.pwritev(fd, [memoryview(buf)[:n]], off)
        os.fsync(fd)
    finally:
        os.close(fd)
        buf.close()
