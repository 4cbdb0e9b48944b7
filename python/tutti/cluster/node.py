"""One node of the cluster tier: its store, its Mooncake link, its index entries, its transfers.

Threads: a dispatcher that takes the transfer engine's notifies (requests to serve, queued for the
serve threads of tutti.cluster.transfer; replies to fetches, handed to the fetch that asked) and a
keeper that checks every cluster_keeper_interval_s that this node's record is still in Mooncake: when
the master is unreachable it marks the index down (lookups are misses at once); when the record is gone
(a master restarted empty) it re-publishes everything the store holds from the slot table; when the
store evicted blocks it withdraws their descriptors (ClusterIndex.check_evictions).

The store is not thread-safe: everything here touches it under ``store_lock``, and a caller that uses
the same Store elsewhere (the connector) must hold that lock too (ClusterNode.store_lock).
"""
from __future__ import annotations

import collections
import ctypes
import itertools
import logging
import mmap
import threading
import time

from .. import affinity
from .bounded import CallTimeout
from .claims import ReplicaClaims
from .config import ClusterConfig
from .errors import ClusterError
from .index import ClusterIndex
from .link import Link
from .quarantine import Quarantine
from .transfer import Transfers, contiguous_memmap

log = logging.getLogger("tutti.cluster")

RECORD_EVERY_S = 10.0  # how often the keeper refreshes this node's record (its counters)


class ClusterNode:
    """Join the cluster with ``store`` (publishing what it holds), serve peers, fetch from them."""

    def __init__(self, store, cfg: ClusterConfig, *, store_lock=None, publish_now: bool = True, group: str = ""):
        cfg.check()
        self.store, self.cfg = store, cfg
        self.store_lock = store_lock or threading.RLock()
        self.stats: collections.Counter = collections.Counter()
        self.link = Link(cfg, Transfers.staging_bytes(store.block_bytes, cfg))
        self.quarantine = Quarantine(cfg.peer_quarantine_s)
        self.index = ClusterIndex(store, self.link, self.store_lock, self.stats, quarantine=self.quarantine)
        self.transfers = Transfers(store, self.link, self.store_lock, self.stats, self.quarantine)
        self.claims = ReplicaClaims(self.index, cfg.replicas, group)  # group: a TP engine's ranks claim as one
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._dispatch, name="tutti-cluster-notify", daemon=True),
                         threading.Thread(target=self._keep, name="tutti-cluster-keeper", daemon=True)]
        self.index.check_evictions()  # the baseline the store's eviction counter is compared with
        if publish_now:
            try:
                self.index.republish_all()
            except CallTimeout as e:
                log.warning("tutti cluster: first publish failed (%s); the keeper retries", e)
        self.transfers.start()
        for t in self._threads:
            t.start()

    # --- the API the connector calls --------------------------------------------------

    def lookup_prefix(self, keys) -> int:
        """Blocks of ``keys``, from the first, that other nodes hold (connector keys)."""
        return self.index.lookup_prefix(keys)

    def fetch(self, keys, into, owners: list | None = None) -> list:
        """Fetch the blocks of connector ``keys`` from their owners into writable buffers ``into`` (one
        per key, block_bytes each); per key True only if those bytes match the owner's committed checksum.
        A False leaves undefined bytes in its buffer: that block is recomputed.  ``owners``: gets, per
        key, the endpoint it was asked of (None: no peer held it)."""
        keys, into = list(keys), list(into)
        if len(keys) != len(into):
            raise ValueError(f"{len(keys)} keys but {len(into)} buffers")
        for b in into:
            if memoryview(b).nbytes != self.store.block_bytes:
                raise ValueError(f"each buffer must hold one block ({self.store.block_bytes} bytes)")
        descs = self.index.lookup(keys)
        if owners is not None:
            owners += [d.endpoint if d is not None else None for d in descs]
        result = [False] * len(keys)
        by_owner = collections.defaultdict(list)
        for i, d in enumerate(descs):
            if d is None:
                self.stats["misses_absent"] += 1
            else:
                by_owner[d.endpoint].append(i)
        # Batches of batch_blocks per owner, owners taken in turn so that a slow one does not hold up
        # the others; the transfers keep cluster_inflight_batches of them in flight.
        n = self.cfg.batch_blocks
        per_owner = [[(owner, idx[c:c + n]) for c in range(0, len(idx), n)] for owner, idx in by_owner.items()]
        parts = [p for turn in itertools.zip_longest(*per_owner) for p in turn if p is not None]
        got = self.transfers.fetch_batches([(owner, [descs[i] for i in part], [into[i] for i in part])
                                            for owner, part in parts])
        for (_, part), oks in zip(parts, got):
            for i, ok in zip(part, oks):
                result[i] = ok
        return result

    # A replica is written in chunks of at most this many bytes: one write transaction (one commit)
    # per chunk instead of a put (a commit) per block, which cost 6x as much (256 blocks of 128 KiB on
    # the test VM's disk: 0.20 s as puts, 0.034 s as one transaction), with the buffer bounded.
    REPLICA_CHUNK_BYTES = 256 << 20

    def fetch_into_store(self, keys, transient: list | None = None, owners: list | None = None) -> list:
        """Fetch blocks into this store; per key True only if its block was verified and is now in this
        store.  Each is a replica this node keeps (and publishes) unless ``cluster_replicas`` limits the
        copies and it won no claim (claims.py): then its key is appended to ``transient`` — the caller
        uses it and drops it (``drop``); never published.  ``owners``: as for ``fetch``."""
        keys = list(keys)
        bb = self.store.block_bytes
        per = max(1, self.REPLICA_CHUNK_BYTES // bb)
        ok: list = []
        for c in range(0, len(keys), per):
            ok += self._fetch_chunk(keys[c:c + per], owners)
        good = [k for k, g in zip(keys, ok) if g]
        if self.claims.limited and good:
            with self.store_lock:
                slots = self.store.lookup(good)
                copies = []
                for k, slot in zip(good, slots):
                    try:
                        rec = self.store.slot_record(slot) if slot is not None else None
                    except KeyError:
                        rec = None
                    if rec is not None:
                        copies.append((k, rec["key"], slot, rec["gen"]))
            won = self.claims.claim([(sk, slot, gen) for _, sk, slot, gen in copies])
            kept = [k for k, sk, _, _ in copies if sk in won]
            if transient is not None:
                transient += [k for k, sk, _, _ in copies if sk not in won]
            good = kept
        self.publish(good)
        return ok

    def drop(self, keys) -> list:
        """Drop blocks of connector ``keys`` from this store (transient copies, after their use): they
        leave the store durably, with any claim on them.  Returns the slots emptied."""
        keys = list(keys)
        with self.store_lock:
            slots = [s for s in self.store.lookup(keys) if s is not None]
            if slots:
                self.store.invalidate(slots)
        self.claims.release_slots(slots)
        self.stats["replicas_dropped"] += len(slots)
        return slots

    def _fetch_chunk(self, keys, owners=None) -> list:
        bb, n = self.store.block_bytes, len(keys)
        buf = mmap.mmap(-1, n * bb)  # blocks back to back: the layout a contiguous memmap describes
        try:
            views = [memoryview(buf)[i * bb:(i + 1) * bb] for i in range(n)]
            ok = self.fetch(keys, views, owners)
            for v in views:
                v.release()
            good = [i for i in range(n) if ok[i]]
            if not good:
                return ok
            addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
            ffi = self.store._owned.binding.ffi
            mm, keep = contiguous_memmap(ffi, addr, self.store.geometry, n)
            with self.store_lock:
                try:
                    with self.store.write([keys[i] for i in good]) as txn:
                        for layer in range(self.store.geometry.n_layers):
                            txn.layer(layer, mm, good)
                        status = txn.finish()
                except OSError as e:  # the local store could not take them: recomputed, not a hit
                    log.info("tutti cluster: keeping %d fetched blocks failed: %s", len(good), e)
                    status = [-1] * len(good)
            del keep, mm
            for i, st in zip(good, status):
                if st != 0:
                    ok[i] = False
                    self.stats["replica_failures"] += 1
            return ok
        finally:
            try:
                buf.close()
            except BufferError:  # a view still held somewhere: the mapping goes with it
                pass

    def publish(self, keys) -> int:
        """Tell the cluster this store holds connector ``keys`` (after they committed); descriptors of
        blocks evicted for them are withdrawn, and any the store evicted otherwise (its counter moved
        more than that explains) after a reconcile."""
        n = self.index.publish(keys)
        try:
            self.index.check_evictions()
        except CallTimeout as e:
            log.info("tutti cluster: withdrawing evicted blocks: %s", e)
        return n

    def withdraw(self, keys) -> int:
        """Tell the cluster this store no longer holds ``keys`` (before or after evicting them)."""
        return self.index.withdraw(keys)

    def info(self) -> dict:
        return {"endpoint": self.cfg.endpoint, "store_uuid": self.store.uuid,
                "master": self.cfg.master, "master_up": self.index.master_up.is_set(),
                "quarantined": self.quarantine.active(), "stats": dict(self.stats)}

    # --- lifetime ---------------------------------------------------------------------

    def close(self, withdraw: bool = True) -> None:
        """Leave the cluster: withdraw this node's entries (bounded), stop the threads."""
        if self._stop.is_set():
            return
        self._stop.set()
        if withdraw:
            try:
                self.claims.release_all()
                self.index.withdraw_all()
            except (CallTimeout, ClusterError) as e:
                log.info("tutti cluster: withdraw at close: %s", e)
        for t in self._threads:
            t.join(self.cfg.call_timeout_s + self.cfg.fetch_timeout_s)
        self.transfers.stop(self.cfg.call_timeout_s + self.cfg.fetch_timeout_s)
        self.link.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- threads ----------------------------------------------------------------------

    def _dispatch(self) -> None:
        affinity.service_thread()
        engine = self.link.engine
        while not self._stop.is_set():
            try:
                notes = engine.get_notifies()
            except Exception as e:  # noqa: BLE001 - keep serving; say why once in a while
                log.info("tutti cluster: get_notifies: %s", e)
                notes = []
            if not notes:
                self._stop.wait(0.002)
                continue
            for n in notes:
                try:
                    self.transfers.on_notify(n.name, n.msg)
                except Exception as e:  # noqa: BLE001 - one bad request must not stop the node
                    self.stats["serve_failures"] += 1
                    log.warning("tutti cluster: handling a peer message failed: %s", e)

    def _keep(self) -> None:
        affinity.service_thread()
        idx, link = self.index, self.link
        last_record = time.monotonic()
        while not self._stop.wait(self.cfg.keeper_interval_s):
            try:
                there = link.call(link.store.is_exist, idx.node_record, what="check node record")
            except CallTimeout:
                there = -1
            if there < 0:
                if idx.master_up.is_set():
                    log.warning("tutti cluster: master %s unreachable: remote lookups are misses until it "
                                "answers", self.cfg.master)
                idx.master_up.clear()
                continue
            idx.master_up.set()
            if there == 0:
                try:
                    n = idx.republish_all()
                    log.info("tutti cluster: re-published %d blocks", n)
                except CallTimeout as e:
                    log.info("tutti cluster: re-publish: %s", e)
            try:  # what the master refused or did not answer before
                idx.retry_publish()
            except CallTimeout as e:
                log.info("tutti cluster: publishing again: %s", e)
            if time.monotonic() - last_record >= RECORD_EVERY_S:  # this node's line in `cluster status`
                last_record = time.monotonic()
                try:
                    idx.publish_record()
                except CallTimeout as e:
                    log.info("tutti cluster: node record: %s", e)
            try:  # blocks the store evicted while nothing was published (or dropped as corrupt)
                idx.check_evictions()
                idx.adopt_orphans()  # blocks kept here whose publisher has gone
                self.claims.check()  # after it: an adopted copy's claim is given up
            except CallTimeout as e:
                log.info("tutti cluster: withdrawing evicted blocks: %s", e)
