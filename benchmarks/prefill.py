#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Layer-wise prefill benchmark (H200, emulated NVMe controller).

  prefill.py run --out prefill_h200.json [--quick] [--kv gio|store]
      profile one layer (small grid) and the store's I/O, then TTFT of a Llama-3-8B-shaped
      model (random bf16 weights) for 32K, 64K, 128K-token prompts: recompute vs prefix KV
      already in HBM vs Tutti (prefix KV read layer by layer from the store through GPU-built
      NVMe commands, overlapped with compute), and a fine hit-rate sweep around the model's
      predicted crossover to measure where bubbles start; --quick: 32K only, a few points (< 2 min)
  prefill.py render --json prefill_h200.json --doc docs/benchmarks.md
      writes the section "Layer-wise prefill (H200)" (only it)
  prefill.py model --json prefill_h200.json
      the model (tutti.sched) against a run: every point's TTFT and the crossovers, predicted with the
      I/O rate measured alone and with the one measured beside GEMMs (no GPU needed)

Two kinds of store (--kv):

  gio (default; the published numbers): raw gio_uring over 2 namespaces of one emulated controller
      (host threads, pinned host memory, bandwidth cap 2 x 14 GB/s), laid out as a formatted store
      would be; no store format, records or checksums (GioKV, slots).
  store: a real Tutti store (tutti.gpu.GpuStore) striped over 2 member files (on /dev/shm by
      default), moved by its gio data path: GPU threads build NVMe commands for an emulated
      controller (same cap) that serves the member files; every loaded block is verified against its
      commit record with checksums computed on the GPU (StoreKV, keys).  HUNG on the H200 in its
      first runs (a read through the store's gio path never completed; docs/gpu.md, Known issues).

The prefix KV is random bytes written to the store first, so hbm and tutti runs attend to identical
KV and must produce identical logits.

Crossover, measured exactly as tutti.sched.crossover_hit_rate predicts it: the hit rate h at
which one layer's load (h*T tokens of KV) takes as long as that layer's compute ((1-h)*T new
tokens attending to h*T cached ones): load and compute times per layer are the medians of
each run's CUDA-event spans, and h is interpolated linearly where load - compute changes sign.
"""
from __future__ import annotations

import argparse
import datetime
import faulthandler
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

SECTION_TITLE = "Layer-wise prefill (H200)"
BS = 16
PROFILE_GRID = [(n, p) for n in (2048, 4096, 8192, 16384) for p in (0, 16384, 28672, 57344, 126976)
                if n + p <= 131072] + [(32768, 0), (32768, 32768), (65536, 0), (65536, 65536), (131072, 0)]
QUICK_GRID = [(n, p) for n in (2048, 8192) for p in (0, 28672)] + [(32768, 0)]
RECHECK_GRID = [(4096, 28672), (16384, 16384), (32768, 0)]


def _burn_gpu(torch, dev, seconds: float) -> float:
    """Back-to-back bf16 GEMMs for ``seconds``: clocks and power state as under a real prefill."""
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(8):
            a @ a
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def sh(cmd: str) -> str:
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception:  # noqa: BLE001 - informational only
        return ""


def plan_runs(args) -> list[tuple[int, list[float], int]]:
    """(tokens, coarse hit rates, repeats); fine sweeps are added once the crossover is predicted."""
    if args.quick:
        return [(32768, [0.5, 1.0], 1)]
    return [(32768, [0.25, 0.5, 0.75, 1.0], 3), (65536, [0.5, 0.9, 1.0], 1), (131072, [0.75, 1.0], 1)]


def measured_crossover(points: list[dict]) -> float | None:
    """Hit rate where median load per layer - median compute per layer crosses zero (linear interpolation)."""
    pts = sorted((p["hit_rate"], p["layer_load_median_s"] - p["layer_compute_median_s"]) for p in points)
    for (h0, d0), (h1, d1) in zip(pts, pts[1:]):
        if d0 < 0 <= d1:
            return h0 + (h1 - h0) * (-d0) / (d1 - d0)
    return None


def bubble_onset(points: list[dict], threshold_s: float = 1e-3) -> tuple[float | None, float | None]:
    """(last hit rate without, first hit rate with) a between-layer bubble above threshold_s."""
    lo = hi = None
    for p in sorted(points, key=lambda p: p["hit_rate"]):
        if p["hit_rate"] >= 1.0:
            continue
        if p["bubble_s"] - p["fill_s"] > threshold_s:
            hi = p["hit_rate"]
            break
        lo = p["hit_rate"]
    return lo, hi


def command_line(args) -> str:
    """The command recorded in the results (and rendered into benchmarks.md)."""
    return ("python3 benchmarks/prefill.py run" + (" --quick" if args.quick else "")
            + (" --kv store" if args.kv == "store" else ""))


class GioStore:
    """--kv gio: raw gio_uring (GioKV) over an emulated controller backed by pinned host memory, laid out as a
    formatted store would be; blocks go to slots, no records or checksums.  The path of the published numbers
    (the benchmark as it was before the store path, 4a6ed94^)."""

    def __init__(self, args, shape, cache, n_blocks: int, max_writes: int):
        from tutti.prefill import GioKV
        from tutti.prefill.kvio import open_emulated_store

        self.args, self.n_blocks, self.n_layers = args, n_blocks, shape.n_layers
        self.ctrl, self.gio, self.geo = open_emulated_store(
            shape, dtype="bfloat16", n_slots=n_blocks + max_writes, n_ns=args.namespaces, rate_gbps=args.rate_gbps,
            n_queues=args.queues, n_threads=args.threads, depth=args.depth)
        self.kv = GioKV(self.gio, self.geo, cache, n_blocks)
        self.write_slots = list(range(n_blocks, n_blocks + max_writes))

    @staticmethod
    def meta(args) -> dict:
        return {"emulator": {"namespaces": args.namespaces, "rate_cap_gbps": args.rate_gbps, "backing": "hostmem",
                             "queues": args.queues, "threads": args.threads, "depth": args.depth}}

    def describe(self) -> str:
        return f"{self.args.namespaces} namespaces"

    def io_targets(self, n: int) -> list:
        return list(range(n))

    def store_prefix(self, torch, table) -> tuple[list, float, int]:
        """(slots, seconds, failed commands): every block of ``table`` written to shuffled slots."""
        slots = torch.randperm(self.n_blocks, generator=torch.Generator().manual_seed(3)).tolist()
        self.kv.bind([], [], slots, table.tolist())
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for l in range(self.n_layers):
            self.kv.write(l, None)
        torch.cuda.synchronize()
        return slots, time.perf_counter() - t0, self.kv.errors()

    def restored(self) -> None:
        pass  # the raw path has no per-block status (io_errors of the runs counts failed commands)

    def write_targets(self) -> list:
        return self.write_slots  # every run writes the same slots

    def after_tutti(self, d: dict) -> None:
        pass

    def stats(self) -> dict:
        return {"emulator_stats": self.ctrl.stats()}

    def close(self) -> None:
        self.kv.close()
        self.gio.close()
        self.ctrl.close()


class TuttiStore:
    """--kv store: a formatted Tutti store (GpuStore) through its gio data path (StoreKV): the emulated controller
    serves the store's member files; blocks are committed under keys and verified by GPU checksums on every load."""

    def __init__(self, args, shape, cache, n_blocks: int, max_writes: int):
        from tutti.prefill.kvio import StoreKV, open_store

        self.args, self.n_blocks, self.n_layers = args, n_blocks, shape.n_layers
        self.max_writes, self.run_id = max_writes, 0
        n_slots = n_blocks + max_writes + 64
        slot_bytes = shape.n_layers * 2 * -(-shape.block_size * shape.n_kv_heads * shape.head_dim * 2 // 4096) * 4096
        need, free = n_slots * slot_bytes * 1.02 + 64 * 2**20, shutil.disk_usage(args.store_dir).free
        if free < need:
            sys.exit(f"{args.store_dir}: {free / 2**30:.1f} GiB free, the store needs {need / 2**30:.1f} GiB "
                     "(--store-dir elsewhere, or --quick)")
        self.dir = tempfile.mkdtemp(prefix="tutti-prefill-", dir=args.store_dir)
        self.store = open_store(shape, self.dir, dtype="bfloat16", n_slots=n_slots, n_members=args.namespaces,
                                path="gio", rate_gbps=args.rate_gbps, n_queues=args.queues, n_threads=args.threads,
                                depth=args.depth)
        self.geo = self.store.geometry
        self.kv = StoreKV(self.store, cache)

    @staticmethod
    def meta(args) -> dict:
        return {"emulator": {"namespaces": args.namespaces, "rate_cap_gbps": args.rate_gbps,
                             "backing": f"file (the store's members in {args.store_dir})", "queues": args.queues,
                             "threads": args.threads, "depth": args.depth},
                "store": {"path": "gio", "dir": args.store_dir, "members": args.namespaces,
                          "verify": "GPU XXH3, every load"}}

    def describe(self) -> str:
        return f"{self.args.namespaces} members in {self.dir}, gio path"

    def io_targets(self, n: int) -> list:
        return [f"io-{i}" for i in range(n)]

    def store_prefix(self, torch, table) -> tuple[list, float, int]:
        """(slots, seconds, failed blocks): every block of ``table`` committed under its key."""
        keys = [f"prefix-{b}" for b in range(self.n_blocks)]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        self.kv.bind([], [], keys, table.tolist())
        for l in range(self.n_layers):
            self.kv.write(l, None)
        errors = self.kv.finish()  # durable and committed
        fill_s = time.perf_counter() - t0
        slots = self.store.lookup(keys)
        if errors or None in slots:
            sys.exit(f"storing the prefix failed: {errors} blocks, status {self.kv.last_status['write'][:8]}...")
        return slots, fill_s, errors

    def restored(self) -> None:
        if self.kv.finish():
            raise RuntimeError(f"restoring the prefix: status {self.kv.last_status['read']}")

    def write_targets(self) -> list:
        self.run_id += 1  # fresh keys: the previous run's blocks were dropped
        return [f"run{self.run_id}-{k}" for k in range(self.max_writes)]

    def after_tutti(self, d: dict) -> None:
        d["blocks_verified"] = len(self.kv.last_status["read"])  # GPU checksums checked against the records
        d["blocks_written"] = len(self.kv.written_slots)
        self.kv.discard_writes()  # free slots for the next run's writes

    def stats(self) -> dict:
        return {"emulator_stats": self.store.emulator_stats(), "store_stats": self.store.stats()}

    def close(self) -> None:
        self.kv.close()
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)


KV_KINDS = {"gio": GioStore, "store": TuttiStore}


def run(args):
    t_start = time.perf_counter()
    Store = KV_KINDS[args.kv]
    import torch

    from tutti import gpu
    from tutti.prefill import LLAMA3_8B_SHAPE, Decoder, PagedKVCache, PrefillHarness, new_block_table
    from tutti.prefill.profiling import device_name, measure_io, profile_layer, profile_table
    from tutti.sched import ComputeProfile, Hardware, SlackScheduler, crossover_hit_rate, plan_io

    def log(msg):
        print(f"[{time.perf_counter() - t_start:6.1f}s] {msg}", flush=True)
        faulthandler.dump_traceback_later(args.watchdog_s, exit=True)  # no progress for this long: a hang

    dev = torch.device("cuda")
    torch.cuda.init()
    shape = LLAMA3_8B_SHAPE
    out = {"meta": {
        "date": datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat(),
        "command": command_line(args),
        "gpu": sh("nvidia-smi --query-gpu=name,driver_version --format=csv,noheader"),
        "cpus": os.cpu_count(), "cpu_model": sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2").strip(),
        "kernel": platform.release(), "torch": torch.__version__, "python": platform.python_version(),
        "library": str(gpu.library_path()),
        "model": {**shape.to_dict("bfloat16"), "name": "Llama-3-8B shape, random weights"},
        **Store.meta(args),
    }, "runs": [], "sweeps": {}}

    def save():
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)

    runs = plan_runs(args)
    max_t = max(t for t, _, _ in runs)

    # 1. profile one layer, once the GPU has left its idle clocks (a cold first run profiled every point
    #    about 2x slower than the same layers ran inside the pipeline later)
    warm_s = _burn_gpu(torch, dev, args.warm_s)
    grid = QUICK_GRID if args.quick else PROFILE_GRID
    pts = profile_layer(shape, grid, device=dev, dtype=torch.bfloat16, repeats=3)
    log(f"profiled {len(pts)} points after {warm_s:.1f} s of GEMMs")
    torch.cuda.empty_cache()

    # 2. model, cache, store
    model = Decoder(shape, device=dev, dtype=torch.bfloat16, vocab=128256, seed=1)
    n_blocks = max_t // BS
    cache = PagedKVCache(shape, n_blocks, device=dev, dtype=torch.bfloat16)
    cache.kv.normal_()
    # write region: the new full blocks of the run with the most of them (32K: any hit rate, for the
    # fine sweep wherever the crossover falls)
    max_writes = max([(t - int(min(hs) * t)) // BS for t, hs, _ in runs] + [32768 // BS])
    store = Store(args, shape, cache, n_blocks, max_writes)
    geo, kv = store.geo, store.kv
    log(f"model, {cache.kv.numel() * 2 / 2**30:.1f} GiB cache, store of {geo.n_slots} slots on {store.describe()}")

    # 3. store I/O rates (write then bit-exact read-back of 32K tokens' KV, all layers; 16K with --quick)
    n_io = 1024 if args.quick else 2048
    io = measure_io(kv, cache, n_io, store.io_targets(n_io))
    log(f"I/O: write {io['write_gbps']:.2f} GB/s, read {io['read_gbps']:.2f} GB/s under compute "
        f"(idle {io['write_gbps_idle']:.2f} / {io['read_gbps_idle']:.2f}), bit-exact {io['bit_exact']}")
    out["io"] = io
    # the model plans with the rates measured alone (sched.plan_io: the loads inside a prefill ran at
    # them on the H200; the rates beside GEMMs were up to 2.5x pessimistic)
    prof_json = profile_table(shape, pts, device=device_name(dev), dtype="bfloat16",
                              io={"read_gbps": io["read_gbps"], "write_gbps": io["write_gbps"],
                                  "n_ssd": args.namespaces, "read_gbps_idle": io["read_gbps_idle"],
                                  "write_gbps_idle": io["write_gbps_idle"]})
    out["profile"] = prof_json
    profile = ComputeProfile.from_json(prof_json)
    pio = plan_io(prof_json["io"])
    hw = Hardware(read_gbps=pio["read_gbps"], write_gbps=pio["write_gbps"], n_ssd=args.namespaces)
    sched = SlackScheduler(shape, hw, profile, prefetch_depth=2)
    out["fit"] = profile.describe()
    save()

    # 4. the prefix KV: every block of the longest prompt, in a shuffled block table (gio: to shuffled slots;
    #    store: committed under keys)
    table = new_block_table(n_blocks, n_blocks, seed=2, device=dev)
    slots, fill_s, fill_errors = store.store_prefix(torch, table)
    ref = cache.kv.view(torch.int16).sum(dim=(1, 3, 4, 5))  # [layer, block] sums of the stored bytes
    out["store_fill"] = {"blocks": n_blocks, "bytes": n_blocks * 2 * geo.span_bytes * shape.n_layers,
                         "s": fill_s, "errors": fill_errors}
    log(f"stored {n_blocks} blocks in {fill_s:.2f} s")

    harness = PrefillHarness(model, cache, kv)
    gen = torch.Generator().manual_seed(4)

    def restore_prefix(tbl, nb):
        """Put the stored prefix KV into HBM (untimed; nothing else runs meanwhile): what hbm mode assumes."""
        if nb:
            kv.bind(slots[:nb], tbl[:nb].tolist(), [], [])
            for l in range(shape.n_layers):
                kv.read(l, harness.io)
            store.restored()
            torch.cuda.synchronize()

    def one(mode, T, h, tokens, tbl):
        hit = int(h * T)
        plan = sched.plan_prefill(T, hit) if mode == "tutti" else None
        if mode == "tutti":
            nb = plan.load_blocks
            for l in range(shape.n_layers):  # the prefix must really come from the store
                cache.kv[l][:, tbl[:nb].long()] = 0
        r = harness.run(mode, tokens, tbl, hit, plan=plan, read_slots=slots,
                        write_slots=store.write_targets() if mode == "tutti" else ())
        d = r.to_dict()
        d["hit_rate"] = h
        if mode == "tutti":
            store.after_tutti(d)
            ids = tbl[:plan.load_blocks].long()
            d["kv_matches_store"] = all(  # per layer: one layer's blocks at a time fit beside the model
                torch.equal(cache.kv[l][:, ids].view(torch.int16).sum(dim=(0, 2, 3, 4)), ref[l, ids])
                for l in range(shape.n_layers))
            p = plan.predicted
            d["predicted"] = {"ttft_s": p.ttft_s, "bubble_s": p.bubble_s, "layer_io_s": p.layer_io_s,
                              "layer_compute_s": p.layer_compute_s, "hbm_ttft_s": p.hbm_ttft_s,
                              "recompute_ttft_s": p.recompute_ttft_s}
            d["plan"] = {"writes_in_prefill": sum(len(w) for w in plan.writes_after_layer),
                         "deferred_writes": len(plan.deferred_writes)}
        return r, d

    # Warm-up: kernels, cuBLAS, flash attention, the gio path.  Every (prompt, hit rate) runs hbm before
    # tutti: CUDA loads a kernel's module at its first launch (lazy loading) and waits for the device to
    # idle, which never happens while a gio kernel spins on the emulated controller (the first run of
    # this benchmark hung that way); hbm mode launches the same compute kernels with no I/O in flight.
    tok = torch.randint(0, 128256, (8192,), generator=gen).to(dev)
    one("recompute", 8192, 0.0, tok, table[:8192 // BS])
    restore_prefix(table, sched.plan_prefill(8192, 4096).load_blocks)
    one("hbm", 8192, 0.5, tok, table[:8192 // BS])
    one("tutti", 8192, 0.5, tok, table[:8192 // BS])
    log("warm")

    def sweep(T, hs, repeats, tokens, tbl, key=None, modes=("hbm", "tutti")):
        for h in hs:
            group = {}
            for mode in modes:
                if mode == "hbm":
                    restore_prefix(tbl, sched.plan_prefill(T, int(h * T)).load_blocks)
                ds = []
                for _ in range(repeats):
                    r, d = one(mode, T, h, tokens, tbl)
                    ds.append((d, r.logits))
                ds.sort(key=lambda x: x[0]["ttft_s"])
                d, logits = ds[len(ds) // 2]
                d["ttft_runs_s"] = [x[0]["ttft_s"] for x in ds]
                group[mode] = (d, logits)
            if "tutti" in group and "hbm" in group:
                group["tutti"][0]["logits_equal_hbm"] = bool(torch.equal(group["tutti"][1], group["hbm"][1]))
            for d, _ in group.values():
                d["sweep"] = key
                out["runs"].append(d)
            t = group.get("tutti", (None,))[0]
            if t:
                log(f"T={T} h={h:.3f} tutti {t['ttft_s'] * 1e3:.0f} ms (pred {t['predicted']['ttft_s'] * 1e3:.0f}), "
                    f"bubble {t['bubble_s'] * 1e3:.1f} ms, load/compute per layer "
                    f"{t['layer_load_median_s'] * 1e3:.2f}/{t['layer_compute_median_s'] * 1e3:.2f} ms"
                    + (f", hbm {group['hbm'][0]['ttft_s'] * 1e3:.0f} ms" if "hbm" in group else ""))
            save()

    def prompt(T):
        g = torch.Generator().manual_seed(T)
        return torch.randint(0, 128256, (T,), generator=g).to(dev), table[:-(-T // BS)]

    def fine_sweep(T, offsets):
        tokens, tbl = prompt(T)
        hstar = out["sweeps"][str(T)]["predicted_crossover"]
        hs_fine = sorted({round(min(1.0, max(0.0, hstar + d)), 4) for d in offsets})
        sweep(T, hs_fine, 1, tokens, tbl, key="fine")
        pts_fine = [d for d in out["runs"] if d["mode"] == "tutti" and d["total_tokens"] == T]
        m = measured_crossover(pts_fine)
        out["sweeps"][str(T)].update(measured_crossover=m, points=len(pts_fine))
        log(f"T={T} crossover predicted {hstar:.4f}, measured {m}")
        save()

    fine = {32768: [-0.08, -0.05, -0.03, -0.015, 0.0, 0.015, 0.03, 0.05, 0.08],
            65536: [-0.06, -0.03, 0.0, 0.03, 0.06]}
    if args.quick:
        fine = {32768: [-0.05, 0.0, 0.05]}
    for T, hs, repeats in runs:
        if time.perf_counter() - t_start > args.budget_s:
            log(f"budget reached: skipping T={T}")
            out.setdefault("skipped", []).append(T)
            continue
        tokens, tbl = prompt(T)
        for _ in range(repeats if T <= 32768 else 1):
            r, d = one("recompute", T, 0.0, tokens, tbl)
            d["sweep"] = None
            out["runs"].append(d)
        log(f"T={T} recompute {d['ttft_s'] * 1e3:.0f} ms")
        out["sweeps"][str(T)] = {"predicted_crossover": crossover_hit_rate(shape, hw, profile, T)}
        sweep(T, hs, repeats, tokens, tbl)
        if T == 32768:  # the 32K sweep first; 64K's after every prompt ran, if time is left
            fine_sweep(T, fine[T])
        save()
    for T in (65536,):
        if T in fine and str(T) in out["sweeps"]:
            if time.perf_counter() - t_start > args.budget_s:
                log(f"budget reached: no fine sweep at T={T}")
                out.setdefault("skipped", []).append(f"fine sweep {T}")
            else:
                fine_sweep(T, fine[T])

    # The same model fed with the layer times measured inside the pipeline (prefix-in-HBM and recompute
    # runs) instead of the one-layer profile: tells a wrong profile apart from a wrong model.
    insitu = [{"new_tokens": r["new_tokens"], "prefix_tokens": r["total_tokens"] - r["new_tokens"],
               "layer_s": statistics.median(r["layer_compute_s"])}
              for r in out["runs"] if r["mode"] in ("hbm", "recompute") and r["total_tokens"] >= 16384]
    if len(insitu) >= 3:
        ip = ComputeProfile.from_json(dict(prof_json, compute=insitu))
        out["insitu_fit"] = ip.describe()
        for T, sw in out["sweeps"].items():
            sw["predicted_crossover_insitu"] = crossover_hit_rate(shape, hw, ip, int(T))
            log(f"T={T} crossover from in-pipeline layer times {sw['predicted_crossover_insitu']:.4f}, "
                f"measured {sw.get('measured_crossover')}")
    # did the one-layer profile drift? (same points again, GPU warm)
    again = profile_layer(shape, RECHECK_GRID, device=dev, dtype=torch.bfloat16, repeats=3)
    first = {(q["new_tokens"], q["prefix_tokens"]): q["layer_s"] for q in pts}
    out["profile_recheck"] = [dict(q, first_s=first.get((q["new_tokens"], q["prefix_tokens"])),
                                   insitu_model_s=ip.layer_time(q["new_tokens"], q["prefix_tokens"])
                                   if len(insitu) >= 3 else None) for q in again]
    log("profile recheck: " + ", ".join(f"{q['new_tokens']}/{q['prefix_tokens']}: {q['layer_s'] * 1e3:.1f} ms "
                                       f"(first {q['first_s'] * 1e3:.1f})" for q in out["profile_recheck"]
                                       if q["first_s"]))
    out.update(store.stats())
    out["elapsed_s"] = time.perf_counter() - t_start
    store.close()
    save()
    log(f"done, {out['elapsed_s']:.0f} s")


# ------------------------------------------------------------------ render


def _ms(s):
    return "n/a" if s is None else f"{s * 1e3:.0f}"


def _gpus(gpu: str) -> str:
    """nvidia-smi's one line per GPU, as one line ("NVIDIA H200, 580.x (2 on the host)")."""
    lines = [x.strip() for x in gpu.splitlines() if x.strip()]
    if len(lines) > 1 and len(set(lines)) == 1:
        return f"{lines[0]} ({len(lines)} on the host, one used)"
    return "; ".join(lines)


def _store_line(m: dict) -> str:
    """What the store was: results with a "store" key ran --kv store, the others raw gio_uring (--kv gio)."""
    e = m["emulator"]
    n, cap = e["namespaces"], e["rate_cap_gbps"]
    ctrl = f"{e['queues']} queues, {e['threads']} controller threads"
    cap_s = f"bandwidth cap {cap:g} GB/s in total ({n} x {cap / n:g} GB/s)"
    if m.get("store"):
        line = (f"- Store: a formatted Tutti store (`tutti.gpu.GpuStore`) over {n} member files ({e['backing']}), "
                f"moved by its gio data path: one emulated NVMe controller ({ctrl}) serves the member files, "
                f"{cap_s}; commit records, and every loaded block verified against them with XXH3 computed on "
                "the GPU; GPU threads build one NVMe command per 32 KiB object from one descriptor per layer.")
    else:
        backing = "pinned host memory" if e.get("backing") == "hostmem" else e.get("backing")
        line = (f"- Store: raw gio_uring over {n} namespaces of one emulated NVMe controller whose namespaces are "
                f"{backing} ({ctrl}), {cap_s}; objects laid out as a formatted store places them "
                "(`tt_store_plan`/`tt_locate`), but no store format, commit records or checksums; GPU threads "
                "build one NVMe command per 32 KiB object from one descriptor per layer.")
    return line


def _io_note(m: dict, io: dict) -> str:
    cap = m["emulator"]["rate_cap_gbps"]
    idle = min(io.get("read_gbps_idle", io.get("read_gbps", 0)), io.get("write_gbps_idle", io.get("write_gbps", 0)))
    busy = min(io.get("read_gbps", 0), io.get("write_gbps", 0))
    if not cap:
        return ""
    return (f"The I/O path alone moves {100 * idle / cap:.0f}% of the cap; with GEMMs on the GPU, "
            f"{100 * busy / cap:.0f}%.")


def render_section(data: dict) -> str:
    m, runs, io = data["meta"], data["runs"], data.get("io", {})
    L = [f"## {SECTION_TITLE}", "", f"Measured {m['date']} with:", "", "```",
         "make -j16 DEPS_ROOT=.h200/root BUILD=build/h200 gpu-lib",
         "TUTTI_GPU_LIB=build/h200/libtutti_gpu.so PYTHONPATH=python " + m["command"], "```", "",
         "Raw results: [benchmarks/prefill_h200.json](../benchmarks/prefill_h200.json). Design and limits: "
         "[prefill.md](prefill.md).", "",
         f"- Machine: {_gpus(m['gpu'])}; {m['cpus']} CPUs ({m['cpu_model']}); Linux {m['kernel']}; "
         f"PyTorch {m['torch']}",
         "- Model: Llama-3-8B shape (32 layers, hidden 4096, 32 heads, 8 KV heads, head dim 128, MLP 14336), "
         "random bf16 weights; vLLM-style paged KV cache (16-token blocks, shuffled block table); flash "
         "attention (lower-right causal) over the gathered prefix + new keys.",
         _store_line(m),
         f"- Store I/O measured before the runs (32K tokens' KV, all layers) while GEMMs keep the GPU busy on "
         f"another stream: write {io.get('write_gbps', 0):.2f} GB/s, read {io.get('read_gbps', 0):.2f} GB/s "
         f"(I/O alone: write {io.get('write_gbps_idle', io.get('write_gbps', 0)):.2f}, read "
         f"{io.get('read_gbps_idle', io.get('read_gbps', 0)):.2f}); read-back bit-exact: "
         f"{'yes' if io.get('bit_exact') else 'NO'}. The scheduler's model plans with the rates measured alone "
         "(tutti.sched.plan_io) and the profiled layer times. " + _io_note(m, io),
         "- Prefix KV: random bytes written to the store first (hbm and tutti attend to identical KV); before each "
         "tutti run the prefix blocks in HBM are zeroed, so they can only come from the store.", ""]
    rec = {}
    for r in runs:
        if r["mode"] == "recompute" and r["total_tokens"] >= 16384:
            rec.setdefault(r["total_tokens"], []).append(r["ttft_s"])
    by = {}
    for r in runs:
        if r["mode"] in ("tutti", "hbm") and r.get("sweep") is None:
            by.setdefault((r["total_tokens"], r["hit_rate"]), {})[r["mode"]] = r
    L += ["TTFT (ms, median of the runs shown); bubble = time the compute stream waited for KV (fill of layer 0 "
          "included); predicted = tutti.sched's model from the profile:", "",
          "| Prompt | Hit rate | Recompute | Prefix in HBM | Tutti | Tutti predicted | Bubble (fill) | "
          "Tutti compute vs HBM | Speedup vs recompute | Writes in prefill / deferred | Checks |",
          "|---|---|---|---|---|---|---|---|---|---|---|"]
    for (T, h), g in sorted(by.items()):
        t, hb = g.get("tutti"), g.get("hbm")
        rc = statistics.median(rec[T]) if T in rec else None
        checks = "n/a"
        if t:
            ok = t.get("kv_matches_store") and t.get("logits_equal_hbm", True) and not t["io_errors"]
            checks = "ok" if ok else "FAIL"
        L.append(f"| {T // 1024}K | {h:.2f} | {_ms(rc)} | {_ms(hb and hb['ttft_s'])} | "
                 f"**{_ms(t and t['ttft_s'])}** | {_ms(t and t['predicted']['ttft_s'])} | "
                 f"{_ms(t and t['bubble_s'])} ({_ms(t and t['fill_s'])}) | "
                 f"{(100 * (t['compute_s'] / hb['compute_s'] - 1)) if (t and hb) else float('nan'):+.1f}% | "
                 f"{(rc / t['ttft_s']) if (t and rc) else float('nan'):.2f}x | "
                 f"{t['writes_in_prefill'] if t else '-'} / {t['deferred_writes'] if t else '-'} | {checks} |")
    L += ["", "Checks: the loaded prefix KV's per-block sums equal the stored bytes', tutti's logits are "
          "bit-identical to the all-in-HBM run's, and no NVMe command failed"
          + (" (and every loaded block passed its checksum)" if m.get("store") else "")
          + ". \"Tutti compute vs HBM\": the "
          "layers' compute time with the I/O kernels and the emulated controller's copies running beside it, "
          "against the same compute alone (I/O and compute share all SMs here; no green contexts).", ""]
    sw = data.get("sweeps", {})
    if any("measured_crossover" in v for v in sw.values()):
        L += ["Crossover hit rate (where one layer's load takes as long as its compute; above it bubbles open "
              "between layers), measured on a fine sweep vs predicted by `tutti.sched.crossover_hit_rate`:", "",
              "| Prompt | Predicted (profile) | Measured | Difference | Predicted from in-pipeline layer times | "
              "Bubbles between layers first seen (vs predicted) |",
              "|---|---|---|---|---|---|"]
        for T, v in sorted(sw.items(), key=lambda kv: int(kv[0])):
            if "measured_crossover" not in v:
                continue
            mc, pc = v["measured_crossover"], v["predicted_crossover"]
            diff = f"{100 * (mc - pc) / pc:+.1f}%" if mc is not None else "not crossed in the sweep"
            ins = v.get("predicted_crossover_insitu")
            lo, hi = bubble_onset([r for r in runs if r["mode"] == "tutti" and r["total_tokens"] == int(T)])
            onset = "not seen" if hi is None else f"{lo:.3f}–{hi:.3f} ({100 * (lo - pc) / pc:+.0f}% to " \
                f"{100 * (hi - pc) / pc:+.0f}%)"
            L.append(f"| {int(T) // 1024}K | {pc:.3f} | {'n/a' if mc is None else f'{mc:.3f}'} | {diff} | "
                     f"{'n/a' if ins is None else f'{ins:.3f}'} | {onset} |")
        L += ["", "How to read this: inside the pipeline a layer's load span (its gio kernel on the I/O stream) "
              "tracks that layer's compute span to within about 0.1 ms below the crossover, so the measured "
              "load is not a pure transfer time (the emulated controller's host threads share the CUDA runtime "
              "with the thread that enqueues compute; the cause is not established). The last column is the "
              "observable that does not depend on that span: the pair of sweep points between which the "
              "compute stream first waits more than 1 ms for KV between layers (fill excluded).",
              "", "Fine sweep (tutti, per-layer medians in ms):", "",
              "| Prompt | Hit rate | Load / layer | Compute / layer | Predicted load / compute | Bubble | "
              "of it between layers | TTFT |", "|---|---|---|---|---|---|---|---|"]
        fine = (r for r in runs if r.get("sweep") == "fine" and r["mode"] == "tutti")
        for r in sorted(fine, key=lambda r: (r["total_tokens"], r["hit_rate"])):
            p = r["predicted"]
            L.append(f"| {r['total_tokens'] // 1024}K | {r['hit_rate']:.3f} | {r['layer_load_median_s'] * 1e3:.2f} | "
                     f"{r['layer_compute_median_s'] * 1e3:.2f} | {p['layer_io_s'] * 1e3:.2f} / "
                     f"{p['layer_compute_s'] * 1e3:.2f} | {r['bubble_s'] * 1e3:.1f} | "
                     f"{(r['bubble_s'] - r['fill_s']) * 1e3:.1f} | {r['ttft_s'] * 1e3:.0f} |")
        L.append("")
    f = data.get("fit", {})
    if f:
        L += [f"Profile: {f.get('points')} points of one layer, fitted t = a + b·n + c·n·(p + n/2) with "
              f"a = {f['a_s'] * 1e3:.3f} ms, b = {f['b_s_per_token'] * 1e9:.1f} ns/token, "
              f"c = {f['c_s_per_pair'] * 1e12:.3f} ps/pair (rms error {100 * f.get('rms_rel_err', 0):.1f}%, "
              f"max {100 * f.get('max_rel_err', 0):.1f}%).", ""]
    rc = data.get("profile_recheck")
    if rc:
        L += ["Profile drift: the same layer shapes profiled again at the end of the run (GPU warm): " +
              ", ".join(f"{q['new_tokens']} new / {q['prefix_tokens']} cached: {q['layer_s'] * 1e3:.1f} ms "
                        f"(first {q['first_s'] * 1e3:.1f})" for q in rc if q.get("first_s")) +
              ". The profile is taken after a few seconds of GEMMs: an earlier run that profiled a cold GPU "
              "measured every point about 2x slower than the same layers ran inside the pipeline, and its "
              "predicted crossover was 12% off.", ""]
    if data.get("skipped"):
        L += [f"Skipped for the time budget: {', '.join(str(t) for t in data['skipped'])} tokens.", ""]
    return "\n".join(L)


def render(args):
    from tutti.bench.report import replace_section

    with open(args.json) as f:
        data = json.load(f)
    sec = render_section(data)
    replace_section(args.doc, SECTION_TITLE, sec + "\n")
    print(sec)


def model_check(args) -> None:
    """Print the model's TTFT and crossover against a run, with either I/O rate."""
    from tutti.sched.measured import check

    with open(args.json) as f:
        run_json = json.load(f)
    res = {s: check(run_json, s) for s in ("alone", "gemms")}
    print(f"| Prompt | Hit rate | Measured (ms) | Predicted, I/O alone ({res['alone']['read_gbps']:.1f} GB/s) | "
          f"error | Predicted, I/O beside GEMMs ({res['gemms']['read_gbps']:.1f} GB/s) | error |")
    print("|---|---|---|---|---|---|---|")
    for a, g in zip(res["alone"]["points"], res["gemms"]["points"]):
        print(f"| {a['tokens'] // 1024}K | {a['hit_rate']:.3f} | {a['measured_s'] * 1e3:.0f} | "
              f"{a['predicted_s'] * 1e3:.0f} | {a['err'] * 100:+.1f}% | {g['predicted_s'] * 1e3:.0f} | "
              f"{g['err'] * 100:+.1f}% |")
    for s in ("alone", "gemms"):
        r = res[s]
        cr = ", ".join(f"{c['tokens'] // 1024}K {c['predicted']:.3f} vs {c['measured']:.3f} ({c['err'] * 100:+.1f}%)"
                       for c in r["crossovers"])
        print(f"\nI/O {s}: largest TTFT error {r['max_abs_err'] * 100:.1f}% over {len(r['points'])} points; "
              f"crossover predicted vs measured: {cr}")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", default="prefill_h200.json")
    r.add_argument("--quick", action="store_true", help="32K only, few points (a smoke test)")
    r.add_argument("--kv", choices=sorted(KV_KINDS), default="gio",
                   help="gio: raw gio_uring over a host-memory emulated controller (the published numbers); "
                        "store: a Tutti store through its gio data path (hung on the H200 in its first runs)")
    r.add_argument("--namespaces", type=int, default=2)
    r.add_argument("--rate-gbps", type=float, default=28.0, help="bandwidth cap over all namespaces")
    r.add_argument("--queues", type=int, default=24)
    r.add_argument("--threads", type=int, default=12, help="emulated controller threads")
    r.add_argument("--depth", type=int, default=1024, help="emulated controller ring entries per queue")
    r.add_argument("--store-dir", default="/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir(),
                   help="--kv store: where the store's member files go (RAM-backed: the emulated SSD rate is the cap)")
    r.add_argument("--warm-s", type=float, default=4.0, help="GEMMs before profiling (GPU clocks up)")
    r.add_argument("--budget-s", type=float, default=300.0, help="skip the remaining prompts after this long")
    r.add_argument("--watchdog-s", type=float, default=120.0, help="exit when no step finished for this long")
    r.set_defaults(fn=run)
    m = sub.add_parser("model")
    m.add_argument("--json", required=True)
    m.set_defaults(fn=model_check)
    d = sub.add_parser("render")
    d.add_argument("--json", required=True)
    d.add_argument("--doc", default="docs/benchmarks.md")
    d.set_defaults(fn=render)
    return ap


def main():
    a = parser().parse_args()
    a.fn(a)


if __name__ == "__main__":
    main()
