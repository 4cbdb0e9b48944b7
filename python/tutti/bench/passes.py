"""The timed passes over one store: store, layer-wise retrieve, and the naive per-object reader.

Also what surrounds them: filling the host buffer's blocks before a read
(``poison``), checking the bytes after it (``verify``), and writing the data
region once so timed writes overwrite allocated blocks (``prefill``).
"""
from __future__ import annotations

import mmap
import os
import time
from typing import Sequence

from .common import GB, BenchError, cpu_seconds, is_block_device


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


def prefill(paths: Sequence[str], geo, region: int) -> None:
    """Write the data region (``region`` bytes per member) of regular files once so every
    timed write overwrites allocated blocks."""
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


def verify(src, dst, geo, mem_ids: Sequence[int], what: str) -> None:
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


def poison(buf, geo, mem_ids: Sequence[int], byte: int) -> None:
    """Overwrite the blocks with a constant byte before a read pass."""
    pattern = bytes([byte & 0xFF]) * geo.span_bytes
    for layer in range(geo.n_layers):
        for span in range(geo.n_spans):
            for b in mem_ids:
                buf.block_view(layer, span, b)[:] = pattern


def store_pass(store, src, geo, keys, mem_ids) -> dict:
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


def stored_slots(store, keys, what: str = "retrieve") -> list:
    """The slots of ``keys`` just stored; a missing one fails the benchmark."""
    slots = list(store.lookup(keys))
    if any(s is None or s < 0 for s in slots):
        raise BenchError(f"{what}: blocks just stored are missing from the store", 1)
    return slots


def retrieve_pass(store, dst, geo, slots, mem_ids) -> dict:
    """Layer-wise retrieve with a one-layer pipeline: submit l+1, then wait for l."""
    n_layers = geo.n_layers
    st0 = store.stats()
    cpu0 = cpu_seconds()
    t0 = time.perf_counter()
    txn = store.read(slots)
    txn.layer(0, dst.memmap, mem_ids)
    for layer in range(n_layers):
        if layer + 1 < n_layers:
            txn.layer(layer + 1, dst.memmap, mem_ids)
        txn.wait_layer(layer)
    statuses = list(txn.finish())
    seconds = time.perf_counter() - t0
    cpu = cpu_seconds() - cpu0
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


def object_extents(store, geo, slots) -> list[list[list[tuple[int, int]]]]:
    """``[layer][span][i]`` = (member, byte offset) of slot ``slots[i]``'s object, from the
    library (Store.locate); computed before the naive pass so its timing is the reads only."""
    locate = store.locate
    return [[[tuple(locate(slot, layer, span)) for slot in slots] for span in range(geo.n_spans)]
            for layer in range(geo.n_layers)]


def naive_pass(paths, dst, geo, extents, mem_ids) -> dict:
    """One os.preadv per object, O_DIRECT, layer by layer, into the same paged buffer.

    ``extents`` is object_extents() of the blocks to read, in the order of ``mem_ids``.
    """
    fds = [os.open(p, os.O_RDONLY | os.O_DIRECT) for p in paths]
    aligned = geo.span_bytes == geo.obj_stride
    bounce = None if aligned else mmap.mmap(-1, geo.obj_stride)
    try:
        preadv = os.preadv
        cpu0 = cpu_seconds()
        t0 = time.perf_counter()
        for layer in range(geo.n_layers):
            for span in range(geo.n_spans):
                for (member, off), b in zip(extents[layer][span], mem_ids):
                    view = dst.block_view(layer, span, b)
                    if aligned:
                        n = preadv(fds[member], [view], off)
                    else:
                        assert bounce is not None  # made above when the spans are not aligned
                        n = preadv(fds[member], [bounce], off)
                        view[:] = memoryview(bounce)[: geo.span_bytes]
                    if n != geo.obj_stride:
                        raise BenchError(f"naive read: short read at member {member} offset {off}: {n}", 1)
        seconds = time.perf_counter() - t0
        cpu = cpu_seconds() - cpu0
    finally:
        for fd in fds:
            os.close(fd)
        if bounce is not None:
            bounce.close()
    n_blocks = len(mem_ids)
    nbytes = n_blocks * geo.n_layers * geo.n_spans * geo.span_bytes
    n_objs = n_blocks * geo.n_spans
    return {
        "seconds": seconds,
        "gbps": nbytes / seconds / GB,
        "cpu_us_per_layer": cpu / geo.n_layers * 1e6,
        "syscalls_per_layer": n_objs,
    }
