"""Commit a block on every TP rank or on none; serve it only if every rank has it.

Each rank writes its shard through its own store.  ``commit`` then runs:

  1. prepare: this rank's data is durable (flushed), no record written;
  2. agree:   all-reduce(MIN) of "durable here" per block over the group;
  3. finish:  commit the blocks durable on every rank, veto the others;
  4. agree:   all-reduce(MIN) of "committed here"; a block some rank failed
              to commit is invalidated again where it was committed.

A rank that dies before 2 makes the collective fail on the others, which
abort: nothing of the batch is committed anywhere.  A rank that dies after 2
may leave the block committed on some ranks only (an orphan); it is never
served, because ``lookup`` requires every rank to hold a key, and
``reconcile`` drops it when the group reopens.

Collectives take any torch.distributed group (gloo on CPU; with NCCL the
flags travel in a CUDA tensor).  ``group=None`` outside torch.distributed, or
a group of one rank, is today's single-store commit.  ``timeout`` (seconds, per
collective) bounds each wait where a peer may be gone (shutdown): a collective
that times out is a GroupError like a dead rank's, and the group is not used
again.
"""
import errno
import logging

from ..errors import GroupError

log = logging.getLogger("tutti.tp")


def _group_size(group):
    try:
        import torch.distributed as dist
    except ImportError:
        return 1
    if not dist.is_available() or not dist.is_initialized():
        return 1
    return dist.get_world_size(group)


def agree(flags, group=None, timeout=None) -> list:
    """Per position: True only if every rank of ``group`` passed True there.

    Every rank must call it with the same number of flags.  ``timeout``: seconds
    to wait for the others (default: the group's own timeout).
    """
    flags = [bool(f) for f in flags]
    if _group_size(group) == 1:
        return flags
    import torch
    import torch.distributed as dist

    device = "cpu"
    if dist.get_backend(group) == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    t = torch.tensor([int(f) for f in flags] or [1], dtype=torch.int32, device=device)
    try:
        if timeout is None:
            dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group)
        else:
            import datetime
            work = dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group, async_op=True)
            work.wait(timeout=datetime.timedelta(seconds=max(float(timeout), 0.001)))
    except Exception as e:  # gloo/NCCL raise RuntimeError or DistBackendError
        raise GroupError(f"TP group collective failed (a rank died?): {e}") from e
    return [bool(x) for x in t.tolist()[: len(flags)]]


def commit(txn, group=None, width=None, hook=None, positions=None, timeout=None) -> list:
    """Commit the prepared-everywhere blocks of write transaction ``txn``; finishes it.

    ``width``: length of the flag vectors when ranks' transactions may hold a
    prefix of one common list of blocks (absent blocks count as not durable).
    ``positions``: block i of ``txn`` is entry ``positions[i]`` of that common
    list (default: i), for transactions that hold their blocks in another order.
    ``hook(phase)`` is called after "prepared", "agreed" and "committed"
    (tracing, crash tests).  ``timeout``: seconds each agreement may wait, or a
    callable giving them (a deadline shared by several commits), or None.
    Returns per block of ``txn``: committed on every rank.  Raises GroupError
    if a rank died; the blocks are then aborted (before agreement) or rolled
    back here (after), and the group reconciles when it reopens.
    """
    n = len(txn)
    width = n if width is None else width
    if width < n:
        raise ValueError(f"width {width} < {n} blocks in the transaction")
    pos = list(range(n)) if positions is None else [int(p) for p in positions]
    if len(pos) != n or len(set(pos)) != n or not all(0 <= p < width for p in pos):
        raise ValueError(f"positions must name {n} distinct entries of 0..{width - 1}")

    def spread(flags):  # per block of txn -> per entry of the common list
        v = [False] * width
        for i, f in enumerate(flags):
            v[pos[i]] = f
        return v
    try:
        status = txn.prepare()
    except Exception as e:  # noqa: BLE001 - a failed flush is a vote against, not a hang
        log.warning("tutti.tp: making %d blocks durable failed: %s", n, e)
        status = [-errno.EIO] * n
    _call(hook, "prepared")
    try:
        everywhere = agree(spread([rc == 0 for rc in status]), group, _left(timeout))
    except GroupError:
        txn.abort()
        raise
    for i in range(n):
        if not everywhere[pos[i]]:
            txn.veto(i)
    _call(hook, "agreed")
    try:
        final = txn.finish()
        fresh = [rc == 0 and not txn.present[i] for i, rc in enumerate(final)]
    except Exception as e:  # noqa: BLE001 - records may be half written: treat as not committed
        log.warning("tutti.tp: committing %d blocks failed: %s", n, e)
        final = [-errno.EIO] * n
        # Some may be committed here all the same: the peers drop theirs, so drop them too.
        fresh = [everywhere[pos[i]] and not txn.present[i] for i in range(n)]
    _call(hook, "committed")
    try:
        done = agree(spread([rc == 0 for rc in final]), group, _left(timeout))
    except GroupError:
        # Whether the others committed is unknown: absent here is never wrong.
        _rollback(txn, [i for i in range(n) if fresh[i]])
        raise
    _rollback(txn, [i for i in range(n) if fresh[i] and not done[pos[i]]])
    return [done[pos[i]] for i in range(n)]


def abstain(group=None, width=0, timeout=None) -> None:
    """Take part in a commit of ``width`` blocks with nothing to commit (no transaction here)."""
    agree([False] * width, group, _left(timeout))
    agree([False] * width, group, _left(timeout))


def _left(timeout):
    return timeout() if callable(timeout) else timeout


def _rollback(txn, idx):
    if not idx:
        return
    try:
        txn._store.invalidate([txn.slots[i] for i in idx])
    except Exception as e:  # noqa: BLE001 - the group's reconcile at reopen catches these
        log.warning("tutti.tp: dropping %d blocks committed on this rank only failed: %s",
                    len(idx), e)


def _call(hook, phase):
    if hook is not None:
        hook(phase)


def lookup(store, keys, group=None) -> list:
    """Slot of each key in this rank's store, or None unless every rank holds the key."""
    slots = store.lookup(keys)
    everywhere = agree([s is not None for s in slots], group)
    return [s if e else None for s, e in zip(slots, everywhere)]


def loaded_everywhere(status, group=None) -> list:
    """After a read: per block, did every rank load (and verify) its shard?"""
    return agree([rc == 0 for rc in status], group)
