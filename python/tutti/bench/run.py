"""One benchmark: what to measure (BenchConfig), the runs, and the medians (run_bench)."""
from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import random
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from .common import (
    BenchError,
    drop_page_cache,
    has_store_magic,
    host_memory_available,
    human_bytes,
    is_block_device,
    median,
    member_bytes,
    ratio,
    room_for,
)
from .fio import FIO_SETTINGS, fio_available, pick_fio_config, run_fio
from .machine import machine_info
from .passes import naive_pass, object_extents, poison, prefill, retrieve_pass, store_pass, stored_slots, verify

if TYPE_CHECKING:
    from ..model import Fingerprint
from .report import SECTION_TITLE

BENCH_MODEL_PREFIX = "tutti-bench:"
DEFAULT_SWEEP = (64, 256, 1024, 2048)
TARGETS = {
    "retrieve/fio_read": 0.95,
    "retrieve/naive": 3.0,
    "store/fio_write": 0.9,
}


@dataclasses.dataclass
class BenchConfig:
    """What to measure.  ``fp`` None means the Llama-3-8B preset."""

    paths: Sequence[str]
    prefix_tokens: int = 32768
    runs: int = 5
    size: int | None = None  # store capacity in bytes; None: just the prefix
    fp: Fingerprint | None = None
    fio: bool = True
    sweep: Sequence[int] = DEFAULT_SWEEP
    engine: str = "auto"
    seed: int = 1
    force: bool = False
    cpu_threads: int = 0  # Store.open's: 0 = auto
    command: str = ""


def bench_key(run: int, index: int) -> bytes:
    """16-byte key of prefix block ``index`` in run ``run``."""
    return hashlib.blake2b(f"tutti-bench/{run}/{index}".encode(), digest_size=16).digest()


def _check_paths(cfg: BenchConfig) -> None:
    """Refuse to destroy anything the benchmark did not create, unless forced."""
    from ..store import Store

    if cfg.force:
        return
    existing = [p for p in cfg.paths if member_bytes(p)]
    if not existing:
        return
    for p in existing:
        if is_block_device(p):
            raise BenchError(f"{p} is a block device: the benchmark formats it; pass --force to allow", 2)
        if not has_store_magic(p):
            raise BenchError(f"{p} holds data that is not a Tutti store; pass --force to overwrite it", 2)
    try:
        with Store.open(list(cfg.paths), readonly=True, verify=False) as s:
            model_id = s.fingerprint.model_id
    except OSError as e:
        raise BenchError(f"{', '.join(existing)}: existing store cannot be opened ({e}); "
                         "pass --force to overwrite it", 2) from None
    if not model_id.startswith(BENCH_MODEL_PREFIX):
        raise BenchError(f"{', '.join(existing)} holds a Tutti store for {model_id!r}, not a benchmark "
                         "store; pass --force to overwrite it", 2)


def _check_room(paths: list[str], member_need: int, prefix_bytes: int) -> None:
    """Refuse (exit 2) a benchmark the machine cannot hold, before anything is allocated or written:
    the store on the members' file systems, and the prefix twice (source and destination) in memory."""
    for p in paths:
        room = room_for(p)
        if room is not None and member_need > room:
            raise BenchError(f"{p}: the store needs {human_bytes(member_need)} per member; the file system "
                             f"holding it has room for {human_bytes(room)}", 2)
    memory = host_memory_available()
    if 2 * prefix_bytes > memory:
        raise BenchError(f"the prefix's two host buffers need {human_bytes(2 * prefix_bytes)}; "
                         f"{human_bytes(memory)} of memory is available", 2)


def run_bench(cfg: BenchConfig, log: Callable[[str], None] | None = None) -> dict:
    """Run the benchmark; return a JSON-serialisable dict (see the package docstring of tutti.bench)."""
    from ..memory import PagedBuffer
    from ..model import LLAMA3_8B
    from ..store import Store

    log = log or (lambda msg: None)
    paths = [str(p) for p in cfg.paths]
    if not paths:
        raise BenchError("no store path given", 2)
    if cfg.runs < 1:
        raise BenchError("--runs must be at least 1", 2)
    fp = cfg.fp or LLAMA3_8B
    if cfg.prefix_tokens < fp.block_size:
        raise BenchError(f"--prefix-tokens must be at least one block ({fp.block_size} tokens)", 2)
    n_blocks = cfg.prefix_tokens // fp.block_size
    bench_fp = dataclasses.replace(fp, model_id=(BENCH_MODEL_PREFIX + fp.model_id)[:127])

    _check_paths(cfg)
    for p in paths:
        if member_bytes(p) is None:
            Path(p).parent.mkdir(parents=True, exist_ok=True)

    if cfg.size is not None:
        sizing = {"capacity_bytes": cfg.size}
    else:
        sizing = {"n_slots": n_blocks}
    try:
        geo, need = Store.plan(len(paths), bench_fp, **sizing)
    except (OSError, ValueError) as e:
        raise BenchError(f"cannot plan a store for {n_blocks} blocks on {len(paths)} member(s): {e}", 2) from None
    if geo.n_slots < n_blocks:
        raise BenchError(f"--size {human_bytes(cfg.size or 0)} holds {geo.n_slots} blocks; the prefix needs "
                         f"{n_blocks} ({human_bytes(n_blocks * geo.block_bytes)} of data)", 2)
    _check_room(paths, need, n_blocks * geo.block_bytes)
    sweep = sorted({n for n in cfg.sweep if 0 < n <= n_blocks} | {n_blocks})

    fio_version = fio_available() if cfg.fio else None
    if not cfg.fio:
        fio_note = "skipped (--no-fio)"
    elif fio_version is None:
        fio_note = "skipped: fio is not installed"
    else:
        fio_note = fio_version
    region = need - geo.data_off  # data region per member: what the plan needs past the header
    fio_size = max(1 << 20, region // (1 << 20) * (1 << 20))

    rng = random.Random(cfg.seed)
    mem_ids = list(range(n_blocks))
    rng.shuffle(mem_ids)
    log(f"workload: {fp.model_id} geometry, {cfg.prefix_tokens} tokens = {n_blocks} blocks = "
        f"{human_bytes(n_blocks * geo.block_bytes)}; store {geo.n_slots} slots on {len(paths)} member(s)")

    src = PagedBuffer(geo.n_layers, geo.n_spans, n_blocks, geo.span_bytes)
    dst = PagedBuffer(geo.n_layers, geo.n_spans, n_blocks, geo.span_bytes)
    src.fill_random(mem_ids, cfg.seed)

    runs: list[dict] = []
    fio_cfg: dict = {}
    sweep_rows: dict[int, list[dict]] = {n: [] for n in sweep}
    dropped = False
    engine_name = None
    prefilled = False

    def format_store():
        try:
            Store.format(paths, bench_fp, force=True, **sizing)
        except OSError as e:
            raise BenchError(f"format failed: {e}", 3) from None

    def register(store):
        for buf in (src, dst):
            try:
                buf.register(store)
            except OSError:
                pass  # registration is an optimisation only

    for r in range(cfg.runs):
        log(f"run {r + 1}/{cfg.runs}")
        format_store()
        if not prefilled:
            prefill(paths, geo, region)
            prefilled = True
        run: dict = {}
        with Store.open(paths, engine=cfg.engine, cpu_threads=cfg.cpu_threads) as store:
            engine_name = store.engine
            if store.geometry != geo:
                raise BenchError(f"formatted geometry {store.geometry} differs from the plan {geo}", 1)
            register(store)
            if fio_version and not fio_cfg:
                fio_cfg = {rw: pick_fio_config(paths, rw, geo.data_off, fio_size) for rw in ("write", "read")}
                log("  fio calibration: " + ", ".join(f"{rw} {b}/QD{q}" for rw, (b, q) in fio_cfg.items()))
            if fio_version:
                run["fio_write_gbps"] = run_fio(paths, "write", geo.data_off, fio_size, fio_cfg["write"])["gbps"]
            keys = [bench_key(r, i) for i in range(n_blocks)]
            run["store_gbps"] = store_pass(store, src, geo, keys, mem_ids)["gbps"]
            if fio_version:
                dropped = drop_page_cache() or dropped
                run["fio_read_gbps"] = run_fio(paths, "read", geo.data_off, fio_size, fio_cfg["read"])["gbps"]

            slots = stored_slots(store, keys)
            poison(dst, geo, mem_ids, 0x5A ^ r)  # a read that lands nowhere fails verification
            dropped = drop_page_cache() or dropped
            ret = retrieve_pass(store, dst, geo, slots, mem_ids)
            verify(src, dst, geo, mem_ids, "retrieve")
            run.update({
                "retrieve_gbps": ret["gbps"],
                "retrieve_cpu_us_per_layer": ret["cpu_us_per_layer"],
                "retrieve_syscalls_per_layer": ret["syscalls_per_layer"],
                "retrieve_reqs_per_layer": ret["reqs_per_layer"],
            })

            extents = object_extents(store, geo, slots)  # the library's layout, outside the timing
            poison(dst, geo, mem_ids, 0xA5 ^ r)
            dropped = drop_page_cache() or dropped
            naive = naive_pass(paths, dst, geo, extents, mem_ids)
            verify(src, dst, geo, mem_ids, "naive read")
            run.update({
                "naive_gbps": naive["gbps"],
                "naive_cpu_us_per_layer": naive["cpu_us_per_layer"],
                "naive_syscalls_per_layer": naive["syscalls_per_layer"],
            })

            if r < min(cfg.runs, 3):
                for n in sweep:
                    drop_page_cache()
                    row = retrieve_pass(store, dst, geo, slots[:n], mem_ids[:n])
                    sweep_rows[n].append(row)
                verify(src, dst, geo, mem_ids, "sweep retrieve")
        # The same retrieve without checksum verification: how much CPU is hashing.  Its own store pass
        # first, in its open: the retrieve above read what that open's writes left (on tmpfs, through
        # the member's mapping), which a fresh open would read otherwise (by preadv).
        format_store()
        with Store.open(paths, engine=cfg.engine, verify=False, cpu_threads=cfg.cpu_threads) as store:
            register(store)
            store_pass(store, src, geo, keys, mem_ids)
            slots = stored_slots(store, keys, "unverified retrieve")
            poison(dst, geo, mem_ids, 0x3C ^ r)
            dropped = drop_page_cache() or dropped
            nv = retrieve_pass(store, dst, geo, slots, mem_ids)
            verify(src, dst, geo, mem_ids, "unverified retrieve")
            run["unverified_gbps"] = nv["gbps"]
            run["unverified_cpu_us_per_layer"] = nv["cpu_us_per_layer"]
        runs.append(run)
        log("  " + ", ".join(f"{k.removesuffix('_gbps')} {v:.2f} GB/s" for k, v in run.items()
                             if k.endswith("_gbps")))

    keys_med = sorted({k for run in runs for k in run})
    medians = {k: median(run.get(k) for run in runs) for k in keys_med}
    ratios = {}
    for name, target in TARGETS.items():
        num, den = name.split("/")
        # Paired: each run's ratio of two measurements taken moments apart, then the
        # median; on a noisy machine this is steadier than a ratio of medians.
        value = median(ratio(run.get(f"{num}_gbps"), run.get(f"{den}_gbps")) for run in runs)
        ratios[name] = {"value": value, "target": target, "met": None if value is None else value >= target}
    sweep_out = []
    for n in sweep:
        rows = sweep_rows[n]
        sweep_out.append({
            "blocks": n,
            "bytes": n * geo.block_bytes,
            "gbps": median(x["gbps"] for x in rows),
            "cpu_us_per_layer": median(x["cpu_us_per_layer"] for x in rows),
            "syscalls_per_layer": median(x["syscalls_per_layer"] for x in rows),
            "reqs_per_layer": median(x["reqs_per_layer"] for x in rows),
            "runs": len(rows),
        })

    return {
        "title": SECTION_TITLE,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": cfg.command,
        "machine": machine_info(paths),
        "workload": {
            "model_id": fp.model_id,
            "n_layers": geo.n_layers,
            "n_spans": geo.n_spans,
            "span_bytes": geo.span_bytes,
            "block_size": fp.block_size,
            "prefix_tokens": cfg.prefix_tokens,
            "blocks": n_blocks,
            "bytes": n_blocks * geo.block_bytes,
            "memory_block_ids": "shuffled",
        },
        "store": {
            "paths": paths,
            "engine": engine_name,
            "n_members": geo.n_members,
            "n_slots": geo.n_slots,
            "stripe_objs": geo.stripe_objs,
            "data_off": geo.data_off,
            "data_region_bytes": region,
            "member_bytes": need,
        },
        "fio": {"used": bool(fio_version), "note": fio_note, "bytes_per_member": fio_size if fio_version else None,
                "settings": FIO_SETTINGS + ("; chosen: " + ", ".join(f"{rw} {b}/QD{q}" for rw, (b, q) in
                                                                     fio_cfg.items()) if fio_cfg else "")},
        "page_cache_dropped": dropped,
        "runs": runs,
        "median": medians,
        "ratios": ratios,
        "sweep": sweep_out,
        "verified": True,
    }
