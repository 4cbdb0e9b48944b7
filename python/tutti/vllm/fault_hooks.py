"""Faults the connector's own tests inject into a real vLLM run (inert unless asked for).

    TUTTI_VLLM_TEST_CRASH_AFTER_SAVED_LAYERS=N  SIGKILL the worker after N layer writes
    TUTTI_VLLM_TEST_LOAD_FAULTS=k1,k2,...       the i-th step that loads gets fault k_i on the
                                                middle block of its load: none, missing (the key
                                                is dropped from the store first, as when the
                                                scheduler's index is a step stale), checksum
                                                (bytes flipped on disk), eio (the block's read
                                                reports -EIO), unwaited (the model's wait for
                                                the middle layer is skipped)

vLLM drives the worker, so these are the only way to make each kind of failure happen at a
known step of a real engine; the worker-level tests inject the same kinds directly.
"""
import errno
import os

LOAD_FAULTS = ("none", "missing", "checksum", "eio", "unwaited")

_plan: dict = {}


def _faults() -> dict:
    """This process's plan, read from its environment at first use (not at import: a process forked
    from one that imported this module, as the tests' zygote does, has an environment of its own)."""
    if _plan.get("pid") != os.getpid():
        loads = [k for k in os.environ.get("TUTTI_VLLM_TEST_LOAD_FAULTS", "").split(",") if k]
        if any(k not in LOAD_FAULTS for k in loads):
            raise ValueError(f"TUTTI_VLLM_TEST_LOAD_FAULTS: kinds are {', '.join(LOAD_FAULTS)}")
        _plan.update(pid=os.getpid(), loads=loads, rank=os.environ.get("TUTTI_VLLM_TEST_FAULT_RANK", ""),
                     crash_after=int(os.environ.get("TUTTI_VLLM_TEST_CRASH_AFTER_SAVED_LAYERS", "0")))
    return _plan


def _mine(f, rank):
    return f["rank"] in ("", str(rank))


def crash_point(rank=0):
    """SIGKILL this process after N layers of saves were submitted (mid-transaction)."""
    f = _faults()
    if f["crash_after"] > 0 and _mine(f, rank):
        f["crash_after"] -= 1
        if f["crash_after"] == 0:
            os.kill(os.getpid(), 9)


def next_load_fault(store, keys, rank=0):
    """The fault planned for this load (None: none); makes missing/checksum happen on disk."""
    f = _faults()
    plan = f["loads"]
    if not plan or not _mine(f, rank):
        return None
    kind = plan.pop(0)
    victim = keys[len(keys) // 2]
    slot = store.lookup([victim])[0]
    if kind == "missing" and slot is not None:
        store.invalidate([slot])
    elif kind == "checksum" and slot is not None:
        member, off = store.locate(slot, store.geometry.n_layers - 1, 0)
        with open(store.paths[member], "r+b") as f:
            f.seek(off + 64)
            b = f.read(16)
            f.seek(off + 64)
            f.write(bytes(x ^ 0x5A for x in b))
    return None if kind == "none" else kind


def apply_eio(kind, status):
    """The middle block's read failed with -EIO (an I/O error, not corruption)."""
    if kind == "eio" and status:
        status = list(status)
        status[len(status) // 2] = status[len(status) // 2] or -errno.EIO
    return status


def skip_wait(kind, layer, n_layers):
    return kind == "unwaited" and layer == n_layers // 2
