"""Exact event times of the layer pipeline, and where writes fit between reads.

Layer i's KV is read from SSD, then layer i is computed.  Reads are serial (a layer's
objects are striped over every SSD, so one layer's read already uses all of them);
compute is serial; layer i's compute starts when its KV has landed and layer i-1's
compute is done.  The prefetch depth D bounds how far reads run ahead: while layer k
is being computed, reads of layers up to k + D may be in flight or done, i.e. the read
of layer i may start once the compute of layer i - D has started.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

EPS = 1e-12  # relative slack for comparing float event times


def _per_layer(x: float | Sequence[float], n: int, what: str) -> list[float]:
    xs = [float(x)] * n if isinstance(x, (int, float)) else [float(v) for v in x]
    if len(xs) != n:
        raise ValueError(f"{what}: {len(xs)} values for {n} layers")
    if any(not v >= 0 for v in xs):
        raise ValueError(f"{what}: times must be >= 0")
    return xs


@dataclass(frozen=True)
class Timeline:
    """Start and end of every read and compute, in seconds from the prefill's start. No reads: empty."""

    read_start: tuple[float, ...]
    read_end: tuple[float, ...]
    compute_start: tuple[float, ...]
    compute_end: tuple[float, ...]

    @property
    def ttft(self) -> float:
        return self.compute_end[-1]

    def write_windows(self) -> list[tuple[float, float, int]]:
        """Intervals in [0, ttft] with no read in flight: (start, end, index of the read they follow, -1: none)."""
        if not self.read_end:
            return [(0.0, self.ttft, -1)]
        wins = [(self.read_end[i], self.read_start[i + 1], i) for i in range(len(self.read_end) - 1)
                if self.read_start[i + 1] > self.read_end[i]]
        if self.ttft > self.read_end[-1]:
            wins.append((self.read_end[-1], self.ttft, len(self.read_end) - 1))
        return wins


def simulate_pipeline(n_layers: int, load_s: float | Sequence[float], compute_s: float | Sequence[float],
                      prefetch_depth: int = 2) -> Timeline:
    """Run the pipeline; a load of 0 for every layer means nothing is read (no hit)."""
    if n_layers < 1:
        raise ValueError(f"n_layers must be >= 1, got {n_layers}")
    if prefetch_depth < 1:
        raise ValueError(f"prefetch_depth must be >= 1, got {prefetch_depth}")
    io = _per_layer(load_s, n_layers, "load_s")
    c = _per_layer(compute_s, n_layers, "compute_s")
    reads = any(v > 0 for v in io)
    rs: list[float] = []
    re: list[float] = []
    cs: list[float] = []
    ce: list[float] = []
    for i in range(n_layers):
        landed = 0.0
        if reads:
            allowed = cs[i - prefetch_depth] if i >= prefetch_depth else 0.0
            rs.append(max(re[-1] if re else 0.0, allowed))
            re.append(rs[-1] + io[i])
            landed = re[-1]
        cs.append(max(landed, ce[-1] if ce else 0.0))
        ce.append(cs[-1] + c[i])
    return Timeline(tuple(rs), tuple(re), tuple(cs), tuple(ce))


def place_writes(tl: Timeline, write_s: float | Sequence[float]) -> list[tuple[float, float, int] | None]:
    """Greedy, in layer order: each layer's write goes into the first read-free window where it fits whole.

    A write may start once its layer's compute is done and must end before the next read is
    allowed to start (reads go first, and reads and writes never share the SSDs), or, after the
    last read, before the prefill ends.  Returns per layer (start, end, index of the read the
    write follows or -1), or None: no slack left, the write is deferred to the decode phase.
    """
    n = len(tl.compute_end)
    w = _per_layer(write_s, n, "write_s")
    wins = tl.write_windows()
    out: list[tuple[float, float, int] | None] = []
    cursor, k = 0.0, 0  # writes are serial: the next one starts no earlier than the last one placed ends
    for j in range(n):
        t = max(cursor, tl.compute_end[j])
        placed = None
        for wi in range(k, len(wins)):
            start = max(t, wins[wi][0])
            if start + w[j] <= wins[wi][1] * (1 + EPS):
                placed = (start, start + w[j], wins[wi][2])
                cursor, k = start + w[j], wi
                break
        out.append(placed)
    return out
