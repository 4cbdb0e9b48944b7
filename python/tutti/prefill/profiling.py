"""Measuring what the scheduler's model needs: one layer's prefill time over a grid, and the store's I/O rates.

The profile table format is tutti.sched.profile's (version 1); ``profile_table`` builds it.
"""
from __future__ import annotations

import dataclasses
import datetime
import statistics
import time

import torch

from ..sched.model import ModelShape
from .decoder import Decoder
from .harness import new_block_table
from .paged import PagedKVCache

# (new_tokens, prefix_tokens) for an 8B-class model on one GPU: long and short suffixes over
# prefixes up to 128K, so the fit covers every point the benchmark runs.
DEFAULT_GRID = [(n, p) for n in (512, 2048, 4096, 8192, 16384, 32768) for p in (0, 8192, 28672, 61440, 126976)
                if n + p <= 131072] + [(65536, 0), (65536, 65536), (131072, 0)]
TINY_GRID = [(n, p) for n in (16, 48, 96) for p in (0, 64, 160)]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def profile_layer(shape: ModelShape, grid, *, device="cpu", dtype=torch.float32, repeats: int = 3,
                  warmup: int = 1, seed: int = 0, progress=None) -> list[dict]:
    """Median seconds of one decoder layer's prefill at each (new_tokens, prefix_tokens) of ``grid``.

    The layer is the harness's own (QKV, RoPE, paged-cache write, gather of prefix + new keys,
    lower-right causal attention, MLP) on a one-layer model of ``shape`` with random weights; the
    prefix's KV is random bytes in the paged cache (its values do not change the work).
    """
    device = torch.device(device)
    one = dataclasses.replace(shape, n_layers=1)
    model = Decoder(one, device=device, dtype=dtype, vocab=256, seed=seed)
    most = max(n + p for n, p in grid)
    n_blocks = -(-most // shape.block_size)
    cache = PagedKVCache(one, n_blocks, device=device, dtype=dtype)
    cache.kv.normal_()
    table = new_block_table(n_blocks, n_blocks, seed=seed, device=device)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    out = []
    for n, p in grid:
        x = model.embed_tokens(torch.randint(0, 256, (n,), generator=gen).to(device))
        times = []
        for i in range(warmup + repeats):
            _sync(device)
            if device.type == "cuda":
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                model.layer(0, x, cache, table, p)
                b.record()
                b.synchronize()
                dt = a.elapsed_time(b) / 1e3
            else:
                t0 = time.perf_counter()
                model.layer(0, x, cache, table, p)
                dt = time.perf_counter() - t0
            if i >= warmup:
                times.append(dt)
        out.append({"new_tokens": n, "prefix_tokens": p, "layer_s": statistics.median(times)})
        if progress:
            progress(out[-1])
    return out


def _gemm_load(n_iters: int):
    """Enqueue ``n_iters`` 16K x 16K bf16 GEMMs on a side stream: compute the I/O path has to share the GPU with.

    Few long kernels rather than many short ones: with CUDA's launch queue full, the CPU would block in
    a gio launch while earlier gio kernels wait for the emulated controller, whose host threads then
    block in the CUDA runtime too (see PrefillHarness.run).
    """
    side = torch.cuda.Stream()
    a = torch.randn(16384, 16384, device="cuda", dtype=torch.bfloat16)
    c = torch.empty_like(a)
    with torch.cuda.stream(side):
        for _ in range(n_iters):
            torch.mm(a, a, out=c)
    return side, (a, c)


def _gemm_seconds() -> float:
    """One GEMM of _gemm_load; also loads its kernel now (a kernel's lazy first load must never happen
    while a gio kernel spins: the load waits for the device to idle, the gio kernel for the host)."""
    side, keep = _gemm_load(1)
    side.synchronize()
    side, keep = _gemm_load(5)
    t0 = time.perf_counter()
    side.synchronize()
    return max((time.perf_counter() - t0) / 5, 1e-4)


def measure_io(kv, cache: PagedKVCache, n_blocks: int, slots, *, stream=None, under_compute: bool = True) -> dict:
    """Write ``n_blocks`` cache blocks of every layer to ``slots`` through ``kv`` (StoreKV: keys; GioKV: slots)
    and read them back
    into the next ``n_blocks`` cache blocks; decimal GB/s each way, and whether the copy is bit-exact.

    Measured idle, then (``under_compute``) again while GEMMs keep the GPU busy on another stream:
    ``read_gbps``/``write_gbps`` are then the rates beside GEMMs (a pessimistic bound), ``*_idle`` the
    rates of the I/O path alone, which the model plans with (``tutti.sched.plan_io``: loads inside a
    prefill ran at them on the H200).
    """
    if cache.num_blocks < 2 * n_blocks:
        raise ValueError(f"a cache of {cache.num_blocks} blocks cannot hold {n_blocks} blocks twice")
    L = cache.shape.n_layers
    src, dst = list(range(n_blocks)), list(range(n_blocks, 2 * n_blocks))
    keyed = getattr(kv, "keyed", False)  # StoreKV: ``slots`` are keys; each round writes, reads back, drops them
    if not keyed:
        kv.bind(slots[:n_blocks], dst, slots[:n_blocks], src)
    errors = 0
    stream = stream or torch.cuda.Stream()
    res: dict = {}
    gemm_s = _gemm_seconds() if under_compute else 0.0
    rounds = ("idle", "busy") if under_compute else ("idle",)
    exact = True
    for rnd in rounds:
        for op in ("write", "read"):
            torch.cuda.synchronize()
            cache.kv[:, :, n_blocks:2 * n_blocks] = 0
            torch.cuda.synchronize()  # the I/O streams do not wait for the zeroing's stream
            keep = None
            if rnd == "busy":  # enough GEMMs to outlast the I/O measured idle (twice over)
                side, keep = _gemm_load(int(2 * res[f"{op}_s_idle"] / gemm_s) + 2)
            if keyed:
                if op == "write":
                    kv.bind([], [], slots[:n_blocks], src)
                else:
                    kv.bind(kv.store.lookup(slots[:n_blocks]), dst, [], [])
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.cuda.stream(stream):
                a.record(stream)
                for l in range(L):
                    (kv.write if op == "write" else kv.read)(l, stream)
                kv.fence(stream)  # a data path's own streams: wait for its last layer
                b.record(stream)
            b.synchronize()
            s = a.elapsed_time(b) / 1e3
            torch.cuda.synchronize()
            del keep
            if keyed:
                errors += kv.finish()  # commit / verify, outside the timed span
                if op == "read":
                    kv.store.invalidate(kv.store.lookup(slots[:n_blocks]))
            nbytes = L * (kv.read_bytes_per_layer if op == "read" else kv.write_bytes_per_layer)
            suffix = "_idle" if rnd == "idle" else ""
            res[f"{op}_gbps{suffix}"] = nbytes / s / 1e9
            res[f"{op}_s{suffix}"] = s
            res[f"{op}_bytes"] = nbytes
        exact = exact and bool(torch.equal(cache.kv[:, :, :n_blocks], cache.kv[:, :, n_blocks:2 * n_blocks]))
    if not under_compute:
        for op in ("write", "read"):
            res[f"{op}_gbps"], res[f"{op}_s"] = res[f"{op}_gbps_idle"], res[f"{op}_s_idle"]
    res["under_compute"] = under_compute
    res["errors"] = errors if keyed else kv.errors()
    res["bit_exact"] = exact
    return res


def device_name(device) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import platform

    return f"cpu ({platform.machine()}, {torch.get_num_threads()} threads)"


def profile_table(shape: ModelShape, points: list[dict], *, device: str, dtype: str, io: dict | None = None) -> dict:
    """The profile JSON object (tutti.sched.profile format, version 1)."""
    d = {"version": 1, "device": device,
         "date": datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat(),
         "model": shape.to_dict(dtype), "compute": points}
    if io is not None:
        d["io"] = io
    return d
