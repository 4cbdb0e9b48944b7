"""How many bytes of carried-over writes a step submits (``drain_bytes_per_step: auto``).

Deferred saves' queued layers go out at the end of a step and run while the next step computes. They
cost nothing unless the next step loads: a read never shares the SSDs with a write (write_policy slack),
so the load first waits for them, and that wait is the next request's TTFT. The budget therefore follows
what is measured, not a model: a load that had to wait for drained writes halves it (at most once a
step); a step that spent its whole budget with no load held up since grows it by a quarter. Between
one layer of one save (every save progresses) and the pending bound. Decode-only stretches drain fast;
steps that load keep the drain to what fits before the next read.
"""
from __future__ import annotations

START = 64 << 20     # the fixed default before ``auto``
WAIT_S = 0.001       # a load that waited less than this for writes was not held up


class DrainBudget:
    """Bytes a step may drain, adapted to whether drained writes held up the next load."""

    def __init__(self, floor: int, ceiling: int, start: int = START):
        self.floor = max(1, floor)
        self.ceiling = max(self.floor, ceiling)
        self.bytes = min(max(start, self.floor), self.ceiling)
        self._cut_this_step = False
        self.held_up = 0          # loads that waited for drained writes
        self.waited_s = 0.0

    def load_waited(self, seconds: float) -> None:
        """A load started ``seconds`` after asking (waiting for writes in flight)."""
        if seconds < WAIT_S:
            return
        self.held_up += 1
        self.waited_s += seconds
        if not self._cut_this_step:
            self.bytes = max(self.floor, self.bytes // 2)
            self._cut_this_step = True

    def step_drained(self, spent: int, wanted_more: bool) -> None:
        """The end of a step's drain: ``spent`` bytes submitted; ``wanted_more``: writes were left
        queued when the budget ran out."""
        if wanted_more and not self._cut_this_step and spent >= self.bytes:
            self.bytes = min(self.ceiling, self.bytes + max(self.bytes // 4, self.floor))
        self._cut_this_step = False
