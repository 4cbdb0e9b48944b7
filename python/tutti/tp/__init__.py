"""Tensor parallelism: one store per TP rank, blocks committed on all ranks or none.

Each rank keeps its shard of the KV heads in its own store (``shard``).  A
block is written by every rank, made durable everywhere, and only then
committed (``commit``); a block is served only if every rank holds it
(``lookup``); blocks a crash left committed on some ranks only are found and
dropped when the group reopens (``reconcile``).  Collectives go over any
torch.distributed group (gloo on CPU, NCCL on GPU); see docs/tp.md.
"""
from .commit import abstain, agree, commit, loaded_everywhere, lookup
from .reconcile import orphans, reconcile, reconcile_group
from .shard import head_range, join_shards, rank_paths, shard_fingerprint, shard_of

__all__ = ["abstain", "agree", "commit", "loaded_everywhere", "lookup", "orphans", "reconcile",
           "reconcile_group", "head_range", "join_shards", "rank_paths", "shard_fingerprint",
           "shard_of"]
