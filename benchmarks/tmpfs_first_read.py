#!/usr/bin/env python3
"""Why the first read of freshly written tmpfs pages is slower than the next ones; writes docs/benchmarks.md.

No Tutti code runs here: a file on tmpfs, its space reserved (``posix_fallocate``, as a preallocated store),
is written in 8 MiB pieces either with ``pwrite`` or through a shared mapping (``MADV_POPULATE_WRITE`` then
a copy: what the engine does for a RAM-backed member, ``TUTTI_TMPFS_MAP``), the mapping unmapped after the
writes (``mapped``) or kept during the reads (``mapped, kept``: as the engine keeps it), then read back three
times with ``preadv`` into one touched buffer. Optionally, before the reads, one byte of every page is read
(``touch``): that moves no data, only visits each page's bookkeeping. Reported: first read ÷ mean of the two
later reads, per writer and touch; the writers rotate between runs.

    python benchmarks/tmpfs_first_read.py                      # 1 GiB, 4 runs, /dev/shm
    python benchmarks/tmpfs_first_read.py --mib 4096 --runs 6
"""
from __future__ import annotations

import argparse
import datetime
import json
import mmap
import os
import shlex
import statistics
import sys
import time
from pathlib import Path

from tutti.bench import machine_info, replace_section

ROOT = Path(__file__).resolve().parent.parent
TITLE = "tmpfs: the first read of freshly written pages"
PIECE = 8 << 20
WRITERS = ("pwrite", "mapped", "mapped, kept")
POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)


def one(path: str, size: int, writer: str, touch: bool, src, dst) -> dict:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.posix_fallocate(fd, 0, size)
        t = time.perf_counter()
        m = None
        if writer == "pwrite":
            for off in range(0, size, PIECE):
                os.pwrite(fd, src, off)
        else:
            m = mmap.mmap(fd, size, flags=mmap.MAP_SHARED)
            m.madvise(POPULATE_WRITE)
            for off in range(0, size, PIECE):
                m[off:off + PIECE] = src
            if writer == "mapped":
                m.close()
        write_gbps = size / (time.perf_counter() - t) / 1e9
        touch_s = 0.0
        if touch:
            t = time.perf_counter()
            for off in range(0, size, 4096):
                os.pread(fd, 1, off)
            touch_s = time.perf_counter() - t
        reads = []
        for _ in range(3):
            t = time.perf_counter()
            for off in range(0, size, PIECE):
                os.preadv(fd, [dst], off)
            reads.append(size / (time.perf_counter() - t) / 1e9)
        if m is not None:
            m.close()
    finally:
        os.close(fd)
        os.unlink(path)
    return {"writer": writer, "touch": touch, "write_gbps": write_gbps, "touch_s": touch_s, "read_gbps": reads,
            "first_over_later": reads[0] / statistics.mean(reads[1:])}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/dev/shm", help="a tmpfs directory (one file, removed after)")
    ap.add_argument("--mib", type=int, default=1024, help="file size in MiB")
    ap.add_argument("--runs", type=int, default=4, help="runs per variant, medians reported")
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "tmpfs_first_read_cpu.json"), help="raw results")
    ap.add_argument("--output", default=str(ROOT / "docs" / "benchmarks.md"), help="markdown file to update")
    args = ap.parse_args(argv)
    if args.mib < 8 or args.runs < 1:
        ap.error("--mib must be at least 8 and --runs at least 1")
    size = (args.mib << 20) // PIECE * PIECE
    path = os.path.join(args.dir, "tutti-first-read.img")
    src = mmap.mmap(-1, PIECE)
    src.write(os.urandom(PIECE))
    dst = mmap.mmap(-1, PIECE)
    dst.write(b"\1" * PIECE)  # touched: the reads pay for no fault of their own
    rows = []
    try:
        for r in range(args.runs):
            for writer in WRITERS[r % 3:] + WRITERS[:r % 3]:
                for touch in (False, True):
                    row = dict(one(path, size, writer, touch, src, dst), run=r)
                    rows.append(row)
                    print(json.dumps(row), file=sys.stderr)
    except OSError as e:
        print(f"tmpfs_first_read: {path}: {e.strerror or e}", file=sys.stderr)
        return 1
    command = " ".join(["python", "benchmarks/tmpfs_first_read.py", *map(shlex.quote, argv or sys.argv[1:])])
    when = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    out = {"command": command, "date": when, "machine": machine_info([args.dir]), "bytes": size, "rows": rows}
    Path(args.json).write_text(json.dumps(out, indent=1) + "\n")

    med = statistics.median
    table = ["| written by | before the reads | first read GB/s | later reads GB/s | first ÷ later | touch s |",
             "|---|---|---|---|---|---|"]
    for writer in WRITERS:
        for touch in (False, True):
            xs = [x for x in rows if x["writer"] == writer and x["touch"] == touch]
            table.append(f"| {writer} | {'one byte of every page' if touch else 'nothing'} | "
                         f"{med([x['read_gbps'][0] for x in xs]):.2f} | "
                         f"{med([statistics.mean(x['read_gbps'][1:]) for x in xs]):.2f} | "
                         f"**{med([x['first_over_later'] for x in xs]):.2f}** | "
                         f"{med([x['touch_s'] for x in xs]):.2f} |")
    m = out["machine"]
    section = "\n".join([
        f"## {TITLE}", "",
        f"Measured {when} with:", "", "```", command, "```", "",
        f"Machine: {m['cpu']}, {m['cores']} CPUs, {m['kernel']}; {size >> 20} MiB file in `{args.dir}`, "
        f"{args.runs} runs per variant (medians). Raw: `{os.path.relpath(args.json, ROOT)}`.", "",
        *table, "",
    ])
    replace_section(args.output, TITLE, section)
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
