"""Side by side with LMCache's disk engines: the same KV through Tutti and LMCache's layouts (issue 15).

``tutti-admin bench PATH --compare lmcache`` stores and retrieves one prefix of a model's KV (default: the
Llama-3-8B geometry) through each engine below, in the same run, on the file system holding PATH:

``tutti``
    Tutti's layer-wise store and retrieve (as ``tutti-admin bench``): one write transaction, one call per
    layer, ``finish`` (data and commit records durable); the read submits layer l+1 before waiting for layer
    l.  Every object's XXH3 checksum is checked on read (the store's default); ``tutti_unverified`` is the same
    read with the store opened ``verify=False``.
``raw_block``
    LMCache's raw-block layout driven through its Rust io_uring engine (the PyPI package
    ``lmcache-rust-raw-block-io``, ``RawBlockDevice``) the way LMCache's ``RawBlockCore`` drives it: a
    128 MiB metadata region, then one slot per 256-token chunk (a 4 KiB header: magic ``LMCBLK01``, the
    key's 64-bit identity, the payload length; then the chunk), O_DIRECT, queue depth 256, the chunk
    buffers registered as fixed buffers; a store writes header and payload of up to 64 chunks per
    ``batched_write``, a retrieve reads every chunk's payload in one ``batched_read``.
``local_disk`` / ``local_disk_odirect``
    LMCache's local-disk layout: one file per chunk, written and read whole from plain Python by 4 threads
    (its ``disk_io_threads`` default), buffered (its default) or O_DIRECT (its ``use_odirect``).
``lmcache``
    (with ``--lmcache-python``) LMCache's own ``RawBlockCore`` (``put_many``, ``load_many_into``) run by an
    interpreter that has the ``lmcache`` package, in a child process sharing this process's buffers.

Chunks are LMCache's ``KV_2LTD`` memory objects ([K/V, layer, token, hidden]), 256 tokens each.  All engines
move the same bytes: one memory area holds the prefix, another receives it.  The LMCache engines see each area
as consecutive chunk buffers; Tutti sees the same area as a paged KV cache (per layer and K/V a block stride of
one object, as vLLM's per-layer tensors) whose prefix blocks sit at shuffled block ids.  After every read the
destination is compared byte for byte with the source (it is overwritten with a constant byte before each
read), and a difference fails the benchmark.

On a disk, the page cache is dropped (needs root) before every read, and every engine that can reads with
O_DIRECT; on tmpfs there is no cache to drop (the file system is memory).  The baseline is fio's sequential
O_DIRECT io_uring read of Tutti's store file (its data region), measured in the same run.  Each run rotates
the order of the engines.  Rates are GB/s (10^9 bytes) of KV payload; CPU is the process's user+sys time
(all its threads; for fio and the child, theirs) per GB moved.
"""
from __future__ import annotations

import ctypes
import dataclasses
import datetime as _dt
import hashlib
import importlib
import importlib.metadata
import json
import mmap
import os
import random
import shutil
import subprocess
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ..errors import TuttiError
from ..memory import PagedBuffer, ffi
from .common import (
    GB,
    BenchError,
    cpu_seconds,
    drop_page_cache,
    host_memory_available,
    human_bytes,
    median,
    ratio,
    room_for,
)
from .fio import FIO_CONFIGS, fio_available, pick_fio_config, run_fio
from .machine import describe_path, filesystem_type, machine_info
from .passes import prefill, retrieve_pass, store_pass

if TYPE_CHECKING:
    from ..model import Fingerprint, Geometry

RAW_BLOCK_MODULE = "lmcache_rust_raw_block_io"
RAW_BLOCK_PIP = "lmcache-rust-raw-block-io"
EXTRA = "tutti[lmcache-bench]"
COMPARE_TITLE = "Side by side with LMCache's disk engines"
TARGET = 1.5                # issue 15: Tutti >= 1.5x the best LMCache engine on retrieve

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
CHILD_TIMEOUT_S = 900
# fio's settings tried for the baseline: the store benchmark's, and LMCache's own request size (a whole
# 32 MiB chunk per read) with 4 in flight (its 4 disk threads), 16, and 128 (raw-block's whole prefix at once):
# a baseline must not be a weak one (a one-off check on this VM's virtual disk found 32M/QD128 well above 1M/QD32).
COMPARE_FIO_CONFIGS = (*FIO_CONFIGS, ("32M", 4), ("32M", 16), ("32M", 128))
FIO_MIN_BYTES = 32 << 20    # the largest block size of COMPARE_FIO_CONFIGS
FIO_SETTINGS = ("sequential read, O_DIRECT, io_uring, the fastest of bs/iodepth "
                + ", ".join(f"{b}/{q}" for b, q in COMPARE_FIO_CONFIGS) + " in an uncounted calibration pass")

ENGINES = {  # name -> (label, what its read checks, how it moves the bytes)
    "tutti": ("Tutti, layer-wise", "XXH3 of every object (default)",
              "io_uring, O_DIRECT, into a paged buffer at shuffled block ids"),
    "tutti_all_layers": ("Tutti, all layers submitted at once", "XXH3 of every object (default)",
                         "the same read with every layer in flight before the first wait"),
    "tutti_unverified": ("Tutti, layer-wise, checksums off", "nothing (verify=False)",
                         "the same read, store opened verify=False"),
    "raw_block": ("LMCache raw-block (Rust io_uring)", "nothing (the slot header is not read on load)",
                  "lmcache-rust-raw-block-io batched_read/write, O_DIRECT, QD 256, fixed buffers"),
    "local_disk": ("LMCache local-disk, buffered", "nothing",
                   "one file per chunk, open/readinto, 4 threads (LMCache's default)"),
    "local_disk_odirect": ("LMCache local-disk, O_DIRECT", "nothing",
                           "one file per chunk, O_DIRECT readinto, 4 threads"),
    "lmcache": ("lmcache RawBlockCore (the package itself)", "nothing (the slot header is not read on load)",
                "lmcache's put_many/load_many_into over the same Rust engine, O_DIRECT, io_uring"),
    "fio": ("fio, sequential read", "nothing", "sequential O_DIRECT io_uring read of Tutti's store file"),
}
LMCACHE_ENGINES = ("raw_block", "local_disk", "local_disk_odirect", "lmcache")


def raw_block_module() -> Any:
    """The ``lmcache_rust_raw_block_io`` module; BenchError (exit 2) with the install hint when it is missing."""
    try:
        return importlib.import_module(RAW_BLOCK_MODULE)
    except ImportError:
        raise BenchError(f"--compare lmcache needs the Python package {RAW_BLOCK_PIP} "
                         f"(pip install '{EXTRA}')", 2) from None


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _round_up(x: int, align: int) -> int:
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
        return _round_up(RB_HEADER + self.chunk_bytes, RB_ALIGN)

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


def _rate(nbytes: int, seconds: float, cpu: float) -> dict:
    return {"bytes": nbytes, "seconds": seconds, "cpu_seconds": cpu, "gbps": nbytes / seconds / GB,
            "cpu_s_per_gb": cpu / (nbytes / GB)}


def _timed(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    """(fn's result, wall seconds, CPU seconds of this process)."""
    c0, t0 = cpu_seconds(), time.perf_counter()
    out = fn()
    t1, c1 = time.perf_counter(), cpu_seconds()
    return out, t1 - t0, c1 - c0


def _equal_fn() -> Callable[[memoryview, memoryview], bool]:
    """Byte equality of two views: numpy's when it is installed (no copies), else through bytes."""
    try:
        np: Any = importlib.import_module("numpy")
    except ImportError:
        return lambda a, b: bytes(a) == bytes(b)
    return lambda a, b: bool(np.array_equal(np.frombuffer(a, dtype=np.uint8), np.frombuffer(b, dtype=np.uint8)))


def verify_chunks(src: SharedArea, dst: SharedArea, layout: ChunkLayout, what: str) -> None:
    equal = _equal_fn()
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
    equal = _equal_fn()
    for layer in range(layout.n_layers):
        for span in range(layout.n_spans):
            for i, (a, b) in enumerate(zip(src_ids, dst_ids)):
                if not equal(src.block_view(layer, span, a), dst.block_view(layer, span, b)):
                    raise BenchError(f"{what}: block {i} (layer {layer}, span {span}) read back differs "
                                     "from the block stored", 1)


def _fdatasync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
    finally:
        os.close(fd)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _prefill_file(path: str, size: int) -> None:
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


class _Ctx:
    """What every engine shares in one comparison."""

    def __init__(self, cfg: CompareConfig, layout: ChunkLayout, geo: Geometry, bench_fp: Fingerprint,
                 src: SharedArea, dst: SharedArea, tmpfs: bool, log: Callable[[str], None]):
        self.cfg, self.layout, self.geo, self.bench_fp = cfg, layout, geo, bench_fp
        self.src, self.dst, self.tmpfs, self.log = src, dst, tmpfs, log
        self.dropped = False

    def before_read(self, byte: int) -> None:
        """Overwrite the destination (a read that lands nowhere fails verification); drop the page cache."""
        self.dst.fill_byte(byte)
        if self.cfg.drop_cache:
            self.dropped = drop_page_cache() or self.dropped


def retrieve_all_layers(store: Any, dst: PagedBuffer, geo: Geometry, slots: Sequence[int],
                        mem_ids: Sequence[int]) -> dict:
    """Tutti's read with every layer submitted before the first wait (the whole prefix in flight, as the
    LMCache engines read it), then each layer waited for; checksums as the store was opened."""
    def go() -> list:
        txn = store.read(slots)
        for layer in range(geo.n_layers):
            txn.layer(layer, dst.memmap, mem_ids)
        for layer in range(geo.n_layers):
            txn.wait_layer(layer)
        return list(txn.finish())

    statuses, secs, cpu = _timed(go)
    bad = [i for i, st in enumerate(statuses) if st != 0]
    if bad:
        raise BenchError(f"retrieve (all layers): {len(bad)} of {len(slots)} blocks failed (first: block "
                         f"{bad[0]}, status {statuses[bad[0]]})", 1)
    return {"seconds": secs, "cpu_seconds": cpu}


class TuttiEngine:
    names = ("tutti", "tutti_all_layers", "tutti_unverified", "fio")

    def __init__(self, ctx: _Ctx, path: str, fio_version: str | None):
        self.ctx, self.path = ctx, path
        geo, layout = ctx.geo, ctx.layout
        ids = layout.block_ids()
        rng = random.Random(ctx.cfg.seed)
        self.src_ids, self.dst_ids = list(ids), list(ids)
        rng.shuffle(self.src_ids)
        rng.shuffle(self.dst_ids)
        self.src_pb = ChunkPagedBuffer(ctx.src, layout)
        self.dst_pb = ChunkPagedBuffer(ctx.dst, layout)
        self.fio_version = fio_version
        self.fio_cfg: tuple[str, int] | None = None
        self.region = layout.n_blocks * geo.slot_bytes
        self.fio_size = max(1 << 20, self.region // (1 << 20) * (1 << 20))
        self.prefilled = False

    def run(self, r: int) -> dict:
        from ..store import Store
        from .run import bench_key

        ctx, geo, layout = self.ctx, self.ctx.geo, self.ctx.layout
        n = layout.n_blocks
        nbytes = layout.total_bytes
        out: dict = {}
        try:
            Store.format([self.path], ctx.bench_fp, force=True, n_slots=n)
        except OSError as e:
            raise BenchError(f"format failed: {e}", 3) from None
        if not self.prefilled and not ctx.tmpfs:
            prefill([self.path], geo, self.region)
            self.prefilled = True
        keys = [bench_key(r, i) for i in range(n)]
        with Store.open([self.path], engine=ctx.cfg.engine) as store:
            self.engine_name = store.engine
            self.src_pb.register(store)
            _, secs, cpu = _timed(lambda: store_pass(store, self.src_pb, geo, keys, self.src_ids))
            out["tutti"] = {"store": _rate(nbytes, secs, cpu)}
            out["tutti"]["store_durable"] = out["tutti"]["store"]  # finish() makes data and records durable
            slots = list(store.lookup(keys))
            if any(s is None or s < 0 for s in slots):
                raise BenchError("retrieve: blocks just stored are missing from the store", 1)
            self.dst_pb.register(store)
            ctx.before_read(0x5A ^ r)
            ret = retrieve_pass(store, self.dst_pb, geo, slots, self.dst_ids)
            verify_paged(self.src_pb, self.dst_pb, layout, self.src_ids, self.dst_ids, "Tutti retrieve")
            out["tutti"]["retrieve"] = _rate(nbytes, ret["seconds"], ret["cpu_us_per_layer"] * geo.n_layers / 1e6)
            ctx.before_read(0xA7 ^ r)
            al = retrieve_all_layers(store, self.dst_pb, geo, slots, self.dst_ids)
            verify_paged(self.src_pb, self.dst_pb, layout, self.src_ids, self.dst_ids, "Tutti retrieve, all layers")
            out["tutti_all_layers"] = {"retrieve": _rate(nbytes, al["seconds"], al["cpu_seconds"])}
        with Store.open([self.path], engine=ctx.cfg.engine, verify=False) as store:
            self.dst_pb.register(store)
            ctx.before_read(0x3C ^ r)
            nv = retrieve_pass(store, self.dst_pb, geo, slots, self.dst_ids)
            verify_paged(self.src_pb, self.dst_pb, layout, self.src_ids, self.dst_ids, "Tutti retrieve, verify off")
            out["tutti_unverified"] = {"retrieve": _rate(nbytes, nv["seconds"],
                                                         nv["cpu_us_per_layer"] * geo.n_layers / 1e6)}
        if self.fio_version:  # after the reads, not right after the store: the same state the reads found
            if self.fio_cfg is None:
                self.fio_cfg = pick_fio_config([self.path], "read", geo.data_off, self.fio_size,
                                               COMPARE_FIO_CONFIGS)
                ctx.log(f"  fio calibration: read {self.fio_cfg[0]}/QD{self.fio_cfg[1]}")
            f = run_fio([self.path], "read", geo.data_off, self.fio_size, self.fio_cfg)  # drops the cache first
            out["fio"] = {"retrieve": {"bytes": f["bytes"], "seconds": f["seconds"], "gbps": f["gbps"],
                                       "cpu_seconds": f["cpu_seconds"],
                                       "cpu_s_per_gb": f["cpu_seconds"] / (f["bytes"] / GB)}}
        if ctx.tmpfs:
            _unlink(self.path)
        return out

    def close(self) -> None:
        self.src_pb.close()
        self.dst_pb.close()
        _unlink(self.path)


class RawBlockEngine:
    """LMCache's raw-block layout through its Rust io_uring engine, driven as RawBlockCore drives it."""

    names = ("raw_block",)

    def __init__(self, ctx: _Ctx, path: str):
        self.ctx, self.path, self.mod = ctx, path, raw_block_module()
        self.prepared = False
        self.fixed: bool | None = None

    def _file(self) -> None:
        size = self.ctx.layout.raw_file_bytes
        if self.ctx.tmpfs or not self.prepared:
            with open(self.path, "wb") as f:
                f.truncate(size)
            if not self.ctx.tmpfs:
                _prefill_file(self.path, size)
            self.prepared = True

    def _open(self) -> Any:
        dev = self.mod.RawBlockDevice(self.path, writable=True, use_odirect=True, alignment=RB_ALIGN,
                                      io_engine="io_uring", iouring_queue_depth=RB_QUEUE_DEPTH)
        sp, ss = self.ctx.src.fixed_regions()
        dp, ds = self.ctx.dst.fixed_regions()
        try:
            dev.register_fixed_buffers(sp + dp, ss + ds)  # one-shot, as LMCache registers its allocator
            self.fixed = True
        except Exception as e:  # noqa: BLE001 - optional, as in LMCache: it logs and goes on without
            self.ctx.log(f"  raw_block: fixed buffers not registered ({e})")
            self.fixed = False
        return dev

    @staticmethod
    def _wait(dev: Any, batch: int, n: int, what: str) -> None:
        ok, errors = dev.wait_iouring(batch)
        if len(ok) != n or not all(ok):
            raise BenchError(f"raw_block {what}: {sum(1 for x in ok if not x)} of {n} I/Os failed "
                             f"{list(errors)[:3]}", 1)

    def run(self, r: int) -> dict:
        ctx, lay = self.ctx, self.ctx.layout
        self._file()
        dev = self._open()
        try:
            chunks = range(lay.n_chunks)
            headers = [slot_header(chunk_identity(r, c), lay.chunk_bytes) for c in chunks]
            srcs = [ctx.src.view(c * lay.chunk_bytes, lay.chunk_bytes) for c in chunks]
            dsts = [ctx.dst.view(c * lay.chunk_bytes, lay.chunk_bytes) for c in chunks]

            def store() -> None:
                for first in range(0, lay.n_chunks, RB_BATCH_KEYS):
                    batch = chunks[first:first + RB_BATCH_KEYS]
                    offs, bufs, lens = [], [], []
                    for c in batch:
                        offs += [lay.slot_offset(c), lay.slot_offset(c) + RB_HEADER]
                        bufs += [headers[c], srcs[c]]
                        lens += [RB_HEADER, lay.chunk_bytes]
                    self._wait(dev, dev.batched_write(offs, bufs, lens, None, lens), len(offs), "write")

            def retrieve() -> None:
                offs = [lay.slot_offset(c) + RB_HEADER for c in chunks]
                self._wait(dev, dev.batched_read(offs, dsts, [lay.chunk_bytes] * lay.n_chunks),
                           lay.n_chunks, "read")

            _, s_secs, s_cpu = _timed(store)
            _, d_secs, d_cpu = _timed(lambda: _fdatasync(self.path))
            ctx.before_read(0xC3 ^ r)
            _, r_secs, r_cpu = _timed(retrieve)
        finally:
            dev.close()
        for v in srcs + dsts:
            try:
                v.release()
            except BufferError:
                pass  # still held by the engine's objects: released with them
        verify_chunks(ctx.src, ctx.dst, lay, "raw_block retrieve")
        n = lay.total_bytes
        out = {"raw_block": {"store": _rate(n, s_secs, s_cpu),
                             "store_durable": _rate(n, s_secs + d_secs, s_cpu + d_cpu),
                             "retrieve": _rate(n, r_secs, r_cpu)}}
        if ctx.tmpfs:
            _unlink(self.path)
        return out

    def close(self) -> None:
        _unlink(self.path)


class LocalDiskEngine:
    """LMCache's local-disk layout: one file per chunk, plain Python reads and writes from a thread pool."""

    def __init__(self, ctx: _Ctx, directory: str, odirect: bool):
        self.ctx, self.dir, self.odirect = ctx, directory, odirect
        self.names = ("local_disk_odirect",) if odirect else ("local_disk",)
        self.threads = ctx.cfg.disk_threads

    def _path(self, r: int, c: int) -> str:
        return os.path.join(self.dir, f"vllm@tutti-bench@1@0@{chunk_identity(r, c):x}@bfloat16.pt")

    def _clear(self) -> None:
        if os.path.isdir(self.dir):
            for name in os.listdir(self.dir):
                os.unlink(os.path.join(self.dir, name))
        os.makedirs(self.dir, exist_ok=True)

    def _write(self, path: str, view: memoryview) -> None:
        if self.odirect:
            fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_DIRECT, 0o644)
            try:
                n = os.write(fd, view)
            finally:
                os.close(fd)
        else:
            with open(path, "wb") as f:
                n = f.write(view)
        if n != len(view):
            raise BenchError(f"local_disk: short write of {path}: {n} of {len(view)} bytes", 1)

    def _read(self, path: str, view: memoryview) -> None:
        if self.odirect:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
            with os.fdopen(fd, "rb", buffering=0) as f:
                n = f.readinto(view)
        else:
            with open(path, "rb") as f:
                n = f.readinto(view)
        if n != len(view):
            raise BenchError(f"local_disk: short read of {path}: {n} of {len(view)} bytes", 1)

    def run(self, r: int) -> dict:
        ctx, lay = self.ctx, self.ctx.layout
        name = self.names[0]
        self._clear()  # LMCache writes a new file per new key
        paths = [self._path(r, c) for c in range(lay.n_chunks)]
        srcs = [ctx.src.view(c * lay.chunk_bytes, lay.chunk_bytes) for c in range(lay.n_chunks)]
        dsts = [ctx.dst.view(c * lay.chunk_bytes, lay.chunk_bytes) for c in range(lay.n_chunks)]

        def sync_all() -> None:
            for p in paths:
                fd = os.open(p, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)

        with ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="lmc-disk") as pool:
            _, s_secs, s_cpu = _timed(lambda: list(pool.map(self._write, paths, srcs)))
            _, d_secs, d_cpu = _timed(sync_all)
            ctx.before_read(0x96 ^ r)
            _, r_secs, r_cpu = _timed(lambda: list(pool.map(self._read, paths, dsts)))
        for v in srcs + dsts:
            v.release()
        verify_chunks(ctx.src, ctx.dst, lay, f"{name} retrieve")
        n = lay.total_bytes
        out = {name: {"store": _rate(n, s_secs, s_cpu), "store_durable": _rate(n, s_secs + d_secs, s_cpu + d_cpu),
                      "retrieve": _rate(n, r_secs, r_cpu)}}
        if ctx.tmpfs:
            self._clear()
        return out

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


CHILD = Path(__file__).with_name("_lmcache_core_child.py")


def run_child(python: str, spec: dict, pass_fds: Sequence[int] = ()) -> dict:
    """Run _lmcache_core_child.py with ``python`` and ``spec``; its TUTTI-RESULT, or BenchError (exit 2 when
    lmcache does not import there or the interpreter does not run)."""
    try:
        proc = subprocess.run([python, str(CHILD), json.dumps(spec)], capture_output=True, text=True,
                              pass_fds=tuple(pass_fds), timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise BenchError(f"lmcache: the child did not finish within {CHILD_TIMEOUT_S} s", 1) from None
    except OSError as e:
        raise BenchError(f"--lmcache-python {python}: cannot run it: {e.strerror}", 2) from None
    result = error = None
    for line in proc.stdout.splitlines():
        if line.startswith("TUTTI-RESULT "):
            result = json.loads(line[len("TUTTI-RESULT "):])
        elif line.startswith("TUTTI-ERROR "):
            error = line[len("TUTTI-ERROR "):]
    if error is not None:
        raise BenchError(f"--lmcache-python {python}: {error}", 2 if proc.returncode == 3 else 1)
    if proc.returncode != 0 or result is None:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise BenchError(f"--lmcache-python {python}: the child failed (exit {proc.returncode}): {tail}",
                         2 if spec.get("check") else 1)
    return result


def check_lmcache_python(python: str) -> str | None:
    """Before anything is written: lmcache imports in ``python``; its version."""
    return run_child(python, {"check": True}).get("lmcache_version")


class LMCacheCoreEngine:
    """LMCache's own RawBlockCore, run by ``--lmcache-python`` in a child that maps the same buffers."""

    names = ("lmcache",)

    def __init__(self, ctx: _Ctx, raw: RawBlockEngine, python: str):
        self.ctx, self.raw, self.python = ctx, raw, python
        self.version: str | None = None

    def run(self, r: int) -> dict:
        ctx, lay = self.ctx, self.ctx.layout
        self.raw._file()
        spec = {"device_path": self.raw.path, "file_bytes": lay.raw_file_bytes, "chunks": lay.n_chunks,
                "chunk_bytes": lay.chunk_bytes, "spans": lay.n_spans, "layers": lay.n_layers,
                "chunk_tokens": lay.chunk_tokens, "token_bytes": lay.part_bytes // lay.chunk_tokens,
                "dtype": ctx.bench_fp.dtype, "meta_bytes": RB_META, "header_bytes": RB_HEADER,
                "slot_bytes": lay.slot_bytes,
                "align": RB_ALIGN, "queue_depth": RB_QUEUE_DEPTH, "src_fd": ctx.src.fd, "dst_fd": ctx.dst.fd,
                "area_bytes": ctx.src.size, "run": r, "poison": 0x69 ^ r, "drop_cache": ctx.cfg.drop_cache}
        result = run_child(self.python, spec, (ctx.src.fd, ctx.dst.fd))
        self.version = result.get("lmcache_version")
        ctx.dropped = bool(result.get("dropped")) or ctx.dropped
        verify_chunks(ctx.src, ctx.dst, lay, "lmcache RawBlockCore retrieve")
        n = lay.total_bytes
        s, d, g = result["store"], result["durable"], result["retrieve"]
        out = {"lmcache": {"store": _rate(n, s["seconds"], s["cpu_seconds"]),
                           "store_durable": _rate(n, s["seconds"] + d["seconds"], s["cpu_seconds"] + d["cpu_seconds"]),
                           "retrieve": _rate(n, g["seconds"], g["cpu_seconds"])}}
        if ctx.tmpfs:
            _unlink(self.raw.path)
        return out

    def close(self) -> None:
        pass


@dataclasses.dataclass
class CompareConfig:
    """One comparison: Tutti's store at ``path``, LMCache's files beside it (``path``.lmcache-raw, -disk/)."""

    path: str
    prefix_tokens: int = 32768
    runs: int = 5
    fp: Fingerprint | None = None
    engine: str = "auto"
    fio: bool = True
    seed: int = 1
    force: bool = False
    lmcache_python: str | None = None
    disk_threads: int = DISK_THREADS
    drop_cache: bool = True     # drop the page cache before every read (root); tests turn it off
    command: str = ""


def lmcache_paths(path: str) -> tuple[str, str]:
    """LMCache's raw-block file and local-disk directory beside Tutti's store file ``path``."""
    return path + ".lmcache-raw", path + ".lmcache-disk"


def _check_lmcache_paths(cfg: CompareConfig) -> None:
    raw, ddir = lmcache_paths(cfg.path)
    if cfg.force:
        return
    for p in (raw, ddir):
        if os.path.lexists(p):
            raise BenchError(f"{p} exists (LMCache's files of the comparison go there); remove it or pass --force", 2)


def _check_room(cfg: CompareConfig, layout: ChunkLayout, tutti_bytes: int, tmpfs: bool) -> None:
    files = [tutti_bytes, layout.raw_file_bytes, layout.total_bytes]
    disk = max(files) if tmpfs else sum(files)  # tmpfs: each engine's files are removed after its turn
    room = room_for(cfg.path)
    if room is not None and disk > room:
        raise BenchError(f"{cfg.path}: the comparison's files need {human_bytes(disk)}; the file system holding "
                         f"it has room for {human_bytes(room)}", 2)
    memory = 2 * layout.total_bytes + (max(files) if tmpfs else 0)
    avail = host_memory_available()
    if memory > avail:
        raise BenchError(f"the comparison needs {human_bytes(memory)} of memory (two copies of the prefix"
                         f"{' and the files on tmpfs' if tmpfs else ''}); {human_bytes(avail)} is available", 2)


def _probe_odirect(directory: str) -> None:
    probe = os.path.join(directory, f".tutti-odirect-probe-{os.getpid()}")
    try:
        fd = os.open(probe, os.O_CREAT | os.O_RDWR | os.O_DIRECT, 0o600)
        os.close(fd)
    except OSError as e:
        raise BenchError(f"{directory}: the file system refuses O_DIRECT ({e.strerror}); the comparison "
                         "needs it", 2) from None
    finally:
        _unlink(probe)


def run_compare(cfg: CompareConfig, log: Callable[[str], None] | None = None) -> dict:
    """Run the comparison; a JSON-serialisable dict (see this module's docstring)."""
    from ..model import LLAMA3_8B
    from ..store import Store
    from .run import BENCH_MODEL_PREFIX, BenchConfig, _check_paths

    log = log or (lambda msg: None)
    raw_block_module()  # exit 2 with the install hint before anything is touched
    if cfg.runs < 1:
        raise BenchError("--runs must be at least 1", 2)
    fp = cfg.fp or LLAMA3_8B
    if cfg.prefix_tokens < fp.block_size:
        raise BenchError(f"--prefix-tokens must be at least one block ({fp.block_size} tokens)", 2)
    bench_fp = dataclasses.replace(fp, model_id=(BENCH_MODEL_PREFIX + fp.model_id)[:127])
    n_blocks = cfg.prefix_tokens // fp.block_size
    try:
        geo, need = Store.plan(1, bench_fp, n_slots=n_blocks)
    except (OSError, ValueError) as e:
        raise BenchError(f"cannot plan a store for {n_blocks} blocks: {e}", 2) from None
    layout = ChunkLayout.for_geometry(geo, fp.block_size, cfg.prefix_tokens)
    path = str(cfg.path)
    _check_paths(BenchConfig(paths=[path], force=cfg.force))
    _check_lmcache_paths(cfg)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmpfs = filesystem_type(directory) == "tmpfs"
    _check_room(cfg, layout, need, tmpfs)
    _probe_odirect(directory)
    fio_version = fio_available() if cfg.fio else None
    fio_note = ("skipped (--no-fio)" if not cfg.fio else fio_version or "skipped: fio is not installed")
    if fio_version and layout.n_blocks * geo.slot_bytes < FIO_MIN_BYTES:
        fio_version, fio_note = None, f"skipped: the store's data region is under {human_bytes(FIO_MIN_BYTES)}"

    if cfg.lmcache_python:
        log(f"lmcache {check_lmcache_python(cfg.lmcache_python)} in {cfg.lmcache_python}")
    log(f"workload: {fp.model_id} geometry, {cfg.prefix_tokens} tokens = {n_blocks} blocks = "
        f"{layout.n_chunks} chunks of {CHUNK_TOKENS} tokens = {human_bytes(layout.total_bytes)}; "
        f"{'tmpfs' if tmpfs else 'disk'} at {directory}")
    src = SharedArea(layout.total_bytes, "tutti-bench-src")
    dst = SharedArea(layout.total_bytes, "tutti-bench-dst")
    engines: list[Any] = []
    ctx: _Ctx | None = None
    raw_path, disk_dir = lmcache_paths(path)
    try:
        src.fill_random(cfg.seed)
        ctx = _Ctx(cfg, layout, geo, bench_fp, src, dst, tmpfs, log)
        tutti = TuttiEngine(ctx, path, fio_version)
        raw = RawBlockEngine(ctx, raw_path)
        engines = [tutti, raw, LocalDiskEngine(ctx, disk_dir, odirect=False),
                   LocalDiskEngine(ctx, disk_dir, odirect=True)]
        core = LMCacheCoreEngine(ctx, raw, cfg.lmcache_python) if cfg.lmcache_python else None
        if core is not None:
            engines.append(core)
        runs: list[dict] = []
        for r in range(cfg.runs):
            log(f"run {r + 1}/{cfg.runs}")
            run: dict = {}
            order = engines[r % len(engines):] + engines[:r % len(engines)]
            took = []
            for eng in order:
                t0 = time.perf_counter()
                run.update(eng.run(r))
                took.append(f"{eng.names[0]} {time.perf_counter() - t0:.0f} s")
            run["order"] = [n for eng in order for n in eng.names if n in run]
            runs.append(run)
            log("  took (store, reads, checks): " + ", ".join(took))
            log("  retrieve GB/s: " + ", ".join(f"{k} {v['retrieve']['gbps']:.2f}" for k, v in run.items()
                                               if isinstance(v, dict) and "retrieve" in v))
        engine_name = getattr(tutti, "engine_name", None)
        fixed = raw.fixed
        lmcache_version = core.version if core is not None else None
    finally:
        for eng in engines:
            try:
                eng.close()
            except (OSError, BufferError):
                pass
        src.close()
        dst.close()
        for p in (raw_path,):
            _unlink(p)
        shutil.rmtree(disk_dir, ignore_errors=True)
    return summarize(runs, {
        "title": COMPARE_TITLE,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": cfg.command,
        "machine": machine_info([directory]),
        "medium": {"kind": "tmpfs" if tmpfs else "disk", "directory": directory,
                   "description": describe_path(directory)},
        "workload": {"model_id": fp.model_id, "n_layers": geo.n_layers, "n_spans": geo.n_spans,
                     "span_bytes": geo.span_bytes, "block_size": fp.block_size, "prefix_tokens": cfg.prefix_tokens,
                     "blocks": n_blocks, "bytes": layout.total_bytes},
        "layout": layout.to_dict(),
        "tutti": {"engine": engine_name, "store_bytes": need},
        "raw_block": {"package": RAW_BLOCK_PIP, "version": _version(RAW_BLOCK_PIP), "fixed_buffers": fixed},
        "lmcache": {"python": cfg.lmcache_python, "version": lmcache_version},
        "fio": {"used": bool(fio_version), "note": fio_note, "settings": FIO_SETTINGS,
                "chosen": list(tutti.fio_cfg) if tutti.fio_cfg else None},
        "page_cache_dropped": bool(ctx and ctx.dropped),
        "engines": {n: {"label": ENGINES[n][0], "verifies": ENGINES[n][1], "io": ENGINES[n][2]}
                    for n in ENGINES if any(n in run for run in runs)},
        "target": TARGET,
    })


METRICS = ("store", "store_durable", "retrieve")


def summarize(runs: list[dict], res: dict) -> dict:
    """Medians per engine and metric, the best LMCache engine, and the paired ratios (median of per-run ratios)."""
    names = [n for n in ENGINES if any(n in run for run in runs)]
    med: dict = {}
    for n in names:
        med[n] = {}
        for m in METRICS:
            vals = [run[n][m] for run in runs if n in run and m in run[n]]
            if vals:
                med[n][m] = {"gbps": median(v["gbps"] for v in vals),
                             "cpu_s_per_gb": median(v["cpu_s_per_gb"] for v in vals),
                             "runs_gbps": [v["gbps"] for v in vals]}
    lmc = [n for n in LMCACHE_ENGINES if n in med and "retrieve" in med[n]]
    best = max(lmc, key=lambda n: med[n]["retrieve"]["gbps"]) if lmc else None
    best_store = max(lmc, key=lambda n: med[n]["store_durable"]["gbps"]) if lmc else None

    def paired(a: str, b: str | None, metric: str, metric_b: str | None = None) -> float | None:
        if b is None:
            return None
        return median(ratio(run.get(a, {}).get(metric, {}).get("gbps"),
                            run.get(b, {}).get(metric_b or metric, {}).get("gbps")) for run in runs)

    ratios: dict[str, Any] = {
        "tutti/best_lmcache_retrieve": paired("tutti", best, "retrieve"),
        "tutti_unverified/best_lmcache_retrieve": paired("tutti_unverified", best, "retrieve"),
        "tutti/best_lmcache_store_durable": paired("tutti", best_store, "store_durable"),
        "tutti/best_lmcache_store_own": paired("tutti", best_store, "store", "store"),
        "vs_fio": {n: paired(n, "fio", "retrieve") for n in names if n != "fio" and "fio" in med},
        "tutti/each": {n: paired("tutti", n, "retrieve") for n in lmc},
    }
    res.update({"runs": runs, "median": med, "best_lmcache": best, "best_lmcache_store": best_store,
                "ratios": ratios,
                "met": {k: (None if ratios[k] is None else ratios[k] >= TARGET)
                        for k in ("tutti/best_lmcache_retrieve", "tutti_unverified/best_lmcache_retrieve")}})
    return res


# ---------------------------------------------------------------- reporting


def _f(v: float | None, spec: str = ".2f") -> str:
    return "n/a" if v is None else format(v, spec)


def engine_rows(res: dict) -> list[tuple[str, ...]]:
    """(engine, verifies, retrieve GB/s, runs, CPU s/GB, × fio, Tutti ÷ it, store GB/s, store+fsync GB/s,
    store CPU s/GB) per engine, Tutti's rows first."""
    med, ratios = res["median"], res["ratios"]
    out: list[tuple[str, ...]] = []
    for n in res["engines"]:
        m = med.get(n, {})
        g, s, d = m.get("retrieve"), m.get("store"), m.get("store_durable")
        each = ratios["tutti/each"].get(n)
        label = res["engines"][n]["label"] + (" **(best LMCache)**" if n == res["best_lmcache"] else "")
        out.append((
            label, res["engines"][n]["verifies"],
            f"**{_f(g['gbps'])}**" if g else "n/a",
            " / ".join(_f(x) for x in g["runs_gbps"]) if g else "n/a",
            _f(g["cpu_s_per_gb"], ".3f") if g else "n/a",
            _f(ratios["vs_fio"].get(n)) if n != "fio" else "—",
            _f(each) if each is not None else "—",
            _f(s["gbps"]) if s else "—",
            _f(d["gbps"]) if d else "—",
            _f(s["cpu_s_per_gb"], ".3f") if s else "—",
        ))
    return out


ENGINE_HEADER = ("Engine", "Checks on read", "Retrieve GB/s", "Runs (GB/s)", "Retrieve CPU s/GB", "× fio",
                 "Tutti ÷ engine", "Store GB/s", "Store + fsync GB/s", "Store CPU s/GB")


def summary_row(res: dict) -> tuple[str, ...]:
    med, r, best = res["median"], res["ratios"], res["best_lmcache"]

    def g(n: str | None) -> str:
        return _f(med[n]["retrieve"]["gbps"]) if n and n in med and "retrieve" in med[n] else "n/a"

    def met(k: str) -> str:
        v = res["met"][k]
        return "n/a" if v is None else ("yes" if v else "**no**")

    return (res["medium"]["kind"], str(res["workload"]["prefix_tokens"]), human_bytes(res["workload"]["bytes"]),
            f"{res['engines'][best]['label'] if best else 'n/a'}: {g(best)}", g("tutti"),
            f"{_f(r['tutti/best_lmcache_retrieve'])} ({met('tutti/best_lmcache_retrieve')})", g("tutti_unverified"),
            f"{_f(r['tutti_unverified/best_lmcache_retrieve'])} ({met('tutti_unverified/best_lmcache_retrieve')})",
            g("fio"), _f(r["tutti/best_lmcache_store_durable"]))


SUMMARY_HEADER = ("Medium", "Tokens", "KV", "Best LMCache engine: retrieve GB/s", "Tutti (checksums) GB/s",
                  f"Tutti ÷ best (≥ {TARGET:g})", "Tutti (no checksums) GB/s", f"no checksums ÷ best (≥ {TARGET:g})",
                  "fio read GB/s", "Tutti store ÷ best LMCache store + fsync")


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def markdown_section(results: Sequence[dict], command: str, title: str = COMPARE_TITLE,
                     date: str | None = None, notes: Sequence[str] = ()) -> str:
    """One section for one or more comparisons (e.g. disk and tmpfs, 8K and 32K tokens)."""
    first = results[0]
    m, lay = first["machine"], first["layout"]
    rb = first["raw_block"]
    lmc = next((r["lmcache"] for r in results if r["lmcache"].get("version")), first["lmcache"])
    out = [
        f"## {title}", "",
        f"Measured {date or first['date']} with:", "",
        "```", command or first["command"] or "(library call)", "```", "",
        f"- Machine: {m['host']}, {m['cpu']}, {m['cores']} cores, {m['kernel']}, Python {m['python']}.",
        "- Media: " + "; ".join(dict.fromkeys(f"{r['medium']['kind']} = {r['medium']['description']}"
                                              for r in results)) + ".",
        f"- Workload: `{first['workload']['model_id']}` geometry ({first['workload']['n_layers']} layers, "
        f"K and V of {human_bytes(first['workload']['span_bytes'])} per {first['workload']['block_size']}-token "
        f"block), prefixes of " + ", ".join(dict.fromkeys(str(r["workload"]["prefix_tokens"]) for r in results))
        + f" tokens; LMCache's {lay['chunk_tokens']}-token chunks of {human_bytes(lay['chunk_bytes'])} "
        f"({lay['memory_format']}). {len(first['runs'])} run(s) per row, medians; engine order rotated run by run; "
        "ratios are medians of per-run ratios.",
        f"- Engines: Tutti (engine `{first['tutti']['engine']}`); {rb['package']} {rb['version']} "
        f"(fixed buffers registered: {'yes' if rb['fixed_buffers'] else 'no'}); LMCache's local-disk I/O "
        "reproduced in plain Python (open/readinto/write, 4 threads, as lmcache 0.5.6 does it); "
        + (f"lmcache {lmc['version']} itself (`RawBlockCore`) through `{lmc['python']}`."
           if lmc.get("version") else "lmcache itself not run (no --lmcache-python)."),
        "- Page cache: "
        + ("dropped before every read on the disk (as root; `sync` first)"
           + ("" if all(r["page_cache_dropped"] for r in results if r["medium"]["kind"] == "disk") else
              " (**not** in every row: not root)") + "; "
           if any(r["medium"]["kind"] == "disk" for r in results) else "")
        + "every engine but `local-disk, buffered` reads with O_DIRECT"
        + ("; tmpfs has no cache to drop (its files are memory)" if any(r["medium"]["kind"] == "tmpfs"
                                                                        for r in results) else "") + ".",
        f"- Baseline: fio sequential read of Tutti's store file in the same run ({first['fio']['note']}; "
        f"{first['fio']['settings']}).",
        "- Every read is compared byte for byte with the source; the destination is overwritten before each.",
        "", _md_table(SUMMARY_HEADER, [summary_row(r) for r in results]), "",
    ]
    for r in results:
        chosen = r["fio"].get("chosen")
        out += [f"**{r['medium']['kind']}, {r['workload']['prefix_tokens']} tokens "
                f"({human_bytes(r['workload']['bytes'])})** — fio: "
                + (f"{chosen[0]}/QD{chosen[1]} chosen by the calibration" if chosen else r["fio"]["note"])
                + "; store durable: Tutti's `finish` fsyncs, the LMCache engines do not (`Store GB/s`), "
                "`Store + fsync` adds an fdatasync of their files.", "",
                _md_table(ENGINE_HEADER, engine_rows(r)), ""]
    out += list(notes)
    return "\n".join(out).rstrip("\n") + "\n"


def print_compare(con: Any, res: dict) -> None:
    """Console tables of one comparison."""
    from rich.table import Table

    w = res["workload"]
    con.print(f"{w['model_id']} geometry; prefix {w['prefix_tokens']} tokens = {human_bytes(w['bytes'])}; "
              f"{res['medium']['kind']}: {res['medium']['description']}; {len(res['runs'])} run(s)")
    t = Table(title="Retrieve and store (medians; GB/s, CPU s per GB)", title_justify="left")
    keep = (0, 2, 4, 5, 6, 7, 8, 9)  # the console drops the checks (listed below) and every run's value
    for i in keep:
        t.add_column(ENGINE_HEADER[i].replace(" GB/s", "").replace("Retrieve CPU s/GB", "CPU s/GB"),
                     justify="left" if i == 0 else "right")
    for row in engine_rows(res):
        t.add_row(*(row[i].replace("**", "").replace(" (best LMCache)", " *") for i in keep))
    con.print(t)
    con.print("* the best LMCache engine.  Checks on read: " + "; ".join(
        f"{e['label']}: {e['verifies']}" for n, e in res["engines"].items() if n != "fio"))
    best = res["best_lmcache"]
    for k, label in (("tutti/best_lmcache_retrieve", "Tutti (checksums on) ÷ best LMCache"),
                     ("tutti_unverified/best_lmcache_retrieve", "Tutti (checksums off) ÷ best LMCache")):
        v, met = res["ratios"][k], res["met"][k]
        style = "green" if met else "red"
        con.print(f"[{style}]{label} ({best}): {_f(v)} (target ≥ {TARGET:g}: "
                  f"{'n/a' if met is None else 'met' if met else 'NOT met'})[/]")
    con.print("[green]every read verified byte for byte[/]")

