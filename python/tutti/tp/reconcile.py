"""Find and drop blocks committed on some TP ranks only (orphans of a crash).

A crash between one rank's commit record and another's leaves a block whose
shards are not all stored.  ``lookup`` already never serves it; reconciling
when the group (re)opens frees its slots and makes every rank's slot table
agree, so a reader of one table (vLLM's scheduler side) sees the same keys.
Invalidation is durable and idempotent: a crash during reconcile leaves a
subset of the orphans, found again next time.
"""


def orphans(key_sets) -> list:
    """Per rank, the keys it holds that some other rank does not."""
    key_sets = [set(k) for k in key_sets]
    common = set.intersection(*key_sets) if key_sets else set()
    return [ks - common for ks in key_sets]


def reconcile(stores) -> list:
    """Drop orphans from ``stores`` (one per rank, all open here); the orphan keys, sorted.

    Keys are 16-byte store keys (key_from_bytes of the caller's names).
    """
    held = [s.committed() for s in stores]
    dropped = set()
    for store, have, extra in zip(stores, held, orphans(held)):
        if extra:
            store.invalidate([have[k] for k in extra])
            dropped |= extra
    return sorted(dropped)


def reconcile_group(store, group=None) -> list:
    """Each rank with its own store: exchange key sets and drop this rank's orphans.

    Collective: every rank of ``group`` calls it.  Returns the keys dropped here.
    """
    from .commit import _group_size

    if _group_size(group) == 1:
        return []
    import torch.distributed as dist

    have = store.committed()
    gathered = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, sorted(have), group=group)
    extra = orphans(gathered)[dist.get_rank(group)]
    if extra:
        store.invalidate([have[k] for k in extra])
    return sorted(extra)
