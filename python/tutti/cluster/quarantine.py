"""Peers this process could not reach, or that let a fetch time out, left alone for a while.

Mooncake's master drops a dead node's entries only after its client_ttl; until then every lookup would
still name it and every request with its blocks would wait for a fetch that cannot succeed (up to
cluster_fetch_timeout_s).  A peer that failed once is instead skipped for cluster_peer_quarantine_s:
its blocks are misses at once (recomputed), and a block this node then holds itself is published over
that peer's descriptor (any holder's answer is a correct one: a fetch checks the bytes).  Afterwards the
peer is asked again; if it is still gone, it fails once more and is skipped again.
"""
from __future__ import annotations

import threading
import time


class Quarantine:
    """Endpoints skipped until a deadline; thread-safe.  ``seconds`` 0: nothing is ever skipped."""

    def __init__(self, seconds: float, clock=time.monotonic):
        self.seconds, self._clock = seconds, clock
        self._until: dict = {}
        self._new: list = []
        self._lock = threading.Lock()

    def add(self, endpoint: str) -> None:
        if self.seconds <= 0:
            return
        with self._lock:
            if not self._holds(endpoint):
                self._new.append(endpoint)
            self._until[endpoint] = self._clock() + self.seconds

    def _holds(self, endpoint: str) -> bool:
        until = self._until.get(endpoint)
        if until is None:
            return False
        if until <= self._clock():
            del self._until[endpoint]
            return False
        return True

    def holds(self, endpoint: str) -> bool:
        with self._lock:
            return self._holds(endpoint)

    def take_new(self) -> list:
        """Endpoints added since the last call (the vLLM worker tells its scheduler about them)."""
        with self._lock:
            out, self._new = self._new, []
        return out

    def active(self) -> list:
        with self._lock:
            return sorted(e for e in list(self._until) if self._holds(e))
