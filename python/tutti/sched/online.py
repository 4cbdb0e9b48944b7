"""How much of a stored prefix to load, from rates measured while serving (issue 13: loads only where
they pay).

The connector's scheduler side asks ``blocks_to_load`` for every hit.  The model is the layer-wise
pipeline's: loading k blocks and computing the other tokens of the request costs about
``max(k * t_load, rest_tokens * t_token) + k * t_load / n_layers`` (a layer's load overlaps the
previous layer's compute; the first layer's load is not hidden).  That is lowest where the two terms
meet, so above that point the rest of the hit is recomputed instead of loaded.

The rates come from the workers: a load the forward waited for most of the time (I/O-bound) gives the
store's read rate; a load hidden under compute only shows the rate is at least that high; prefill steps
give compute seconds per token.  Medians of the last few samples, so one slow step does not swing it;
until there are enough, and unless the gain is clear, the whole hit is loaded (what a fast store gets).
"""
from __future__ import annotations

import statistics
from collections import deque

# Samples needed of each rate before any hit is cut (a few requests into serving).
MIN_SAMPLES = 3
WINDOW = 9            # the last samples the medians are taken over
IO_BOUND = 0.5        # a load is I/O-bound when the forward waited for it at least this share of its time
MIN_GAIN = 0.8        # cut a hit only when the predicted time is at most this share of loading it all


class LoadPlanner:
    """Online read and compute rates, and the load length they make best."""

    def __init__(self, block_bytes: int, block_size: int, n_layers: int, *, min_step_tokens: int | None = None):
        if block_bytes <= 0 or block_size <= 0 or n_layers <= 0:
            raise ValueError("LoadPlanner: block_bytes, block_size and n_layers must be > 0")
        self.block_bytes, self.block_size, self.n_layers = block_bytes, block_size, n_layers
        # Steps with fewer tokens (decode) are mostly fixed cost: they would overstate a token's.
        self.min_step_tokens = min_step_tokens if min_step_tokens is not None else 2 * block_size
        self._read: deque = deque(maxlen=WINDOW)      # bytes/s of I/O-bound loads
        self._hidden_bps = 0.0                        # highest bytes/s of a load compute hid
        self._token: deque = deque(maxlen=WINDOW)     # compute seconds per token

    def observe_load(self, nbytes: int, wall_s: float, stall_s: float) -> None:
        """A finished load: its bytes, its time from start to the last layer, and how long the
        forward sat waiting for it."""
        if nbytes <= 0 or not wall_s > 0:
            return
        bps = nbytes / wall_s
        if stall_s >= IO_BOUND * wall_s:
            self._read.append(bps)
        else:
            self._hidden_bps = max(self._hidden_bps, bps)

    def observe_step(self, tokens: int, compute_s: float) -> None:
        """A forward that computed ``tokens`` tokens in ``compute_s`` (its load waits taken out)."""
        if tokens >= self.min_step_tokens and compute_s > 0:
            self._token.append(compute_s / tokens)

    @property
    def read_bps(self) -> float | None:
        if len(self._read) < MIN_SAMPLES:
            return None
        return max(statistics.median(self._read), self._hidden_bps)

    @property
    def token_s(self) -> float | None:
        return statistics.median(self._token) if len(self._token) >= MIN_SAMPLES else None

    def predict_s(self, load_blocks: int, new_tokens: int) -> float | None:
        """Predicted forward time of a request loading ``load_blocks`` of its ``new_tokens``."""
        rb, tt = self.read_bps, self.token_s
        if rb is None or tt is None:
            return None
        load = load_blocks * self.block_bytes / rb
        compute = max(new_tokens - load_blocks * self.block_size, 1) * tt
        return max(load, compute) + load / self.n_layers

    def blocks_to_load(self, hit_blocks: int, new_tokens: int) -> int:
        """Of ``hit_blocks`` stored blocks at the head of ``new_tokens`` tokens still to process,
        how many to load (the rest recomputed)."""
        if hit_blocks <= 0:
            return 0
        full = self.predict_s(hit_blocks, new_tokens)
        if full is None:
            return hit_blocks
        t_load = self.block_bytes / self.read_bps  # type: ignore[operator]
        t_block = self.block_size * self.token_s  # type: ignore[operator]
        # Where the load and the compute of the rest meet; beyond it every block loaded adds time.
        k = int(new_tokens * self.token_s / (t_load + t_block))  # type: ignore[operator]
        best = min((min(max(k + d, 0), hit_blocks) for d in (-1, 0, 1)),
                   key=lambda b: (self.predict_s(b, new_tokens), -b))
        if best < hit_blocks and self.predict_s(best, new_tokens) <= MIN_GAIN * full:  # type: ignore[operator]
            return best
        return hit_blocks

    def describe(self) -> dict:
        rb, tt = self.read_bps, self.token_s
        return {"read_MBps": round(rb / 1e6, 2) if rb else None,
                "token_us": round(tt * 1e6, 2) if tt else None,
                "read_samples": len(self._read), "token_samples": len(self._token)}
