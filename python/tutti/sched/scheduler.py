"""Slack-aware scheduling of one prefill's reads and writes (the rules of the paper).

1. Reads go first: a layer's KV must land before its compute, so reads are issued as early
   as the prefetch depth allows and nothing delays them.
2. Reads and writes never share the SSDs at the same time (every layer is striped over all
   SSDs, and mixing reads with writes costs an SSD more than either alone), so a write is
   issued only while no read is in flight and only if it ends before the next read may start.
3. The new KV of layer j can be written once layer j is computed; writes that find no such
   window before the prefill ends are deferred to the decode phase, a budget per decode step.

Two forms, same rules:

* static: ``SlackScheduler.plan_prefill()`` returns a PrefillPlan whose ``io_ops`` is the
  order of operations on one I/O queue (or CUDA stream), each with the event it waits for:
  read i waits for compute i-D to start, write j for compute j to finish.  Issue them in that
  order; the plan put every write where it ends before the next read is allowed.
* online: ``ScheduleState(plan)`` is fed events (read/write done, compute start/done) and
  answers which reads and writes to issue now, re-estimating the windows from the compute
  times it observes.  Use it when I/O completes on the CPU (file engine threads).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from .model import Hardware, ModelShape, Prediction, TokenSplit, best_load_blocks, layer_times, predict
from .pipeline import Timeline, place_writes, simulate_pipeline
from .profile import ComputeProfile


@dataclass(frozen=True)
class IoOp:
    """One layer's read or write, in queue order; ``wait`` = (event, layer) to wait for first, or None."""

    kind: str  # "read" | "write"
    layer: int
    wait: tuple[str, int] | None  # ("compute_start", k) or ("compute_done", k)
    start_s: float  # predicted
    end_s: float


@dataclass
class PrefillPlan:
    """What to load, and when to read and write each layer's KV, for one request's prefill."""

    total_tokens: int
    hit_tokens: int
    load_blocks: int  # load the first load_blocks stored blocks; the rest of the prompt is computed
    load_tokens: int
    new_tokens: int
    write_blocks: int  # full blocks to store after prefill (per layer)
    write_bytes_per_layer: int
    prefetch_depth: int
    read_order: list[int]
    io_ops: list[IoOp]
    writes_after_layer: list[list[int]]  # [i]: write these layers once layer i's compute is done
    deferred_writes: list[int]  # to the decode phase
    predicted: Prediction
    timeline: Timeline = field(repr=False)

    @property
    def predicted_bubble_s(self) -> float:
        return self.predicted.bubble_s

    def to_dict(self) -> dict:
        return {"total_tokens": self.total_tokens, "hit_tokens": self.hit_tokens, "load_blocks": self.load_blocks,
                "load_tokens": self.load_tokens, "new_tokens": self.new_tokens, "write_blocks": self.write_blocks,
                "write_bytes_per_layer": self.write_bytes_per_layer, "prefetch_depth": self.prefetch_depth,
                "read_order": self.read_order, "writes_after_layer": self.writes_after_layer,
                "deferred_writes": self.deferred_writes,
                "io_ops": [[o.kind, o.layer, list(o.wait) if o.wait else None] for o in self.io_ops],
                "predicted": self.predicted.to_dict()}


class SlackScheduler:
    """Plans prefills for one model on one set of SSDs.

    ``limit_load``: load only as many stored blocks as minimise the predicted TTFT and recompute
    the rest (pays above the crossover hit rate, when the pipeline is I/O-bound).  Off by
    default: then every stored block of the prefix is loaded.
    """

    def __init__(self, shape: ModelShape, hw: Hardware, profile: ComputeProfile, prefetch_depth: int = 2,
                 limit_load: bool = False):
        if prefetch_depth < 1:
            raise ValueError(f"prefetch_depth must be >= 1, got {prefetch_depth}")
        self.shape, self.hw, self.profile = shape, hw, profile
        self.prefetch_depth = prefetch_depth
        self.limit_load = limit_load

    def plan_prefill(self, total_tokens: int, hit_tokens: int) -> PrefillPlan:
        """Plan a request of ``total_tokens`` whose first ``hit_tokens`` are stored (rounded down to blocks)."""
        shape, D = self.shape, self.prefetch_depth
        load_blocks = None
        if self.limit_load:
            load_blocks = best_load_blocks(shape, self.hw, self.profile, total_tokens, hit_tokens, D)
        split = TokenSplit.of(shape, total_tokens, hit_tokens, load_blocks)
        io, c, w = layer_times(shape, self.hw, self.profile, split)
        L = shape.n_layers
        tl = simulate_pipeline(L, io, c, D)
        placed = place_writes(tl, w) if split.write_blocks else [None] * L
        pred = predict(shape, self.hw, self.profile, total_tokens, 0.0, D, hit_tokens=hit_tokens,
                       load_blocks=split.load_blocks)

        read_order = list(range(L)) if tl.read_end else []
        ops: list[IoOp] = []
        by_read: dict[int, list[int]] = {}
        for j, p in enumerate(placed):
            if p is not None:
                by_read.setdefault(p[2], []).append(j)

        def writes_after(r: int):
            for j in by_read.get(r, []):
                p = placed[j]
                assert p is not None  # by_read holds the placed writes only
                ops.append(IoOp("write", j, ("compute_done", j), p[0], p[1]))

        writes_after(-1)
        for i in read_order:
            ops.append(IoOp("read", i, ("compute_start", i - D) if i >= D else None, tl.read_start[i], tl.read_end[i]))
            writes_after(i)

        after_layer: list[list[int]] = [[] for _ in range(L)]
        for j, p in enumerate(placed):
            if p is not None:  # the last compute done by the time the write starts: its trigger
                k = max(i for i in range(j, L) if tl.compute_end[i] <= p[0] * (1 + 1e-12) + 1e-15)
                after_layer[k].append(j)
        deferred = [j for j, p in enumerate(placed) if p is None] if split.write_blocks else []
        return PrefillPlan(
            total_tokens=total_tokens, hit_tokens=hit_tokens, load_blocks=split.load_blocks,
            load_tokens=split.load_tokens, new_tokens=split.new_tokens, write_blocks=split.write_blocks,
            write_bytes_per_layer=split.write_blocks * shape.block_layer_io_bytes, prefetch_depth=D,
            read_order=read_order, io_ops=ops, writes_after_layer=after_layer, deferred_writes=deferred,
            predicted=pred, timeline=tl)

    def decode_budget(self, decode_step_s: float, read_busy_s: float = 0.0) -> int:
        """Bytes of deferred writes that fit into one decode step.

        ``read_busy_s``: time per step the SSDs spend reading for other requests' prefills; reads
        still go first, writes take what is left of the step.
        """
        if decode_step_s < 0 or read_busy_s < 0:
            raise ValueError("decode_step_s and read_busy_s must be >= 0")
        return int(max(0.0, decode_step_s - read_busy_s) * self.hw.write_bps)

    def decode_write_steps(self, plan: PrefillPlan, decode_step_s: float, read_busy_s: float = 0.0) -> list[list[int]]:
        """The deferred writes grouped per decode step within the budget (a layer larger than a step gets one alone)."""
        budget = self.decode_budget(decode_step_s, read_busy_s)
        if budget == 0 and plan.deferred_writes:
            raise ValueError("no write budget: the reads fill the whole decode step")
        steps: list[list[int]] = []
        used = 0
        for j in plan.deferred_writes:
            if not steps or used + plan.write_bytes_per_layer > budget:
                steps.append([])
                used = 0
            steps[-1].append(j)
            used += plan.write_bytes_per_layer
        return steps


class ScheduleState:
    """The same rules, online: feed it events, ask it what to issue.

    Harness loop; times are ``now`` (seconds, any origin) or the clock (default time.monotonic()):

        st = ScheduleState(plan)
        at the start and after every event (st.on_read_done(i), st.on_write_done(j), st.on_compute_done(i)):
            if the compute engine is idle and st.can_compute(l): start l; st.on_compute_start(l)
            issue(st.next_reads())             # after the compute start: it may allow a read
            issue(st.next_writes())
        deferred = st.finish()                  # after the last layer: writes for the decode phase

    next_reads() returns nothing while a write is in flight; next_writes() returns nothing while
    a read is in flight or allowed, and only writes that its estimate says end before the next
    read is allowed (the estimate uses the compute time per layer it has observed).
    """

    def __init__(self, plan: PrefillPlan, clock=time.monotonic):
        self.plan = plan
        self.clock = clock
        self.n_layers = len(plan.writes_after_layer)
        self._reads = list(plan.read_order)  # not yet issued, in order
        self.reads_in_flight: set[int] = set()
        self.reads_done: set[int] = set()
        self.writes_in_flight: set[int] = set()
        self.writes_done: set[int] = set()
        self._pending: list[int] = []  # computed, write not yet issued
        self.compute_started: dict[int, float] = {}
        self.compute_done: dict[int, float] = {}
        self._compute_s = plan.predicted.layer_compute_s
        self._write_s = plan.predicted.layer_write_s
        self.finished = False

    # ------------------------------------------------------------ events

    def on_read_done(self, layer: int) -> None:
        self.reads_in_flight.remove(layer)
        self.reads_done.add(layer)

    def on_write_done(self, layer: int) -> None:
        self.writes_in_flight.remove(layer)
        self.writes_done.add(layer)

    def on_compute_start(self, layer: int, now: float | None = None) -> None:
        self.compute_started[layer] = self.clock() if now is None else now

    def on_compute_done(self, layer: int, now: float | None = None) -> None:
        t = self.clock() if now is None else now
        self.compute_done[layer] = t
        if layer in self.compute_started:
            self._compute_s = max(0.0, t - self.compute_started[layer])
        if self.plan.write_blocks:
            self._pending.append(layer)

    # ------------------------------------------------------------ decisions

    def can_compute(self, layer: int) -> bool:
        """Layer's KV is in place (or nothing is loaded) and the previous layer is done."""
        loaded = not self.plan.read_order or layer in self.reads_done
        return loaded and (layer == 0 or layer - 1 in self.compute_done)

    def _read_allowed(self, layer: int) -> bool:
        k = layer - self.plan.prefetch_depth
        return k < 0 or k in self.compute_started

    def next_reads(self) -> list[int]:
        """Reads to issue now (marked in flight)."""
        if self.writes_in_flight:
            return []
        out = []
        while self._reads and self._read_allowed(self._reads[0]):
            out.append(self._reads.pop(0))
        self.reads_in_flight.update(out)
        return out

    def next_writes(self, now: float | None = None) -> list[int]:
        """Writes to issue now (marked in flight)."""
        if self.finished or not self._pending or self.reads_in_flight:
            return []
        if self._reads:
            nxt = self._reads[0]
            if self._read_allowed(nxt):
                return []
            # Read nxt is allowed when compute of layer nxt - D starts; computes run back to back
            # from the latest started one, since every read before nxt has landed.
            k = max(self.compute_started, default=None)
            if k is None:
                return []
            t = self.clock() if now is None else now
            window = self.compute_started[k] + (nxt - self.plan.prefetch_depth - k) * self._compute_s - t
        else:
            window = float("inf")
        out, used = [], 0.0
        while self._pending and used + self._write_s <= window:
            out.append(self._pending.pop(0))
            used += self._write_s
        self.writes_in_flight.update(out)
        return out

    def finish(self) -> list[int]:
        """End of prefill: the writes not issued yet go to the decode phase."""
        self.finished = True
        deferred, self._pending = self._pending, []
        return deferred
