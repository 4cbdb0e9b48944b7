"""Waiting for a worker's pending saves to be written (tests that count the steps a commit takes).

A deferred save is committed at the first ``wait_for_save`` after its writes completed
(``tutti.vllm.saves``: a step never waits for them), so on a real store the step that commits it
depends on the device.  A test that asserts which step commits calls ``settle(w)`` before the step:
then every save written by then is committed by that step, as on an infinitely fast store.
"""
import time

from tutti.vllm.saves import SavesMixin


def settle(w, timeout_s: float = 30.0) -> None:
    """Wait until the writes of every pending save of worker ``w`` have completed (bounded)."""
    end = time.monotonic() + timeout_s
    for e in list(getattr(w, "_fifo", ())):
        while not e.void and not SavesMixin._written(e):
            if time.monotonic() > end:
                raise AssertionError(f"the writes of a pending save did not complete in {timeout_s} s")
            time.sleep(0.001)
