#!/usr/bin/env python3
"""The engine alone on tmpfs: save a prefix, then three checked layer-wise retrieves of it in the same open.

Prints one JSON line: the store's GB/s and each retrieve's. The first retrieve reads pages the save just
wrote; A/B the engine's knobs through the environment around it, e.g. the populate step on the pages this
process's writes mapped (``TUTTI_TMPFS_POPULATE=1`` keeps it where there is no swap), the streamed copy
(``TUTTI_TMPFS_NT``), the dispatched hash (``TUTTI_XXH_DISPATCH``):

    for p in 0 1 0 1; do TUTTI_TMPFS_POPULATE=$p python benchmarks/store_first_read.py --tag pop$p; done
"""
import argparse
import json
import os
import random
import sys
import tempfile

from tutti.bench.passes import retrieve_pass, store_pass, verify
from tutti.bench.run import bench_key
from tutti.memory import PagedBuffer
from tutti.model import LLAMA3_8B
from tutti.store import Store


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--blocks", type=int, default=2048, help="Llama-3-8B blocks (2048 = 4 GiB)")
    ap.add_argument("--dir", default="/dev/shm", help="where the store file goes (tmpfs)")
    ap.add_argument("--cpu-threads", type=int, default=0, help="Store.open(cpu_threads=); 0: auto")
    ap.add_argument("--reads", type=int, default=3, help="retrieves after the save")
    ap.add_argument("--tag", default="", help="a label copied into the output")
    args = ap.parse_args(argv)
    if args.blocks < 1 or args.reads < 1 or args.cpu_threads < 0:
        ap.error("--blocks and --reads: 1 or more; --cpu-threads: 0 (auto) or more")
    n = args.blocks
    geo, _ = Store.plan(1, LLAMA3_8B, n_slots=n)
    ids = list(range(n))
    random.Random(1).shuffle(ids)
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="tutti-first-read-") as d, \
            PagedBuffer(geo.n_layers, geo.n_spans, n, geo.span_bytes) as src, \
            PagedBuffer(geo.n_layers, geo.n_spans, n, geo.span_bytes) as dst:
        path = os.path.join(d, "s.img")
        Store.format([path], LLAMA3_8B, n_slots=n)
        src.fill_random(ids, 1)
        out = {"tag": args.tag, "blocks": n, "cpu_threads": args.cpu_threads,
               "env": {k: v for k, v in os.environ.items() if k.startswith("TUTTI_")}}
        with Store.open([path], cpu_threads=args.cpu_threads) as st:
            src.register(st)
            dst.register(st)
            keys = [bench_key(0, i) for i in range(n)]
            out["store_gbps"] = store_pass(st, src, geo, keys, ids)["gbps"]
            slots = list(st.lookup(keys))
            out["retrieve_gbps"] = [retrieve_pass(st, dst, geo, slots, ids)["gbps"] for _ in range(args.reads)]
            verify(src, dst, geo, ids, "retrieve")
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except OSError as e:  # no room on the tmpfs, a store error: one line, not a traceback
        print(f"store_first_read: {e}", file=sys.stderr)
        sys.exit(1)
