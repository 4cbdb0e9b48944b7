"""Layer-wise prefill: load layer l's prefix KV while earlier layers compute; measure TTFT and bubbles.

Modes (same model, same cache, same tokens):

  recompute   nothing cached: every token is computed
  hbm         the prefix's KV is already in the paged cache: only the suffix is computed
  tutti       the prefix's KV is read from the store layer by layer; layer l's compute waits on
              the GPU for layer l only (StoreKV: tt_txn_layer_order); the new KV is written back
              as the scheduler's plan says (io_ops order; deferred writes after the first token)

Timing on the GPU is by CUDA events: TTFT from the request's start (recorded on the compute
stream, which the I/O stream waits for) to the logits; a layer's bubble is the time its compute
stream spent in the wait for its KV; load and write times per layer are their kernels' spans on
the I/O stream.  On the CPU (tests) everything runs in order and the clock is perf_counter.
"""
from __future__ import annotations

import statistics
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from ..sched.model import TokenSplit
from .decoder import Decoder
from .paged import PagedKVCache

MODES = ("recompute", "hbm", "tutti")


class _Clock:
    """Timestamps on a stream: CUDA events on the GPU, perf_counter on the CPU."""

    def __init__(self, cuda: bool):
        self.cuda = cuda

    def mark(self, stream=None):
        if not self.cuda:
            return time.perf_counter()
        ev = torch.cuda.Event(enable_timing=True)
        ev.record(stream)
        return ev

    def span(self, a, b) -> float:
        return a.elapsed_time(b) / 1e3 if self.cuda else b - a


@dataclass
class RunResult:
    mode: str
    total_tokens: int
    hit_tokens: int
    load_tokens: int
    new_tokens: int
    ttft_s: float  # request start -> logits, on the GPU (events)
    wall_s: float  # the same on the host, incl. launch overheads and the final synchronisation
    compute_s: float  # sum of the layers' compute
    bubble_s: float  # time compute waited for KV (all layers, incl. the first layer's fill)
    fill_s: float  # of it: the wait for layer 0
    layer_compute_s: list[float] = field(default_factory=list)
    layer_wait_s: list[float] = field(default_factory=list)
    layer_load_s: list[float] = field(default_factory=list)
    layer_write_s: list[float] = field(default_factory=list)
    writes_in_prefill: int = 0
    deferred_writes: int = 0
    deferred_write_s: float = 0.0  # deferred writes, after the first token
    io_errors: int = 0
    logits: torch.Tensor | None = field(default=None, repr=False)

    @property
    def layer_load_median_s(self) -> float:
        return statistics.median(self.layer_load_s) if self.layer_load_s else 0.0

    @property
    def layer_compute_median_s(self) -> float:
        return statistics.median(self.layer_compute_s)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("logits")
        d["layer_load_median_s"] = self.layer_load_median_s
        d["layer_compute_median_s"] = self.layer_compute_median_s
        return d


class PrefillHarness:
    """Runs one request's prefill in one of MODES over ``model`` and ``cache``.

    ``kv``: StoreKV or GioKV (GPU), HostKV (CPU), needed for mode tutti.  ``io_stream`` and
    ``compute_stream``: torch streams (e.g. from tutti.gpu.Domains); default: a new
    stream for I/O and the current stream for compute.  ``cpu_lead_layers``: how many
    layers the CPU may enqueue ahead of the GPU (see before() in run()).
    """

    def __init__(self, model: Decoder, cache: PagedKVCache, kv=None, *, io_stream=None, compute_stream=None,
                 cpu_lead_layers: int = 2):
        self.model, self.cache, self.kv = model, cache, kv
        self.cpu_lead_layers = cpu_lead_layers
        self.cuda = cache.kv.is_cuda
        self.clock = _Clock(self.cuda)
        if self.cuda:
            self.compute = compute_stream or torch.cuda.current_stream()
            self.io = io_stream or torch.cuda.Stream()
        else:
            self.compute = self.io = None

    def run(self, mode: str, tokens: torch.Tensor, block_table: torch.Tensor, hit_tokens: int = 0, *,
            plan=None, read_slots=(), write_slots=()) -> RunResult:
        """Prefill ``tokens`` (the whole prompt) whose first ``hit_tokens`` are stored.

        ``block_table``: paged-cache block of each of the prompt's blocks.  Mode tutti: ``plan``
        (tutti.sched PrefillPlan for this request), ``read_slots[i]``: store slot of block i
        (i < plan.load_blocks), ``write_slots[k]``: where block hit_blocks + k goes (StoreKV: its key,
        the store picks the slot; GioKV/HostKV: the slot).
        Modes hbm and tutti compute the same tokens: those after the loadable prefix.
        """
        if mode not in MODES:
            raise ValueError(f"mode {mode!r}: one of {', '.join(MODES)}")
        shape, total = self.model.shape, int(tokens.shape[0])
        split = TokenSplit.of(shape, total, 0 if mode == "recompute" else hit_tokens)
        if mode == "tutti":
            if plan is None or self.kv is None:
                raise ValueError("mode tutti needs a plan and a KV store (kv=)")
            if (plan.total_tokens, plan.load_blocks) != (total, split.load_blocks):
                raise ValueError(f"plan is for {plan.total_tokens} tokens / {plan.load_blocks} blocks, "
                                 f"request has {total} / {split.load_blocks}")
        prefix = split.load_tokens
        L = shape.n_layers
        c = self.clock
        ev: dict[tuple[str, int], Any] = {}
        io_marks: list[tuple[str, int, object, object]] = []
        reads_issued: set[int] = set()
        # Writes to a store's data path must find their memory complete (its streams do not wait for ours):
        # they are issued once the host sees their compute event done, never by blocking the CPU's enqueue.
        host_ready = bool(self.cuda and getattr(self.kv, "host_ready_writes", False))
        ready_writes: deque = deque()  # (event, layer)
        waits: list = [None] * L
        layer_marks: list = [None] * L

        if mode == "tutti":
            nb = split.load_blocks
            self.kv.bind(list(read_slots)[:nb], block_table[:nb].tolist(),
                         list(write_slots)[:split.write_blocks],
                         block_table[split.hit_blocks:split.hit_blocks + split.write_blocks].tolist())
        pending = deque(plan.io_ops if mode == "tutti" else ())

        def io_op(kind: str, layer: int) -> None:
            with self._on(self.io):
                a = c.mark(self.io)
                (self.kv.read if kind == "read" else self.kv.write)(layer, self.io)
                b = c.mark(self.io)
            io_marks.append((kind, layer, a, b))
            if kind == "read":
                reads_issued.add(layer)

        def pump() -> None:
            # Enqueue every I/O op whose event already exists: a stream cannot wait for an event
            # that has not been recorded yet, so ops are issued as the compute side records them.
            while pending:
                op = pending[0]
                if op.wait is not None:
                    key = tuple(op.wait)
                    if key not in ev:
                        break
                    if host_ready and op.kind == "write":
                        pending.popleft()
                        ready_writes.append((ev[key], op.layer))  # reads behind it go on (reads first)
                        continue
                    if self.cuda:
                        self.io.wait_event(ev[key])
                pending.popleft()
                io_op(op.kind, op.layer)
            while ready_writes and ready_writes[0][0].query():
                io_op("write", ready_writes.popleft()[1])

        def before(l: int) -> None:
            if self.cuda and l >= self.cpu_lead_layers:  # all modes alike, so their TTFTs compare
                # Keep the CPU at most cpu_lead_layers ahead of the GPU.  Unbounded, it fills CUDA's launch
                # queue while compute waits for layer 0's KV; the blocked launch then also blocks the
                # emulated controller's host threads in their cudaMemcpyAsync, so that KV never lands
                # (seen on the H200: a hang at 32K tokens, hit rate 0.5).  The GPU still has a layer queued.
                ev[("compute_done", l - self.cpu_lead_layers)].synchronize()
            w0 = c.mark(self.compute)
            if mode == "tutti" and split.load_blocks:
                if l not in reads_issued:
                    raise RuntimeError(f"plan does not read layer {l} before its compute can run")
                if self.cuda:
                    self.kv.order(l, self.compute)  # on the GPU: no host round trip
            w1 = c.mark(self.compute)
            waits[l] = (w0, w1)
            ev[("compute_start", l)] = w1
            pump()

        def after(l: int) -> None:
            e = c.mark(self.compute)
            layer_marks[l] = (waits[l][1], e)
            ev[("compute_done", l)] = e
            pump()

        if self.cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with self._on(self.compute):
            start = c.mark(self.compute)
            if mode == "tutti" and self.cuda:
                self.io.wait_event(start)  # the request starts here for the I/O stream too
            pump()
            logits = self.model.prefill(tokens[prefix:], self.cache, block_table, prefix, before, after)
            end = c.mark(self.compute)
        if self.cuda:
            self.compute.synchronize()
        wall = time.perf_counter() - t0
        if pending:
            raise RuntimeError(f"{len(pending)} I/O ops of the plan were never issued")

        # Writes with no slack in the prefill go after the first token (the decode phase's budget), and so do
        # host-ready writes whose compute the host had not yet seen finish.
        deferred = list(plan.deferred_writes) if mode == "tutti" and split.write_blocks else []
        in_prefill = sum(1 for m in io_marks if m[0] == "write")
        deferred = [j for _, j in ready_writes] + deferred
        ready_writes.clear()
        d0 = d1 = None
        if deferred:
            with self._on(self.io):
                if self.cuda:
                    self.io.wait_event(end)
                d0 = c.mark(self.io)
                for j in deferred:
                    self.kv.write(j, self.io)
                d1 = c.mark(self.io)
        if self.cuda:
            torch.cuda.synchronize()

        io_errors = self.kv.finish() if mode == "tutti" else 0  # StoreKV: commit, verify every loaded block
        load = [0.0] * L if mode == "tutti" and split.load_blocks else []
        write = [0.0] * L if mode == "tutti" and split.write_blocks else []
        deferred_s = c.span(d0, d1) if deferred else 0.0
        spans = getattr(self.kv, "spans", None) if mode == "tutti" and self.cuda else None
        if spans is not None:  # the data path's own streams: its spans, not the I/O stream's marks
            deferred_s = 0.0
            ops = spans()
            for i, (kind, layer, sec) in enumerate(ops):
                if kind == "read":
                    load[layer] = sec
                elif i >= len(ops) - len(deferred):  # the deferred writes went last
                    deferred_s += sec
                else:
                    write[layer] = sec
        else:
            for kind, layer, a, b in io_marks:
                (load if kind == "read" else write)[layer] = c.span(a, b)
        wait_s = [c.span(*w) for w in waits]
        comp = [c.span(*m) for m in layer_marks]
        return RunResult(
            mode=mode, total_tokens=total, hit_tokens=hit_tokens if mode != "recompute" else 0, load_tokens=prefix,
            new_tokens=total - prefix, ttft_s=c.span(start, end), wall_s=wall, compute_s=sum(comp),
            bubble_s=sum(wait_s), fill_s=wait_s[0], layer_compute_s=comp, layer_wait_s=wait_s, layer_load_s=load,
            layer_write_s=write, writes_in_prefill=in_prefill,
            deferred_writes=len(deferred), deferred_write_s=deferred_s, io_errors=io_errors, logits=logits)

    def _on(self, stream):
        return torch.cuda.stream(stream) if self.cuda else _Null()


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def new_block_table(n_blocks: int, cache_blocks: int, *, seed: int = 0, device="cpu") -> torch.Tensor:
    """A shuffled block table: ``n_blocks`` distinct cache blocks in random order (int32, as vLLM keeps it)."""
    if n_blocks > cache_blocks:
        raise ValueError(f"{n_blocks} blocks do not fit a cache of {cache_blocks}")
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(cache_blocks, generator=g)[:n_blocks].to(torch.int32).to(device)
