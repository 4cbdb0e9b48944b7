#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Compute/I-O interference benchmark driver (H200, green contexts, emulated controller).

  gpu_interference.py run --bin build/gpu/gpu_interference --out results.json [-- PROGRAM OPTIONS]
      runs benchmarks/gpu_interference.cu's program (its options after --, e.g.
      --reps 11, --iosms 8 --modes green) and prints its summary
  gpu_interference.py render --json results.json [--json more.json ...] --doc docs/benchmarks.md
      writes the section "Compute/I-O interference with green contexts (H200)" (only it)

The program measures each compute kernel alone and with a continuous gio_uring
load, interleaved rep by rep; times are medians, every rep is kept in the JSON.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

TITLE = "Compute/I-O interference with green contexts (H200)"
GOAL_PCT = 5.0


def run(args):
    extra = [a for a in args.extra if a != "--"]
    cmd = [args.bin, "--json", args.out] + extra
    print("#", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, timeout=args.timeout)
    if p.returncode != 0:
        print(f"# exit {p.returncode}", flush=True)
    return p.returncode


def load(paths):
    runs = []
    for path in paths:
        with open(path) as f:
            runs.append((os.path.basename(path), json.load(f)))
    return runs


def fmt_io(load_name, value):
    if value is None:
        return "n/a"
    return f"{value:.2f} M cmd/s" if load_name == "null" else f"{value:.1f} GB/s"


def io_value(load_name, gbps, mcmds):
    return mcmds if load_name == "null" else gbps


def placement(r):
    if r["green"]:
        return f"green: I/O {r['io_sms']} SMs, compute {r['compute_sms']} SMs"
    return f"fallback: plain streams, all {r['compute_sms']} SMs"


def render_section(runs):
    meta = runs[0][1]["meta"]
    loads, kernels, rows, alone_io = {}, {}, [], {}
    for name, d in runs:
        for x in d["loads"]:
            loads.setdefault(x["name"], x)
        for x in d["kernels"]:
            kernels.setdefault(x["name"], dict(x, runs=[]))["runs"].append(str(x["launches"]))
        for x in d["io_alone"]:
            alone_io[(name, x["load"], x["mode"])] = io_value(x["load"], x["gbps"], x["mcmds_per_s"])
        rows += [(name, r) for r in d["results"]]

    L = [f"## {TITLE}", ""]
    drv = meta["driver"]
    L.append(f"Measured {meta['date']} on {meta['gpu']} ({meta['sms']} SMs, driver API "
             f"{drv // 1000}.{drv % 1000 // 10}, {meta['cpus']} CPUs {meta['cpu_model'].strip()}) with:")
    L += ["", "```"]
    for _, d in runs:
        L.append(d["meta"]["command"])
    L += ["```", ""]
    notes = list(dict.fromkeys(d["note"] for _, d in runs if d.get("note")))
    for n in notes:
        L.append(f"{n}")
        L.append("")
    L.append("To reproduce: `scripts/gpu/h200_run.sh --tests` (builds `build/gpu/gpu_interference` against "
             "libtutti_gpu.so with the other programs), then `python3 benchmarks/gpu_interference.py run --bin "
             "build/gpu/gpu_interference --out gpu_interference_h200.json -- --reps 11`.")
    L.append("")
    L.append("Program: [benchmarks/gpu_interference.cu](../benchmarks/gpu_interference.cu); raw runs: "
             + ", ".join(f"[benchmarks/{n}](../benchmarks/{n})" for n, _ in runs)
             + ". Design: [gpu.md](gpu.md#sm-domains-green-contexts).")
    L.append("")
    gap = max(abs(w - g) for _, r in rows for a, b in (("alone_ms", "alone_wall_ms"), ("with_io_ms", "with_io_wall_ms"))
              for g, w in zip(r[a], r[b]))
    reps = ", ".join(f"{d['meta']['reps']} ({d['meta']['io_sms']}-SM I/O domain run)" if len(runs) > 1
                     else str(d["meta"]["reps"]) for _, d in runs)
    L.append("- Method: each compute kernel is launched back to back until one measurement takes about "
             f"{meta['target_ms']:.0f} ms on the compute domain; it runs alone, then with a continuous I/O load "
             "on the I/O stream (a host thread keeps layer batches queued; `tt_gio_submit_wait`, one kernel per "
             "layer), alternating which goes first rep by rep so drift cancels. One warm-up rep, then "
             f"{reps} reps; time = first block start to last block end over "
             "the measurement's launches (`%globaltimer`; host wall time, also in the JSON, is within "
             f"{gap:.2f} ms of it). Slowdown = median with I/O / median alone − 1; the range is over the "
             "per-rep pairs.")
    L.append("- Placements: **green** = `tt_gpu_domains_create(io_sms)`, I/O kernels in the I/O green context, "
             "compute kernels in the compute one (disjoint SMs); **fallback** = two plain streams over the "
             "whole GPU (what the library does without green contexts). The compute kernels are the same "
             "launches in both; grids of thousands of blocks, so the hardware spreads them over whatever SMs "
             "the context has.")
    L.append("- Compute kernels (self-contained, no cuBLAS):")
    for k in kernels.values():
        L.append(f"  - `{k['name']}`: {k['what']}; {' / '.join(k['runs'])} launches per measurement "
                 "(sized per run)" if len(runs) > 1 else
                 f"  - `{k['name']}`: {k['what']}; {k['launches']} launches per measurement")
    L.append("- I/O loads (emulated controller: host threads fetch the GPU-built SQEs and post CQEs):")
    for x in loads.values():
        if x["backing"] == "null":
            L.append(f"  - `null`: {x['queues']} queues × depth {x['depth']}, {x['ctrl_threads']} controller "
                     f"threads, {x['cmds_per_kernel']} reads of {x['object_bytes'] // 1024} KiB per layer kernel, "
                     "completed without moving data: the GPU submits and polls as fast as it can")
        else:
            L.append(f"  - `hostmem`: {x['queues']} queues × depth {x['depth']}, {x['ctrl_threads']} controller "
                     f"threads, {x['cmds_per_kernel']} reads of {x['object_bytes'] // 1024} KiB per layer kernel "
                     "from pinned host memory into HBM (the copy engine moves the data), capped at "
                     f"{x['rate_cap_gbps']:.0f} GB/s")
    L.append("")
    L.append("| I/O load | Kernel | Placement | Alone (ms) | Kernel alone | With I/O (ms) | Slowdown | "
             "Per-rep range | I/O during compute | I/O alone |")
    L.append("|---|---|---|---|---|---|---|---|---|---|")
    order = {"hostmem": 0, "null": 1}
    korder = {k: i for i, k in enumerate(kernels)}

    def key(nr):
        n, r = nr
        return (order.get(r["load"], 9), korder.get(r["kernel"], 9), not r["green"], -r["io_sms"])

    for n, r in sorted(rows, key=key):
        io_w = io_value(r["load"], r["io_gbps_med"], r["io_mcmds_per_s_med"])
        io_a = alone_io.get((n, r["load"], r["mode"]))
        slow = r["slowdown_pct"]
        mark = f"**{slow:+.1f}%**" if slow > GOAL_PCT else f"{slow:+.1f}%"
        L.append(f"| {r['load']} | {r['kernel']} | {placement(r)} | {r['alone_med_ms']:.1f} | "
                 f"{r['alone_throughput']:.0f} {r['throughput_unit']} | {r['with_io_med_ms']:.1f} | {mark} | "
                 f"{min(r['paired_pct']):+.1f} … {max(r['paired_pct']):+.1f}% | {fmt_io(r['load'], io_w)} | "
                 f"{fmt_io(r['load'], io_a)} |")
    L.append("")
    bad = sum(r["io_errors"] for _, r in rows)
    L.append(f"Every I/O command completed{' without error' if bad == 0 else f'; {bad} with an error'}. "
             f"Bold: above the {GOAL_PCT:.0f}% goal.")
    L.append("")

    # What the numbers say, computed from them.
    def pick(load_name, green, io_sms=None):
        return {r["kernel"]: r for _, r in rows if r["load"] == load_name and bool(r["green"]) == green
                and (io_sms is None or r["io_sms"] == io_sms)}

    def slows(rs):
        return ", ".join(f"`{k}` {r['slowdown_pct']:+.1f}%" for k, r in rs.items())

    io_sms = meta["io_sms"]
    gh, gn = pick("hostmem", True, io_sms), pick("null", True, io_sms)
    fh, fn = pick("hostmem", False), pick("null", False)
    if gh:
        io = statistics.median(r["io_gbps_med"] for r in gh.values())
        met = all(r["slowdown_pct"] <= GOAL_PCT for r in gh.values())
        L.append(f"- **Bandwidth load (hostmem, {io:.0f} GB/s achieved of the "
                 f"{loads['hostmem']['rate_cap_gbps']:.0f} GB/s cap): goal {'met' if met else 'NOT met'}** with "
                 f"the I/O kernels on {io_sms} SMs: {slows(gh)}. (The cap is a ceiling the emulator enforces; why "
                 "this path stays below it was not investigated here.)")
    if gn:
        met = all(r["slowdown_pct"] <= GOAL_PCT for r in gn.values())
        rate = statistics.median(r["io_mcmds_per_s_med"] for r in gn.values())
        ratio = rate / statistics.median(r["io_mcmds_per_s_med"] for r in gh.values()) if gh else float("nan")
        L.append(f"- **Maximum command rate (null, {rate:.0f} M commands/s during compute): goal "
                 f"{'met' if met else 'NOT met'}**: {slows(gn)}, although the two kernels share no SM. The "
                 f"hostmem load moves far more bytes (into HBM) but issues {ratio:.0f}× fewer commands and "
                 "costs the same kernels almost nothing: the interference follows the GPU-side command rate "
                 "(SQE and doorbell writes over PCIe, CQEs read back, queue atomics, per command), not the "
                 "data volume. Which shared resource it is was not identified: the tensor-core kernels suffer "
                 "most, the HBM-bound triad least, and an FP32 FMA kernel that works in registers showed none "
                 "under a similar null load (GPU io_uring section above), which points at the memory system "
                 "(L2, crossbar, address translation) rather than power or clocks; untested.")
    small = [r for _, r in rows if r["green"] and r["io_sms"] != io_sms]
    if small:
        n8 = {r["kernel"]: r for r in small if r["load"] == "null"}
        if n8:
            rate = statistics.median(r["io_mcmds_per_s_med"] for r in n8.values())
            L.append(f"- With {small[0]['io_sms']} I/O SMs the null load reaches {rate:.0f} M commands/s during "
                     f"compute and costs {slows(n8)}: fewer I/O SMs, fewer commands, less interference.")
    if gn and fn:
        L.append(f"- **Fallback (no partition)** at the maximum command rate: {slows(fn)}: lower than with green "
                 "contexts, but here the I/O is starved while compute holds the SMs: "
                 + ", ".join(f"{r['io_mcmds_per_s_med']:.0f} (fallback) vs {gn[k]['io_mcmds_per_s_med']:.0f} "
                             f"(green) M commands/s during `{k}`" for k, r in fn.items() if k in gn)
                 + ". With the bandwidth load: " + slows(fh) + ".")
    if gh and fh:
        cost = ", ".join(f"`{k}` {100 * (gh[k]['alone_med_ms'] / fh[k]['alone_med_ms'] - 1):+.1f}%"
                         for k in gh if k in fh)
        L.append(f"- **Price of the partition**: the same kernels alone on the {gh[next(iter(gh))]['compute_sms']}"
                 f"-SM compute domain vs the whole GPU take {cost} (HBM-bound work barely notices the missing "
                 "SMs; compute-bound work pays for them).")
    return "\n".join(L) + "\n"


def render(args):
    section = render_section(load(args.json))
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    from tutti.bench.report import replace_section  # only here: no cffi needed

    replace_section(args.doc, TITLE, section)
    print(section)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--bin", default="build/gpu/gpu_interference")
    r.add_argument("--out", default="gpu_interference.json")
    r.add_argument("--timeout", type=int, default=600)
    r.add_argument("extra", nargs=argparse.REMAINDER, help="options for the program, after --")
    r.set_defaults(fn=run)
    d = sub.add_parser("render")
    d.add_argument("--json", action="append", required=True, help="a program's JSON (repeatable)")
    d.add_argument("--doc", default="docs/benchmarks.md")
    d.set_defaults(fn=render)
    a = ap.parse_args()
    sys.exit(a.fn(a) or 0)


if __name__ == "__main__":
    main()
