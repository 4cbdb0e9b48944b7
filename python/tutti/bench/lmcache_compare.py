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

import dataclasses
import datetime as _dt
import os
import shutil
import time
from typing import TYPE_CHECKING, Any, Callable

from .common import (
    BenchError,
    host_memory_available,
    human_bytes,
    median,
    ratio,
    room_for,
)
from .fio import fio_available
from .lmcache_engines import (
    COMPARE_FIO_CONFIGS,
    RAW_BLOCK_PIP,
    LMCacheCoreEngine,
    LocalDiskEngine,
    RawBlockEngine,
    RunContext,
    TuttiEngine,
    check_lmcache_python,
    dist_version,
    raw_block_module,
)
from .lmcache_layout import CHUNK_TOKENS, DISK_THREADS, ChunkLayout, SharedArea, unlink_quietly
from .machine import describe_path, filesystem_type, machine_info

if TYPE_CHECKING:
    from ..model import Fingerprint


COMPARE_TITLE = "Side by side with LMCache's disk engines"
TARGET = 1.5                # issue 15: Tutti >= 1.5x the best LMCache engine on retrieve
FIO_MIN_BYTES = 32 << 20    # the largest block size of COMPARE_FIO_CONFIGS
FIO_SETTINGS = ("sequential read, O_DIRECT, io_uring, the fastest of bs/iodepth "
                + ", ".join(f"{b}/{q}" for b, q in COMPARE_FIO_CONFIGS) + " in an uncounted calibration pass")

ENGINES = {  # name -> (label, what its read checks, how it moves the bytes)
    "tutti": ("Tutti, layer-wise", "XXH3 of every object (default)",
              "io_uring, O_DIRECT, into a paged buffer at shuffled block ids"),
    "tutti_one_thread": ("Tutti, layer-wise, one CPU thread", "XXH3 of every object (default)",
                         "the same read with cpu_threads=1: copies (page cache, tmpfs) and checksums on the "
                         "calling thread, as before 2026-12-04"),
    "tutti_all_layers": ("Tutti, all layers submitted at once", "XXH3 of every object (default)",
                         "the same read with every layer in flight before the first wait"),
    "tutti_unverified": ("Tutti, layer-wise, checksums off", "nothing (verify=False)",
                         "the same read, store opened verify=False (after its own store pass in that open)"),
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
    cpu_threads: int = 0        # Store.open's for Tutti's rows (0: auto); the one-thread row stays 1
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
        unlink_quietly(probe)


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
    ctx: RunContext | None = None
    raw_path, disk_dir = lmcache_paths(path)
    try:
        src.fill_random(cfg.seed)
        ctx = RunContext(cfg, layout, geo, bench_fp, src, dst, tmpfs, log)
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
            unlink_quietly(p)
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
        "tutti": {"engine": engine_name, "store_bytes": need, "cpu_threads": cfg.cpu_threads},
        "raw_block": {"package": RAW_BLOCK_PIP, "version": dist_version(RAW_BLOCK_PIP), "fixed_buffers": fixed},
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
        "tutti/tutti_one_thread_retrieve": paired("tutti", "tutti_one_thread" if "tutti_one_thread" in med else None,
                                                  "retrieve"),
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
