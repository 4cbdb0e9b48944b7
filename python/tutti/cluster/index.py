"""The cluster index: which node holds which block, kept in Mooncake.

A node publishes one descriptor object per block its store holds (tutti.cluster.descriptor) into its
*own* Mooncake segment, so Mooncake's master drops them with the node when the node stops heartbeating
(the master's client_ttl) — no home-made liveness service.  A clean shutdown withdraws them at once.

Publishing the same block from two nodes at once: a name held by another node's valid descriptor is
left alone (the first one stays), a name that is empty, invalid or this node's own (a stale
generation) is written; so is another node's descriptor when that node is in this process's
quarantine (tutti.cluster.quarantine: it failed a fetch), so a stuck first publisher does not keep
peers waiting on it.  A publish the master refuses (a killed node's names, until the master drops
them) or does not answer is retried by the node's keeper.  Two nodes racing on an empty name
both write; the last write is what every reader sees, and both writers hold the block, so any answer
is a correct one — and a fetch checks the bytes anyway.  A node that holds a block under another node's
descriptor keeps it as a backup and publishes it once the name is empty (``adopt_orphans``, from the
keeper): a block stays findable while any node holds it.

Every Mooncake call is bounded (cluster_call_timeout_s); while the master is unreachable (the node's
keeper says so) lookups are misses at once instead of timing out one by one.

Eviction: the store evicts least recently used blocks on its own (inside libtutti, on a write), and tells
only how many (its ``evictions`` counter).  The index remembers which slot and generation each of its own
descriptors names, so (1) publishing a block into a slot that one of its descriptors names withdraws that
descriptor at once (the slot was evicted for it: the common case, every commit is published), and (2)
``reconcile`` — run by the node's keeper when the counter moved more than (1) explains, or at least every
RECONCILE_EVERY_S while it moves — checks every remembered descriptor against its slot's record, in chunks
(the store lock is released between them), and withdraws those whose slot no longer holds that key and
generation.  A withdrawal removes a name only while it still holds that exact stale descriptor.
"""
from __future__ import annotations

import json
import logging
import threading
import time

from .._cconv import key_from_bytes
from .bounded import CallTimeout
from .descriptor import Descriptor
from .errors import DescriptorError
from .keys import block_name, fingerprint_id, node_name

log = logging.getLogger("tutti.cluster")

RECONCILE_CHUNK = 1024     # slot records checked per store-lock hold
RECONCILE_EVERY_S = 30.0   # a full check at least this often while the store keeps evicting
MAX_STALE_LATER = 1 << 16  # stale descriptors kept for a later withdrawal while the master is away
MAX_RETRY = 1 << 16        # slots kept for a later publish while the master refuses or is away
UPSERT_CALLS = 32          # calls one publish may spend finding the names the master refuses
ADOPT_EVERY_S = 2.0        # how often a node looks for its backups' names left empty


class ClusterIndex:
    """Publish, withdraw and look up location descriptors of one store's blocks."""

    def __init__(self, store, link, store_lock, stats, *, endpoint=None, quarantine=None):
        """``endpoint``: the node whose own entries a lookup leaves out (default: this link's).  The
        vLLM scheduler looks up through its own link on behalf of its workers' nodes.  ``quarantine``
        (tutti.cluster.quarantine.Quarantine): peers whose descriptors are misses for now."""
        self.store, self.link, self.lock, self.stats = store, link, store_lock, stats
        self.quarantine = quarantine
        self.fp_id = fingerprint_id(store.fingerprint)
        self.endpoint = endpoint or link.cfg.endpoint
        self.master_up = threading.Event()
        self.master_up.set()
        # This node's own descriptors in Mooncake: slot -> (store key, gen), and key -> slot.  Index
        # mutations are serialized (a withdrawal must not remove a descriptor published meanwhile).
        self._mine: dict = {}
        self._slot_of: dict = {}
        self._mutate = threading.RLock()
        self._explained = 0         # evictions seen through publishing (1) since the last check
        self._changes_seen = None   # the store's evictions + corrupt_blocks at the last check
        self._last_full = 0.0
        self._stale_later: list = []  # stale descriptors to withdraw once the master answers
        self._retry: set = set()      # slots whose publish the master refused or did not answer
        self._backups: dict = {}      # slot -> (key, gen): blocks held here, published by another node
        self._last_adopt = 0.0

    # --- names -------------------------------------------------------------------

    def store_key(self, key) -> bytes:
        """The 16-byte store key of a connector key (the same hash the store uses)."""
        return key_from_bytes(self.store._owned.binding, key)

    def name_of(self, store_key: bytes) -> str:
        return block_name(self.fp_id, store_key)

    @property
    def node_record(self) -> str:
        return node_name(self.fp_id, self.endpoint)

    # --- publishing ----------------------------------------------------------------

    def _descriptors_of_slots(self, slots) -> list:
        """This node's descriptor of each committed slot (slots no longer committed are left out)."""
        g = self.store.geometry
        out = []
        with self.lock:
            for slot in slots:
                try:
                    rec = self.store.slot_record(slot)
                except KeyError:
                    continue
                out.append(Descriptor(fp_id=self.fp_id, key=rec["key"], store_uuid=self.store.uuid,
                                      endpoint=self.endpoint, slot=slot, gen=rec["gen"],
                                      data_sum=rec["data_sum"], block_bytes=self.store.block_bytes,
                                      span_bytes=g.span_bytes, n_objs=g.n_layers * g.n_spans))
        return out

    def publish(self, keys) -> int:
        """Publish the blocks of connector ``keys`` this store holds; returns how many were written."""
        keys = list(keys)
        with self.lock:
            slots = [s for s in self.store.lookup(keys) if s is not None]
        return self.publish_slots(slots)

    def publish_slots(self, slots) -> int:
        with self._mutate:
            return self._publish_slots(slots)

    def _publish_slots(self, slots) -> int:
        descs = self._descriptors_of_slots(slots)
        if not descs:
            return 0
        # A slot one of our descriptors names now holds another key: that block was evicted for it.
        evicted = []
        for d in descs:
            had = self._mine.get(d.slot)
            if had is not None and had[0] != d.key:
                evicted.append((had[0], d.slot, had[1]))
        if evicted:
            self._explained += len(evicted)
            self._withdraw_stale(evicted)
        names = [self.name_of(d.key) for d in descs]
        current = self._get_values(names)
        if current is None:
            self._retry_later(d.slot for d in descs)
            return 0
        put_names, put_values, put_descs = [], [], []
        for name, d, cur in zip(names, descs, current):
            if cur:
                try:
                    other = Descriptor.decode(cur)
                    if other == d:
                        self._remember(d.key, d.slot, d.gen)
                        continue  # already there
                    if (other.endpoint != self.endpoint and other.fp_id == self.fp_id
                            and not self._quarantined(other.endpoint)):
                        self._backing(d.slot, d.key, d.gen)
                        continue  # another node published it first: its descriptor stays
                except DescriptorError:
                    pass  # garbage under our name: replaced
            put_names.append(name)
            put_values.append(d.encode())
            put_descs.append(d)
        if not put_names:
            return 0
        done = self._upsert(put_names, put_values, put_descs, [UPSERT_CALLS])
        self.stats["published"] += done
        return done

    def _upsert(self, names, values, descs, budget: list) -> int:
        """Write descriptors; those Mooncake refuses (upsert_batch says only that one did) are found by
        halving the batch and kept for the keeper to retry: a name whose dead owner's metadata the master
        still holds is refused until the master drops it, and must not hold back the rest.  At most
        ``budget[0]`` calls (a master that refuses everything, e.g. a full segment, costs a few, not 2N)."""
        if budget[0] <= 0:
            self._retry_later(d.slot for d in descs)
            return 0
        budget[0] -= 1
        try:
            rc = self.link.call(self.link.store.upsert_batch, names, values,
                                self.link.replicate_here(), what=f"publish {len(names)} blocks")
        except CallTimeout as e:
            log.warning("tutti cluster: %s", e)
            self._retry_later(d.slot for d in descs)
            return 0
        if rc == 0:
            for d in descs:
                self._remember(d.key, d.slot, d.gen)
                self._retry.discard(d.slot)
            return len(descs)
        if len(names) == 1:
            log.info("tutti cluster: publishing %s refused (mooncake rc %s): retried", names[0], rc)
            self._retry_later([descs[0].slot])
            return 0
        h = len(names) // 2
        return (self._upsert(names[:h], values[:h], descs[:h], budget)
                + self._upsert(names[h:], values[h:], descs[h:], budget))

    def _backing(self, slot: int, key: bytes, gen: int) -> None:
        """This store holds a block whose name another node's descriptor holds: a backup, published
        by ``adopt_orphans`` once that name is empty (its holder evicted it, left, or died)."""
        if len(self._backups) < MAX_RETRY:
            self._backups[slot] = (key, gen)

    def adopt_orphans(self, chunk: int = RECONCILE_CHUNK) -> int:
        """Publish the backups whose name no node's descriptor holds any more (the keeper calls this
        every ADOPT_EVERY_S): a block stays findable while any node keeps it.  Backups whose slot no
        longer holds them are forgotten."""
        with self._mutate:
            # Every ADOPT_EVERY_S, slower with many backups: about 1000 names a second at most.
            every = max(ADOPT_EVERY_S, len(self._backups) / 1000)
            if not self._backups or time.monotonic() - self._last_adopt < every:
                return 0
            self._last_adopt = time.monotonic()
            items = list(self._backups.items())
            n = 0
            for c in range(0, len(items), chunk):
                part = items[c:c + chunk]
                held = []
                for (slot, (key, _)), still in zip(part, self.still_held(part)):
                    if still:
                        held.append((slot, key))
                    else:
                        self._backups.pop(slot, None)
                vals = self._get_values([self.name_of(k) for _, k in held])
                if vals is None:
                    return n
                empty = [slot for (slot, _), v in zip(held, vals) if not v]
                for slot in empty:
                    self._backups.pop(slot, None)
                if empty:
                    got = self._publish_slots(empty)
                    self.stats["adopted"] += got
                    n += got
            return n

    def _retry_later(self, slots) -> None:
        for slot in slots:
            if len(self._retry) >= MAX_RETRY:
                self.stats["publish_dropped"] += 1  # the next full re-publish (master restart) has it
                continue
            self._retry.add(slot)

    def retry_publish(self) -> int:
        """Publish again what the master refused or could not take (the keeper calls this)."""
        with self._mutate:
            if not self._retry:
                return 0
            slots = sorted(self._retry)
            self._retry.clear()
            self.stats["publish_retries"] += 1
            return self._publish_slots(slots)

    def _quarantined(self, endpoint: str) -> bool:
        return self.quarantine is not None and self.quarantine.holds(endpoint)

    def _remember(self, key: bytes, slot: int, gen: int) -> None:
        old = self._slot_of.get(key)
        if old is not None and old != slot and self._mine.get(old, (None,))[0] == key:
            del self._mine[old]
        self._mine[slot] = (key, gen)
        self._slot_of[key] = slot

    def _forget(self, key: bytes) -> None:
        slot = self._slot_of.pop(key, None)
        if slot is not None and self._mine.get(slot, (None,))[0] == key:
            del self._mine[slot]

    def republish_all(self, chunk: int = 1024) -> int:
        """Publish everything the store holds (its on-disk slot table), and this node's record."""
        with self.lock:
            slots = list(self.store.committed().values())
        n = 0
        for i in range(0, len(slots), chunk):
            n += self.publish_slots(slots[i:i + chunk])
        self.stats["republished"] += 1
        self.publish_record()
        return n

    def record(self) -> dict:
        """What this node's record says about it (``tutti-admin cluster status`` reads it)."""
        with self.lock:
            info = self.store.info()
        return {"v": 1, "endpoint": self.endpoint, "store_uuid": info["uuid"],
                "model": info["fingerprint"].get("model_id"), "tp_rank": info["fingerprint"].get("tp_rank"),
                "blocks": info["n_committed"], "slots": info["n_committed"] + info["n_free"],
                "quarantined": self.quarantine.active() if self.quarantine is not None else [],
                "stats": dict(self.stats), "at": time.time()}

    def publish_record(self) -> None:
        """Write this node's record: its presence tells the keeper the index survived the master, its
        value (JSON, ``record()``) is this node's line in ``tutti-admin cluster status``."""
        self.link.call(self.link.store.upsert, self.node_record, json.dumps(self.record()).encode(),
                       self.link.replicate_here(), what="publish node record")

    def withdraw(self, keys) -> int:
        """Remove this node's descriptors of connector ``keys`` (before or after its store drops them)."""
        return self.withdraw_store_keys([self.store_key(k) for k in keys])

    def withdraw_store_keys(self, store_keys) -> int:
        with self._mutate:
            store_keys = list(store_keys)
            names = [self.name_of(k) for k in store_keys]
            current = self._get_values(names)
            if current is None:
                return 0
            mine = []
            for name, cur in zip(names, current):
                try:
                    if cur and Descriptor.decode(cur).endpoint == self.endpoint:
                        mine.append(name)
                except DescriptorError:
                    mine.append(name)  # garbage: nobody's, removed
            for k in store_keys:
                self._forget(k)
            return self.remove_names(mine)

    def remove_names(self, names, what="withdraw", counter="withdrawn") -> int:
        """Remove this node's objects ``names`` (bounded; a timeout leaves them, and says so); counted
        under ``counter``."""
        if not names:
            return 0
        try:
            rcs = self.link.call(self.link.store.batch_remove, names, True, what=f"{what} {len(names)}")
        except CallTimeout as e:
            log.warning("tutti cluster: %s", e)
            return 0
        n = sum(1 for rc in rcs if rc == 0)
        self.stats[counter] += n
        return n

    def _withdraw_stale(self, entries) -> int:
        """Withdraw this node's descriptors of ``entries`` ((store key, slot, gen) no longer held): each
        name only while it holds exactly that descriptor (not one published since).  While the master
        cannot be asked they are kept for the next check."""
        for key, slot, gen in entries:
            if self._mine.get(slot) == (key, gen):
                del self._mine[slot]
            if self._slot_of.get(key) == slot:
                del self._slot_of[key]
        names = [self.name_of(k) for k, _, _ in entries]
        current = self._get_values(names)
        if current is None:
            self._stale_later = (self._stale_later + list(entries))[-MAX_STALE_LATER:]
            return 0
        stale = []
        for name, (key, slot, gen), cur in zip(names, entries, current):
            try:
                d = Descriptor.decode(cur) if cur else None
            except DescriptorError:
                continue
            if d is not None and d.endpoint == self.endpoint and (d.key, d.slot, d.gen) == (key, slot, gen):
                stale.append(name)
        n = self.remove_names(stale)
        self.stats["withdrawn_evicted"] += n
        return n

    def check_evictions(self, force: bool = False) -> int:
        """If the store evicted (or dropped corrupt) blocks since the last check beyond what publishing
        explained, or RECONCILE_EVERY_S passed while it keeps evicting: reconcile.  Returns how many
        descriptors were withdrawn."""
        with self.lock:
            st = self.store.stats()
        changes = st["evictions"] + st["corrupt_blocks"]
        with self._mutate:
            if self._changes_seen is None:
                self._changes_seen = changes
            moved = changes - self._changes_seen
            explained, self._explained = self._explained, 0
            self._changes_seen = changes
            n = 0
            if self._stale_later:  # withdrawals the master could not take last time
                later, self._stale_later = self._stale_later, []
                n += self._withdraw_stale(later)
            due = time.monotonic() - self._last_full >= RECONCILE_EVERY_S
            if not force and (moved == 0 or (moved <= explained and not due)):
                return n
            return n + self.reconcile()

    def publishes(self, items) -> list:
        """Of ``items`` ((slot, (store key, gen)...)), the slots whose name this node's own descriptor
        holds (it published the block first, or adopted it)."""
        with self._mutate:
            return [slot for slot, (key, gen, *_) in items if self._mine.get(slot) == (key, gen)]

    def still_held(self, items) -> list:
        """Of ``items`` ((slot, (store key, gen)...)), per item whether its slot still holds that key and
        generation; read under the store lock, one hold per RECONCILE_CHUNK (the engine's hooks wait one
        chunk at most)."""
        out = []
        for c in range(0, len(items), RECONCILE_CHUNK):
            with self.lock:
                for slot, (key, gen, *_) in items[c:c + RECONCILE_CHUNK]:
                    try:
                        rec = self.store.slot_record(slot)
                    except KeyError:
                        rec = None
                    out.append(rec is not None and rec["key"] == key and rec["gen"] == gen)
        return out

    def reconcile(self, chunk: int = RECONCILE_CHUNK) -> int:
        """Withdraw every descriptor of this node whose slot no longer holds its key and generation."""
        with self._mutate:
            self._last_full = time.monotonic()
            items = list(self._mine.items())
            gone = [(key, slot, gen) for (slot, (key, gen)), held in zip(items, self.still_held(items))
                    if not held]
            self.stats["reconciled"] += 1
            n = 0
            for c in range(0, len(gone), chunk):
                n += self._withdraw_stale(gone[c:c + chunk])
            return n

    def withdraw_all(self) -> int:
        """Withdraw every block of this store and the node record (a clean shutdown)."""
        with self.lock:
            keys = list(self.store.committed())
        with self._mutate:
            keys = list(dict.fromkeys(keys + list(self._slot_of)))  # and what it still names elsewhere
            n = 0
            for c in range(0, len(keys), RECONCILE_CHUNK):
                n += self.withdraw_store_keys(keys[c:c + RECONCILE_CHUNK])
            self._mine.clear()
            self._slot_of.clear()
        try:
            self.link.call(self.link.store.remove, self.node_record, True, what="withdraw node record")
        except CallTimeout:
            pass
        return n

    # --- lookups -------------------------------------------------------------------

    def _get_values(self, names):
        """Values of ``names`` (b"" where absent), or None when the master cannot be asked."""
        if not names:
            return []
        if not self.master_up.is_set():
            self.stats["lookups_master_down"] += 1
            return None
        try:
            vals = self.link.call(self.link.store.get_batch, names, what=f"look up {len(names)} blocks")
        except CallTimeout as e:
            log.warning("tutti cluster: %s", e)
            self.stats["lookup_timeouts"] += 1
            return None
        if vals is None or len(vals) != len(names):
            return None
        return [bytes(v) if v else b"" for v in vals]

    def lookup(self, keys) -> list:
        """The checked descriptor of each connector key held by *another* node, or None.

        A value that fails its checks (DescriptorError: torn, altered, stale format, another model or
        geometry) is a miss and counted as rejected.
        """
        store_keys = [self.store_key(k) for k in keys]
        vals = self._get_values([self.name_of(k) for k in store_keys])
        self.stats["lookups"] += len(store_keys)
        if vals is None:
            return [None] * len(store_keys)
        out: list = []
        g = self.store.geometry
        for sk, v in zip(store_keys, vals):
            if not v:
                out.append(None)
                continue
            try:
                d = Descriptor.decode(v)
                d.check_against(self.fp_id, sk, g)
            except DescriptorError as e:
                self.stats["rejected"] += 1
                log.info("tutti cluster: descriptor of %s rejected: %s", sk.hex(), e)
                out.append(None)
                continue
            if d.endpoint == self.endpoint:
                out.append(None)
            elif self._quarantined(d.endpoint):
                self.stats["misses_quarantined"] += 1
                out.append(None)
            else:
                out.append(d)
        return out

    def lookup_prefix(self, keys, owners: list | None = None) -> int:
        """How many of ``keys``, from the first, other nodes hold (a prefix stops at its first miss);
        ``owners`` gets each of those blocks' holder (endpoint)."""
        n = 0
        for d in self.lookup(keys):
            if d is None:
                break
            n += 1
            if owners is not None:
                owners.append(d.endpoint)
        return n
