"""Names in Mooncake: every name carries the fingerprint id, so a node of another model (or another TP
rank) never finds, and is never asked for, a block it cannot use."""
from __future__ import annotations

import json

from .. import _binding
from .._cconv import key_from_bytes

PREFIX = "tutti/v1"


def fingerprint_id(fp) -> bytes:
    """16 bytes naming model, dtype, geometry and TP rank (XXH3-128 of the fingerprint as JSON)."""
    return key_from_bytes(_binding.EXTENSION, json.dumps(fp.to_dict(), sort_keys=True).encode())


def group_fingerprint_id(fp) -> bytes:
    """16 bytes naming model, dtype, geometry and TP size but not the rank: what the ranks of one
    tensor-parallel engine share (its replica claims)."""
    d = fp.to_dict()
    d["tp_rank"] = -1
    return key_from_bytes(_binding.EXTENSION, json.dumps(d, sort_keys=True).encode())


def block_name(fp_id: bytes, store_key: bytes) -> str:
    """The Mooncake object holding ``store_key``'s location descriptor."""
    return f"{PREFIX}/{fp_id.hex()}/{store_key.hex()}"


def node_name(fp_id: bytes, endpoint: str) -> str:
    """A node's liveness record (its presence tells the node its index survived the master)."""
    return f"{PREFIX}/{fp_id.hex()}/node/{endpoint}"


def claim_name(fp_id: bytes, store_key: bytes, i: int) -> str:
    """Replica claim ``i`` (1 .. cluster_replicas - 1) of ``store_key``: whoever wrote it first keeps a copy."""
    return f"{block_name(fp_id, store_key)}/r{i}"
