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
Hits cut whole measure nothing, so once per PROBE_EVERY_S without a load one is let through whole, and a
rate more than STALE_FACTOR off the estimate drops the old samples: the store is measured anew.

Remote blocks (cluster tier: the last ``remote`` blocks of a hit, held by peers) cost more: the worker
fetches them into its store before the forward starts (nothing hides that), then loads them like local
ones.  So each loaded remote block adds ``block_bytes / rate`` ahead of the pipeline above, the rate
being its holder's: the median of the workers' fetches from that peer (bytes asked over the time the
fetch took, failures included: a peer that times out is slow), else, for a peer not yet fetched from,
the median over all peers.  A fetch from several peers at once counts for each with its share of the
bytes over the whole time (a lower bound: they ran in parallel), so a slow peer prices its own blocks,
not everyone's.  Before the first fetch is measured, and when no fetch was
measured for PROBE_EVERY_S while remote blocks were being cut, it is DEFAULT_FETCH_BPS — and after such
a pause one hit is let through whole, so the rate is measured again instead of the default ruling
forever.  The predicted time is convex in the blocks loaded, so its minimum is at the end of the local
part, at the meeting point of load and compute, or at an end of the hit: the cut falls where fetching
stops paying.

A profile table (``tutti-admin profile``, the connector's ``profile`` key) gives the planner a start:
until the workers have reported enough loads (or prefill steps), the store's read rate is the table's
(``plan_io``: the rate measured alone when it has one) and a request's compute is the table's fitted
layer time for its own length, so the first requests of a slow store are cut from the start instead of
after a few slow ones.  Measured
rates replace each prior as soon as there are MIN_SAMPLES of them (the table was measured elsewhere,
or another day: what this server sees wins).
"""
from __future__ import annotations

import itertools
import statistics
import time
from collections import OrderedDict, deque
from typing import TYPE_CHECKING, Callable, Sequence

if TYPE_CHECKING:
    from .profile import ComputeProfile

# Samples needed of each rate before any hit is cut (a few requests into serving).
MIN_SAMPLES = 3
WINDOW = 9            # the last samples the medians are taken over
IO_BOUND = 0.5        # a load is I/O-bound when the forward waited for it at least this share of its time
MIN_GAIN = 0.8        # cut a hit only when the predicted time is at most this share of loading it all
# Remote blocks' fetch rate until one is measured: conservative, about what a fetch into the local
# store (TCP loopback, then a put) gave on the 2-core test VM (docs/cluster.md); a real network per
# stream is rarely faster over TCP.
DEFAULT_FETCH_BPS = 200e6
PROBE_EVERY_S = 60.0  # remote blocks cut this long without a fetch measured: measure again;
                      # the same for local blocks cut whole without a load measured
STALE_FACTOR = 2.0    # a probe's read rate this far from the estimate: the store changed, measure anew
MAX_PEERS = 256       # peers whose fetch rates are kept (the least recently fetched from go first)


class LoadPlanner:
    """Online read and compute rates, and the load length they make best."""

    def __init__(self, block_bytes: int, block_size: int, n_layers: int, *, min_step_tokens: int | None = None,
                 clock: Callable[[], float] = time.monotonic, prior: ComputeProfile | None = None):
        """``prior``: a tutti.sched.profile.ComputeProfile of this model, used until rates are measured."""
        if block_bytes <= 0 or block_size <= 0 or n_layers <= 0:
            raise ValueError("LoadPlanner: block_bytes, block_size and n_layers must be > 0")
        self.block_bytes, self.block_size, self.n_layers = block_bytes, block_size, n_layers
        # Steps with fewer tokens (decode) are mostly fixed cost: they would overstate a token's.
        self.min_step_tokens = min_step_tokens if min_step_tokens is not None else 2 * block_size
        # The last loads, (bytes/s, I/O-bound): those the forward waited for measure the store; those
        # compute hid only bound it from below.  One window for both, so old evidence of either kind
        # ages out (a store that was fast once, or slow once, is not taken to be so for good).
        self._loads: deque = deque(maxlen=WINDOW)
        self._last_load: float | None = None          # when a load was last measured (or probed)
        self._probing = False                         # a hit was let through whole to measure again
        self._token: deque = deque(maxlen=WINDOW)     # compute seconds per token
        self._fetch: deque = deque(maxlen=WINDOW)     # bytes/s of fetches from peers (cluster tier)
        self._peer_fetch: OrderedDict = OrderedDict()  # peer -> deque of its fetches' bytes/s
        self._clock = clock
        self._last_fetch: float | None = None         # when a fetch was last measured (or probed)
        self.prior = prior
        from .profile import plan_io
        pi = plan_io(getattr(prior, "io", None))
        self._prior_read_bps = pi["read_gbps"] * 1e9 if pi and pi["read_gbps"] else None

    def observe_load(self, nbytes: int, wall_s: float, stall_s: float) -> None:
        """A finished load: its bytes, its time from start to the last layer, and how long the
        forward sat waiting for it."""
        if nbytes <= 0 or not wall_s > 0:
            return
        bps = nbytes / wall_s
        io_bound = stall_s >= IO_BOUND * wall_s
        self._last_load = self._clock()
        if self._probing:
            self._probing = False
            est = self.read_bps
            if est and io_bound and not est / STALE_FACTOR <= bps <= est * STALE_FACTOR:
                self._loads.clear()  # the store is not what the window says any more: measure it anew
        self._loads.append((bps, io_bound))

    def observe_step(self, tokens: int, compute_s: float) -> None:
        """A forward that computed ``tokens`` tokens in ``compute_s`` (its load waits taken out)."""
        if tokens >= self.min_step_tokens and compute_s > 0:
            self._token.append(compute_s / tokens)

    def observe_fetch(self, nbytes: int, wall_s: float, peers: dict | None = None) -> None:
        """A worker's fetch of remote blocks into its store: the bytes it asked for and how long it
        took (blocks that did not arrive included); ``peers``: blocks asked of each peer."""
        if not (nbytes > 0 and wall_s > 0):
            return
        self._fetch.append(nbytes / wall_s)
        self._last_fetch = self._clock()
        total = sum(peers.values()) if peers else 0
        for peer, blocks in (peers or {}).items():
            if blocks > 0:
                w = self._peer_fetch.pop(peer, None) or deque(maxlen=WINDOW)
                w.append(nbytes * blocks / total / wall_s)
                self._peer_fetch[peer] = w
        while len(self._peer_fetch) > MAX_PEERS:
            self._peer_fetch.popitem(last=False)

    @property
    def fetch_bps(self) -> float:
        """The fetch rate remote blocks are priced at: measured, else DEFAULT_FETCH_BPS."""
        return statistics.median(self._fetch) if self._fetch else DEFAULT_FETCH_BPS

    def peer_fetch_bps(self, peer: str) -> float:
        """The rate blocks held by ``peer`` are priced at: its fetches' median, else fetch_bps."""
        w = self._peer_fetch.get(peer)
        return statistics.median(w) if w else self.fetch_bps

    def _fetch_cum(self, blocks: int, owners: Sequence[str] | None) -> list[float]:
        """Seconds to fetch the first 0, 1, ..., ``blocks`` remote blocks, ``owners`` naming each one's
        holder (blocks past its end, or all without it, at fetch_bps): worked out once per hit, then
        read for every load length tried."""
        named = list(owners or ())[:max(blocks, 0)]
        rates = {o: self.peer_fetch_bps(o) for o in set(named)}
        per = [self.block_bytes / rates[o] for o in named]
        per += [self.block_bytes / self.fetch_bps] * (max(blocks, 0) - len(named))
        return list(itertools.accumulate(per, initial=0.0))

    @property
    def read_bps(self) -> float | None:
        """The store's read rate: the median of the window's I/O-bound loads, at least the fastest load
        compute hid; the profile's (or None) until MIN_SAMPLES I/O-bound loads are in the window."""
        io = self._io_bound_bps()
        if len(io) < MIN_SAMPLES:
            return self._prior_read_bps
        return max(statistics.median(io), max((bps for bps, io_bound in self._loads if not io_bound),
                                              default=0.0))

    def _io_bound_bps(self) -> list:
        """Rates of the window's loads the forward waited for: the store's read rate samples."""
        return [bps for bps, io_bound in self._loads if io_bound]

    @property
    def token_s(self) -> float | None:
        """Measured compute seconds per token (None until MIN_SAMPLES steps; see _compute_s)."""
        return statistics.median(self._token) if len(self._token) >= MIN_SAMPLES else None

    def _compute_s(self, rest_tokens: int, prefix_tokens: int) -> float | None:
        """The forward of ``rest_tokens`` new tokens after ``prefix_tokens`` loaded ones: measured
        per-token time, else the profile's fitted layer time (which knows attention grows with both)."""
        tt = self.token_s
        if tt is not None:
            return max(rest_tokens, 1) * tt
        if self.prior is not None:
            return self.n_layers * self.prior.layer_time(max(rest_tokens, 1), max(prefix_tokens, 0))
        return None

    def _effective_token_s(self, new_tokens: int) -> float | None:
        """Seconds per token of this request computed whole (the closed-form meeting point's)."""
        c = self._compute_s(new_tokens, 0)
        return None if c is None else c / max(new_tokens, 1)

    def predict_s(self, load_blocks: int, new_tokens: int, remote_from: int | None = None,
                  owners: Sequence[str] | None = None) -> float | None:
        """Predicted time of a request loading ``load_blocks`` of its ``new_tokens`` (fetch of the
        remote ones, then the forward), where the blocks from ``remote_from`` on are remote, held by
        ``owners`` (one peer per remote block, in order; optional)."""
        cum = None
        if remote_from is not None and load_blocks > remote_from:
            cum = self._fetch_cum(load_blocks - remote_from, owners)
        return self._predict_s(load_blocks, new_tokens, remote_from, cum)

    def _predict_s(self, load_blocks: int, new_tokens: int, remote_from: int | None,
                   fetch_cum: list[float] | None) -> float | None:
        """predict_s, the fetch of the first k remote blocks taking ``fetch_cum[k]`` seconds."""
        rb = self.read_bps
        loaded = load_blocks * self.block_size
        compute = self._compute_s(new_tokens - loaded, loaded)
        if rb is None or compute is None:
            return None
        load = load_blocks * self.block_bytes / rb
        fetch = 0.0
        if remote_from is not None and load_blocks > remote_from and fetch_cum is not None:
            fetch = fetch_cum[load_blocks - remote_from]
        return fetch + max(load, compute) + load / self.n_layers

    def blocks_to_load(self, hit_blocks: int, new_tokens: int, remote_blocks: int = 0,
                       remote_owners: Sequence[str] | None = None) -> int:
        """Of ``hit_blocks`` stored blocks at the head of ``new_tokens`` tokens still to process, the
        last ``remote_blocks`` of them held by peers (``remote_owners``: each one's holder, in order),
        how many to load (the rest recomputed)."""
        if hit_blocks <= 0:
            return 0
        remote_blocks = min(max(remote_blocks, 0), hit_blocks)
        local = hit_blocks - remote_blocks
        rfrom = local if remote_blocks else None
        cum = self._fetch_cum(remote_blocks, remote_owners) if remote_blocks else None
        full = self._predict_s(hit_blocks, new_tokens, rfrom, cum)
        if full is None:
            return hit_blocks
        tt = self._effective_token_s(new_tokens)
        t_load = self.block_bytes / self.read_bps  # type: ignore[operator]
        t_block = self.block_size * tt  # type: ignore[operator]
        # Where the load and the compute of the rest meet; beyond it every block loaded adds time.  With
        # remote blocks the time is still convex in k: its minimum is at a meeting point, at the end of
        # the local part, or at an end of the hit.
        k = int(new_tokens * tt / (t_load + t_block))  # type: ignore[operator]
        cands = {min(max(c, 0), hit_blocks) for c in (k - 1, k, k + 1, local, 0, hit_blocks)}
        if self.token_s is None:  # the profile's curve: not linear in the tokens, so look around too
            cands |= {hit_blocks * i // 32 for i in range(33)}
        best = min(cands, key=lambda b: (self._predict_s(b, new_tokens, rfrom, cum), -b))
        if best < hit_blocks and self._predict_s(best, new_tokens, rfrom, cum) <= MIN_GAIN * full:  # type: ignore[operator]
            if remote_blocks and self._probe_due():  # the cut takes remote blocks first
                return hit_blocks  # no fetch measured for long: this hit fetches them, to measure
            if best == 0 and self._read_probe_due():
                # Every hit cut whole measures nothing: without this, one slow spell would stop
                # loading until the server restarts.  One hit per PROBE_EVERY_S loads, to measure.
                self._probing = True
                return hit_blocks
            return best
        return hit_blocks

    def _probe_due(self) -> bool:
        """True (once per PROBE_EVERY_S) when no fetch was measured for that long: a hit whose remote
        part would be cut is let through whole, to measure the rate again."""
        now = self._clock()
        if self._last_fetch is None:
            self._last_fetch = now  # the default rules for the first PROBE_EVERY_S
            return False
        if now - self._last_fetch < PROBE_EVERY_S:
            return False
        self._last_fetch = now
        return True

    def _read_probe_due(self) -> bool:
        """True (once per PROBE_EVERY_S) when no load was measured for that long."""
        now = self._clock()
        if self._last_load is None:
            self._last_load = now  # cut from a profile table before any load: it rules for a while
            return False
        if now - self._last_load < PROBE_EVERY_S:
            return False
        self._last_load = now
        return True

    def describe(self) -> dict:
        rb, tt = self.read_bps, self.token_s
        return {"read_MBps": round(rb / 1e6, 2) if rb else None,
                "token_us": round(tt * 1e6, 2) if tt else None,
                "fetch_MBps": round(self.fetch_bps / 1e6, 2),
                "peer_fetch_MBps": {p: round(statistics.median(w) / 1e6, 2) for p, w in self._peer_fetch.items()},
                "read_samples": len(self._io_bound_bps()),
                "token_samples": len(self._token),
                "fetch_samples": len(self._fetch), "profile": self.prior is not None}
