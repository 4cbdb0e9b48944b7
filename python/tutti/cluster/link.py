"""This node's handles on Mooncake: one transfer engine (TCP here) shared by the Mooncake store client,
and one registered staging area that block bytes leave from and land in.

Mooncake is an optional dependency (``pip install tutti[cluster]``); without it the cluster tier says so
in one line.  Mooncake logs through glog to stderr; its lines are its own.
"""
from __future__ import annotations

import mmap

from . import registration
from .bounded import Bounded, CallTimeout
from .config import ClusterConfig
from .errors import ClusterError


def import_mooncake():
    """(TransferEngine, TransferNotify, TransferOpcode, MooncakeDistributedStore, ReplicateConfig)."""
    try:
        from mooncake.engine import TransferEngine, TransferNotify, TransferOpcode
        from mooncake.store import MooncakeDistributedStore, ReplicateConfig
    except ImportError as e:
        raise ClusterError(f"the cluster tier needs Mooncake (pip install 'tutti[cluster]'): {e}") from None
    return TransferEngine, TransferNotify, TransferOpcode, MooncakeDistributedStore, ReplicateConfig


class Link:
    """Transfer engine + store client + staging area of one node.  close() releases all of it."""

    def __init__(self, cfg: ClusterConfig, staging_bytes: int):
        TE, self.Notify, self.Opcode, MDS, self.ReplicateConfig = import_mooncake()
        self.cfg = cfg
        self.bounded = Bounded()
        self.engine = TE()
        rc = self._call(self.engine.initialize, cfg.endpoint, cfg.metadata, cfg.protocol,
                        cfg.rdma_devices, what="transfer engine init")
        if rc != 0:
            raise ClusterError(f"Mooncake transfer engine at {cfg.endpoint} did not start (rc {rc}): "
                               + self._why_not_started())
        # Staging: one anonymous mapping (page aligned, never moves), registered once.
        self.staging = mmap.mmap(-1, max(staging_bytes, mmap.PAGESIZE))
        self.staging_addr = _address_of(self.staging)
        rc = self.engine.register_memory(self.staging_addr, len(self.staging))
        if rc != 0:
            raise ClusterError(f"Mooncake could not register {len(self.staging)} bytes of staging memory "
                               f"(rc {rc})")
        self.store = MDS()
        rc = self._call(self.store.setup, cfg.endpoint, cfg.metadata, cfg.index_bytes, 16 << 20,
                        cfg.protocol, cfg.rdma_devices, cfg.master, self.engine.get_engine(),
                        what="mooncake store setup")
        if rc != 0:
            raise ClusterError(f"Mooncake master at {cfg.master} refused this node (setup rc {rc})")
        self.segment = self.store.get_hostname()

    def _why_not_started(self) -> str:
        """What a failed start is most likely about, asked of the metadata server (bounded)."""
        cfg, t = self.cfg, self.cfg.call_timeout_s
        meta = registration.registered(cfg.metadata, cfg.endpoint, t)
        if meta is None:
            return f"is the metadata server at {cfg.metadata} up and the port free?"
        where = f"{meta['ip_or_host_name']}:{meta['rpc_port']}"
        if registration.alive(meta, t):
            return (f"another live node is registered as {cfg.endpoint} (its transfer engine answers at "
                    f"{where}): every node needs its own cluster_host:cluster_port")
        return (f"{cfg.endpoint} is still registered by a node that ended without closing (nothing answers at "
                f"{where}); the master drops it after its client_ttl: start this node with another "
                "cluster_port, or once that time has passed")

    def _call(self, fn, *args, what):
        try:
            return self.bounded.call(self.cfg.call_timeout_s, fn, *args, what=what)
        except CallTimeout as e:
            raise ClusterError(str(e)) from None

    def call(self, fn, *args, what="mooncake call", timeout_s=None):
        """``fn(*args)`` bounded by ``timeout_s`` (default: cluster_call_timeout_s); CallTimeout if not."""
        return self.bounded.call(timeout_s or self.cfg.call_timeout_s, fn, *args, what=what)

    def replicate_here(self):
        """Put objects in this node's own segment: they go away with the node (Mooncake unmounts a dead
        client's segment after the master's client_ttl)."""
        c = self.ReplicateConfig()
        c.replica_num = 1
        c.preferred_segment = self.segment
        return c

    def close(self) -> None:
        for what, fn in (("store", getattr(self, "store", None)),):
            if fn is not None:
                try:
                    self.bounded.call(self.cfg.call_timeout_s, fn.close, what=f"close {what}")
                except Exception:  # noqa: BLE001 - closing: the master may be gone
                    pass
        self.store = None


def _address_of(buf) -> int:
    import ctypes
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))
