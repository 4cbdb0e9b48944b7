#!/usr/bin/env python3
"""A store's first save with its space reserved at format vs a sparse store; writes docs/benchmarks.md.

For each directory (default: tmpfs and this machine's disk) and run, in alternating order: a fresh store
(the file removed first) is formatted sparse or preallocated (``Store.format(preallocate=...)``), then one
prefix is saved into it (the first save: every page or block new to the file) and a second prefix over the
same slots (the baseline in the same run: the file's space already taken). Reported per mode: format time,
first-save and overwrite GB/s, and their ratio; then preallocated ÷ sparse on the first save.

    python benchmarks/store_prealloc.py                          # 8192 tokens, 5 runs, tmpfs and disk
    python benchmarks/store_prealloc.py --dirs /dev/shm/tp --tokens 32768 --runs 3
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import statistics
import sys
import time
from pathlib import Path

from tutti import LLAMA3_8B, PagedBuffer, Store
from tutti.bench import machine_info, replace_section
from tutti.bench.passes import store_pass
from tutti.bench.run import bench_key

ROOT = Path(__file__).resolve().parent.parent
TITLE = "Store: space reserved at format"
MODES = ("sparse", "preallocated")


def one(path: str, mode: str, run: int, n: int, src, cpu_threads: int) -> dict:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    t0 = time.perf_counter()
    Store.format([path], LLAMA3_8B, n_slots=n, preallocate=mode == "preallocated")
    fmt = time.perf_counter() - t0
    st = os.stat(path)
    ids = list(range(n))
    with Store.open([path], cpu_threads=cpu_threads) as s:
        geo = s.geometry
        first = store_pass(s, src, geo, [bench_key(2 * run, i) for i in ids], ids)
        again = store_pass(s, src, geo, [bench_key(2 * run + 1, i) for i in ids], ids)
        engine = s.engine
    os.unlink(path)
    return {"mode": mode, "run": run, "format_s": fmt, "first_gbps": first["gbps"], "overwrite_gbps": again["gbps"],
            "allocated_bytes": st.st_blocks * 512, "size": st.st_size, "engine": engine}


def medium(d: str) -> str:
    try:
        return "tmpfs" if os.statvfs(d).f_fsid == 0 or "shm" in d else "disk"
    except OSError:
        return "disk"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dirs", default=f"/dev/shm/tutti-prealloc,{ROOT / 'build' / 'bench-prealloc'}",
                    help="comma-separated directories, one store file each (created, removed after)")
    ap.add_argument("--tokens", type=int, default=8192, help="prefix tokens (Llama-3-8B KV: 128 KiB a token)")
    ap.add_argument("--runs", type=int, default=5, help="runs per mode, medians reported")
    ap.add_argument("--cpu-threads", type=int, default=0, help="Store.open's cpu_threads (0: auto)")
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "store_prealloc_cpu.json"), help="raw results")
    ap.add_argument("--output", default=str(ROOT / "docs" / "benchmarks.md"), help="markdown file to update")
    args = ap.parse_args(argv)
    if args.tokens < 16 or args.runs < 1:
        ap.error("--tokens must be at least 16 and --runs at least 1")
    n = args.tokens // 16
    dirs = [d for d in args.dirs.split(",") if d]
    src = PagedBuffer.for_geometry(Store.plan(1, LLAMA3_8B, n_slots=n)[0], n)
    src.fill_random(list(range(n)), seed=7)
    rows = []
    try:
        for d in dirs:
            os.makedirs(d, exist_ok=True)
            path = os.path.join(d, "prealloc.img")
            for r in range(args.runs):
                for mode in (MODES if r % 2 == 0 else MODES[::-1]):
                    row = dict(one(path, mode, r, n, src, args.cpu_threads), dir=d, medium=medium(d))
                    rows.append(row)
                    print(json.dumps(row), file=sys.stderr)
    finally:
        src.close()
    command = " ".join(["python", "benchmarks/store_prealloc.py", *map(shlex.quote, argv or sys.argv[1:])])
    when = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    machine = machine_info([os.path.join(d, "prealloc.img") for d in dirs])
    out = {"command": command, "date": when, "machine": machine, "tokens": args.tokens, "rows": rows}
    Path(args.json).write_text(json.dumps(out, indent=1) + "\n")

    med = lambda xs: statistics.median(xs)
    table = ["| store on | format | format s | first save GB/s | overwrite GB/s | first ÷ overwrite "
             "| held after format |", "|---|---|---|---|---|---|---|"]
    ratios = []
    for d in dirs:
        by = {m: [x for x in rows if x["dir"] == d and x["mode"] == m] for m in MODES}
        for m in MODES:
            xs = by[m]
            table.append(f"| {xs[0]['medium']} (`{d}`) | {m} | {med([x['format_s'] for x in xs]):.3f} | "
                         f"{med([x['first_gbps'] for x in xs]):.2f} | {med([x['overwrite_gbps'] for x in xs]):.2f} | "
                         f"{med([x['first_gbps'] / x['overwrite_gbps'] for x in xs]):.2f} | "
                         f"{med([x['allocated_bytes'] / x['size'] for x in xs]):.0%} |")
        per_run = [p["first_gbps"] / s["first_gbps"] for p, s in zip(by["preallocated"], by["sparse"])]
        ratios.append(f"- {by['sparse'][0]['medium']}: first save preallocated ÷ sparse **{med(per_run):.2f}** "
                      f"(runs {min(per_run):.2f}–{max(per_run):.2f})")
    section = "\n".join([
        f"## {TITLE}", "",
        f"Measured {when} with:", "", "```", command, "```", "",
        f"- Machine: {machine.get('host', '?')}, {machine.get('cpu', '?')}, {os.cpu_count()} CPUs, "
        f"{machine.get('kernel', '?')}",
        f"- Workload: a Llama-3-8B-shaped prefix of {args.tokens} tokens ({n} blocks, "
        f"{n * 2 << 20 >> 20} MiB) into a store of exactly that many slots; engine `{rows[0]['engine']}`; "
        "each run removes the file, formats it (sparse or preallocated, alternating which goes first), saves "
        "the prefix (*first save*) and then a second prefix over the same slots (*overwrite*: the baseline "
        "of the same run); medians of the runs. Raw: `" + os.path.relpath(args.json, ROOT) + "`.", "",
        *table, "", *ratios, ""])
    replace_section(args.output, TITLE, section)
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
