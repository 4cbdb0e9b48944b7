"""What the cluster holds, as ``tutti-admin cluster status`` shows it.

The names come from the master's admin HTTP service (``mooncake_master --metrics_port``, 9003 by default:
``/health``, ``/get_all_keys``); the node records' values (tutti.cluster.index ``record()``: blocks held,
counters, peers skipped; refreshed by each node's keeper every RECORD_EVERY_S) through a lookup-only
Mooncake client, as the vLLM scheduler's.  Listing every key costs the master O(keys): this is for an
operator now and then, not for a loop.
"""
from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

from .errors import ClusterError
from .keys import PREFIX, node_name


def _http(url: str, timeout_s: float) -> str:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:  # noqa: S310 - an operator's own master
            return r.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        raise ClusterError(f"the master's admin HTTP service at {url} did not answer: {reason} "
                           "(mooncake_master --metrics_port, 9003 by default)") from None


def _is_hex(s: str, n: int) -> bool:
    return len(s) == n and all(c in "0123456789abcdef" for c in s)


def parse_names(lines) -> dict:
    """Per fingerprint id: its node endpoints and how many block descriptors are indexed."""
    models: dict = {}
    for name in lines:
        parts = name.strip().split("/")
        if len(parts) < 4 or "/".join(parts[:2]) != PREFIX or not _is_hex(parts[2], 32):
            continue  # not tutti's (other users of the same master)
        m = models.setdefault(parts[2], {"nodes": [], "descriptors": 0})
        if parts[3] == "node" and len(parts) >= 5:
            m["nodes"].append("/".join(parts[4:]))
        elif len(parts) == 4 and _is_hex(parts[3], 32):
            m["descriptors"] += 1
    return models


def decode_record(value: bytes, endpoint: str) -> dict:
    """A node record's value: JSON (``ClusterIndex.record``); an older node wrote only its endpoint."""
    try:
        rec = json.loads(value)
        if isinstance(rec, dict):
            return rec
    except ValueError:
        pass
    return {"endpoint": endpoint, "stats": {}, "old_record": True}


def gather(admin: str, cfg=None, *, timeout_s: float = 5.0) -> dict:
    """The master's state and every model's nodes.  ``cfg``: a ClusterConfig for the lookup client that
    reads the node records (None: names and counts only)."""
    admin = admin.rstrip("/")
    try:
        health = json.loads(_http(f"{admin}/health", timeout_s))
    except ValueError:
        health = {}
    models = parse_names(_http(f"{admin}/get_all_keys", timeout_s).splitlines())
    records: dict = {}
    if cfg is not None and models:
        from .link import Link
        link = Link(cfg, 4096)
        try:
            names = [node_name(bytes.fromhex(fp), ep) for fp, m in models.items() for ep in m["nodes"]]
            vals = link.call(link.store.get_batch, names, what=f"read {len(names)} node records") if names else []
            for name, v in zip(names, vals or []):
                if v:
                    records[name] = bytes(v)
        finally:
            link.close()
    now = time.time()
    out = []
    for fp, m in sorted(models.items()):
        nodes = []
        for ep in sorted(m["nodes"]):
            raw = records.get(node_name(bytes.fromhex(fp), ep))
            rec = decode_record(raw, ep) if raw is not None else {"endpoint": ep, "stats": {}, "unread": True}
            if "at" in rec:
                rec["age_s"] = round(max(now - float(rec["at"]), 0.0), 1)
            nodes.append(rec)
        model = next((n.get("model") for n in nodes if n.get("model")), None)
        out.append({"fp_id": fp, "model": model, "descriptors": m["descriptors"], "nodes": nodes})
    return {"admin": admin, "master": health, "models": out}
