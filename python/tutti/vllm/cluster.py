"""The cluster tier in the connector (tutti.cluster, docs/cluster.md): blocks other nodes hold.

Scheduler side (``SchedulerCluster``): after the local hit, one batched lookup in Mooncake's index
says how many further blocks of the prompt peers hold; those count as loadable and travel in the
step's load as *remote* (``BlockTransfer.remote``).  It has its own lookup-only Mooncake client (no
segment, serves nothing) at ``cluster_port + 1000``; it never touches a store (names are hashed
from keys; the rank's fingerprint and geometry come from the scheduler's read-only snapshot).

Worker side (``WorkerCluster``): rank r runs a ClusterNode over its store at ``cluster_port + r``:
it serves peers, publishes what its store holds (at start, then each commit: ``publish``), and
before a step's local read fetches that step's remote blocks into its store (``fetch``), where
they are verified against their owner's committed checksum; from then on they are local blocks
and go through the normal verified load path.  A block that does not arrive is a load error
(recomputed).

Neither side ever waits unbounded for Mooncake: every call has a deadline (tutti.cluster.bounded),
a master that is down makes lookups misses at once (a keeper checks it each
cluster_keeper_interval_s), and a node or client that cannot start now is retried in the
background (``RETRY_S``) while the connector serves from its local store.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import queue
import threading
import time
from typing import Any

from .. import affinity
from ..cluster.quarantine import Quarantine
from ..errors import CallTimeout, ClusterError

log = logging.getLogger("vllm.tutti")

SCHEDULER_PORT_OFFSET = 1000   # the scheduler's lookup client: cluster_port + 1000
RETRY_S = 5.0                  # a node or client that could not start is tried again this often
TRANSIENT_HOLD_S = 60.0        # a transient copy is dropped at most this long after it arrived
PROBE_NAME = "tutti/v1/probe"  # a name nobody writes: its lookup tells whether the master answers


def worker_config(ccfg, rank: int):
    """Rank ``rank``'s node: its own endpoint (cluster_port + rank)."""
    return dataclasses.replace(ccfg, port=ccfg.port + rank)


def scheduler_config(ccfg):
    """The scheduler's lookup-only client: cluster_port + 1000, no Mooncake segment of its own."""
    return dataclasses.replace(ccfg, port=ccfg.port + SCHEDULER_PORT_OFFSET, index_bytes=0)


def check_ports(ccfg, tp_size: int) -> None:
    top = ccfg.port + max(tp_size - 1, SCHEDULER_PORT_OFFSET)
    if top > 65535:
        raise ClusterError(f"cluster_port {ccfg.port}: the scheduler's client needs port {top} "
                           f"(cluster_port + {SCHEDULER_PORT_OFFSET}); choose a lower cluster_port")


class _NoLock:
    """The scheduler's lookups never touch a store (ClusterIndex only locks to publish)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class SchedulerCluster:
    """Lookups of blocks held by peers, for every TP rank, through one lookup-only client."""

    def __init__(self, ccfg, tp_size: int):
        check_ports(ccfg, tp_size)
        self.cfg = scheduler_config(ccfg)
        self.worker_endpoints = [worker_config(ccfg, r).endpoint for r in range(tp_size)]
        self.stats: collections.Counter = collections.Counter()
        self.master_up = threading.Event()
        self.quarantine = Quarantine(ccfg.peer_quarantine_s)  # peers the workers' fetches found gone
        self.link: Any = None  # tutti.cluster.link.Link once connected
        self._indexes: dict = {}
        self._stop = threading.Event()
        self._connect()  # first try now: the first request should not miss for want of a client
        self._thread = threading.Thread(target=self._keep, name="tutti-cluster-sched", daemon=True)
        self._thread.start()

    def _connect(self) -> bool:
        from ..cluster.link import Link
        try:
            self.link = Link(self.cfg, 4096)
        except ClusterError as e:
            log.warning("tutti cluster: scheduler client at %s: %s (local hits only; retried every %g s)",
                        self.cfg.endpoint, e, RETRY_S)
            return False
        self.master_up.set()
        log.info("tutti cluster: scheduler looks up peers' blocks through %s (client %s)",
                 self.cfg.master, self.cfg.endpoint)
        return True

    def _keep(self) -> None:
        affinity.service_thread()
        while self.link is None:
            if self._stop.wait(RETRY_S):
                return
            self._connect()
        link = self.link
        while not self._stop.wait(self.cfg.keeper_interval_s):
            try:
                up = link.call(link.store.is_exist, PROBE_NAME, what="check the master") >= 0
            except CallTimeout:
                up = False
            if up != self.master_up.is_set():
                log.warning("tutti cluster: master %s %s", self.cfg.master,
                            "answers again" if up else "unreachable: local hits only until it answers")
            (self.master_up.set if up else self.master_up.clear)()

    def _index(self, rank: int, snapshot):
        idx = self._indexes.get(rank)
        if idx is None or idx.store is not snapshot:
            from ..cluster.index import ClusterIndex
            idx = ClusterIndex(snapshot, self.link, _NoLock(), self.stats,
                               endpoint=self.worker_endpoints[rank], quarantine=self.quarantine)
            idx.master_up = self.master_up
            self._indexes[rank] = idx
        return idx

    def remote_prefix(self, snapshots, keys, owners: list | None = None) -> int:
        """How many of ``keys``, from the first, peers hold for every rank (0 while the client is
        not connected, the master is down, or a rank's store is not there yet).  ``owners``: gets
        rank 0's holder (endpoint) of each of those blocks, the planner's per-peer fetch rates' key."""
        if not keys or self.link is None or not self.master_up.is_set() or any(s is None for s in snapshots):
            return 0
        n = len(keys)
        held: list = []
        for rank, snap in enumerate(snapshots):
            n = min(n, self._index(rank, snap).lookup_prefix(keys[:n], held if rank == 0 else None))
            if n == 0:
                break
        if owners is not None:
            owners += held[:n]
        return n

    def close(self) -> None:
        self._stop.set()
        self._thread.join(self.cfg.call_timeout_s + 1)
        if self.link is not None:
            self.link.close()
            self.link = None


class WorkerCluster:
    """Rank ``rank``'s ClusterNode over its store: serve peers, publish commits, fetch remote blocks.

    ``lock`` is the worker's store lock: the node's threads (serving peers, re-publishing) use the
    store only under it, and the worker holds it in every hook that uses the store (connector.py).
    """

    def __init__(self, store, ccfg, rank: int, tp_size: int, lock):
        from ..cluster.config import check_staging
        from ..errors import ConfigError

        check_ports(ccfg, tp_size)
        try:  # a staging area too large for this machine is a setting to change, not worth retrying
            check_staging(ccfg, store.block_bytes)
        except ClusterError as e:
            raise ConfigError(f"TuttiConnector: {e}") from None
        self.store, self.lock = store, lock
        self.cfg = worker_config(ccfg, rank)
        self.group = ccfg.endpoint if tp_size > 1 else ""  # the ranks claim replicas as one
        self.node: Any = None  # tutti.cluster.ClusterNode once joined
        # Fetched copies this node may not keep: key -> [drop at (monotonic), requests still to load it].
        self._transient: dict = {}
        self._transient_mu = threading.Lock()
        self._todo: queue.SimpleQueue = queue.SimpleQueue()  # keys to publish; None: stop
        self._stop = threading.Event()
        self._start()  # first try now, without the publish (the thread does that)
        self._thread = threading.Thread(target=self._run, name="tutti-cluster-worker", daemon=True)
        self._thread.start()

    def _start(self) -> bool:
        from ..cluster.node import ClusterNode
        try:
            self.node = ClusterNode(self.store, self.cfg, store_lock=self.lock, publish_now=False,
                                    group=self.group)
        except ClusterError as e:
            log.warning("tutti cluster: node %s: %s (local store only; retried every %g s)",
                        self.cfg.endpoint, e, RETRY_S)
            return False
        log.info("tutti cluster: node %s joined %s", self.cfg.endpoint, self.cfg.master)
        return True

    def _run(self) -> None:
        affinity.service_thread()
        while self.node is None:
            if self._stop.wait(RETRY_S):
                return
            self._start()
        try:
            n = self.node.index.republish_all()
            log.info("tutti cluster: node %s published %d blocks", self.cfg.endpoint, n)
        except CallTimeout as e:
            log.warning("tutti cluster: first publish failed (%s); the node's keeper retries", e)
        while True:
            keys = self._todo.get()
            if keys is None:
                return
            try:
                self.node.publish(keys)
            except CallTimeout as e:  # the keeper re-publishes everything when the master comes back
                log.info("tutti cluster: publish: %s", e)

    def publish(self, keys) -> None:
        """Blocks just committed: published by the node's thread (the step does not wait)."""
        if keys:
            self._todo.put(list(keys))

    def fetch(self, keys, wanted_by=(), owners: list | None = None) -> list:
        """Fetch ``keys`` from their owners into the store (call *without* the store lock: the node's
        thread that takes the owner's answer may be waiting for it); per key True when its block is
        now in the store, verified against its owner's committed checksum.  With cluster_replicas a
        block that won no claim is transient: kept until the requests ``wanted_by`` have loaded it
        (``wait_for``, ``note_loaded``), then dropped (``drop_used``).  ``owners``: gets the endpoint
        each key was asked of (tutti.cluster.ClusterNode.fetch)."""
        node = self.node
        if node is None or not keys:
            return [False] * len(keys)
        transient: list = []
        try:
            ok = node.fetch_into_store(keys, transient, owners)
        except (CallTimeout, ClusterError, OSError) as e:  # the store's put failing: a miss, said once
            log.warning("tutti cluster: fetching %d blocks failed: %s", len(keys), e)
            return [False] * len(keys)
        if transient:
            until = time.monotonic() + TRANSIENT_HOLD_S
            with self._transient_mu:
                for k in transient:
                    self._transient.setdefault(k, [until, set()])[1].update(wanted_by)
        return ok

    def wait_for(self, keys, req_id) -> None:
        """Request ``req_id`` will load ``keys``: transient ones among them stay until it has."""
        with self._transient_mu:
            for k in keys:
                t = self._transient.get(k)
                if t is not None:
                    t[1].add(req_id)

    def note_loaded(self, keys, req_id) -> None:
        """Request ``req_id``'s load read ``keys``: a transient copy no other request waits for goes at
        the next ``drop_used``."""
        with self._transient_mu:
            for k in keys:
                t = self._transient.get(k)
                if t is not None:
                    t[1].discard(req_id)
                    if not t[1]:
                        t[0] = 0.0  # due

    def forget(self, req_ids) -> None:
        """Requests that finished (vLLM's get_finished): a copy only they waited for is due (they may
        have found its blocks in vLLM's own prefix cache and never loaded it)."""
        gone = set(req_ids)
        with self._transient_mu:
            for t in self._transient.values():
                if t[1] and not t[1].isdisjoint(gone):
                    t[1] -= gone
                    if not t[1]:
                        t[0] = 0.0

    def kept(self, keys) -> None:
        """This rank's own saves committed ``keys``: they stay, whatever a fetch of them was."""
        with self._transient_mu:
            for k in keys:
                self._transient.pop(k, None)

    def drop_used(self) -> list:
        """Drop transient copies every request that waited for them has loaded, or that waited
        TRANSIENT_HOLD_S for a load (the caller holds the store lock, and no load is in flight: a slot a
        read has pinned is never emptied under it).  Returns the slots emptied."""
        now = time.monotonic()
        with self._transient_mu:
            due = [k for k, (until, _) in self._transient.items() if until <= now]
            for k in due:
                del self._transient[k]
        node = self.node
        if not due or node is None:
            return []
        try:
            return node.drop(due)
        except OSError as e:  # a copy that stays is one more replica, never a wrong block
            log.warning("tutti cluster: dropping %d transient blocks failed: %s", len(due), e)
            return []

    def take_unreachable(self) -> list:
        """Peers this rank's fetches found gone since the last call (for the scheduler's lookups)."""
        return self.node.quarantine.take_new() if self.node is not None else []

    def stats(self) -> dict:
        return dict(self.node.stats) if self.node is not None else {}

    def close(self) -> None:
        self._stop.set()
        with self._transient_mu:  # copies this node may not keep do not outlive it
            for t in self._transient.values():
                t[0] = 0.0
        self.drop_used()
        self._todo.put(None)
        self._thread.join(self.cfg.call_timeout_s * 2 + 1)
        if self.node is not None:
            self.node.close()
            self.node = None
