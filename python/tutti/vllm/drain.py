"""How many bytes of carried-over writes a step submits (``drain_bytes_per_step: auto``).

Deferred saves' queued layers go out at the end of a step and run while the next step computes: that
step is their slack. They cost nothing unless a later step loads: a read never shares the SSDs with a
write (write_policy slack), so the load first waits for the writes in flight, and that wait is the
next request's TTFT. So a step's drain should be what the store writes in about one step: then the
writes in flight when a load arrives are one or two steps' worth, whenever it arrives, while the store
still writes all the time. The size follows what is measured (the worker, saves.py), seeded by the
profile table when there is one:

- **spilled**: a drain is still being written at the end of the step after the next (``Txn.poll``;
  the drain from one step end may still run when the next goes out, so the store never idles between
  them, but not two). The size shrinks by a quarter, once for that drain, and nothing more is drained
  until it is written: at most two drains in flight, so a load waits for about two steps' writes at
  most (not for a backlog), and a backlog does not cut the size again and again.
- **held up**: a load had to wait (>= WAIT_S) for drained writes. The size halves: that wait was TTFT.
- **saturated**: the size left writes queued whose KV was final (the next layer did not fit), the last
  drain was written within its step (the store kept up), and neither of the above. The size grows by
  a quarter.

At most one cut a step; no growth in a step that was cut. Between one layer of one save (every save
progresses) and the pending bound. The profile table's write rate (``profile``; ``sched.plan_io``) sets the size
once the first step's duration is known: the bytes that rate writes in one step. Without a table it
starts at START. A data path that cannot tell whether writes completed (``poll`` always True) never
spills: only loads that waited then cut the size. Measured on the host-memory path (CPU) and on
``staged`` (H200); ``gio`` keeps the rule before the fit (slack_fit_for). On a GPU data path the size
is at most GPU_STEP_CEILING.
"""
from __future__ import annotations

START = 64 << 20     # the fixed default before ``auto``; the size until a profile seeds it
# On a GPU data path a drain's work (gather kernels, copies; gio's moves under the emulated
# controller) runs beside the next steps' kernels: the size is kept at most this.  Measured beside
# decode steps replayed from a CUDA graph on the H200 (8-11 ms steps, Llama-3-8B shape), staged:
# drains of 110-128 MiB a step cost the steps 0.9-2.5 %, 263 MiB 6.3 %, 420 MiB 3.6 %
# (docs/benchmarks.md, "The drain rule on the GPU paths").  At least one layer still goes each step.
GPU_STEP_CEILING = 128 << 20
WAIT_S = 0.001       # a load that waited less than this for writes was not held up


def slack_fit_for(path) -> bool:
    """Does the slack fit size this data path's drains?  On the H200 (docs/benchmarks.md, "The drain
    rule on the GPU paths") it bounds ``staged``'s drained writes in flight to a step or two, where the
    earlier rule let 1-4 GiB go at once (a hit then waited up to 0.5 s for them).  ``gio`` keeps the
    earlier rule: with the emulated controller its writes complete within the next step, so the fit
    only grows the drain to the pending bound, and the emulator's data moves on the SMs then cost the
    decode steps more (1.43x vs 1.2x at 8K) -- to be measured again on a real controller.  ``gds`` runs
    the same pipeline as ``staged`` (file_pipe) and gets the fit with it, unmeasured itself."""
    return path != "gio"


class DrainBudget:
    """Bytes a step may drain, sized to the steps' slack: what the store writes in about one step."""

    # False: the rule before the slack fit (no spill cut, no wait for a late drain, growth while
    # writes are left queued): gio's rule (slack_fit_for), and the baseline of
    # benchmarks/drain_slack.py and save_step_gpu.py --slack-fit off; not a setting.
    slack_fit = True

    def __init__(self, floor: int, ceiling: int, start: int = START, write_bps: float | None = None):
        self.floor = max(1, floor)
        self.ceiling = max(self.floor, ceiling)
        self.bytes = self._clamp(start)
        self._cut_this_step = False
        self._write_bps = write_bps if write_bps and write_bps > 0 else None
        self.held_up = 0          # loads that waited for drained writes
        self.waited_s = 0.0
        self.spills = 0           # drains still being written two step ends after they went out

    def _clamp(self, n: float) -> int:
        return int(min(max(n, self.floor), self.ceiling))

    def step_time(self, seconds: float) -> None:
        """A step took ``seconds`` (end to end). The first one, with a profile's write rate, sizes the
        drain: the bytes the store writes in one step. Measurements rule from then on."""
        if self._write_bps is not None and seconds > 0:
            self.bytes = self._clamp(self._write_bps * seconds)
            self._write_bps = None

    def load_waited(self, seconds: float) -> None:
        """A load started ``seconds`` after asking (waiting for writes in flight)."""
        if seconds < WAIT_S:
            return
        self.held_up += 1
        self.waited_s += seconds
        if not self._cut_this_step:
            self.bytes = max(self.floor, self.bytes // 2)
            self._cut_this_step = True

    def spilled(self) -> None:
        """A drain is still being written two step ends after it went out (called once for it)."""
        self.spills += 1
        if not self._cut_this_step:
            self.bytes = max(self.floor, self.bytes - self.bytes // 4)
            self._cut_this_step = True

    def step_drained(self, spent: int, wanted_more: bool) -> None:
        """The end of a step's drain: ``spent`` bytes submitted; ``wanted_more``: the budget left
        writes queued whose KV was final (the next layer did not fit)."""
        if wanted_more and not self._cut_this_step:
            self.bytes = min(self.ceiling, self.bytes + max(self.bytes // 4, self.floor))
        self._cut_this_step = False


class DrainRate:
    """``drain_bytes_per_step`` fixed at N: N bytes a step on average.  The next layer to go, when larger
    than N (a long prompt's layer, or any with a small N), waits until the steps' unspent N add up to it
    instead of going out every step: the setting then bounds what drains take from the steps beside
    them on average (on a GPU path their gathers and copies run beside the next steps' kernels)."""

    def __init__(self, per_step: int):
        self.per_step = max(1, per_step)
        self.credit = 0   # bytes saved up by steps that sent less than per_step

    def budget(self, next_bytes: int | None) -> int:
        """This step's bytes to drain, given the next layer's size (None: nothing final is queued, so
        nothing is saved up for a burst later); 0: not this step."""
        if next_bytes is None:
            self.credit = 0
            return 0
        self.credit = min(self.credit + self.per_step, max(self.per_step, next_bytes))
        return self.credit if self.credit >= next_bytes else 0

    def spent(self, n: int) -> None:
        """The step's drain submitted ``n`` bytes of its budget."""
        self.credit = max(self.credit - n, 0)
