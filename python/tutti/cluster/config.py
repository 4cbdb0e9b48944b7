"""The cluster tier's settings: the ``cluster_*`` keys of the connector's extra config (docs/cluster.md)."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from .errors import ClusterError

MAX_INFLIGHT = 64        # cluster_inflight_batches at most (each is batch_blocks blocks of landing memory)
MAX_SEND_THREADS = 8     # cluster_send_threads at most
MAX_STAGING_SHARE = 4    # registered staging at most 1/this of the machine's memory
MAX_REPLICAS = 16        # cluster_replicas at most (each claim round is two master calls)


def auto_send_threads() -> int:
    """cluster_send_threads=0: one send per 4 CPUs this process may use, 1 to 3.  On the H200 host (16
    CPUs) a 512 MiB fetch went from 0.74-0.78 x Mooncake's get with one send at a time to 0.83 with 3; on
    2 CPUs a second send changed nothing (the transfers already use both)."""
    import os

    return max(1, min(3, len(os.sched_getaffinity(0)) // 4))


def staging_bytes(block_bytes: int, batch_blocks: int, inflight_batches: int, serve_slots: int) -> int:
    """Registered staging of one node: serve_slots serve batches, inflight_batches landing batches and a
    page for notifies."""
    return (serve_slots + inflight_batches) * batch_blocks * block_bytes + 4096


def check_staging(cfg: "ClusterConfig", block_bytes: int) -> int:
    """The staging size of ``cfg`` with blocks of ``block_bytes``; ClusterError naming the keys to lower
    when it would exceed 1/MAX_STAGING_SHARE of this machine's memory."""
    import os

    need = staging_bytes(block_bytes, cfg.batch_blocks, cfg.inflight_batches, cfg.serve_slots)
    try:
        phys = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        phys = 0
    if phys > 0 and need > phys // MAX_STAGING_SHARE:
        raise ClusterError(f"cluster staging of {need >> 20} MiB (({cfg.serve_slots} serve slots + "
                           f"cluster_inflight_batches {cfg.inflight_batches}) x cluster_batch_blocks "
                           f"{cfg.batch_blocks} x {block_bytes} bytes) exceeds 1/{MAX_STAGING_SHARE} of this "
                           f"machine's {phys >> 20} MiB: lower cluster_batch_blocks, cluster_inflight_batches "
                           "or cluster_send_threads")
    return need


@dataclass(frozen=True)
class ClusterConfig:
    """Where the Mooncake master and metadata server are, this node's transfer endpoint, and the bounds
    of every wait.

    ``host:port`` is this node's endpoint (its Mooncake segment name and node id): unique per node.
    """

    master: str = "127.0.0.1:50051"            # mooncake_master RPC address
    metadata: str = "http://127.0.0.1:8080/metadata"  # its HTTP metadata server
    host: str = "127.0.0.1"                    # this node's address as peers reach it
    port: int = 17001                          # this node's transfer-engine port
    protocol: str = "tcp"                      # "tcp" ran here; "rdma" is Mooncake's, not run here
    rdma_devices: str = ""
    index_bytes: int = 32 << 20                # this node's Mooncake segment: holds its descriptors
    batch_blocks: int = 16                     # blocks per transfer request (staging buffer size)
    inflight_batches: int = 4                  # batches a fetch keeps in flight (landing slots of batch_blocks)
    send_threads: int = 0                      # batches an owner sends at once; 0: auto_send_threads()
    call_timeout_s: float = 2.0                # any one Mooncake call (master, metadata)
    fetch_timeout_s: float = 10.0              # one batch of blocks from a peer
    keeper_interval_s: float = 1.0             # how often a node checks its index survived (master restart)
    fetch: str = "async"                       # connector: "async" (a request waits, steps go on) or "step"
    fetch_wait_s: float = 30.0                 # connector, async: longest a request waits for its fetch
    peer_quarantine_s: float = 30.0            # a peer that failed a fetch is skipped this long (0: never)
    replicas: int = 0                          # nodes keeping a block (its first holder + claims); 0: no limit

    @property
    def sends(self) -> int:
        """Batches an owner sends at once (cluster_send_threads, 0 resolved)."""
        return self.send_threads or auto_send_threads()

    @property
    def serve_slots(self) -> int:
        """Batches an owner holds at once: one being read from its store, the others being sent."""
        return self.sends + 1

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    @classmethod
    def from_extra_config(cls, extra: dict) -> "ClusterConfig":
        """From ``cluster_<field>`` keys (``cluster_master``, ``cluster_port``...); unknown ``cluster_``
        keys are refused, so a typo is not silently a default."""
        known = {f.name: f for f in fields(cls)}
        kw = {}
        for k, v in extra.items():
            if not k.startswith("cluster_") or k == "cluster_enable":
                continue
            name = k[len("cluster_"):]
            if name not in known:
                raise ClusterError(f"unknown cluster option {k!r} (known: "
                                   f"{', '.join('cluster_' + n for n in known)})")
            kw[name] = _coerce(k, v, type(getattr(cls, name)))
        cfg = cls(**kw)
        cfg.check()
        return cfg

    def check(self) -> None:
        if not 0 < self.port < 65536:
            raise ClusterError(f"cluster_port {self.port} is not a TCP port")
        if self.fetch not in ("async", "step"):
            raise ClusterError(f"cluster_fetch {self.fetch[:40]!r}: 'async' (a request waits for its blocks "
                               "while other requests' steps go on) or 'step' (fetched inside the step)")
        for name in ("call_timeout_s", "fetch_timeout_s", "keeper_interval_s", "fetch_wait_s"):
            if not 0 < getattr(self, name) <= 3600:
                raise ClusterError(f"cluster_{name} must be > 0 and at most 3600 s: every wait is bounded")
        if not 0 <= self.peer_quarantine_s <= 3600:
            raise ClusterError("cluster_peer_quarantine_s must be between 0 and 3600 s")
        if not 1 <= self.batch_blocks <= 4096:
            raise ClusterError("cluster_batch_blocks must be between 1 and 4096")
        if not 1 <= self.inflight_batches <= MAX_INFLIGHT:
            raise ClusterError(f"cluster_inflight_batches must be between 1 and {MAX_INFLIGHT}")
        if not 0 <= self.send_threads <= MAX_SEND_THREADS:
            raise ClusterError(f"cluster_send_threads must be between 0 (auto) and {MAX_SEND_THREADS}")
        if not 0 <= self.replicas <= MAX_REPLICAS:
            raise ClusterError(f"cluster_replicas must be between 0 (every node that fetches a block keeps "
                               f"it) and {MAX_REPLICAS}")
        if not 1 << 12 <= self.index_bytes <= 1 << 40:
            raise ClusterError("cluster_index_bytes must be between 4 KiB and 1 TiB")
        for name in ("master", "metadata", "host", "protocol"):
            v = getattr(self, name)
            if not v.strip() or len(v) > 1024 or any(ord(c) < 32 or 0xD800 <= ord(c) < 0xE000 for c in v):
                raise ClusterError(f"cluster_{name} {v[:60]!r} is not an address")


def _coerce(key: str, v: object, typ: type) -> Any:
    """``v`` as the option's type: an int from an int or its digits, a float from a finite number, text
    from text; anything else (a bool, a list, NaN, 1.5 blocks) is refused with the option's name."""
    import math

    if typ is str:
        if isinstance(v, str):
            return v
    elif typ is int:
        if isinstance(v, str) and v.strip().isdigit():
            return int(v)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
        if isinstance(v, float) and math.isfinite(v) and v.is_integer():
            return int(v)
    elif typ is float:
        try:
            f = float(v) if isinstance(v, (int, float, str)) and not isinstance(v, bool) else math.nan
        except ValueError:
            f = math.nan
        if math.isfinite(f):
            return f
    raise ClusterError(f"cluster option {key}={v!r:.60} is not a {typ.__name__}")
