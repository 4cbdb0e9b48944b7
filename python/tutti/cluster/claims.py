"""How many nodes keep a block (``cluster_replicas``), decided by Mooncake's master.

A block's descriptor names one holder (index.py): the node that published it first, normally the
one that computed it.  Every other node that serves a request with that block fetches it, and by
default keeps what it fetched: a popular prefix ends up on every node, and the cluster holds no
more distinct blocks than one node does.  With ``cluster_replicas`` R >= 1 the cluster keeps each
block on at most R nodes: its first holder and the winners of R - 1 *replica claims*.

A claim is a small Mooncake object, ``<block name>/r<i>`` (i = 1 .. R - 1), that the claiming node
writes into its own segment and whose value is its endpoint.  Mooncake's ``put`` keeps the first
value written under a name (a second put succeeds and changes nothing), so the master arbitrates:
a node writes the claims it wants, reads them back, and holds those that read as its own.  Nothing
else is needed for liveness: a node that dies takes its claims with its segment (the master's
client_ttl), and a node that drops the block (evicted, or closed) removes them, so a later fetcher
can take its place.  A block fetched without a claim won is *transient*: it serves the request
that fetched it and is then dropped from the store (vllm/worker.py); it is never published.

With tensor parallelism each rank is a node of its own (its shard, its endpoint), but a copy is of
use only if every rank of the engine keeps its shard of it: the ranks claim as one.  A claim's name
then carries the fingerprint without the rank, and its value the engine's group (its first rank's
endpoint), so when two engines fetch a block at once every rank of each reads back the same winner;
per-rank claims could give one engine rank 0's shard and the other rank 1's, a block neither can
serve.

Claims cost two master calls per round (a put of every wanted name, one read of all of them), at
most R - 1 rounds per fetch, every call bounded; while the master cannot be asked no claim is won
(the blocks are transient: a miss later, never a wrong answer).
"""
from __future__ import annotations

import logging
import threading

from .bounded import CallTimeout
from .keys import claim_name, group_fingerprint_id

log = logging.getLogger("tutti.cluster")



class ReplicaClaims:
    """The replica claims one node holds: won through Mooncake, released when its copies go."""

    def __init__(self, index, replicas: int, group: str = ""):
        """``group``: the TP engine this node is a rank of (its first rank's endpoint); its ranks claim
        as one.  Empty: this node alone."""
        self.index, self.replicas = index, replicas
        self._mine = (group or index.endpoint).encode()
        self._fp_id = group_fingerprint_id(index.store.fingerprint) if group else index.fp_id
        self.link, self.stats, self.lock = index.link, index.stats, index.lock
        self._held: dict = {}          # slot -> (store key, gen, claim name)
        self._mu = threading.Lock()    # the fetch thread claims while the keeper checks
        self._changes_seen = None

    @property
    def limited(self) -> bool:
        return self.replicas > 0

    def claim(self, copies) -> set:
        """``copies``: (store key, slot, gen) of blocks this node just wrote from a peer.  Returns the
        store keys it may keep (every one when replicas are not limited)."""
        copies = list(copies)
        if not self.limited:
            return {k for k, _, _ in copies}
        won: set = set()
        mine = self._mine
        todo = copies
        for i in range(1, self.replicas):
            if not todo or not self.index.master_up.is_set():
                break
            names = [claim_name(self._fp_id, k, i) for k, _, _ in todo]
            try:
                # put keeps whatever was there first; only the read back tells who holds the claim
                self.link.call(self.link.store.put_batch, names, [mine] * len(names),
                               self.link.replicate_here(), what=f"claim {len(names)} replicas")
                vals = self.link.call(self.link.store.get_batch, names, what=f"read {len(names)} claims")
            except CallTimeout as e:
                log.info("tutti cluster: replica claims: %s", e)
                break
            if vals is None or len(vals) != len(names):
                break
            left = []
            for (k, slot, gen), name, v in zip(todo, names, vals):
                if v and bytes(v) == mine:
                    won.add(k)
                    with self._mu:
                        self._held[slot] = (k, gen, name)
                else:
                    left.append((k, slot, gen))
            todo = left
        self.stats["replicas_claimed"] += len(won)
        self.stats["replicas_declined"] += len(copies) - len(won)
        return won

    def release_slots(self, slots) -> int:
        """This node no longer keeps the copies in ``slots``: give their claims up."""
        with self._mu:
            names = [self._held.pop(s)[2] for s in slots if s in self._held]
        # A removal that times out leaves the claims until this node leaves (they go with its segment).
        return self.index.remove_names(names, what="release claims of", counter="replicas_released")

    def check(self, force: bool = False) -> int:
        """Release the claims of copies the store no longer holds (evicted, dropped as corrupt: when the
        store's eviction or corruption counter moved) and of copies this node now publishes itself
        (adopted when their first holder went: it counts as that holder now, and its claim lets the
        next fetcher keep a copy, so the block is back to R copies).  Run by the keeper."""
        with self._mu:
            if not self._held:
                return 0
            items = list(self._held.items())
        adopted = set(self.index.publishes(items))
        n = self.release_slots(adopted)
        items = [it for it in items if it[0] not in adopted]
        if not items:
            return n
        with self.lock:
            st = self.index.store.stats()
        changes = st["evictions"] + st["corrupt_blocks"]
        if not force and changes == self._changes_seen:
            return n
        self._changes_seen = changes
        gone = [slot for (slot, _), held in zip(items, self.index.still_held(items)) if not held]
        return n + self.release_slots(gone)

    def release_all(self) -> int:
        with self._mu:
            slots = list(self._held)
        return self.release_slots(slots)

    def held(self) -> int:
        with self._mu:
            return len(self._held)
