"""tutti-admin profile: measure one decoder layer's prefill time (and the store's I/O rates) for the scheduler."""
from __future__ import annotations

import json
import re

import click

from . import limits
from .app import main
from .common import EXIT_CODES, EXIT_USAGE, CliError, _emit_json, _json_opt, format_size, make_console
from .params import Choice, Finite, OutputFile, Parsed, Whole, c_field
from .text import shown

_GRID_RE = re.compile(r"^\s*([0-9]{1,30})\s*:\s*([0-9]{1,30})\s*$")
_DEVICE_RE = re.compile(r"^(cpu|cuda(:[0-9]{1,6})?)$")


def _parse_grid(text: str) -> list[tuple[int, int]]:
    """'4096:0,4096:28672' -> [(4096, 0), (4096, 28672)]: (new tokens >= 1, cached prefix tokens)."""
    matches = [_GRID_RE.match(item) for item in text.split(",") if item.strip()]
    grid = [(int(m.group(1)), int(m.group(2))) for m in matches if m]
    if not matches or len(grid) != len(matches) or any(n < 1 for n, _ in grid):
        raise click.BadParameter(f"{shown(text)}: give NEW:PREFIX pairs, e.g. 4096:0,4096:28672")
    return grid


def _parse_device(text: str) -> str:
    if not _DEVICE_RE.match(text.strip()):
        raise click.BadParameter(f"{shown(text)}: give cpu, cuda or cuda:N")
    return text.strip()


def _preset_names() -> list[str]:
    from ..sched import PRESETS

    return list(PRESETS)


@main.command("profile", epilog=EXIT_CODES)
@click.option("--out", "out", required=True, type=OutputFile(), help="profile table to write (JSON)")
@click.option("--device", type=Parsed(_parse_device, "DEVICE"), default=None,
              help="cuda, cuda:N or cpu (default: cuda when available)")
@click.option("--tiny", is_flag=True, help="a tiny model shape and grid (float32): seconds on a CPU, for tests")
@click.option("--preset", type=Choice(_preset_names()), default="llama3-8b", show_default=True, help="model shape")
@click.option("--grid", type=Parsed(_parse_grid, "N:P,..."), default=None,
              help="(new_tokens, prefix_tokens) points; default: a grid up to 128K tokens (--tiny: a small one)")
@click.option("--repeats", default=3, show_default=True, type=Whole(1, 100), help="timed runs per point")
@click.option("--io", "with_io", is_flag=True,
              help="also measure read/write rates of the store on the emulated NVMe controller (GPU, libtutti_gpu.so)")
@click.option("--io-namespaces", default=2, show_default=True,
              type=Whole(1, limits.max_members, "a store has at most TT_MAX_MEMBERS members"),
              help="namespaces (store members) of the emulated controller")
@click.option("--io-rate-gbps", default=28.0, show_default=True, type=Finite(0, min_open=False, max=1e6),
              help="the controller's bandwidth cap over all namespaces, GB/s (0: none)")
@click.option("--io-blocks", default=2048, show_default=True, type=c_field("tt_format_params", "n_slots"),
              help="KV blocks written and read back per layer for the I/O rates")
@_json_opt
def profile_cmd(out, device, tiny, preset, grid, repeats, with_io, io_namespaces, io_rate_gbps, io_blocks,
                as_json):
    """Time one decoder layer's prefill over a grid of (new tokens, cached prefix tokens).

    Random weights of the model's shape, a vLLM-style paged KV cache, the
    same layer the prefill harness runs (docs/prefill.md).  Writes the
    profile table that `tutti.sched` (plan, scheduler) reads: format version
    1, the model's shape, the measured points and, with --io, the emulated
    store's read and write rates.
    """
    try:
        import torch
    except ImportError:
        raise CliError("profile needs PyTorch (pip install torch)", EXIT_USAGE) from None
    from ..prefill import TINY_SHAPE
    from ..prefill.profiling import DEFAULT_GRID, TINY_GRID, device_name, profile_layer, profile_table
    from ..sched import PRESETS

    if tiny:
        shape, dtype, default_grid = TINY_SHAPE, torch.float32, TINY_GRID
    else:
        shape, dtype, default_grid = PRESETS[preset], torch.bfloat16, DEFAULT_GRID
    grid = grid or default_grid
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except RuntimeError as e:
        raise CliError(f"--device {device}: {e}", EXIT_USAGE) from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise CliError("--device cuda: no CUDA device (use --device cpu --tiny)", EXIT_USAGE)
    if dev.type == "cuda" and (dev.index or 0) >= torch.cuda.device_count():
        raise CliError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s)", EXIT_USAGE)
    if with_io and dev.type != "cuda":
        raise CliError("--io needs a CUDA device (the GPU drives the emulated controller)", EXIT_USAGE)
    itemsize = torch.tensor([], dtype=dtype).element_size()
    kv_token_layer = 2 * shape.n_kv_heads * shape.head_dim * itemsize
    most = max(n + p for n, p in grid)
    _fits_memory(torch, dev, most * kv_token_layer, f"--grid's longest point ({most} tokens): one layer's KV cache")
    if with_io:
        _fits_memory(torch, dev, 2 * io_blocks * shape.block_size * kv_token_layer * shape.n_layers,
                     f"--io-blocks {io_blocks}: the KV cache of twice as many blocks")
    dtype_name = str(dtype).removeprefix("torch.")
    con = make_console(stderr=True)

    def progress(pt):
        if not as_json:
            con.print(f"  new {pt['new_tokens']:>7}  prefix {pt['prefix_tokens']:>7}  "
                      f"{pt['layer_s'] * 1e3:9.3f} ms/layer")

    points = profile_layer(shape, grid, device=dev, dtype=dtype, repeats=repeats, progress=progress)
    io = None
    if with_io:
        io = _measure_store_io(shape, dtype_name, dev, io_namespaces, io_rate_gbps, io_blocks)
    table = profile_table(shape, points, device=device_name(dev), dtype=dtype_name, io=io)
    with open(out, "w") as f:
        json.dump(table, f, indent=1)
        f.write("\n")
    if as_json:
        _emit_json(table)
    else:
        con.print(f"wrote {out}: {len(points)} points on {table['device']}"
                  + (f"; I/O read {io['read_gbps']:.2f} GB/s, write {io['write_gbps']:.2f} GB/s" if io else ""))


def _fits_memory(torch, dev, need: int, what: str) -> None:
    """Refuse (exit 2) a run whose KV cache alone cannot fit the device's free memory, before allocating it
    (a tensor of the asked size would fail deep in PyTorch, or get the process killed)."""
    if dev.type == "cuda":
        free = torch.cuda.mem_get_info(dev)[0]
    else:
        from ..bench import host_memory_available

        free = host_memory_available()
    if need > free:
        raise CliError(f"{what} needs {format_size(need)}; {dev} has {format_size(free)} free", EXIT_USAGE)


def _measure_store_io(shape, dtype_name, dev, n_ns, rate_gbps, n_blocks) -> dict:
    import torch

    from ..gpu import GpuLibraryMissing
    from ..prefill import PagedKVCache
    from ..prefill.kvio import GioKV, open_emulated_store
    from ..prefill.profiling import measure_io

    torch.cuda.set_device(dev)
    try:
        ctrl, gio, geo = open_emulated_store(shape, dtype=dtype_name, n_slots=n_blocks, n_ns=n_ns,
                                             rate_gbps=rate_gbps)
    except GpuLibraryMissing as e:
        raise CliError(str(e), EXIT_USAGE) from None
    try:
        cache = PagedKVCache(shape, 2 * n_blocks, device=dev, dtype=getattr(torch, dtype_name))
        cache.kv.normal_()
        kv = GioKV(gio, geo, cache, n_blocks)
        r = measure_io(kv, cache, n_blocks, list(range(n_blocks)))
        kv.close()
    finally:
        gio.close()
        ctrl.close()
    if r["errors"] or not r["bit_exact"]:
        raise CliError(f"I/O check failed: {r['errors']} failed commands, bit-exact {r['bit_exact']}", 3)
    # both: the model plans with the rates alone (sched.plan_io: what loads inside a prefill reached on
    # the H200), the ones beside GEMMs are its pessimistic bound
    return {"read_gbps": round(r["read_gbps"], 3), "write_gbps": round(r["write_gbps"], 3), "n_ssd": n_ns,
            "read_gbps_idle": round(r["read_gbps_idle"], 3), "write_gbps_idle": round(r["write_gbps_idle"], 3),
            "rate_cap_gbps": rate_gbps, "backing": "emulated controller, hostmem"}
