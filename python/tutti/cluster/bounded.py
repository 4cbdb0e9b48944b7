"""Every call into Mooncake ends within a deadline.

Mooncake's own RPCs wait ~4 s on a dead master and a transfer to a killed peer may wait longer; a
serving engine cannot.  ``Bounded.call`` runs the call on a daemon thread and returns at the deadline
(the call is then a failure for the caller).  A call still running in C past its deadline cannot be
stopped: it is counted as *stuck* until it returns, and while ``max_stuck`` are stuck new calls fail at
once instead of piling up threads.  Calls running within their deadline are not stuck: the pipelined
fetch (tutti.cluster.transfer) runs several at once.
"""
from __future__ import annotations

import threading

from .. import affinity
from ..errors import CallTimeout  # a Mooncake call did not answer in time (or too many are stuck)

__all__ = ["Bounded", "CallTimeout"]


class Bounded:
    def __init__(self, max_stuck: int = 4):
        self.max_stuck = max_stuck
        self._stuck = 0
        self._lock = threading.Lock()
        self.timeouts = 0

    @property
    def stuck(self) -> int:
        return self._stuck

    def call(self, timeout_s: float, fn, *args, what: str = "mooncake call"):
        """``fn(*args)``'s result, or CallTimeout after ``timeout_s``; its exception is re-raised."""
        with self._lock:
            if self._stuck >= self.max_stuck:
                raise CallTimeout(f"{what}: {self._stuck} earlier calls are still stuck (peer or master down?)")
        box: dict = {}

        def run():
            affinity.service_thread()  # Mooncake's synchronous calls poll on the calling thread
            try:
                box["v"] = fn(*args)
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                box["e"] = e
            finally:
                with self._lock:
                    box["done"] = True
                    if box.get("stuck"):
                        self._stuck -= 1

        t = threading.Thread(target=run, name="tutti-mooncake-call", daemon=True)
        t.start()
        t.join(timeout_s)
        with self._lock:
            late = "done" not in box
            if late:
                box["stuck"] = True
                self._stuck += 1
                self.timeouts += 1
        if late:
            raise CallTimeout(f"{what}: no answer in {timeout_s:g} s")
        if "e" in box:
            raise box["e"]
        return box.get("v")
