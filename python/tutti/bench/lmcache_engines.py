"""The engines the LMCache comparison runs (lmcache_compare.py): Tutti's store, LMCache's raw-block layout
through its Rust io_uring engine, LMCache's local-disk layout, and LMCache's own RawBlockCore in a child process.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import random
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ..memory import PagedBuffer
from .common import (
    GB,
    BenchError,
    drop_page_cache,
)
from .fio import FIO_CONFIGS, pick_fio_config, run_fio
from .lmcache_layout import (
    RB_ALIGN,
    RB_BATCH_KEYS,
    RB_HEADER,
    RB_META,
    RB_QUEUE_DEPTH,
    ChunkLayout,
    ChunkPagedBuffer,
    SharedArea,
    chunk_identity,
    fdatasync_path,
    prefill_file,
    rate_of,
    slot_header,
    timed_call,
    unlink_quietly,
    verify_chunks,
    verify_paged,
)
from .passes import prefill, retrieve_pass, store_pass, stored_slots

if TYPE_CHECKING:
    from ..model import Fingerprint, Geometry
    from .lmcache_compare import CompareConfig


RAW_BLOCK_MODULE = "lmcache_rust_raw_block_io"
RAW_BLOCK_PIP = "lmcache-rust-raw-block-io"
EXTRA = "tutti[lmcache-bench]"
CHILD_TIMEOUT_S = 900
# fio's settings tried for the baseline: the store benchmark's, and LMCache's own request size (a whole
# 32 MiB chunk per read) with 4 in flight (its 4 disk threads), 16, and 128 (raw-block's whole prefix at once):
# a baseline must not be a weak one (a one-off check on this VM's virtual disk found 32M/QD128 well above 1M/QD32).
COMPARE_FIO_CONFIGS = (*FIO_CONFIGS, ("32M", 4), ("32M", 16), ("32M", 128))


def raw_block_module() -> Any:
    """The ``lmcache_rust_raw_block_io`` module; BenchError (exit 2) with the install hint when it is missing."""
    try:
        return importlib.import_module(RAW_BLOCK_MODULE)
    except ImportError:
        raise BenchError(f"--compare lmcache needs the Python package {RAW_BLOCK_PIP} "
                         f"(pip install '{EXTRA}')", 2) from None


def dist_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


class RunContext:
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

    statuses, secs, cpu = timed_call(go)
    bad = [i for i, st in enumerate(statuses) if st != 0]
    if bad:
        raise BenchError(f"retrieve (all layers): {len(bad)} of {len(slots)} blocks failed (first: block "
                         f"{bad[0]}, status {statuses[bad[0]]})", 1)
    return {"seconds": secs, "cpu_seconds": cpu}


class TuttiEngine:
    names = ("tutti", "tutti_one_thread", "tutti_all_layers", "tutti_unverified", "fio")

    def __init__(self, ctx: RunContext, path: str, fio_version: str | None):
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
        keys = [bench_key(r, i) for i in range(n)]
        # Checksums off: its own store pass first, in the same open, as every other row reads what
        # its own writes just left (a fresh open would read other pages than the checked row does).
        self._format()
        with Store.open([self.path], engine=ctx.cfg.engine, verify=False,
                        cpu_threads=ctx.cfg.cpu_threads) as store:
            self.src_pb.register(store)
            store_pass(store, self.src_pb, geo, keys, self.src_ids)
            out["tutti_unverified"] = {"retrieve": self._retrieve(store, stored_slots(store, keys), 0x3C ^ r,
                                                                  "Tutti retrieve, verify off")}
        self._format()
        with Store.open([self.path], engine=ctx.cfg.engine, cpu_threads=ctx.cfg.cpu_threads) as store:
            self.engine_name = store.engine
            self.src_pb.register(store)
            _, secs, cpu = timed_call(lambda: store_pass(store, self.src_pb, geo, keys, self.src_ids))
            out["tutti"] = {"store": rate_of(nbytes, secs, cpu)}
            out["tutti"]["store_durable"] = out["tutti"]["store"]  # finish() makes data and records durable
            slots = stored_slots(store, keys)
            out["tutti"]["retrieve"] = self._retrieve(store, slots, 0x5A ^ r, "Tutti retrieve")
            ctx.before_read(0xA7 ^ r)
            al = retrieve_all_layers(store, self.dst_pb, geo, slots, self.dst_ids)
            verify_paged(self.src_pb, self.dst_pb, layout, self.src_ids, self.dst_ids, "Tutti retrieve, all layers")
            out["tutti_all_layers"] = {"retrieve": rate_of(nbytes, al["seconds"], al["cpu_seconds"])}
        # The calling thread alone (cpu_threads=1): what the CPU's threads above are worth.
        with Store.open([self.path], engine=ctx.cfg.engine, cpu_threads=1) as store:
            out["tutti_one_thread"] = {"retrieve": self._retrieve(store, slots, 0x69 ^ r,
                                                                  "Tutti retrieve, one thread")}
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
            unlink_quietly(self.path)
        return out

    def _format(self) -> None:
        from ..store import Store

        ctx = self.ctx
        try:
            Store.format([self.path], ctx.bench_fp, force=True, n_slots=ctx.layout.n_blocks)
        except OSError as e:
            raise BenchError(f"format failed: {e}", 3) from None
        if not self.prefilled and not ctx.tmpfs:
            prefill([self.path], ctx.geo, self.region)
            self.prefilled = True

    def _retrieve(self, store, slots: list, poison: int, what: str) -> dict:
        """One layer-wise retrieve of the prefix into the poisoned paged buffer, checked byte for byte."""
        ctx, geo = self.ctx, self.ctx.geo
        self.dst_pb.register(store)
        ctx.before_read(poison)
        ret = retrieve_pass(store, self.dst_pb, geo, slots, self.dst_ids)
        verify_paged(self.src_pb, self.dst_pb, ctx.layout, self.src_ids, self.dst_ids, what)
        return rate_of(ctx.layout.total_bytes, ret["seconds"], ret["cpu_us_per_layer"] * geo.n_layers / 1e6)

    def close(self) -> None:
        self.src_pb.close()
        self.dst_pb.close()
        unlink_quietly(self.path)


class RawBlockEngine:
    """LMCache's raw-block layout through its Rust io_uring engine, driven as RawBlockCore drives it."""

    names = ("raw_block",)

    def __init__(self, ctx: RunContext, path: str):
        self.ctx, self.path, self.mod = ctx, path, raw_block_module()
        self.prepared = False
        self.fixed: bool | None = None

    def _file(self) -> None:
        size = self.ctx.layout.raw_file_bytes
        if self.ctx.tmpfs or not self.prepared:
            with open(self.path, "wb") as f:
                f.truncate(size)
            if not self.ctx.tmpfs:
                prefill_file(self.path, size)
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

            _, s_secs, s_cpu = timed_call(store)
            _, d_secs, d_cpu = timed_call(lambda: fdatasync_path(self.path))
            ctx.before_read(0xC3 ^ r)
            _, r_secs, r_cpu = timed_call(retrieve)
        finally:
            dev.close()
        for v in srcs + dsts:
            try:
                v.release()
            except BufferError:
                pass  # still held by the engine's objects: released with them
        verify_chunks(ctx.src, ctx.dst, lay, "raw_block retrieve")
        n = lay.total_bytes
        out = {"raw_block": {"store": rate_of(n, s_secs, s_cpu),
                             "store_durable": rate_of(n, s_secs + d_secs, s_cpu + d_cpu),
                             "retrieve": rate_of(n, r_secs, r_cpu)}}
        if ctx.tmpfs:
            unlink_quietly(self.path)
        return out

    def close(self) -> None:
        unlink_quietly(self.path)


class LocalDiskEngine:
    """LMCache's local-disk layout: one file per chunk, plain Python reads and writes from a thread pool."""

    def __init__(self, ctx: RunContext, directory: str, odirect: bool):
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
            _, s_secs, s_cpu = timed_call(lambda: list(pool.map(self._write, paths, srcs)))
            _, d_secs, d_cpu = timed_call(sync_all)
            ctx.before_read(0x96 ^ r)
            _, r_secs, r_cpu = timed_call(lambda: list(pool.map(self._read, paths, dsts)))
        for v in srcs + dsts:
            v.release()
        verify_chunks(ctx.src, ctx.dst, lay, f"{name} retrieve")
        n = lay.total_bytes
        out = {name: {"store": rate_of(n, s_secs, s_cpu), "store_durable": rate_of(n, s_secs + d_secs, s_cpu + d_cpu),
                      "retrieve": rate_of(n, r_secs, r_cpu)}}
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

    def __init__(self, ctx: RunContext, raw: RawBlockEngine, python: str):
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
        out = {"lmcache": {"store": rate_of(n, s["seconds"], s["cpu_seconds"]),
                           "store_durable": rate_of(n, s["seconds"] + d["seconds"],
                                                    s["cpu_seconds"] + d["cpu_seconds"]),
                           "retrieve": rate_of(n, g["seconds"], g["cpu_seconds"])}}
        if ctx.tmpfs:
            unlink_quietly(self.raw.path)
        return out

    def close(self) -> None:
        pass
