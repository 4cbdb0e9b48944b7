"""Store benchmark: layer-wise store and retrieve of a prefix against fio and a naive reader.

The workload is the one the store exists for: a prompt prefix of P tokens
(P / block_size KV blocks) held in host memory laid out like vLLM's paged KV
cache, with the prefix's blocks at shuffled memory block ids.  Each run

1. formats a store on the given path(s), sized for the prefix;
2. (fio) writes the store's data region sequentially with fio, O_DIRECT,
   io_uring, 1 MiB, queue depth 32, fsync at the end: the write ceiling;
3. stores every block layer by layer: one write transaction, one
   ``txn.layer`` call per layer, ``finish`` (which makes the data and the
   commit records durable);
4. (fio) reads the data region sequentially with the same settings: the read
   ceiling;
5. retrieves every block layer by layer, submitting layer l+1 before waiting
   for layer l, and checks the bytes against what was stored;
6. reads every object again with one ``os.preadv`` per object, O_DIRECT, from
   Python (a per-object reader, as LMCache-style connectors do), and checks the
   bytes too.

The page cache is dropped before every read pass when the process may.  All
figures are medians over the runs; GB/s is 10^9 bytes per second.  A sweep
then retrieves the first N blocks for growing N to show how CPU time and
system calls per layer scale with the number of blocks.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import json
import mmap
import os
import platform
import random
import re
import resource
import shutil
import socket
import stat
import statistics
import subprocess
import time
from pathlib import Path
from typing import Callable, Iterable, Sequence

GB = 1e9
SECTION_TITLE = "Store: layer-wise retrieve (file engine)"
BENCH_MODEL_PREFIX = "tutti-bench:"
DEFAULT_SWEEP = (64, 256, 1024, 2048)
TARGETS = {
    "retrieve/fio_read": 0.95,
    "retrieve/naive": 3.0,
    "store/fio_write": 0.9,
}
_SB_MAGIC = b"TUTTIKV1"
_SB_SIZE = 4096


class BenchError(Exception):
    """The benchmark could not run or found wrong data; ``code`` is the exit status to use."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


@dataclasses.dataclass
class BenchConfig:
    """What to measure.  ``fp`` None means the Llama-3-8B preset."""

    paths: Sequence[str]
    prefix_tokens: int = 32768
    runs: int = 5
    size: int | None = None  # store capacity in bytes; None: just the prefix
    fp: object | None = None
    fio: bool = True
    sweep: Sequence[int] = DEFAULT_SWEEP
    engine: str = "auto"
    seed: int = 1
    force: bool = False
    command: str = ""


# ----------------------------------------------------------------- helpers


def human_bytes(n: float) -> str:
    """1073741824 -> '1.00 GiB'."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"  # pragma: no cover


def _median(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b <= 0:
        return None
    return a / b


def _cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def drop_page_cache() -> bool:
    """Write back and drop clean pages (needs root); False if not allowed."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
        return True
    except OSError:
        return False


def _counter(stats: dict, name: str) -> int | None:
    """Counter ``name`` from Store.stats(), flat or nested (e.g. stats['engine'][name])."""
    if name in stats and isinstance(stats[name], (int, float)):
        return stats[name]
    for value in stats.values():
        if isinstance(value, dict):
            found = _counter(value, name)
            if found is not None:
                return found
    return None


def _delta(after: dict, before: dict, name: str) -> int | None:
    a, b = _counter(after, name), _counter(before, name)
    return None if a is None or b is None else a - b


def bench_key(run: int, index: int) -> bytes:
    """16-byte key of prefix block ``index`` in run ``run``."""
    return hashlib.blake2b(f"tutti-bench/{run}/{index}".encode(), digest_size=16).digest()


def member_bytes(path: str) -> int | None:
    """Size of an existing file or block device, None if it does not exist."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        return os.lseek(fd, 0, os.SEEK_END)
    finally:
        os.close(fd)


def has_store_magic(path: str) -> bool:
    """Does either superblock copy of ``path`` start with the Tutti magic?"""
    try:
        with open(path, "rb") as f:
            head = f.read(_SB_SIZE + len(_SB_MAGIC))
    except OSError:
        return False
    return head[: len(_SB_MAGIC)] == _SB_MAGIC or head[_SB_SIZE:] == _SB_MAGIC


def is_block_device(path: str) -> bool:
    try:
        return stat.S_ISBLK(os.stat(path).st_mode)
    except FileNotFoundError:
        return False


# ------------------------------------------------------------- the layout


def locate(geo, slot: int, layer: int, span: int) -> tuple[int, int]:
    """(member, byte offset) of object (slot, layer, span): layout.h's tt_locate()."""
    seq = (layer * geo.n_spans + span) * geo.n_slots + slot
    unit = seq // geo.stripe_objs
    row = unit // geo.n_members
    member = unit % geo.n_members
    off = geo.data_off + (row * geo.stripe_objs + seq % geo.stripe_objs) * geo.obj_stride
    return member, off


def data_region_bytes(geo) -> int:
    """Bytes of the data region on each member (layout.h's tt_member_objs() * obj_stride)."""
    total = geo.n_slots * geo.n_layers * geo.n_spans
    unit = geo.stripe_objs * geo.n_members
    return (total + unit - 1) // unit * geo.stripe_objs * geo.obj_stride


# --------------------------------------------------------------------- fio


def fio_available() -> str | None:
    """fio's version string, or None when fio is not installed or does not run."""
    exe = shutil.which("fio")
    if not exe:
        return None
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() or None


# fio settings (block size, queue depth) tried for the raw-device baseline;
# the fastest wins.  Virtual and real disks peak at different points (seen on
# the CI VM: 1M/QD32 1.3 GB/s, 4M/QD128 1.8 GB/s, 128k/QD256 1.9 GB/s), and a
# baseline must not be a weak one.
FIO_CONFIGS = (("1M", 32), ("4M", 128), ("128k", 256))


def fio_command(paths: Sequence[str], rw: str, offset: int, size: int, bs: str = "1M",
                iodepth: int = 32) -> list[str]:
    """fio over [offset, offset+size) of every path, one job per path, run together."""
    cmd = [
        "fio", "--output-format=json", f"--rw={rw}", f"--bs={bs}", f"--iodepth={iodepth}",
        "--direct=1", "--ioengine=io_uring", f"--offset={offset}", f"--size={size}",
        "--invalidate=1", "--thread",
    ]
    if rw == "write":
        cmd.append("--end_fsync=1")
    for i, p in enumerate(paths):
        cmd += [f"--name=m{i}", "--filename=" + p.replace(":", "\\:")]
    return cmd


def parse_fio_json(text: str, rw: str) -> dict:
    """Aggregate bandwidth of fio's JSON output: all jobs' bytes over the longest job's runtime."""
    # fio may print warnings before the JSON document.
    start = text.find("{")
    if start < 0:
        raise ValueError("fio printed no JSON")
    doc = json.loads(text[start:])
    jobs = doc.get("jobs") or []
    if not jobs:
        raise ValueError("fio reported no jobs")
    total, runtime_ms = 0, 0
    for job in jobs:
        if job.get("error"):
            raise ValueError(f"fio job {job.get('jobname')} failed: error {job['error']}")
        part = job[rw]
        total += int(part["io_bytes"])
        runtime_ms = max(runtime_ms, int(part["runtime"]))
    if total <= 0 or runtime_ms <= 0:
        raise ValueError("fio moved no data")
    return {
        "bytes": total,
        "seconds": runtime_ms / 1000.0,
        "gbps": total / (runtime_ms / 1000.0) / GB,
        "version": doc.get("fio version", ""),
    }


def run_fio(paths: Sequence[str], rw: str, offset: int, size: int) -> dict:
    """The best of fio's runs over FIO_CONFIGS."""
    best = None
    for bs, iodepth in FIO_CONFIGS:
        if rw == "read":
            drop_page_cache()
        cmd = fio_command(paths, rw, offset, size, bs, iodepth)
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            raise BenchError(f"fio {rw} failed (exit {out.returncode}): {out.stderr.strip() or out.stdout[-400:]}")
        try:
            res = parse_fio_json(out.stdout, rw)
        except (ValueError, KeyError) as e:
            raise BenchError(f"cannot read fio's {rw} output: {e}") from None
        res["bs"], res["iodepth"] = bs, iodepth
        if best is None or res["gbps"] > best["gbps"]:
            best = res
    return best


# ----------------------------------------------------------- the machine


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _sys_block(major: int, minor: int) -> Path | None:
    p = Path(f"/sys/dev/block/{major}:{minor}")
    return p.resolve() if p.exists() else None


def _disk_description(dev_dir: Path | None) -> str:
    """'vda (virtio, 252 GiB, rotational=0)'-style text for a /sys block device directory."""
    if dev_dir is None:
        return "unknown device"
    disk = dev_dir if (dev_dir / "device").exists() or not (dev_dir / "partition").exists() else dev_dir.parent
    parts = [dev_dir.name]
    model = ""
    for name in ("device/model", "device/name"):
        try:
            model = (disk / name).read_text().strip()
            if model:
                break
        except OSError:
            pass
    extra = []
    if model:
        extra.append(model)
    try:
        sectors = int((dev_dir / "size").read_text())
        extra.append(human_bytes(sectors * 512))
    except (OSError, ValueError):
        pass
    try:
        extra.append("queue/rotational=" + (disk / "queue/rotational").read_text().strip())
    except OSError:
        pass
    return parts[0] + (f" ({', '.join(extra)})" if extra else "")


def _mount_of(path: str) -> tuple[str, str, str]:
    """(mount point, source, fstype) holding ``path`` from /proc/self/mountinfo."""
    st_dev = os.stat(path).st_dev
    want = f"{os.major(st_dev)}:{os.minor(st_dev)}"
    best = ("?", "?", "?")
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields, rfields = left.split(), right.split()
                if len(fields) >= 5 and fields[2] == want and len(rfields) >= 2:
                    best = (fields[4], rfields[1], rfields[0])
    except OSError:
        pass
    return best


def describe_path(path: str) -> str:
    """Where a member lives: the block device itself, or the file system and disk under a file."""
    try:
        st = os.stat(path)
    except OSError:
        return f"{path} (missing)"
    if stat.S_ISBLK(st.st_mode):
        return f"{path}: block device {_disk_description(_sys_block(os.major(st.st_rdev), os.minor(st.st_rdev)))}"
    mnt, source, fstype = _mount_of(path)
    return (f"{path}: file on {fstype} at {mnt} ({source}; disk "
            f"{_disk_description(_sys_block(os.major(st.st_dev), os.minor(st.st_dev)))})")


def machine_info(paths: Sequence[str]) -> dict:
    return {
        "host": socket.gethostname(),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "kernel": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "storage": [describe_path(p) for p in paths],
    }


# ------------------------------------------------------------- the runs


def _check_paths(cfg: BenchConfig) -> None:
    """Refuse to destroy anything the benchmark did not create, unless forced."""
    from .store import Store  # noqa: PLC0415

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


def _prefill(paths: Sequence[str], geo) -> None:
    """Write the data region of regular files once so every timed write overwrites allocated blocks."""
    region = data_region_bytes(geo)
    chunk = 8 << 20
    buf = mmap.mmap(-1, chunk)
    buf.write(os.urandom(4096) * (chunk // 4096))
    try:
        for p in paths:
            if is_block_device(p):
                continue
            fd = os.open(p, os.O_WRONLY | os.O_DIRECT)
            try:
                off, end = geo.data_off, geo.data_off + region
                while off < end:
                    n = min(chunk, end - off)
                    os.pwritev(fd, [memoryview(buf)[:n]], off)
                    off += n
                os.fsync(fd)
            finally:
                os.close(fd)
    finally:
        buf.close()


def _verify(src, dst, geo, mem_ids: Sequence[int], what: str) -> None:
    """Every object of ``mem_ids`` in ``dst`` must equal ``src``; raise loudly otherwise."""
    for layer in range(geo.n_layers):
        for span in range(geo.n_spans):
            for i, b in enumerate(mem_ids):
                a = src.block_view(layer, span, b)
                c = dst.block_view(layer, span, b)
                if bytes(a) != bytes(c):
                    raise BenchError(
                        f"{what}: bytes read back differ from bytes stored "
                        f"(prefix block {i}, memory block {b}, layer {layer}, span {span})", 1)


def _poison(buf, geo, mem_ids: Sequence[int], byte: int) -> None:
    """Overwrite the blocks with a constant byte before a read pass."""
    pattern = bytes([byte & 0xFF]) * geo.span_bytes
    for layer in range(geo.n_layers):
        for span in range(geo.n_spans):
            for b in mem_ids:
                buf.block_view(layer, span, b)[:] = pattern


def _check_locate(store, geo) -> None:
    """The naive reader's offsets must be the library's: compare a few objects."""
    for slot in {0, geo.n_slots // 2, geo.n_slots - 1}:
        for layer, span in {(0, 0), (geo.n_layers - 1, geo.n_spans - 1), (geo.n_layers // 2, 0)}:
            mine, theirs = locate(geo, slot, layer, span), tuple(store.locate(slot, layer, span))
            if mine != theirs:
                raise BenchError(f"layout disagrees with the library for object ({slot}, {layer}, {span}): "
                                 f"{mine} != {theirs}", 1)


def _store_pass(store, src, geo, keys, mem_ids) -> dict:
    t0 = time.perf_counter()
    txn = store.write(keys)
    for layer in range(geo.n_layers):
        txn.layer(layer, src.memmap, mem_ids)
    statuses = list(txn.finish())
    seconds = time.perf_counter() - t0
    bad = [i for i, s in enumerate(statuses) if s != 0]
    if bad:
        raise BenchError(f"store: {len(bad)} of {len(keys)} blocks failed (first: block {bad[0]}, "
                         f"status {statuses[bad[0]]})", 1)
    nbytes = len(keys) * geo.n_layers * geo.n_spans * geo.span_bytes
    return {"seconds": seconds, "gbps": nbytes / seconds / GB}


def _retrieve_pass(store, dst, geo, slots, mem_ids) -> dict:
    """Layer-wise retrieve with a one-layer pipeline: submit l+1, then wait for l."""
    n_layers = geo.n_layers
    st0 = store.stats()
    cpu0 = _cpu_seconds()
    t0 = time.perf_counter()
    txn = store.read(slots)
    txn.layer(0, dst.memmap, mem_ids)
    for layer in range(n_layers):
        if layer + 1 < n_layers:
            txn.layer(layer + 1, dst.memmap, mem_ids)
        txn.wait_layer(layer)
    statuses = list(txn.finish())
    seconds = time.perf_counter() - t0
    cpu = _cpu_seconds() - cpu0
    st1 = store.stats()
    bad = [i for i, s in enumerate(statuses) if s != 0]
    if bad:
        raise BenchError(f"retrieve: {len(bad)} of {len(slots)} blocks failed (first: block {bad[0]}, "
                         f"status {statuses[bad[0]]})", 1)
    nbytes = len(slots) * n_layers * geo.n_spans * geo.span_bytes
    syscalls = _delta(st1, st0, "syscalls")
    reqs = _delta(st1, st0, "reqs")
    return {
        "blocks": len(slots),
        "seconds": seconds,
        "gbps": nbytes / seconds / GB,
        "cpu_us_per_layer": cpu / n_layers * 1e6,
        "syscalls_per_layer": None if syscalls is None else syscalls / n_layers,
        "reqs_per_layer": None if reqs is None else reqs / n_layers,
    }


def _naive_pass(paths, dst, geo, slots, mem_ids) -> dict:
    """One os.preadv per object, O_DIRECT, layer by layer, into the same paged buffer."""
    fds = [os.open(p, os.O_RDONLY | os.O_DIRECT) for p in paths]
    aligned = geo.span_bytes == geo.obj_stride
    bounce = None if aligned else mmap.mmap(-1, geo.obj_stride)
    try:
        preadv = os.preadv
        cpu0 = _cpu_seconds()
        t0 = time.perf_counter()
        for layer in range(geo.n_layers):
            for span in range(geo.n_spans):
                for slot, b in zip(slots, mem_ids):
                    member, off = locate(geo, slot, layer, span)
                    view = dst.block_view(layer, span, b)
                    if aligned:
                        n = preadv(fds[member], [view], off)
                    else:
                        n = preadv(fds[member], [bounce], off)
                        view[:] = memoryview(bounce)[: geo.span_bytes]
                    if n != geo.obj_stride:
                        raise BenchError(f"naive read: short read at member {member} offset {off}: {n}", 1)
        seconds = time.perf_counter() - t0
        cpu = _cpu_seconds() - cpu0
    finally:
        for fd in fds:
            os.close(fd)
        if bounce is not None:
            bounce.close()
    nbytes = len(slots) * geo.n_layers * geo.n_spans * geo.span_bytes
    n_objs = len(slots) * geo.n_spans
    return {
        "seconds": seconds,
        "gbps": nbytes / seconds / GB,
        "cpu_us_per_layer": cpu / geo.n_layers * 1e6,
        "syscalls_per_layer": n_objs,
    }


def run_bench(cfg: BenchConfig, log: Callable[[str], None] | None = None) -> dict:
    """Run the benchmark; return a JSON-serialisable dict (see module docstring)."""
    from .memory import PagedBuffer  # noqa: PLC0415
    from .model import LLAMA3_8B  # noqa: PLC0415
    from .store import Store  # noqa: PLC0415

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
    except OSError as e:
        raise BenchError(f"cannot plan a store for {n_blocks} blocks on {len(paths)} member(s): {e}", 2) from None
    if geo.n_slots < n_blocks:
        raise BenchError(f"--size {human_bytes(cfg.size)} holds {geo.n_slots} blocks; the prefix needs "
                         f"{n_blocks} ({human_bytes(n_blocks * geo.block_bytes)} of data)", 2)
    sweep = sorted({n for n in cfg.sweep if 0 < n <= n_blocks} | {n_blocks})

    fio_version = fio_available() if cfg.fio else None
    if not cfg.fio:
        fio_note = "skipped (--no-fio)"
    elif fio_version is None:
        fio_note = "skipped: fio is not installed"
    else:
        fio_note = fio_version
    region = data_region_bytes(geo)
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
    sweep_rows: dict[int, list[dict]] = {n: [] for n in sweep}
    dropped = False
    engine_name = None
    prefilled = False
    for r in range(cfg.runs):
        log(f"run {r + 1}/{cfg.runs}")
        try:
            Store.format(paths, bench_fp, force=True, **sizing)
        except OSError as e:
            raise BenchError(f"format failed: {e}", 3) from None
        if not prefilled:
            _prefill(paths, geo)
            prefilled = True
        run: dict = {}
        with Store.open(paths, engine=cfg.engine) as store:
            engine_name = store.engine
            if store.geometry != geo:
                raise BenchError(f"formatted geometry {store.geometry} differs from the plan {geo}", 1)
            _check_locate(store, geo)
            for buf in (src, dst):
                try:
                    buf.register(store)
                except OSError:
                    pass  # registration is an optimisation only
            if fio_version:
                run["fio_write_gbps"] = run_fio(paths, "write", geo.data_off, fio_size)["gbps"]
            keys = [bench_key(r, i) for i in range(n_blocks)]
            run["store_gbps"] = _store_pass(store, src, geo, keys, mem_ids)["gbps"]
            if fio_version:
                dropped = drop_page_cache() or dropped
                run["fio_read_gbps"] = run_fio(paths, "read", geo.data_off, fio_size)["gbps"]

            slots = list(store.lookup(keys))
            if any(s is None or s < 0 for s in slots):
                raise BenchError("retrieve: blocks just stored are missing from the store", 1)
            _poison(dst, geo, mem_ids, 0x5A ^ r)  # a read that lands nowhere fails verification
            dropped = drop_page_cache() or dropped
            ret = _retrieve_pass(store, dst, geo, slots, mem_ids)
            _verify(src, dst, geo, mem_ids, "retrieve")
            run.update({
                "retrieve_gbps": ret["gbps"],
                "retrieve_cpu_us_per_layer": ret["cpu_us_per_layer"],
                "retrieve_syscalls_per_layer": ret["syscalls_per_layer"],
                "retrieve_reqs_per_layer": ret["reqs_per_layer"],
            })

            _poison(dst, geo, mem_ids, 0xA5 ^ r)
            dropped = drop_page_cache() or dropped
            naive = _naive_pass(paths, dst, geo, slots, mem_ids)
            _verify(src, dst, geo, mem_ids, "naive read")
            run.update({
                "naive_gbps": naive["gbps"],
                "naive_cpu_us_per_layer": naive["cpu_us_per_layer"],
                "naive_syscalls_per_layer": naive["syscalls_per_layer"],
            })

            if r < min(cfg.runs, 3):
                for n in sweep:
                    drop_page_cache()
                    row = _retrieve_pass(store, dst, geo, slots[:n], mem_ids[:n])
                    sweep_rows[n].append(row)
                _verify(src, dst, geo, mem_ids, "sweep retrieve")
        # The same retrieve without checksum verification: how much CPU is hashing.
        with Store.open(paths, engine=cfg.engine, verify=False) as store:
            _poison(dst, geo, mem_ids, 0x3C ^ r)
            dropped = drop_page_cache() or dropped
            nv = _retrieve_pass(store, dst, geo, slots, mem_ids)
            _verify(src, dst, geo, mem_ids, "unverified retrieve")
            run["unverified_gbps"] = nv["gbps"]
            run["unverified_cpu_us_per_layer"] = nv["cpu_us_per_layer"]
        runs.append(run)
        log("  " + ", ".join(f"{k.removesuffix('_gbps')} {v:.2f} GB/s" for k, v in run.items()
                             if k.endswith("_gbps")))

    keys_med = sorted({k for run in runs for k in run})
    median = {k: _median(run.get(k) for run in runs) for k in keys_med}
    ratios = {}
    for name, target in TARGETS.items():
        num, den = name.split("/")
        # Paired: each run's ratio of two measurements taken moments apart, then the
        # median; on a noisy machine this is steadier than a ratio of medians.
        value = _median(_ratio(run.get(f"{num}_gbps"), run.get(f"{den}_gbps")) for run in runs)
        ratios[name] = {"value": value, "target": target, "met": None if value is None else value >= target}
    sweep_out = []
    for n in sweep:
        rows = sweep_rows[n]
        sweep_out.append({
            "blocks": n,
            "bytes": n * geo.block_bytes,
            "gbps": _median(x["gbps"] for x in rows),
            "cpu_us_per_layer": _median(x["cpu_us_per_layer"] for x in rows),
            "syscalls_per_layer": _median(x["syscalls_per_layer"] for x in rows),
            "reqs_per_layer": _median(x["reqs_per_layer"] for x in rows),
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
                "settings": "sequential, O_DIRECT, io_uring, best of bs/iodepth " + ", ".join(f"{b}/{q}" for b, q in FIO_CONFIGS) + ", write with end_fsync=1"},
        "page_cache_dropped": dropped,
        "runs": runs,
        "median": median,
        "ratios": ratios,
        "sweep": sweep_out,
        "verified": True,
    }


# ---------------------------------------------------------------- output


def _fmt(v, spec: str = ".2f", none: str = "n/a") -> str:
    return none if v is None else format(v, spec)


def result_rows(res: dict) -> list[tuple[str, str, str, str]]:
    """(measurement, median, every run, note) rows shared by the table and the markdown."""
    med, runs = res["median"], res["runs"]
    fio_note = res["fio"]["note"]

    def each(key, spec=".2f"):
        vals = [r.get(key) for r in runs]
        return " / ".join(_fmt(v, spec) for v in vals) if any(v is not None for v in vals) else "n/a"

    req = med.get("retrieve_reqs_per_layer")
    per_layer = res["workload"]["blocks"] * res["workload"]["n_spans"] * res["workload"]["span_bytes"]
    avg_req = f"{human_bytes(per_layer / req)} per request" if req else "engine counter"
    return [
        ("store: layer-wise write", f"{_fmt(med.get('store_gbps'))} GB/s", each("store_gbps"),
         "one txn, one call per layer, finish (data and records durable)"),
        ("retrieve: layer-wise read", f"{_fmt(med.get('retrieve_gbps'))} GB/s", each("retrieve_gbps"),
         "submit layer l+1 before waiting for l; checksums verified"),
        ("retrieve: CPU per layer", f"{_fmt(med.get('retrieve_cpu_us_per_layer'), '.0f')} µs",
         each("retrieve_cpu_us_per_layer", ".0f"), "user+sys of the process / layers"),
        ("retrieve, checksums off", f"{_fmt(med.get('unverified_gbps'))} GB/s", each("unverified_gbps"),
         "store opened with verify=False (not the default)"),
        ("retrieve, checksums off: CPU per layer", f"{_fmt(med.get('unverified_cpu_us_per_layer'), '.0f')} µs",
         each("unverified_cpu_us_per_layer", ".0f"), "the difference to the row above is XXH3 hashing"),
        ("retrieve: syscalls per layer", _fmt(med.get("retrieve_syscalls_per_layer"), ".1f"),
         each("retrieve_syscalls_per_layer", ".1f"), "engine counter"),
        ("retrieve: requests per layer", _fmt(req, ".1f"), each("retrieve_reqs_per_layer", ".1f"), avg_req),
        ("naive: one preadv per object", f"{_fmt(med.get('naive_gbps'))} GB/s", each("naive_gbps"),
         "Python, O_DIRECT, one thread, layer by layer"),
        ("naive: CPU per layer", f"{_fmt(med.get('naive_cpu_us_per_layer'), '.0f')} µs",
         each("naive_cpu_us_per_layer", ".0f"), "user+sys / layers"),
        ("fio: sequential read", f"{_fmt(med.get('fio_read_gbps'))} GB/s", each("fio_read_gbps"), fio_note),
        ("fio: sequential write", f"{_fmt(med.get('fio_write_gbps'))} GB/s", each("fio_write_gbps"), fio_note),
    ]


def ratio_rows(res: dict) -> list[tuple[str, str, str, str]]:
    rows = []
    for name, r in res["ratios"].items():
        met = "n/a" if r["met"] is None else ("yes" if r["met"] else "NO")
        rows.append((name, _fmt(r["value"]), f"≥ {r['target']:g}", met))
    return rows


def sweep_rows(res: dict) -> list[tuple[str, str, str, str, str]]:
    return [
        (str(s["blocks"]), human_bytes(s["bytes"]), _fmt(s["gbps"]), _fmt(s["cpu_us_per_layer"], ".0f"),
         _fmt(s["syscalls_per_layer"], ".1f"))
        for s in res["sweep"]
    ]


def _md_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def markdown_section(res: dict, title: str = SECTION_TITLE) -> str:
    m, w, s = res["machine"], res["workload"], res["store"]
    storage = "\n".join(f"  - {x}" for x in m["storage"])
    out = [
        f"## {title}",
        "",
        f"Measured {res['date']} with:",
        "",
        "```",
        res["command"] or "(library call)",
        "```",
        "",
        f"- Machine: {m['host']}, {m['cpu']}, {m['cores']} cores, {m['kernel']}, Python {m['python']}",
        f"- Storage ({s['n_members']} member(s), engine `{s['engine']}`):",
        storage,
        f"- Workload: `{w['model_id']}` geometry, {w['n_layers']} layers × {w['n_spans']} spans × "
        f"{human_bytes(w['span_bytes'])} per {w['block_size']}-token block; prefix of {w['prefix_tokens']} tokens = "
        f"{w['blocks']} blocks = {human_bytes(w['bytes'])}; host buffer laid out like vLLM's paged cache with "
        f"shuffled block ids; store of {s['n_slots']} slots; {len(res['runs'])} run(s), medians; "
        f"page cache dropped before reads: {'yes' if res['page_cache_dropped'] else 'no (not root)'}.",
        f"- Baselines on the same member(s): fio ({res['fio']['settings']}) over the store's data region "
        f"({human_bytes(res['fio']['bytes_per_member'] or 0)} per member) — {res['fio']['note']}; naive path: "
        "one `os.preadv` per object from Python into the same buffer.",
        "- Every retrieve and naive read was checked byte for byte against the stored data.",
        "",
        _md_table(("Measurement", "Median", "Runs", "Notes"), result_rows(res)),
        "",
        _md_table(("Ratio (median of per-run ratios)", "Value", "Target", "Met"), ratio_rows(res)),
        "",
        "Retrieve cost as the number of blocks grows (first N blocks of the prefix, layer-wise):",
        "",
        _md_table(("Blocks", "Bytes", "GB/s", "CPU µs / layer", "Syscalls / layer"), sweep_rows(res)),
        "",
    ]
    return "\n".join(out)


def write_markdown(path: str | os.PathLike, res: dict, title: str = SECTION_TITLE) -> None:
    """Replace the section ``## title`` of ``path`` (up to the next ``## ``) or append it."""
    path = Path(path)
    section = markdown_section(res, title)
    text = path.read_text() if path.exists() else "# Benchmarks\n\nEvery number here was measured by the command shown with it.\n"
    heading = re.compile(r"^## " + re.escape(title) + r"[ \t]*$", re.M)
    m = heading.search(text)
    if m:
        nxt = re.compile(r"^## ", re.M).search(text, m.end())
        end = nxt.start() if nxt else len(text)
        text = text[: m.start()] + section + ("\n" if nxt else "") + text[end:]
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
