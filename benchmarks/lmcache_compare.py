#!/usr/bin/env python3
"""Tutti beside LMCache's disk engines, on the disk and on tmpfs, at 8K and 32K tokens; writes docs/benchmarks.md.

Runs tutti.bench.lmcache_compare (the code behind `tutti-admin bench --compare lmcache`) once per medium and
prefix length, writes every run's raw numbers as JSON and the section "Side by side with LMCache's disk
engines" of docs/benchmarks.md.

    python benchmarks/lmcache_compare.py                      # disk (build/bench) and tmpfs (/dev/shm), 8K and 32K
    python benchmarks/lmcache_compare.py --lmcache-python PY  # also lmcache's own RawBlockCore, run by PY

Needs lmcache-rust-raw-block-io (pip install 'tutti[lmcache-bench]'), fio for the baseline, and root to drop
the page cache before every read on the disk.  Memory: two copies of the largest prefix (8 GiB at 32K tokens)
plus, on tmpfs, one engine's files at a time.
"""
import argparse
import json
import os
import shlex
import sys
from pathlib import Path

from tutti.bench import BenchError, replace_section
from tutti.bench import lmcache_compare as lc
from tutti.bench import lmcache_report as lr
from tutti.cli import make_console

ROOT = Path(__file__).resolve().parent.parent


HOW_TO_READ = [
    "How the engines differ (what the numbers above compare):",
    "",
    "- Granularity. The LMCache engines, in LMCache's default (not layer-wise) chunk format measured here, "
    "move whole 256-token chunks: one 32 MiB request per chunk, raw-block "
    "with every chunk of the prefix in flight at once, local-disk four at a time. Tutti reads layer by layer "
    "(requests of up to 2 MiB, layer l+1 submitted before layer l is waited for), so layer 0 is usable after "
    "1/32 of the prefix has arrived; a chunk is usable only when all 32 of its layers are in.",
    "- Destination. Tutti lands every 32 KiB object at its block in a paged buffer (shuffled block ids, as "
    "vLLM's); the LMCache engines land in contiguous chunk buffers, and LMCache's copy from there into vLLM's "
    "paged cache (a GPU kernel in a real deployment) is not in these numbers.",
    "- Checks. Tutti verifies an XXH3 checksum of every object on read (the default; its row with checksums "
    "off is the same-verification-level comparison). None of the LMCache paths checks the data it reads: "
    "raw-block's load reads the payload only (the slot header, with the key's identity and the length, is "
    "read at recovery, not on load), local-disk reads the file.",
    "- Durability. Tutti's store ends with its data and commit records on stable storage; the LMCache "
    "engines' store returns without an fsync (lmcache 0.5.6's raw-block core calls none; its index reaches the "
    "device in a metadata checkpoint every 60 s when idle), so `Store + fsync` is the like-for-like store column.",
    "- Baseline. fio's setting is chosen in one uncounted calibration pass per row; on this VM's virtual disk "
    "the speed changes within seconds and favours deep queues of large requests, so fio's median can be below "
    "engines that keep the whole prefix in flight (× fio above 1 there does not mean faster than the device). "
    "On tmpfs every engine is a memory copy on 2 shared cores: the spread between runs is large.",
]


def _notes(results, load):
    """Facts read off the results (no numbers typed in)."""
    out = ["", "Read off these rows:", ""]
    for r in results:
        med, rat, best = r["median"], r["ratios"], r["best_lmcache"]
        where = f"{r['medium']['kind']}, {r['workload']['prefix_tokens']} tokens"
        if best is None:
            continue
        t, b = med["tutti"]["retrieve"], med[best]["retrieve"]
        line = (f"- {where}: Tutti (checksums on) retrieves at {t['gbps']:.2f} GB/s, "
                f"{rat['tutti/best_lmcache_retrieve']:.2f}× the best LMCache engine ({r['engines'][best]['label']}, "
                f"{b['gbps']:.2f} GB/s), spending {t['cpu_s_per_gb']:.3f} CPU s/GB against its "
                f"{b['cpu_s_per_gb']:.3f}; checksums off: {rat['tutti_unverified/best_lmcache_retrieve']:.2f}×, "
                f"{med['tutti_unverified']['retrieve']['cpu_s_per_gb']:.3f} CPU s/GB.")
        if "fio" in med:
            line += f" fio read {med['fio']['retrieve']['gbps']:.2f} GB/s."
        out.append(line)
    met = [r for r in results if r["met"]["tutti/best_lmcache_retrieve"]]
    met_nv = [r for r in results if r["met"]["tutti_unverified/best_lmcache_retrieve"]]
    out += ["", f"Target (issue 15: Tutti ≥ {lc.TARGET:g}× the best LMCache engine on retrieve): met in {len(met)} of "
            f"{len(results)} rows with Tutti's checksums on (the LMCache engines check nothing), in {len(met_nv)} of "
            f"{len(results)} at the same verification level (checksums off)."]
    out += ["", f"Load average (1 min) of this shared 2-core machine: {load[0]:.2f} at the start, {load[1]:.2f} at "
            "the end; other sessions ran beside this benchmark."]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--disk-dir", default=str(ROOT / "build" / "bench"), help="directory on the disk")
    ap.add_argument("--tmpfs-dir", default="/dev/shm/tutti-lmcache-bench", help="directory on tmpfs")
    ap.add_argument("--media", default="disk,tmpfs", help="which of disk,tmpfs")
    ap.add_argument("--tokens", default="8192,32768", help="prefix lengths (multiples of 256)")
    ap.add_argument("--runs", type=int, default=5, help="runs per row, medians reported")
    ap.add_argument("--lmcache-python", default=None, help="an interpreter with lmcache: run its RawBlockCore too")
    ap.add_argument("--no-fio", action="store_true", help="skip the fio baseline")
    ap.add_argument("--cpu-threads", type=int, default=0,
                    help="Store.open(cpu_threads=) for Tutti's rows (0: the CPUs it may run on, at most 8)")
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "lmcache_compare_cpu.json"), help="raw results")
    ap.add_argument("--output", default=str(ROOT / "docs" / "benchmarks.md"), help="markdown file to update")
    ap.add_argument("--render", action="store_true",
                    help="measure nothing: write the section again from the --json file of an earlier run")
    args = ap.parse_args(argv)
    if args.render:
        with open(args.json) as f:
            saved = json.load(f)
        write_section(args, saved["command"], saved["results"], saved["load_average_1min"])
        print(f"wrote section {lc.COMPARE_TITLE!r} of {args.output} from {args.json}")
        return 0

    if not 0 <= args.cpu_threads <= 1024:
        ap.error("--cpu-threads: 0 (auto) to 1024")
    here = os.path.relpath(__file__, os.getcwd())
    command = " ".join(["python", shlex.quote(here), *map(shlex.quote, sys.argv[1:] if argv is None else argv)])
    dirs = {"disk": args.disk_dir, "tmpfs": args.tmpfs_dir}
    media = [m for m in args.media.split(",") if m]
    if any(m not in dirs for m in media):
        ap.error("--media: disk and/or tmpfs")
    try:
        tokens = [int(t) for t in args.tokens.split(",") if t]
    except ValueError:
        ap.error("--tokens: whole numbers")
    load0 = os.getloadavg()[0]
    results = []
    for medium in media:
        os.makedirs(dirs[medium], exist_ok=True)
        for n in tokens:
            print(f"== {medium}, {n} tokens", file=sys.stderr)
            cfg = lc.CompareConfig(path=os.path.join(dirs[medium], "compare.img"), prefix_tokens=n, runs=args.runs,
                                   fio=not args.no_fio, lmcache_python=args.lmcache_python, command=command,
                                   cpu_threads=args.cpu_threads)
            try:
                res = lc.run_compare(cfg, log=lambda msg: print(msg, file=sys.stderr, flush=True))
            except BenchError as e:
                print(f"lmcache_compare: {e}", file=sys.stderr)
                return e.code
            lr.print_compare(make_console(), res)
            results.append(res)
    load1 = os.getloadavg()[0]
    with open(args.json, "w") as f:
        json.dump({"command": command, "load_average_1min": [load0, load1], "results": results}, f, indent=1)
        f.write("\n")
    write_section(args, command, results, (load0, load1))
    print(f"wrote {args.json} and section {lc.COMPARE_TITLE!r} of {args.output}")
    return 0


def write_section(args, command, results, load):
    name = Path(args.json).name
    notes = [f"Raw runs: [benchmarks/{name}](../benchmarks/{name}).", *_notes(results, load), "", *HOW_TO_READ]
    replace_section(args.output, lc.COMPARE_TITLE, lr.markdown_section(results, command, notes=notes))


if __name__ == "__main__":
    sys.exit(main())
