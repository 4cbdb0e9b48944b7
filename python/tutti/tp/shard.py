"""Which part of the KV cache a TP rank holds, and where its store lives.

vLLM splits the KV heads over the ranks in contiguous ranges; with fewer KV
heads than ranks each head is replicated (rank r holds head r * heads // tp).
No torch import at module level: the connector's config uses rank_paths().
"""
import os
from dataclasses import replace


def rank_paths(paths, rank: int, tp_size: int) -> list:
    """This rank's member paths: ``{rank}`` replaced, else ``.rank<N>`` appended when TP > 1."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    out = []
    for p in map(os.fspath, paths):
        if "{rank}" in p:
            p = p.replace("{rank}", str(rank))
        elif tp_size > 1:
            p = f"{p}.rank{rank}"
        out.append(os.path.expanduser(p))
    return out


def head_range(kv_heads: int, rank: int, tp_size: int) -> tuple:
    """``(first, end)`` of the model's KV heads held by ``rank``."""
    if not 0 <= rank < tp_size:
        raise ValueError(f"rank {rank} not in [0, {tp_size})")
    if kv_heads % tp_size == 0:
        per = kv_heads // tp_size
        return rank * per, (rank + 1) * per
    if tp_size % kv_heads == 0:  # replicated: several ranks hold the same head
        first = rank * kv_heads // tp_size
        return first, first + 1
    raise ValueError(f"{kv_heads} KV heads cannot be split over {tp_size} ranks")


def shard_fingerprint(model_fp, rank: int, tp_size: int):
    """Fingerprint of rank ``rank``'s store, from the whole model's (kv_heads of all ranks)."""
    first, end = head_range(model_fp.kv_heads, rank, tp_size)
    return replace(model_fp, kv_heads=end - first, tp_rank=rank, tp_size=tp_size)


def shard_of(kv, rank: int, tp_size: int, head_dim: int = -2):
    """Rank ``rank``'s slice of tensor ``kv`` along its heads dimension, contiguous."""
    first, end = head_range(kv.shape[head_dim], rank, tp_size)
    return kv.narrow(head_dim, first, end - first).contiguous()


def join_shards(shards, head_dim: int = -2):
    """The whole tensor from every rank's shard, in rank order (split shards only)."""
    import torch

    return torch.cat(list(shards), dim=head_dim)
