#!/usr/bin/env python3
"""Store benchmark: layer-wise store/retrieve vs fio and a naive reader; writes docs/benchmarks.md.

Runs tutti.bench (the code behind `tutti-admin bench`) on a scratch file,
prints the result tables and replaces the section "Store: layer-wise retrieve
(file engine)" of docs/benchmarks.md.

    python benchmarks/store_bench.py            # short run: 8K-token prefix, 3 runs
    python benchmarks/store_bench.py --full     # documented run: 32K-token prefix, 5 runs
"""
import argparse
import os
import shlex
import sys
from pathlib import Path

from tutti import bench
from tutti.cli import make_console, parse_size, print_bench

ROOT = Path(__file__).resolve().parent.parent


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--path", action="append", default=None,
                    help="store member (repeatable; default: build/bench/store.img, created and removed)")
    ap.add_argument("--full", action="store_true", help="the documented run: 32768-token prefix, 5 runs")
    ap.add_argument("--prefix-tokens", type=int, default=None, help="prefix length (default 8192; --full 32768)")
    ap.add_argument("--runs", type=int, default=None, help="runs, medians reported (default 3; --full 5)")
    ap.add_argument("--size", default=None, help="store capacity, e.g. 2GiB (default: just the prefix)")
    ap.add_argument("--no-fio", action="store_true", help="skip the fio baselines")
    ap.add_argument("--engine", default="auto", help="I/O engine: auto, uring, psync")
    ap.add_argument("--output", default=str(ROOT / "docs" / "benchmarks.md"), help="markdown file to update")
    ap.add_argument("--keep", action="store_true", help="keep the scratch store file afterwards")
    ap.add_argument("--force", action="store_true", help="allow overwriting a --path that holds other data")
    args = ap.parse_args(argv)

    prefix = args.prefix_tokens or (32768 if args.full else 8192)
    runs = args.runs or (5 if args.full else 3)
    scratch = args.path is None
    paths = args.path or [str(ROOT / "build" / "bench" / "store.img")]
    try:
        size = parse_size(args.size) if args.size else None
    except ValueError as e:
        ap.error(f"--size: {e}")

    here = os.path.relpath(__file__, os.getcwd())
    cfg = bench.BenchConfig(
        paths=paths, prefix_tokens=prefix, runs=runs, size=size, fio=not args.no_fio, engine=args.engine,
        force=args.force,
        command=" ".join(["python", shlex.quote(here), *map(shlex.quote, sys.argv[1:] if argv is None else argv)]))
    try:
        res = bench.run_bench(cfg, log=lambda msg: print(msg, file=sys.stderr))
    except bench.BenchError as e:
        print(f"store_bench: {e}", file=sys.stderr)
        return e.code
    finally:
        if scratch and not args.keep:
            for p in paths:
                try:
                    os.unlink(p)
                except FileNotFoundError:
                    pass

    print_bench(make_console(), res)
    bench.write_markdown(args.output, res)
    print(f"wrote section {bench.SECTION_TITLE!r} of {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
