#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""What saving costs a cold request on the GPU: TTFT with and without saves, the decode steps that
follow, and the data path's own save and load rates (issue 13's H200 must-shows).

  save_step_gpu.py [--paths staged,gio] [--tokens 2048,8192,32768] [--requests 3] [--decode-steps 8]
                   [--drain-bytes-per-step auto|SIZE] [--decode graph|eager]
                   [--variants none,deferred,step] [--slack-fit default|on|off]
                   [--dir /dev/shm] [--json OUT] [--parts rates,steps] [--cpu] [--tiny]

Two parts, per data path, in one process:

rates: a 32768-token prefix of a Llama-3-8B-shaped KV cache (2048 blocks = 4 GiB) written and read
    by bare transactions of the worker's own data path (every layer submitted, then finished): the
    first write and the first read after ``register_kv_caches`` (attach), then ``--requests`` warm
    ones; GB/s of each and the ratios save / load and first / warm.
steps: a Llama-3-8B-shaped decoder (random bf16 weights, flash attention; tutti.prefill.decoder)
    prefills cold requests of each length against a vLLM-layout paged KV cache, with the worker
    side driven as vLLM's model runner drives it (start_load, save_kv_layer after each layer,
    wait_for_save, the worker metadata), then ``--decode-steps`` one-token decode steps of the same
    request (``--decode graph``, the default: the decode forward captured once in a CUDA graph and
    replayed, as vLLM does, so a step's time is the GPU's and the connector's, not Python's launches;
    every replay decodes the token at the prompt's end).  Three variants, each after a warm-up request:
    no saves; ``save_mode: deferred`` (the default: writes overlap the forward, committed in a later
    step); ``save_mode: step`` (committed in its own step).  Reported: the median TTFT of each (wall
    time of the step to its logits) and deferred / none; the decode steps the deferred save took to
    be committed (it is drained and committed by later steps; at most --max-commit-steps), the median
    decode step time while it was pending, against the --decode-steps steps after and against the
    decode steps of the run without saves; and each deferred save's write latency (from the step end
    at which its last layer had been submitted to the one at which its writes were complete: how long a
    hit arriving then would wait, since a read never runs beside a write).  ``--slack-fit`` forces
    drain_bytes_per_step auto's slack fit (tutti.vllm.drain) on or off.

Every loaded block is compared with what was saved (bit-exact).  Needs a CUDA device (--cpu --tiny: a
smoke test of the same steps on the host).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time

import torch

import tutti.gpu  # noqa: F401 - imported before CUDA starts, as the worker's process does
from tutti.prefill.decoder import LLAMA3_8B_SHAPE, TINY_SHAPE, Decoder
from tutti.prefill.paged import PagedKVCache
from tutti.vllm.config import ModelShape, TuttiConfig, parse_size
from tutti.vllm.metadata import BlockTransfer, TuttiMetadata
from tutti.vllm.stats import TuttiStats
from tutti.vllm.worker import WorkerSide

BS = 16


def name(layer: int) -> str:
    return f"model.layers.{layer}.self_attn.attn"


class Rig:
    """One worker side on one data path over one paged KV cache of ``num_blocks`` blocks."""

    def __init__(self, args, shape, path: str, save_mode: str, num_blocks: int, capacity_blocks: int):
        self.shape, self.dev = shape, torch.device("cpu" if args.cpu else "cuda")
        self.cache = PagedKVCache(shape, num_blocks, device=self.dev, dtype=torch.bfloat16)
        self.block_bytes = shape.n_layers * 2 * BS * shape.n_kv_heads * shape.head_dim * 2
        obj = -(-BS * shape.n_kv_heads * shape.head_dim * 2 // 4096) * 4096  # on disk: 4 KiB-aligned objects
        stored = shape.n_layers * 2 * obj
        self.dir = tempfile.mkdtemp(prefix="save-step-", dir=args.dir)
        cfg = TuttiConfig.from_extra({
            "path": os.path.join(self.dir, "kv.img"), "capacity": str(stored * capacity_blocks + (64 << 20)),
            "data_path": path, "save_mode": save_mode,
            # Every save of the benchmark is pending at once at most: no drops.
            "max_pending_bytes": str(self.block_bytes * capacity_blocks),
            "drain_bytes_per_step": args.drain_bytes_per_step, "write_policy": args.write_policy})
        mshape = ModelShape(model_id="bench/llama-3-8b-shaped", dtype="bfloat16", n_layers=shape.n_layers,
                            kv_heads=shape.n_kv_heads, head_dim=shape.head_dim, block_size=BS, tp_size=1)
        self.w = WorkerSide(cfg, mshape, 0, TuttiStats())
        t0 = time.perf_counter()
        self.w.register_kv_caches({name(layer): self.cache.kv[layer] for layer in range(shape.n_layers)},
                                  num_blocks)
        self.sync()
        self.attach_s = time.perf_counter() - t0
        self.step = 0
        b = self.w._drain_budget
        if b is not None and args.slack_fit != "default":  # a private switch: a measurement
            b.slack_fit = args.slack_fit == "on"
        self.lat = []  # seconds from a pending save's last layer submitted to its writes complete

    def probe(self) -> None:
        """At a step's end: note when each pending save had every layer submitted and when its writes
        were all complete (``Txn.poll``, never waits); the span between is the path's write latency."""
        now = time.perf_counter()
        for e in list(self.w._fifo):
            if e.void or e.queued or e.txn is None:
                continue
            if not hasattr(e, "_t_out"):
                e._t_out = now
            if not hasattr(e, "_t_written") and self.w._written(e):
                e._t_written = now
                self.lat.append(now - e._t_out)

    def sync(self):
        if self.dev.type == "cuda":
            torch.cuda.synchronize()

    def close(self):
        self.w.close()
        for f in os.listdir(self.dir):
            os.unlink(os.path.join(self.dir, f))
        os.rmdir(self.dir)

    # --- bare transactions: the data path's rates ---------------------------------------------

    def _timed(self, begin, n, what) -> float:
        """Seconds of one bare transaction of ``n`` blocks: begun, every layer submitted, finished."""
        self.sync()
        t0 = time.perf_counter()
        txn = begin()
        for layer in range(self.shape.n_layers):
            txn.layer(layer)
        status = txn.finish()
        self.sync()
        dt = time.perf_counter() - t0
        assert list(status) == [0] * n, f"{what} failed: {sorted(set(status))}"
        return dt

    def write(self, keys, ids) -> float:
        return self._timed(lambda: self.w.io.write(keys, ids), len(keys), "write")

    def read(self, keys, ids) -> float:
        slots = self.w.store.lookup(keys)
        assert None not in slots, "a written block is not stored"
        return self._timed(lambda: self.w.io.read(slots, ids), len(keys), "read")

    # --- steps as vLLM's model runner drives them ---------------------------------------------

    def forward_step(self, model, tokens, table, prefix_len, saves) -> float:
        """One step: start_load, the layers (save_kv_layer after each), wait_for_save, the worker
        metadata; wall time to the logits (a cold request's TTFT, a decode step's time)."""
        self.step += 1
        meta = TuttiMetadata(saves=saves, step=self.step)
        w = self.w
        self.sync()
        t0 = time.perf_counter()
        w.start_load(meta)
        logits = model.prefill(tokens, self.cache, table, prefix_len,
                               after_layer=lambda layer: w.save_layer(meta, name(layer)))
        t1 = time.perf_counter()
        w.finish_save(meta)
        w.take_worker_meta()
        t2 = time.perf_counter()
        logits.float().cpu()  # the first token needs them on the host
        t3 = time.perf_counter()
        self.parts = (t1 - t0, t2 - t1, t3 - t2)  # host: forward issued, wait_for_save, to the logits
        return t3 - t0

    def capture_decode(self, model, prefix_len: int, table: torch.Tensor) -> None:
        """Capture one decode step (one token at ``prefix_len``) in a CUDA graph, as vLLM replays its decode
        steps: a step is then one launch, so its time is the GPU's, not Python's.  The block table and the
        token are the graph's inputs (copied in before a replay); every replay writes the same position."""
        self.g_tok = torch.zeros(1, dtype=torch.long, device=self.dev)
        self.g_table = table.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the default stream, as torch.cuda.graph wants
            for _ in range(3):
                model.prefill(self.g_tok, self.cache, self.g_table, prefix_len)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        # thread_local: the data path's own threads may call CUDA meanwhile; they are not part of the graph
        with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
            self.g_logits = model.prefill(self.g_tok, self.cache, self.g_table, prefix_len)
        self.sync()

    def decode_step_graph(self, token: torch.Tensor, table: torch.Tensor) -> float:
        """One decode step with the forward replayed from the graph: start_load, the replay, wait_for_save
        (where the deferred saves drain), the worker metadata; wall time to the logits on the host."""
        self.step += 1
        meta = TuttiMetadata(saves=[], step=self.step)
        w = self.w
        self.sync()
        t0 = time.perf_counter()
        w.start_load(meta)
        self.g_tok.copy_(token, non_blocking=True)
        self.g_table.copy_(table, non_blocking=True)
        self.graph.replay()
        t1 = time.perf_counter()
        w.finish_save(meta)
        w.take_worker_meta()
        t2 = time.perf_counter()
        self.g_logits.float().cpu()
        t3 = time.perf_counter()
        self.parts = (t1 - t0, t2 - t1, t3 - t2)
        return t3 - t0

    def pending(self) -> int:
        return len(self.w._fifo)  # the deferred saves not yet committed (a private list: a benchmark)


def part_rates(args, shape, path: str) -> dict:
    n = args.rate_tokens // BS
    rig = Rig(args, shape, path, "step", 2 * n, 2 * n + 8)  # the set before last is evicted
    try:
        g = torch.Generator(device=rig.dev).manual_seed(1)
        kv = rig.cache.kv
        kv[:, :, :n] = torch.randn(kv[:, :, :n].shape, generator=g, device=rig.dev,
                                   dtype=torch.float32).to(kv.dtype)
        src, dst = list(range(n)), list(range(n, 2 * n))
        writes, reads, exact = [], [], True
        for r in range(args.requests + 1):
            keys = [f"rate{r}-{b}".encode() for b in range(n)]
            writes.append(rig.write(keys, src))
            kv[:, :, n:] = 0
            reads.append(rig.read(keys, dst))
            exact &= torch.equal(kv[:, :, n:], kv[:, :, :n])
        total = n * rig.block_bytes
        warm_w, warm_r = statistics.median(writes[1:]), statistics.median(reads[1:])
        return {"path": path, "tokens": args.rate_tokens, "bytes": total, "attach_s": rig.attach_s,
                "write_s": writes, "read_s": reads, "bit_exact": bool(exact),
                "save_gbps": total / warm_w / 1e9, "load_gbps": total / warm_r / 1e9,
                "save_over_load": warm_r / warm_w,
                "first_save_gbps": total / writes[0] / 1e9, "first_load_gbps": total / reads[0] / 1e9,
                "first_over_warm_save": warm_w / writes[0], "first_over_warm_load": warm_r / reads[0]}
    finally:
        rig.close()


def commit_steps_allowed(args, shape, tokens: int) -> int:
    """--max-commit-steps, or (not given) 400, more where a fixed drain_bytes_per_step needs more steps to write
    the prompt's KV (a 32K Llama-3-8B prompt at 8 MiB a step: 512), with a quarter to spare."""
    if args.max_commit_steps is not None:
        return args.max_commit_steps
    if args.drain_bytes_per_step == "auto":
        return 400
    rate = parse_size(args.drain_bytes_per_step, "--drain-bytes-per-step")
    kv = tokens * shape.n_layers * shape.kv_bytes_per_token_layer
    return max(400, -(-kv // rate) * 5 // 4)


def part_steps(args, shape, model, path: str, tokens: int) -> dict:
    nb = tokens // BS
    max_commit = commit_steps_allowed(args, shape, tokens)
    # The prompt's blocks, then the decode tokens'.
    region = nb + -(-(args.decode_steps + max_commit) // BS) + 1
    n_req = args.requests + 1
    out = {"path": path, "tokens": tokens}
    dev = "cpu" if args.cpu else "cuda"
    graph = args.decode == "graph" and not args.cpu
    out["decode"] = "graph" if graph else "eager"
    g = torch.Generator(device=dev).manual_seed(tokens)
    for variant in args.variants.split(","):
        # Room for two requests' blocks: the oldest are evicted (a pending save pins its own).
        rig = Rig(args, shape, path, "step" if variant == "step" else "deferred", n_req * region, 2 * nb + 8)
        try:
            ttft, parts, dec_busy, dec_idle, commit_steps = [], [], [], [], []
            if graph:
                rig.capture_decode(model, tokens, torch.arange(0, region, device=dev, dtype=torch.int32))

            def decode(toks, table, i, rig=rig):
                if graph:  # every step the same: position `tokens`, in the block after the saved ones
                    return rig.decode_step_graph(toks[-1:], table)
                return rig.forward_step(model, toks[-1:], table, tokens + i, [])

            for r in range(n_req):
                table = torch.arange(r * region, (r + 1) * region, device=dev, dtype=torch.int32)
                toks = torch.randint(0, 1024, (tokens,), device=dev, generator=g)
                keys = [f"{variant}-{r}-{b}".encode() for b in range(nb)]
                saves = [] if variant == "none" else [BlockTransfer(f"r{r}", keys, list(range(r * region,
                                                                                              r * region + nb)))]
                ttft.append(rig.forward_step(model, toks, table, 0, saves))
                rig.probe()
                parts.append(rig.parts)
                # Decode until the deferred save is committed (bounded), then --decode-steps more.
                i = busy = 0
                while rig.pending() and busy < max_commit:
                    rig.probe()  # before the step commits it
                    dt = decode(toks, table, i)
                    i, busy = i + 1, busy + 1
                    if r:
                        dec_busy.append(dt)
                if r and variant != "none":
                    commit_steps.append(busy)
                    assert not rig.pending(), f"a deferred save still pending after {busy} decode steps"
                    assert None not in rig.w.store.lookup(keys), "a save was not committed"
                for _ in range(args.decode_steps):
                    dt = decode(toks, table, i)
                    i += 1
                    if r:
                        dec_idle.append(dt)
            s = rig.w.stats.reduce()
            b = rig.w._drain_budget
            out[variant] = {"write_latency_s": rig.lat, "slack_fit": bool(b and b.slack_fit),
                            "drain_bytes_end": b.bytes if b else None,
                            "ttft_s": ttft, "ttft_median_s": statistics.median(ttft[1:]), "ttft_parts_s": parts,
                            "decode_steps_to_commit": commit_steps,
                            "decode_busy_s": dec_busy, "decode_idle_s": dec_idle,
                            "save_parts": rig.w.stats.data.get("save_parts", 0),
                            "stats": {k: v for k, v in s.items() if isinstance(v, (int, float))}}
        finally:
            rig.close()
    nan = float("nan")
    none = out["none"]["ttft_median_s"] if "none" in out else nan
    if "deferred" in out:
        out["deferred_over_none"] = out["deferred"]["ttft_median_s"] / none
        busy, idle = out["deferred"]["decode_busy_s"], out["deferred"]["decode_idle_s"]
        if busy and idle:
            out["decode_busy_over_idle"] = statistics.median(busy) / statistics.median(idle)
            # The mean too: a drain paced below a layer a step (a fixed drain_bytes_per_step is a rate)
            # costs some steps and not others, which the median hides.
            out["decode_busy_mean_over_idle"] = statistics.mean(busy) / statistics.median(idle)
        if busy and "none" in out and out["none"]["decode_idle_s"]:  # against the run that saves nothing
            out["decode_busy_over_none"] = statistics.median(busy) / statistics.median(out["none"]["decode_idle_s"])
            out["decode_busy_mean_over_none"] = statistics.mean(busy) / statistics.median(out["none"]["decode_idle_s"])
    if "step" in out:
        out["step_over_none"] = out["step"]["ttft_median_s"] / none
    return out


def summary(s: dict) -> str:
    nan = float("nan")
    ms = {v: s[v]["ttft_median_s"] * 1e3 for v in ("none", "deferred", "step") if v in s}
    out = "TTFT " + ", ".join(f"{v} {t:.1f} ms" for v, t in ms.items())
    out += f" (deferred/none {s.get('deferred_over_none', nan):.3f}, step/none {s.get('step_over_none', nan):.3f})"
    if "deferred" in s:
        d = s["deferred"]
        lat = d["write_latency_s"]
        out += (f"; decode ({s['decode']}) while committing / after {s.get('decode_busy_over_idle', nan):.3f}"
                f" (mean {s.get('decode_busy_mean_over_idle', nan):.3f}),"
                f" / no saves {s.get('decode_busy_over_none', nan):.3f}"
                f" (mean {s.get('decode_busy_mean_over_none', nan):.3f}); committed after "
                f"{d['decode_steps_to_commit']} decode steps; slack fit {d['slack_fit']}, drain size at the end "
                f"{d['drain_bytes_end']}; saves cut into {d.get('save_parts', 0)} parts; write latency median "
                f"{statistics.median(lat) * 1e3 if lat else nan:.1f} ms (max {max(lat) * 1e3 if lat else nan:.1f})")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--paths", default="staged,gio")
    ap.add_argument("--tokens", default="2048,8192,32768")
    ap.add_argument("--rate-tokens", type=int, default=32768)
    ap.add_argument("--requests", type=int, default=3, help="measured requests after one warm-up")
    ap.add_argument("--decode-steps", type=int, default=8, help="decode steps measured after the commit")
    ap.add_argument("--max-commit-steps", type=int, default=None,
                    help="decode steps a deferred save may take to be committed (else the run fails); default 400, "
                         "more where a fixed --drain-bytes-per-step needs more to write the prompt's KV")
    ap.add_argument("--drain-bytes-per-step", default="auto",
                    help="the connector's drain_bytes_per_step: carried-over writes a decode step submits")
    ap.add_argument("--write-policy", choices=("slack", "eager", "after_step"), default="slack",
                    help="the connector's write_policy (after_step: no write beside the forward)")
    ap.add_argument("--decode", choices=("graph", "eager"), default="graph",
                    help="decode steps replayed from a CUDA graph (as vLLM does; the default) or run eagerly "
                         "(host-bound Python launches); the CPU runs them eagerly")
    ap.add_argument("--dir", default="/dev/shm")
    ap.add_argument("--json", default=None)
    ap.add_argument("--tiny", action="store_true", help="a 2-layer model, small prompts (a smoke test)")
    ap.add_argument("--parts", default="rates,steps")
    ap.add_argument("--cpu", action="store_true", help="KV cache in host memory, data path cpu (a smoke test)")
    ap.add_argument("--variants", default="none,deferred,step", help="which of the three runs per length")
    ap.add_argument("--slack-fit", choices=("default", "on", "off"), default="default",
                    help="drain_bytes_per_step auto's slack fit (drain.py) forced on or off for this run; "
                         "default: the connector's choice for the path")
    args = ap.parse_args()
    bad = set(args.variants.split(",")) - {"none", "deferred", "step"}
    if bad or not args.variants:
        ap.error(f"--variants: none, deferred or step, comma-separated (got {args.variants!r})")
    if args.cpu:
        args.paths = "cpu"
    elif not torch.cuda.is_available():
        raise SystemExit("save_step_gpu.py needs a CUDA device (--cpu: a smoke test on the host)")
    shape = TINY_SHAPE if args.tiny else LLAMA3_8B_SHAPE
    res = {"command": " ".join([os.path.basename(sys.argv[0])] + sys.argv[1:]),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "device": "cpu" if args.cpu else torch.cuda.get_device_name(0), "host": platform.node(), "dir": args.dir,
           "model": shape.name, "rates": [], "steps": []}

    def dump():
        if args.json:
            with open(args.json, "w") as f:
                json.dump(res, f, indent=1)

    parts = args.parts.split(",")
    for path in args.paths.split(","):
        if "rates" in parts:
            r = part_rates(args, shape, path)
            res["rates"].append(r)
            dump()
            print(f"{path}: save {r['save_gbps']:.2f} GB/s, load {r['load_gbps']:.2f} GB/s "
                  f"(save/load {r['save_over_load']:.3f}); first after attach ({r['attach_s']:.2f} s): "
                  f"save {r['first_save_gbps']:.2f} ({r['first_over_warm_save']:.3f} of warm), "
                  f"load {r['first_load_gbps']:.2f} ({r['first_over_warm_load']:.3f}); "
                  f"bit-exact {r['bit_exact']}", flush=True)
    if "steps" in parts:
        model = Decoder(shape, device="cpu" if args.cpu else "cuda", dtype=torch.bfloat16)
        for path in args.paths.split(","):
            for t in (int(x) for x in args.tokens.split(",")):
                s = part_steps(args, shape, model, path, t)
                res["steps"].append(s)
                dump()
                print(f"{path} {t:6d} tokens: " + summary(s), flush=True)


if __name__ == "__main__":
    main()
