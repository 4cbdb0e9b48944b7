"""Write admission under an SSD write budget: which KV saves to write when the drive's endurance is the limit.

A KV cache rewrites its drives far faster than a database: every cold prompt's KV is a save.  With a
budget (``write_budget``: bytes per day, or drive writes per day of the store's capacity) the saves are
metered by a token bucket that refills at the budget's rate and holds at most ``burst_s`` seconds of it:

- while the bucket is at least half full, every save is admitted (no pressure: the budget is not the
  limit);
- below that, saves are ranked by expected value: prefixes seen before (an earlier request's lookup asked
  for them too, so a later one is likely to hit) first, longer ones first, and admitted while the bucket
  holds their bytes.  With ``policy="second_hit"`` a prefix is never written on its first sighting under
  pressure; with ``"expected_value"`` (the default) unseen prefixes still get what is left after the seen
  ones, down to an eighth of the bucket kept for the seen prefixes still to come.
- ``policy="all"`` admits everything and only counts (to measure what a budget would have cut).

Whatever is not admitted is counted (``skipped_saves``, ``skipped_bytes``): the connector reports these
with its other statistics.  The connector reads the config keys ``write_budget`` and
``write_admission`` (docs/operations.md); this module is the policy, with no vLLM in it.
"""
from __future__ import annotations

import collections
import dataclasses
import re
import time
from typing import Callable, Hashable, Iterable

POLICIES = ("expected_value", "second_hit", "all")
# Under pressure a first sighting may not take the bucket's last eighth: it is kept for prefixes seen
# again, which arrive later in the same refill and are worth more (benchmarks/write_budget.py, a week of
# the document workload at 0.6 of the unbudgeted writes: 36 % of the hits lost without it, 27 % with it).
UNSEEN_RESERVE = 0.125
DAY_S = 86400.0
_BUDGET_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*(?:/\s*(day|d|h|hour))?\s*$", re.I)


def parse_budget(text: str | int | float, capacity_bytes: int | None = None) -> float:
    """A write budget in bytes per day: ``"200GB/day"``, ``"1.5TiB"`` (per day), ``"0.3dwpd"`` (drive writes
    per day of ``capacity_bytes``), ``"10GB/h"``, or a number of bytes per day.  Raises ValueError with the
    reason."""
    from .cli.common import parse_size

    if isinstance(text, (int, float)) and not isinstance(text, bool):
        if not 0 < text < float("inf"):  # NaN too
            raise ValueError(f"write budget {text} must be a number of bytes per day above zero")
        return float(text)
    if not isinstance(text, str):
        raise ValueError(f"write budget must be text like '200GB/day' or '0.3dwpd', not {type(text).__name__}")
    m = _BUDGET_RE.match(text)
    if not m:
        raise ValueError(f"{text!r} is not a write budget: use e.g. 200GB/day, 10GiB/h or 0.3dwpd")
    number, unit, per = m.group(1), m.group(2).lower(), (m.group(3) or "day").lower()
    if unit == "dwpd":
        if m.group(3):
            raise ValueError(f"{text!r}: dwpd is already per day")
        if not capacity_bytes:
            raise ValueError(f"{text!r}: drive writes per day need the store's capacity")
        value = float(number) * capacity_bytes
    else:
        value = float(parse_size(number + unit))
        if per in ("h", "hour"):
            value *= 24
    if value <= 0:
        raise ValueError(f"write budget {text!r} must be above zero")
    return value


@dataclasses.dataclass(frozen=True)
class Save:
    """One candidate save: a request's new blocks.  ``prefix`` identifies the prefix (e.g. the hash of its
    last block), ``tokens`` its length, ``nbytes`` what writing it costs."""

    prefix: Hashable
    tokens: int
    nbytes: int


class Admission:
    """Token-bucket write budget with expected-value or second-hit admission (see the module docstring)."""

    def __init__(self, bytes_per_day: float | None, policy: str = "expected_value", burst_s: float = 3600.0,
                 seen_capacity: int = 1 << 16, clock: Callable[[], float] = time.monotonic):
        if policy not in POLICIES:
            raise ValueError(f"write_admission {policy!r}: one of {', '.join(POLICIES)}")
        if bytes_per_day is not None and bytes_per_day <= 0:
            raise ValueError("the write budget must be above zero")
        if burst_s <= 0 or seen_capacity <= 0:
            raise ValueError("burst_s and seen_capacity must be above zero")
        self.rate: float | None = None if bytes_per_day is None else bytes_per_day / DAY_S  # bytes per second
        self.policy = policy
        # Without a budget (rate None) the bucket is never looked at: size and tokens are then 0.
        self.size: float = 0.0 if self.rate is None else self.rate * burst_s
        self.tokens: float = self.size
        self.clock = clock
        self.last = clock()
        self.seen: collections.OrderedDict = collections.OrderedDict()
        self.seen_capacity = seen_capacity
        self.counters = {k: 0 for k in ("admitted_saves", "admitted_bytes", "skipped_saves", "skipped_bytes",
                                        "skipped_unseen", "pressure_steps")}

    # -------------------------------------------------------------- what was asked for

    def observe(self, prefixes: Iterable[Hashable]) -> None:
        """Lookups of these prefixes happened (the scheduler asked the store for them, the request that will
        save one of them included): each is counted once more."""
        for p in prefixes:
            self.seen[p] = self.seen.pop(p, 0) + 1
            if len(self.seen) > self.seen_capacity:
                self.seen.popitem(last=False)

    def times_seen(self, prefix: Hashable) -> int:
        return self.seen.get(prefix, 0)

    def seen_before(self, prefix: Hashable) -> bool:
        """Asked for by an earlier request too: observe() counts every lookup, the saving request's own
        included, so that is two sightings or more."""
        return self.times_seen(prefix) >= 2

    # -------------------------------------------------------------- the bucket

    def _refill(self) -> None:
        now = self.clock()
        if self.rate is not None:
            self.tokens = min(self.size, self.tokens + max(0.0, now - self.last) * self.rate)
        self.last = now

    def pressured(self) -> bool:
        """Is the budget the limit now (the bucket below half)?"""
        self._refill()
        return self.rate is not None and self.tokens < self.size / 2

    # -------------------------------------------------------------- deciding

    def admit(self, saves: list[Save]) -> list[Save]:
        """The saves of one step to write, in the order to write them; the rest are counted as skipped."""
        self._refill()
        if self.rate is None or self.policy == "all" or not self.pressured():
            chosen = list(saves)
        else:
            self.counters["pressure_steps"] += 1
            ranked = sorted(saves, key=lambda s: (self.seen_before(s.prefix), s.tokens), reverse=True)
            chosen = []
            budget = self.tokens
            for s in ranked:
                seen = self.seen_before(s.prefix)
                if self.policy == "second_hit" and not seen:
                    continue  # second hit: written only once a later request asked for it again
                if s.nbytes <= budget - (0.0 if seen else self.size * UNSEEN_RESERVE):
                    chosen.append(s)
                    budget -= s.nbytes
        picked = {id(s) for s in chosen}
        for s in saves:
            if id(s) in picked:
                self.counters["admitted_saves"] += 1
                self.counters["admitted_bytes"] += s.nbytes
                if self.rate is not None:
                    self.tokens -= s.nbytes  # "all" may overdraw: the debt delays later admissions
            else:
                self.counters["skipped_saves"] += 1
                self.counters["skipped_bytes"] += s.nbytes
                if not self.seen_before(s.prefix):
                    self.counters["skipped_unseen"] += 1
        return chosen

    def stats(self) -> dict:
        """Counters and the budget's state (bytes per day, tokens left), for the connector's statistics."""
        self._refill()
        return {**self.counters, "budget_bytes_per_day": None if self.rate is None else self.rate * DAY_S,
                "budget_tokens": None if self.rate is None else self.tokens, "policy": self.policy}
