"""Store commands: format, info, check, bench."""
from __future__ import annotations

import errno
import os
import shlex
import stat
import sys

import click

from . import limits
from .app import main
from .common import (
    EXIT_CODES,
    EXIT_PROBLEMS,
    EXIT_USAGE,
    SIZE,
    CliError,
    _emit_json,
    _fingerprint,
    _fingerprint_options,
    _json_opt,
    _kv_table,
    _open,
    _paths_arg,
    _print_dict,
    _store_error,
    _store_summary,
    check_members,
    format_size,
    make_console,
)
from .params import Choice, InputFile, MemberPath, OutputFile, Text, Whole, WholeList, c_arg, c_field, dtype_text

_FP = "tt_format_params"


def _store_held(path: str) -> str | None:
    """What Tutti superblock ``path`` holds, as words after the path, or None (also: cannot be read).

    libtutti's probe: any version, valid or damaged, in either copy.  A path that cannot be
    read is left to format itself, which reports why.
    """
    from ..errors import TuttiError
    from ..store import Store

    try:
        pr = Store.probe(path)
    except TuttiError:
        return None
    if pr["kind"] == "store":
        return "already holds a Tutti store"
    if pr["kind"] == "other_version":
        magic = "" if pr["magic"] == "TUTTIKV1" else f", magic {pr['magic']!r}"
        return f"already holds a Tutti store of format version {pr['version']}{magic} (not readable by this tutti)"
    if pr["kind"] == "damaged":
        return "holds a damaged Tutti superblock"
    return None


@main.command("format", epilog=EXIT_CODES)
@_paths_arg(create=True)
@_fingerprint_options(required=True)
@click.option("--capacity", type=SIZE, help="bytes of KV data to hold (e.g. 2GiB); sets the slot count")
@click.option("--slots", type=c_field(_FP, "n_slots"), help="number of KV blocks (slots) to hold")
@click.option("--spans", type=c_field(_FP, "n_spans"), default=2, show_default=True,
              help="objects per layer per block (2: K and V)")
@click.option("--span-bytes", type=c_field(_FP, "span_bytes"), help="bytes per object (default: from the model)")
@click.option("--stripe-objs", type=c_field(_FP, "stripe_objs"),
              help="stripe unit in objects (default: 1 MiB worth)")
@click.option("--force", is_flag=True, help="overwrite an existing Tutti store")
@click.option("--sparse", is_flag=True,
              help="files: take space as blocks are first written (default: reserve the whole size now)")
@click.option("--yes", "-y", is_flag=True, help="do not ask before destroying data")
@_json_opt
def format_cmd(paths, capacity, slots, spans, span_bytes, stripe_objs, force, sparse, yes, as_json, **model):
    """Write a new, empty store over PATH... (files are created).

    Without --capacity or --slots the store fills the smallest member (block
    devices); a regular file needs --capacity or --slots.  A file's whole size
    is reserved at format (fallocate; on tmpfs its memory is taken now), so a
    save never waits for the file system to allocate and never finds it full;
    --sparse leaves holes instead.
    """
    from ..bench import is_block_device, member_bytes
    from ..store import Store

    fp = _fingerprint(model, required=True)
    if capacity is not None and slots is not None:
        raise click.UsageError("give --capacity or --slots, not both")
    for p in paths:
        if capacity is None and slots is None and not is_block_device(p):
            raise CliError(f"{p}: a regular file needs --capacity or --slots", EXIT_USAGE)
    sizing = {"n_slots": slots, "capacity_bytes": capacity}
    layout = {"n_spans": spans, "span_bytes": span_bytes, "stripe_objs": stripe_objs}
    if slots is not None or capacity is not None:
        _plan_fits(paths, fp, sizing, layout)

    held = {p: what for p in paths if (what := _store_held(p))}
    existing = list(held)
    if existing and not force:
        raise CliError("; ".join(f"{p} {what}" for p, what in held.items()) + "; pass --force to overwrite it",
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

    try:
        Store.format(list(paths), fp, force=force, preallocate=not sparse, **layout, **sizing)
    except ValueError as e:
        raise CliError(f"format: {e}", EXIT_USAGE) from None
    except OSError as e:
        if e.errno == errno.EEXIST:
            raise CliError(f"{', '.join(paths)}: already holds a store; pass --force to overwrite it: "
                           f"{e.strerror or e}", EXIT_USAGE) from None
        if e.errno in (errno.ENOSPC, errno.EOPNOTSUPP) and not sparse:
            raise CliError(f"format: {e.strerror or e} (--sparse)", EXIT_USAGE) from None
        if e.errno in (errno.ENOSPC, errno.EINVAL, errno.EFBIG, errno.ERANGE, errno.EOPNOTSUPP):
            raise CliError(f"format: {e.strerror or e}", EXIT_USAGE) from None
        raise _store_error(e, "format") from None
    with _open(paths, "format: reopening the new store", readonly=True) as s:
        info = _store_summary(s)
    held_bytes = _file_space(paths)
    if held_bytes:
        info["allocated_bytes"] = held_bytes  # sparse or not, as the file system says
    if as_json:
        _emit_json(info)
        return
    con = make_console()
    con.print(f"Formatted {len(paths)} member(s): {', '.join(paths)}")
    _print_dict(con, "Store", info)


def _file_space(paths) -> dict:
    """Bytes the file system holds for each regular-file member (st_blocks): its size once reserved."""
    out = {}
    for p in paths:
        try:
            st = os.stat(p)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            out[p] = st.st_blocks * 512
    return out


def _plan_fits(paths, fp, sizing: dict, layout: dict) -> None:
    """Refuse (exit 2) a geometry libtutti would refuse, or a store larger than the file systems of its
    regular-file members can hold, before anything is read or written."""
    from ..bench import room_for
    from ..store import Store

    try:
        _, need = Store.plan(len(paths), fp, **sizing, **layout)
    except (OSError, ValueError) as e:
        raise CliError(f"format: {e.strerror if isinstance(e, OSError) and e.strerror else e}", EXIT_USAGE) from None
    for p in paths:
        room = room_for(p)
        if room is not None and need > room:
            raise CliError(f"format: {p}: the store needs {format_size(need)} per member; the file system "
                           f"holding it has room for {format_size(room)}", EXIT_USAGE)


@main.command("info", epilog=EXIT_CODES)
@_paths_arg()
@_fingerprint_options(required=False)
@click.option("--prometheus", is_flag=True,
              help="print Prometheus metrics (node exporter textfile format): occupancy, and the SMART "
                   "log of NVMe members where readable (docs/operations.md)")
@_json_opt
def info_cmd(paths, as_json, prometheus, **model):
    """Show a store's geometry, model fingerprint, occupancy and counters."""
    fp = _fingerprint(model, required=False)
    if as_json and prometheus:
        raise click.UsageError("give --json or --prometheus, not both")
    with _open(paths, "info", readonly=True, expect=fp) as s:
        info = _store_summary(s)
    if prometheus:
        from ..metrics import store_text

        click.echo(store_text(info), nl=False)
        return
    if as_json:
        _emit_json(info)
        return
    _print_dict(make_console(), "Store", _members_as_tables(info))


def _members_as_tables(info: dict) -> dict:
    """info with the bytes-written members' list as one nested table per member (the text output)."""
    w = info.get("written")
    if not isinstance(w, dict) or not isinstance(w.get("members"), list):
        return info
    members = {f"member {m['index']}" + (f" ({m['path']})" if m.get("path") else ""):
               {k: v for k, v in m.items() if k not in ("index", "path")} for m in w["members"]}
    rest = {k: v for k, v in w.items() if k != "members"}
    return {**info, "written": {**rest, **members}}


@main.command("check", epilog=EXIT_CODES)
@_paths_arg()
@_fingerprint_options(required=False)
@click.option("--repair", is_flag=True,
              help="clear bad slots and damaged records (durably); unreadable slots are kept")
@click.option("--first", type=c_arg("tt_store_check", 1, min=0), default=0, show_default=True,
              help="first slot to check")
@click.option("--count", type=c_arg("tt_store_check", 2), help="slots to check (default: to the end)")
@click.option("--chunk", type=c_arg("tt_store_check", 6), default=64, show_default=True,
              help="slots checked per call (progress granularity; at most the slots checked)")
@click.option("--progress/--no-progress", default=None, help="progress bar on stderr (default: if a terminal)")
@_json_opt
def check_cmd(paths, repair, first, count, chunk, progress, as_json, **model):
    """Read every committed slot and verify its checksums.

    Exit status 1 when bad slots, damaged records or unreadable slots remain
    (after --repair: those that could not be repaired).  A slot that could not
    be read (an I/O error) is reported and never cleared: it is not corruption.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    fp = _fingerprint(model, required=False)
    with _open(paths, "check", readonly=not repair, expect=fp) as s:
        n_slots = s.geometry.n_slots
        if first >= n_slots:
            raise CliError(f"--first {first} is beyond the last slot ({n_slots - 1})", EXIT_USAGE)
        total = min(count if count is not None else n_slots - first, n_slots - first)
        chunk = min(chunk, total)  # its bad-slot buffer: never more than the slots checked
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
    # Unreadable slots (I/O errors) are never repaired: they remain problems to look at.
    unreadable = int(res.get("unreadable", 0))
    remaining += unreadable
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
        if unreadable:
            con.print(f"[bold red]{unreadable} slot(s) could not be read (I/O error)[/]: kept, "
                      "not repaired (an I/O error is not corruption); check the device")
        if remaining:
            con.print(f"[bold red]{remaining} problem(s) remain[/]" +
                      ("" if repair or remaining == unreadable else "; run with --repair to clear bad slots"))
        else:
            con.print("[bold green]store is clean[/]" + (f" ({res.get('repaired', 0)} repaired)" if repair else ""))
    if remaining:
        sys.exit(EXIT_PROBLEMS)


@main.command("bench", epilog=EXIT_CODES)
@click.argument("paths", nargs=-1, metavar="[PATH...]", type=MemberPath(create=True, parents=True))
@click.option("--path", "extra_paths", multiple=True, type=MemberPath(create=True, parents=True),
              help="a member (same as PATH; repeatable)")
@click.option("--size", type=SIZE, help="store capacity (default: just the prefix)")
@click.option("--prefix-tokens", type=c_field(_FP, "n_slots"), default=32768, show_default=True,
              help="tokens of the prefix stored and retrieved")
@click.option("--runs", type=Whole(1, 100), default=5, show_default=True, help="runs (medians reported)")
@click.option("--model-config", type=InputFile(dir_file="config.json"),
              help="HF config.json (default: Llama-3-8B geometry)")
@click.option("--block-size", type=c_field("tt_fingerprint", "block_size"), default=16, show_default=True,
              help="tokens per KV block")
@click.option("--dtype", type=dtype_text(), help="KV dtype with --model-config (default: the config's)")
@click.option("--sweep", type=WholeList(1, lambda: limits.field_max(_FP, "n_slots")), default="64,256,1024,2048",
              show_default=True,
              help="block counts for the CPU-per-layer sweep (clipped to the prefix)")
@click.option("--engine", type=Choice(["auto", "uring", "psync"]), default="auto", show_default=True,
              help="I/O engine")
@click.option("--no-fio", is_flag=True, help="skip the fio baselines")
@click.option("--cpu-threads", type=Whole(0, 1024), default=0, show_default=True,
              help="threads for the CPU's copies (page cache, tmpfs) and checksums; 0: the CPUs it may run on, at most "
                   "8; 1: the calling thread")
@click.option("--force", is_flag=True, help="allow formatting a block device or a file that holds other data")
@click.option("--output", type=OutputFile(), help="markdown file to write the results section into")
@click.option("--section", type=Text(), default=None,
              help="heading of that section (default: the store benchmark's)")
@click.option("--seed", type=int, default=1, show_default=True, help="seed for the data and the block shuffle")
@click.option("--compare", type=Choice(["lmcache"]), default=None,
              help="side by side with LMCache's disk engines on PATH's file system (needs tutti[lmcache-bench])")
@click.option("--lmcache-python", type=InputFile(), default=None,
              help="with --compare lmcache: a Python that has the lmcache package, to run lmcache's own "
                   "RawBlockCore too")
@_json_opt
def bench_cmd(paths, extra_paths, size, prefix_tokens, runs, model_config, block_size, dtype, sweep, engine,
              no_fio, cpu_threads, force, output, section, seed, compare, lmcache_python, as_json):
    """Measure layer-wise store and retrieve against fio and a naive per-object reader.

    Formats a store on PATH... (a benchmark store; anything else needs
    --force), stores a prefix of --prefix-tokens tokens layer by layer from a
    paged host buffer with shuffled block ids, retrieves it, verifies every
    byte, and compares with fio (same files, data region) and one os.preadv
    per object.  Every number printed is measured in this run.

    With --compare lmcache: the same prefix also through LMCache's disk
    engines (its raw-block layout over lmcache-rust-raw-block-io, its
    local-disk layout of one file per 256-token chunk), their files beside
    PATH, with GB/s and CPU seconds per GB of each, against fio.
    """
    from .. import bench

    members = list(check_members(None, None, list(paths) + list(extra_paths)))
    if not members:
        raise click.UsageError("give at least one PATH (or --path)")
    if lmcache_python and not compare:
        raise CliError("bench: --lmcache-python needs --compare lmcache", EXIT_USAGE)
    if compare:
        if len(members) != 1:
            raise CliError("bench: --compare lmcache takes one PATH (Tutti's store file; LMCache's files go "
                           "beside it)", EXIT_USAGE)
        if size is not None:
            raise CliError("bench: --size does not apply to --compare lmcache (the store holds the prefix)",
                           EXIT_USAGE)
    sweep_counts = sweep
    fp = None
    if model_config:
        fp = _fingerprint({"model_config": model_config, "block_size": block_size, "dtype": dtype,
                           "tp_rank": 0, "tp_size": 1}, required=True)
    elif block_size != 16 or dtype:
        import dataclasses

        from ..model import LLAMA3_8B

        fp = dataclasses.replace(LLAMA3_8B, block_size=block_size, dtype=dtype or LLAMA3_8B.dtype)
    command = ("tutti-admin " + " ".join(shlex.quote(a) for a in sys.argv[1:])
               if sys.argv and os.path.basename(sys.argv[0]).startswith("tutti-admin")
               else "tutti-admin bench " + " ".join(shlex.quote(m) for m in members))
    log = (lambda msg: click.echo(msg, err=True)) if not as_json else None
    if compare:
        _bench_compare(members[0], prefix_tokens, runs, fp, engine, no_fio, seed, force, lmcache_python, output,
                       section, command, log, as_json, cpu_threads)
        return
    cfg = bench.BenchConfig(paths=members, prefix_tokens=prefix_tokens, runs=runs, size=size, fp=fp,
                            fio=not no_fio, sweep=sweep_counts, engine=engine, seed=seed, force=force,
                            cpu_threads=cpu_threads, command=command)
    res = _run_bench(bench.run_bench, cfg, log)
    if output:
        bench.write_markdown(output, res, section or bench.SECTION_TITLE)
    if as_json:
        _emit_json(res)
    else:
        print_bench(make_console(), res)
        if output:
            make_console().print(f"results written to {output}", markup=False, soft_wrap=True)


def _run_bench(run, cfg, log):
    """One benchmark run; its failures as the command's one-line errors."""
    from .. import bench

    try:
        return run(cfg, log=log)
    except bench.BenchError as e:
        raise CliError(f"bench: {e}", e.code) from None
    except OSError as e:
        raise _store_error(e, "bench") from None


def _bench_compare(path, prefix_tokens, runs, fp, engine, no_fio, seed, force, lmcache_python, output, section,
                   command, log, as_json, cpu_threads=0) -> None:
    """bench --compare lmcache: Tutti beside LMCache's disk engines (tutti.bench.lmcache_compare)."""
    from .. import bench
    from ..bench import lmcache_compare as lc
    from ..bench import lmcache_report as lr

    cfg = lc.CompareConfig(path=path, prefix_tokens=prefix_tokens, runs=runs, fp=fp, engine=engine, fio=not no_fio,
                           seed=seed, force=force, lmcache_python=lmcache_python, command=command,
                           cpu_threads=cpu_threads)
    res = _run_bench(lc.run_compare, cfg, log)
    if output:
        bench.replace_section(output, section or lc.COMPARE_TITLE,
                              lr.markdown_section([res], command, section or lc.COMPARE_TITLE))
    if as_json:
        _emit_json(res)
    else:
        lr.print_compare(make_console(), res)
        if output:
            make_console().print(f"results written to {output}", markup=False, soft_wrap=True)


def print_bench(con, res: dict) -> None:
    """The benchmark's result tables."""
    from rich.table import Table

    from ..bench import human_bytes, ratio_rows, result_rows, sweep_rows

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
    for col in ("blocks", "bytes", "GB/s", "CPU µs/layer", "syscalls/layer"):
        t.add_column(col, justify="right")
    for srow in sweep_rows(res):
        t.add_row(*srow)
    con.print(t)
    con.print("[green]all data read back verified byte for byte[/]")
