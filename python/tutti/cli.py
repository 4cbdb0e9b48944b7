"""tutti-admin: format, inspect, check and benchmark Tutti stores; list, attach, detach and check NVMe controllers.

Output follows nvme-cli: a table for people, ``--json`` for scripts, on every
command.  Exit codes are part of the interface (see EXIT_CODES).
"""
from __future__ import annotations

import errno
import json
import os
import re
import shlex
import sys
from decimal import Decimal, InvalidOperation

import click

EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_USAGE = 2
EXIT_STORE = 3
EXIT_MISMATCH = 4

EXIT_CODES = """\b
Exit codes:
  0  success
  1  check (or bench verification) found problems that remain;
     health: the controller reports a critical warning
  2  usage error or bad input (bad option, size, path or model config;
     format refusing to overwrite a store without --force; a malformed
     PCI address, or a file that is not an NVMe device)
  3  the store cannot be opened: not a Tutti store, damaged, missing or
     foreign member, busy (locked by another process or mounted);
     attach/detach/health: no such device, in use (mounted, swap, held),
     tutti.ko or nvme driver not loaded, not permitted, command failed
  4  the store holds KV cache of another model (fingerprint mismatch)
"""

# ------------------------------------------------------------------- sizes

_UNITS = {
    "": 1, "b": 1,
    "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40, "pib": 1 << 50,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "pb": 10**15,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_size(text: str | int) -> int:
    """'512MiB' -> 536870912, '1TB' -> 10**12, '4096' -> 4096.

    Binary units: K/M/G/T/P, KiB/MiB/GiB/TiB/PiB; decimal units: KB/MB/GB/TB/PB;
    B or nothing: bytes.  Case-insensitive; a fraction is allowed when the result is
    a whole number of bytes (1.5GiB).  Raises ValueError with the reason otherwise.
    """
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"size {text} is negative")
        return text
    if not isinstance(text, str):
        raise ValueError(f"size must be a string like 2GiB, not {type(text).__name__}")
    m = _SIZE_RE.match(text)
    if not m:
        if text.strip().startswith("-"):
            raise ValueError(f"size {text!r} is negative")
        raise ValueError(f"{text!r} is not a size: use a number with an optional unit, e.g. 4096, 512MiB, 2GiB, 1TB")
    number, unit = m.group(1), m.group(2).lower()
    if unit not in _UNITS:
        raise ValueError(f"unknown unit {m.group(2)!r} in {text!r}: use B, KiB, MiB, GiB, TiB (or K, M, G, T) "
                         "or KB, MB, GB, TB")
    try:
        value = Decimal(number) * _UNITS[unit]
    except InvalidOperation:  # pragma: no cover - the regex only lets numbers through
        raise ValueError(f"{text!r} is not a size") from None
    if value != value.to_integral_value():
        raise ValueError(f"{text!r} is not a whole number of bytes")
    return int(value)


def format_size(n: int) -> str:
    """Exact when possible: 2147483648 -> '2 GiB', 1000 -> '1000 B', else two decimals."""
    for unit, mult in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= mult:
            return f"{n // mult} {unit}" if n % mult == 0 else f"{n / mult:.2f} {unit}"
    return f"{n} B"


class SizeType(click.ParamType):
    name = "SIZE"

    def convert(self, value, param, ctx):
        try:
            size = parse_size(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)
        if size <= 0:
            self.fail("size must be greater than zero", param, ctx)
        return size


SIZE = SizeType()

# ------------------------------------------------------------------ output


def make_console(stderr: bool = False):
    from rich.console import Console  # noqa: PLC0415

    con = Console(stderr=stderr, highlight=False, soft_wrap=False)
    if not con.is_terminal:
        con.width = max(con.width, 120)  # logs and pipes: no 80-column wrapping of tables
    return con


def _emit_json(obj) -> None:
    click.echo(json.dumps(obj, indent=2, sort_keys=False, default=_json_default))


def _json_default(o):
    import dataclasses  # noqa: PLC0415

    if dataclasses.is_dataclass(o):
        return dataclasses.asdict(o)
    if isinstance(o, (bytes, bytearray)):
        return o.hex()
    if isinstance(o, (set, tuple)):
        return list(o)
    return str(o)


class CliError(click.ClickException):
    """An error with its own exit code, printed as 'tutti-admin: error: ...'."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.exit_code = code

    def show(self, file=None):
        click.echo(f"tutti-admin: error: {self.format_message()}", err=True)


def _store_error(e: OSError, what: str) -> CliError:
    """Map a failure to open or use a store to the CLI's exit codes."""
    from .errors import FingerprintMismatch, StoreBusyError  # noqa: PLC0415

    reason = e.strerror or str(e)
    if isinstance(e, FingerprintMismatch) or e.errno == errno.EMEDIUMTYPE:
        return CliError(f"{what}: fingerprint mismatch: {reason}", EXIT_MISMATCH)
    if isinstance(e, StoreBusyError) or e.errno == errno.EBUSY:
        return CliError(f"{what}: store is busy: {reason}", EXIT_STORE)
    if isinstance(e, FileNotFoundError) or e.errno == errno.ENOENT:
        return CliError(f"{what}: no such file or device: {e.filename or reason}", EXIT_STORE)
    if e.errno in (errno.EINVAL, errno.ENODEV, errno.EFBIG):
        return CliError(f"{what}: not a usable Tutti store: {reason}", EXIT_STORE)
    return CliError(f"{what}: {reason}", EXIT_STORE)


def _label(key: str) -> str:
    return key.replace("_", " ")


def _value_text(key: str, value) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if key == "created_ns" and isinstance(value, int) and value > 0:
        import datetime as dt  # noqa: PLC0415

        when = dt.datetime.fromtimestamp(value / 1e9, dt.timezone.utc).isoformat(timespec="seconds")
        return f"{value} ({when})"
    if isinstance(value, int) and (key.endswith("_bytes") or key in ("capacity", "size")) and value >= 1024:
        return f"{value} ({format_size(value)})"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value) if value else "-"
    if isinstance(value, (bytes, bytearray)):
        return value.hex()
    return str(value)


def _kv_table(title: str, items):
    from rich.table import Table  # noqa: PLC0415

    t = Table(title=title, title_justify="left", show_header=False, box=None, pad_edge=False)
    t.add_column(style="bold")
    t.add_column()
    for k, v in items:
        t.add_row(_label(k), _value_text(k, v))
    return t


def _print_dict(console, title: str, d: dict) -> None:
    """Scalars of ``d`` as one table, each nested dict as its own table."""
    scalars = [(k, v) for k, v in d.items() if not isinstance(v, dict)]
    if scalars:
        console.print(_kv_table(title, scalars))
        console.print()
    for k, v in d.items():
        if isinstance(v, dict):
            _print_dict(console, f"{title} / {_label(k)}" if title != "Store" else _label(k).capitalize(), v)


# --------------------------------------------------------- common options


def _fingerprint_options(required: bool):
    """Model options: --model-config or explicit --layers/--kv-heads/--head-dim."""
    help_suffix = "" if required else " (expected model: open fails with exit 4 on mismatch)"

    def deco(f):
        opts = [
            click.option("--model-config", type=click.Path(exists=True, dir_okay=True),
                         help="HF config.json (or its directory) of the model" + help_suffix),
            click.option("--layers", type=click.IntRange(min=1), help="number of layers (without --model-config)"),
            click.option("--kv-heads", type=click.IntRange(min=1), help="KV heads (without --model-config)"),
            click.option("--head-dim", type=click.IntRange(min=1), help="head dimension (without --model-config)"),
            click.option("--dtype", help="KV cache dtype, e.g. bfloat16 (default: the config's, else bfloat16)"),
            click.option("--model-id", help="model name stored in the fingerprint"),
            click.option("--block-size", type=click.IntRange(min=1), default=16, show_default=True,
                         help="tokens per KV block"),
            click.option("--tp-rank", type=click.IntRange(min=0), default=0, show_default=True,
                         help="tensor-parallel rank"),
            click.option("--tp-size", type=click.IntRange(min=1), default=1, show_default=True,
                         help="tensor-parallel size"),
        ]
        for opt in reversed(opts):
            f = opt(f)
        return f

    return deco


def _fingerprint(kw: dict, required: bool):
    """Build a Fingerprint from the model options, or None when none was given and not required."""
    from .model import Fingerprint  # noqa: PLC0415

    manual = [kw.get("layers"), kw.get("kv_heads"), kw.get("head_dim")]
    cfg = kw.get("model_config")
    if cfg and any(v is not None for v in manual):
        raise click.UsageError("give either --model-config or --layers/--kv-heads/--head-dim, not both")
    if kw.get("tp_rank", 0) >= kw.get("tp_size", 1):
        raise click.UsageError(f"--tp-rank {kw['tp_rank']} must be below --tp-size {kw['tp_size']}")
    if cfg:
        try:
            return Fingerprint.from_config(cfg, block_size=kw["block_size"], dtype=kw.get("dtype"),
                                           tp_rank=kw["tp_rank"], tp_size=kw["tp_size"],
                                           model_id=kw.get("model_id"))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise CliError(f"cannot read model config {cfg}: {e}", EXIT_USAGE) from None
    if all(v is None for v in manual):
        if required:
            raise click.UsageError("give the model: --model-config config.json, or --layers, --kv-heads and "
                                   "--head-dim")
        return None
    if any(v is None for v in manual):
        raise click.UsageError("--layers, --kv-heads and --head-dim go together")
    try:
        return Fingerprint(model_id=kw.get("model_id") or "unnamed", dtype=kw.get("dtype") or "bfloat16",
                           n_layers=kw["layers"], kv_heads=kw["kv_heads"], head_dim=kw["head_dim"],
                           block_size=kw["block_size"], tp_rank=kw["tp_rank"], tp_size=kw["tp_size"])
    except (ValueError, TypeError) as e:
        raise CliError(f"bad model geometry: {e}", EXIT_USAGE) from None


def _paths_arg(f):
    return click.argument("paths", nargs=-1, required=True, metavar="PATH...",
                          type=click.Path(dir_okay=False))(f)


def _json_opt(f):
    return click.option("--json", "as_json", is_flag=True, help="print JSON for scripts")(f)


def _open(paths, what: str, **kw):
    from .store import Store  # noqa: PLC0415

    try:
        return Store.open(list(paths), **kw)
    except OSError as e:
        raise _store_error(e, what) from None


def _store_summary(s) -> dict:
    info = s.info()
    return info if isinstance(info, dict) else dict(info)


# -------------------------------------------------------------------- CLI


@click.group(epilog=EXIT_CODES, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tutti", prog_name="tutti-admin")
def main():
    """Administer Tutti stores: SSD-backed KV cache for vLLM.

    A store is one or more files or block devices formatted together (PATH...);
    give all of its members, in any order, to every store command (format,
    info, check, bench).  list, attach, detach and health work on NVMe
    controllers: which driver has them (nvme or tutti.ko) and their health.
    """


@main.command("format", epilog=EXIT_CODES)
@_paths_arg
@_fingerprint_options(required=True)
@click.option("--capacity", type=SIZE, help="bytes of KV data to hold (e.g. 2GiB); sets the slot count")
@click.option("--slots", type=click.IntRange(min=1), help="number of KV blocks (slots) to hold")
@click.option("--spans", type=click.IntRange(min=1), default=2, show_default=True,
              help="objects per layer per block (2: K and V)")
@click.option("--span-bytes", type=click.IntRange(min=1), help="bytes per object (default: from the model)")
@click.option("--stripe-objs", type=click.IntRange(min=1), help="stripe unit in objects (default: 1 MiB worth)")
@click.option("--force", is_flag=True, help="overwrite an existing Tutti store")
@click.option("--yes", "-y", is_flag=True, help="do not ask before destroying data")
@_json_opt
def format_cmd(paths, capacity, slots, spans, span_bytes, stripe_objs, force, yes, as_json, **model):
    """Write a new, empty store over PATH... (files are created).

    Without --capacity or --slots the store fills the smallest member (block
    devices); a regular file needs --capacity or --slots.
    """
    from .bench import has_store_magic, is_block_device, member_bytes  # noqa: PLC0415
    from .store import Store  # noqa: PLC0415

    fp = _fingerprint(model, required=True)
    if capacity is not None and slots is not None:
        raise click.UsageError("give --capacity or --slots, not both")
    if len(set(os.path.realpath(p) for p in paths)) != len(paths):
        raise click.UsageError("a member is named twice")
    for p in paths:
        if os.path.isdir(p):
            raise CliError(f"{p} is a directory", EXIT_USAGE)
        if capacity is None and slots is None and not is_block_device(p):
            raise CliError(f"{p}: a regular file needs --capacity or --slots", EXIT_USAGE)
        parent = os.path.dirname(os.path.abspath(p))
        if not os.path.isdir(parent):
            raise CliError(f"{p}: directory {parent} does not exist", EXIT_USAGE)

    existing = [p for p in paths if has_store_magic(p)]
    if existing and not force:
        raise CliError(f"{', '.join(existing)} already holds a Tutti store; pass --force to overwrite it",
                       EXIT_USAGE)
    danger = []
    for p in paths:
        if is_block_device(p):
            danger.append(f"{p} (block device)")
        elif p in existing:
            danger.append(f"{p} (existing Tutti store)")
        elif member_bytes(p):
            danger.append(f"{p} (non-empty file)")
    if danger and not yes:
        if not sys.stdin.isatty():
            raise CliError("formatting destroys the data on " + ", ".join(danger) +
                           "; pass --yes to confirm (no terminal to ask)", EXIT_USAGE)
        click.confirm("Format destroys the data on " + ", ".join(danger) + ". Continue?", abort=True)

    sizing = {"n_slots": slots, "capacity_bytes": capacity}
    try:
        Store.format(list(paths), fp, n_spans=spans, span_bytes=span_bytes, stripe_objs=stripe_objs,
                     force=force, **sizing)
    except OSError as e:
        if e.errno == errno.EEXIST:
            raise CliError(f"{', '.join(paths)}: already holds a store; pass --force to overwrite it: "
                           f"{e.strerror or e}", EXIT_USAGE) from None
        if e.errno in (errno.ENOSPC, errno.EINVAL, errno.EFBIG, errno.ERANGE):
            raise CliError(f"format: {e.strerror or e}", EXIT_USAGE) from None
        raise _store_error(e, "format") from None
    with _open(paths, "format: reopening the new store", readonly=True) as s:
        info = _store_summary(s)
    if as_json:
        _emit_json(info)
        return
    con = make_console()
    con.print(f"Formatted {len(paths)} member(s): {', '.join(paths)}")
    _print_dict(con, "Store", info)


@main.command("info", epilog=EXIT_CODES)
@_paths_arg
@_fingerprint_options(required=False)
@_json_opt
def info_cmd(paths, as_json, **model):
    """Show a store's geometry, model fingerprint, occupancy and counters."""
    fp = _fingerprint(model, required=False)
    with _open(paths, "info", readonly=True, expect=fp) as s:
        info = _store_summary(s)
    if as_json:
        _emit_json(info)
        return
    _print_dict(make_console(), "Store", info)


@main.command("check", epilog=EXIT_CODES)
@_paths_arg
@_fingerprint_options(required=False)
@click.option("--repair", is_flag=True, help="clear bad slots and damaged records (durably)")
@click.option("--first", type=click.IntRange(min=0), default=0, show_default=True, help="first slot to check")
@click.option("--count", type=click.IntRange(min=1), help="slots to check (default: to the end)")
@click.option("--chunk", type=click.IntRange(min=1), default=64, show_default=True,
              help="slots checked per call (progress granularity)")
@click.option("--progress/--no-progress", default=None, help="progress bar on stderr (default: if a terminal)")
@_json_opt
def check_cmd(paths, repair, first, count, chunk, progress, as_json, **model):
    """Read every committed slot and verify its checksums.

    Exit status 1 when bad slots or damaged records remain (after --repair:
    only those that could not be repaired).
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn  # noqa: PLC0415

    fp = _fingerprint(model, required=False)
    with _open(paths, "check", readonly=not repair, expect=fp) as s:
        n_slots = s.geometry.n_slots
        if first >= n_slots:
            raise CliError(f"--first {first} is beyond the last slot ({n_slots - 1})", EXIT_USAGE)
        total = min(count if count is not None else n_slots - first, n_slots - first)
        err = make_console(stderr=True)
        show = err.is_terminal if progress is None else progress
        bar = Progress(TextColumn("checking"), BarColumn(), MofNCompleteColumn(), TextColumn("slots"),
                       TimeRemainingColumn(), console=err, disable=not show, transient=False)
        with bar:
            task = bar.add_task("check", total=total)
            try:
                res = s.check(first=first, count=total, repair=repair, chunk=chunk,
                              progress=lambda done: bar.update(task, completed=min(done, total)))
            except OSError as e:
                raise _store_error(e, "check") from None
    res = dict(res)
    res.setdefault("first", first)
    res.setdefault("count", total)
    bad_total = int(res.get("bad", 0)) + int(res.get("bad_records", 0))
    remaining = max(0, bad_total - int(res.get("repaired", 0))) if repair else bad_total
    res["remaining_problems"] = remaining
    if as_json:
        _emit_json(res)
    else:
        con = make_console()
        bad_slots = list(res.get("bad_slots") or [])
        shown = {k: v for k, v in res.items() if k != "bad_slots"}
        if bad_slots:
            more = f" (+{len(bad_slots) - 32} more)" if len(bad_slots) > 32 else ""
            shown["bad_slots"] = ", ".join(str(x) for x in bad_slots[:32]) + more
        con.print(_kv_table(f"Check of slots {first}..{first + total - 1}", shown.items()))
        if remaining:
            con.print(f"[bold red]{remaining} problem(s) remain[/]" +
                      ("" if repair else "; run with --repair to clear bad slots"))
        else:
            con.print("[bold green]store is clean[/]" + (f" ({res.get('repaired', 0)} repaired)" if repair else ""))
    if remaining:
        sys.exit(EXIT_PROBLEMS)


@main.command("bench", epilog=EXIT_CODES)
@click.argument("paths", nargs=-1, metavar="[PATH...]", type=click.Path(dir_okay=False))
@click.option("--path", "extra_paths", multiple=True, type=click.Path(dir_okay=False),
              help="a member (same as PATH; repeatable)")
@click.option("--size", type=SIZE, help="store capacity (default: just the prefix)")
@click.option("--prefix-tokens", type=click.IntRange(min=1), default=32768, show_default=True,
              help="tokens of the prefix stored and retrieved")
@click.option("--runs", type=click.IntRange(min=1), default=5, show_default=True, help="runs (medians reported)")
@click.option("--model-config", type=click.Path(exists=True), help="HF config.json (default: Llama-3-8B geometry)")
@click.option("--block-size", type=click.IntRange(min=1), default=16, show_default=True, help="tokens per KV block")
@click.option("--dtype", help="KV dtype with --model-config (default: the config's)")
@click.option("--sweep", default="64,256,1024,2048", show_default=True,
              help="block counts for the CPU-per-layer sweep (clipped to the prefix)")
@click.option("--engine", default="auto", show_default=True, help="I/O engine: auto, uring or psync")
@click.option("--no-fio", is_flag=True, help="skip the fio baselines")
@click.option("--force", is_flag=True, help="allow formatting a block device or a file that holds other data")
@click.option("--output", type=click.Path(dir_okay=False), help="markdown file to write the results section into")
@click.option("--section", default=None, help="heading of that section (default: the store benchmark's)")
@click.option("--seed", type=int, default=1, show_default=True, help="seed for the data and the block shuffle")
@_json_opt
def bench_cmd(paths, extra_paths, size, prefix_tokens, runs, model_config, block_size, dtype, sweep, engine,
              no_fio, force, output, section, seed, as_json):
    """Measure layer-wise store and retrieve against fio and a naive per-object reader.

    Formats a store on PATH... (a benchmark store; anything else needs
    --force), stores a prefix of --prefix-tokens tokens layer by layer from a
    paged host buffer with shuffled block ids, retrieves it, verifies every
    byte, and compares with fio (same files, data region) and one os.preadv
    per object.  Every number printed is measured in this run.
    """
    from . import bench  # noqa: PLC0415

    members = list(paths) + list(extra_paths)
    if not members:
        raise click.UsageError("give at least one PATH (or --path)")
    try:
        sweep_counts = [int(x) for x in sweep.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"{sweep!r} is not a comma-separated list of block counts",
                                 param_hint="--sweep") from None
    fp = None
    if model_config:
        fp = _fingerprint({"model_config": model_config, "block_size": block_size, "dtype": dtype,
                           "tp_rank": 0, "tp_size": 1}, required=True)
    elif block_size != 16 or dtype:
        import dataclasses  # noqa: PLC0415

        from .model import LLAMA3_8B  # noqa: PLC0415

        fp = dataclasses.replace(LLAMA3_8B, block_size=block_size, dtype=dtype or LLAMA3_8B.dtype)
    cfg = bench.BenchConfig(paths=members, prefix_tokens=prefix_tokens, runs=runs, size=size, fp=fp,
                            fio=not no_fio, sweep=sweep_counts, engine=engine, seed=seed, force=force,
                            command="tutti-admin " + " ".join(shlex.quote(a) for a in sys.argv[1:])
                            if sys.argv and os.path.basename(sys.argv[0]).startswith("tutti-admin")
                            else "tutti-admin bench " + " ".join(shlex.quote(m) for m in members))
    log = (lambda msg: click.echo(msg, err=True)) if not as_json else None
    try:
        res = bench.run_bench(cfg, log=log)
    except bench.BenchError as e:
        raise CliError(f"bench: {e}", e.code) from None
    except OSError as e:
        raise _store_error(e, "bench") from None
    if output:
        bench.write_markdown(output, res, section or bench.SECTION_TITLE)
    if as_json:
        _emit_json(res)
    else:
        print_bench(make_console(), res)
        if output:
            make_console().print(f"results written to {output}")


def print_bench(con, res: dict) -> None:
    """The benchmark's result tables."""
    from rich.table import Table  # noqa: PLC0415

    from .bench import human_bytes, ratio_rows, result_rows, sweep_rows  # noqa: PLC0415

    w, s = res["workload"], res["store"]
    con.print(f"{w['model_id']} geometry: {w['n_layers']} layers x {w['n_spans']} spans x "
              f"{human_bytes(w['span_bytes'])}; prefix {w['prefix_tokens']} tokens = {w['blocks']} blocks = "
              f"{human_bytes(w['bytes'])}; engine {s['engine']}; {len(res['runs'])} run(s)")
    t = Table(title="Results (medians)", title_justify="left")
    for c in ("measurement", "median", "runs", "notes"):
        t.add_column(c, justify="right" if c == "median" else "left")
    for row in result_rows(res):
        t.add_row(*row)
    con.print(t)
    t = Table(title="Ratios", title_justify="left")
    for c in ("ratio", "value", "target", "met"):
        t.add_column(c)
    for row in ratio_rows(res):
        t.add_row(*row, style="red" if row[3] == "NO" else None)
    con.print(t)
    t = Table(title="Retrieve cost vs blocks", title_justify="left")
    for c in ("blocks", "bytes", "GB/s", "CPU µs/layer", "syscalls/layer"):
        t.add_column(c, justify="right")
    for row in sweep_rows(res):
        t.add_row(*row)
    con.print(t)
    con.print("[green]all data read back verified byte for byte[/]")


# ----------------------------------------------------------------- devices

_DEVICE_METAVAR = "PCI_ADDR|/dev/nvmeX|/dev/nvmeXnY|/dev/tuttiN"


def _device_error(e, what: str) -> CliError:
    """A devices.DeviceError as a CLI error: bad input exit 2, unusable device exit 3."""
    return CliError(f"{what}: {e}", EXIT_USAGE if e.usage else EXIT_STORE)


def _resolve_device(arg: str, what: str) -> str:
    from .devices import DeviceError, resolve_controller  # noqa: PLC0415

    try:
        return resolve_controller(arg)
    except DeviceError as e:
        raise _device_error(e, what) from None


def _store_text(v) -> str:
    return "?" if v is None else ("yes" if v else "no")


def _decimal_bytes(n: int) -> str:
    for unit, mult in (("PB", 10**15), ("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= mult:
            return f"{n / mult:.2f} {unit}"
    return f"{n} B"


def device_rows(ctls: list) -> list:
    """Rows of the list table: one per namespace (a controller without any: one row)."""
    rows = []
    for c in ctls:
        ident = [c["pci_address"], c["driver"], c["device"] or "-", c["model"] or "-", c["serial"] or "-",
                 c["firmware"] or "-"]
        if not c["namespaces"]:
            rows.append(ident + ["-", "-", "-"])
        for ns in c["namespaces"]:
            name = ns["device"]
            if ns.get("partitions"):
                name += f" ({len(ns['partitions'])} partition{'s' if len(ns['partitions']) > 1 else ''})"
            size = format_size(ns["size_bytes"]) if ns.get("size_bytes") is not None else "?"
            rows.append(ident + [name, size, _store_text(ns.get("tutti_store"))])
    return rows


@main.command("list", epilog=EXIT_CODES)
@_json_opt
def list_cmd(as_json):
    """List NVMe controllers and their namespaces.

    For each controller (PCI class 010802): PCI address, the driver bound to it
    (nvme, tutti or none), its node, model, serial and firmware; for each
    namespace: its block device (nvme) or tutti.ko node, size, and whether a
    Tutti store is on it (superblock magic; '?' when it cannot be read: run as
    root).  Like `nvme list`.
    """
    from rich.table import Table  # noqa: PLC0415

    from .devices import list_controllers  # noqa: PLC0415

    ctls = list_controllers()
    if as_json:
        _emit_json(ctls)
        return
    t = Table(title="NVMe controllers", title_justify="left")
    for col in ("PCI address", "driver", "controller", "model", "serial", "firmware", "namespace", "size",
                "tutti store"):
        t.add_column(col, no_wrap=True)
    for row in device_rows(ctls):
        t.add_row(*row)
    con = make_console()
    if not con.is_terminal:  # pipes and logs: never cut a device name or serial short
        from rich.measure import Measurement  # noqa: PLC0415

        con.width = max(con.width, Measurement.get(con, con.options.update_width(1 << 16), t).maximum)
    con.print(t)
    if not ctls:
        click.echo("no NVMe controller found", err=True)


def _device_summary(ctl: dict) -> str:
    nodes = [ctl["device"]] if ctl["device"] else []
    nodes += [ns["device"] for ns in ctl["namespaces"]]
    return ", ".join(nodes) if nodes else "no device nodes yet"


@main.command("attach", epilog=EXIT_CODES)
@click.argument("device", metavar=_DEVICE_METAVAR)
@_json_opt
def attach_cmd(device, as_json):
    """Hand an NVMe controller to tutti.ko (from the nvme driver, or from no driver).

    DEVICE is the controller's PCI address or any of its device nodes.  Refused
    (exit 3, nothing changed) while any of its namespaces, or a partition on one,
    is mounted, used as swap, held by another block device (dm, md, ...) or
    opened exclusively; also when tutti.ko is not loaded.  Needs root.
    """
    from .devices import DeviceError, attach  # noqa: PLC0415

    bdf = _resolve_device(device, "attach")
    try:
        ctl, changed = attach(bdf)
    except DeviceError as e:
        raise _device_error(e, "attach") from None
    if as_json:
        _emit_json({**ctl, "changed": changed})
        return
    click.echo(f"{bdf}: {'attached to' if changed else 'already bound to'} tutti.ko: {_device_summary(ctl)}")


@main.command("detach", epilog=EXIT_CODES)
@click.argument("device", metavar=_DEVICE_METAVAR)
@_json_opt
def detach_cmd(device, as_json):
    """Give an NVMe controller back to the kernel's nvme driver.

    Waits until the nvme driver has brought the controller up and its namespaces'
    block devices exist.  Exit 3 when the nvme driver is not loaded (the controller
    is then left without a driver: modprobe nvme and run detach again).  Processes
    using the controller's tutti.ko nodes lose them (-ENODEV).  Needs root.
    """
    from .devices import DeviceError, detach  # noqa: PLC0415

    bdf = _resolve_device(device, "detach")
    try:
        ctl, changed = detach(bdf)
    except DeviceError as e:
        raise _device_error(e, "detach") from None
    if as_json:
        _emit_json({**ctl, "changed": changed})
        return
    click.echo(f"{bdf}: {'handed back to' if changed else 'already bound to'} nvme: {_device_summary(ctl)}")


def health_rows(d: dict) -> list:
    """(label, text) rows of the health table, in nvme smart-log's order."""
    cw = d["critical_warning"]
    rows = [
        ("critical warning", f"{cw:#04x}" + (f" ({'; '.join(d['critical_warnings'])})" if cw else " (none)")),
        ("temperature", f"{d['temperature_c']} °C ({d['temperature_k']} K)"),
        ("available spare", f"{d['avail_spare']}%"),
        ("available spare threshold", f"{d['spare_thresh']}%"),
        ("percentage used", f"{d['percent_used']}%"),
        ("endurance group critical warning summary", f"{d['endurance_grp_critical_warning_summary']:#04x}"),
        ("data units read", f"{d['data_units_read']:,} ({_decimal_bytes(d['data_read_bytes'])})"),
        ("data units written", f"{d['data_units_written']:,} ({_decimal_bytes(d['data_written_bytes'])})"),
        ("host read commands", f"{d['host_read_commands']:,}"),
        ("host write commands", f"{d['host_write_commands']:,}"),
        ("controller busy time", f"{d['controller_busy_time']:,} min"),
        ("power cycles", f"{d['power_cycles']:,}"),
        ("power on hours", f"{d['power_on_hours']:,}"),
        ("unsafe shutdowns", f"{d['unsafe_shutdowns']:,}"),
        ("media and data integrity errors", f"{d['media_errors']:,}"),
        ("error information log entries", f"{d['num_err_log_entries']:,}"),
        ("warning temperature time", f"{d['warning_temp_time']:,} min"),
        ("critical composite temperature time", f"{d['critical_comp_time']:,} min"),
    ]
    for i, k in enumerate(d["temperature_sensors_k"]):
        if k:
            rows.append((f"temperature sensor {i + 1}", f"{k - 273} °C ({k} K)"))
    for i in (1, 2):
        if d[f"thm_temp{i}_trans_count"] or d[f"thm_temp{i}_total_time"]:
            rows.append((f"thermal management T{i} transitions", f"{d[f'thm_temp{i}_trans_count']:,}"))
            rows.append((f"thermal management T{i} total time", f"{d[f'thm_temp{i}_total_time']:,} s"))
    return rows


@main.command("health", epilog=EXIT_CODES)
@click.argument("device", metavar=_DEVICE_METAVAR)
@_json_opt
def health_cmd(device, as_json):
    """Show a controller's SMART / health log, like `nvme smart-log`.

    Read through the driver the controller is bound to: the kernel's nvme driver
    (NVME_IOCTL_ADMIN_CMD on /dev/nvmeX) or tutti.ko (its read-only admin
    passthrough on /dev/tuttiN).  Exit 1 when the critical warning is not zero.
    Needs root.
    """
    from rich.table import Table  # noqa: PLC0415

    from .devices import DeviceError, smart_log  # noqa: PLC0415
    from .smart import parse_smart_log  # noqa: PLC0415

    bdf = _resolve_device(device, "health")
    try:
        ctl, page = smart_log(bdf)
    except DeviceError as e:
        raise _device_error(e, "health") from None
    d = {"pci_address": bdf, "device": ctl["device"], "driver": ctl["driver"], **parse_smart_log(page).to_dict()}
    if as_json:
        _emit_json(d)
    else:
        t = Table(title=f"SMART / health log of {bdf} ({ctl['device']}, driver {ctl['driver']})",
                  title_justify="left", show_header=False, box=None, pad_edge=False)
        t.add_column(style="bold")
        t.add_column()
        for label, text in health_rows(d):
            t.add_row(label, text, style="red" if label == "critical warning" and d["critical_warning"] else None)
        make_console().print(t)
    if d["critical_warning"]:
        sys.exit(EXIT_PROBLEMS)


if __name__ == "__main__":  # pragma: no cover
    main()
