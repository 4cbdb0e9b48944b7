"""Moving a block between nodes, verified end to end.

Why this path: on TCP, Mooncake's store API can only move bytes that are already objects in some
segment, which would mean copying SSD-resident blocks into cluster DRAM before anyone asks.  Its
transfer engine instead moves bytes between registered buffers of two nodes, and carries a short
*notify* message with a transfer (both work on TCP loopback, checked here).  So:

  requester  sends the owner a notify "get" (block key, slot, generation, data_sum from the descriptor,
             and where its registered landing area is);
  owner      checks each block against its own slot record (same key, generation, data_sum: else
             "stale", not served), reads them with a verified store read into its registered staging
             area, writes them into the requester's landing area with one batch transfer, and notifies
             "got" with which blocks it sent;
  requester  copies each sent block to where it was asked to go and computes libtutti's checksum of
             *that copy* (Store.block_sum); only a match with the descriptor's data_sum — the owner's
             committed checksum — makes the block a hit.  Anything else is a miss, counted.

Checking the final copy (not the landing area) means a late write from an owner that timed out earlier
cannot change bytes after they were verified.  Every wait is bounded (cluster_fetch_timeout_s).
"""
from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
import uuid as _uuid

from .bounded import CallTimeout

log = logging.getLogger("tutti.cluster")

NOTIFY_NAME = "tutti1"
MAX_MSG = 64 << 10


def contiguous_memmap(ffi, addr: int, geometry, n_blocks: int):
    """A ``struct tt_memmap`` for ``n_blocks`` whole blocks back to back at ``addr`` (put()'s layout),
    and the arrays it borrows."""
    n_objs = geometry.n_layers * geometry.n_spans
    block_bytes = n_objs * geometry.span_bytes
    bases = ffi.new("uint64_t[]", [addr + i * geometry.span_bytes for i in range(n_objs)])
    strides = ffi.new("uint64_t[]", [block_bytes] * n_objs)
    mm = ffi.new("struct tt_memmap *")
    mm.n_layers, mm.n_spans, mm.base, mm.stride = geometry.n_layers, geometry.n_spans, bases, strides
    return mm, (bases, strides)


class Transfers:
    """Both ends of block transfers for one node (ClusterNode owns it)."""

    def __init__(self, store, link, store_lock, stats):
        self.store, self.link, self.lock, self.stats = store, link, store_lock, stats
        self.cfg = link.cfg
        self.bb = store.block_bytes
        n = self.cfg.batch_blocks
        self.serve_off, self.land_off, self.scratch_off = 0, n * self.bb, 2 * n * self.bb
        self._pending: dict = {}  # request id -> [threading.Event, reply]
        self._pending_lock = threading.Lock()
        self._fetch_lock = threading.Lock()  # one fetch at a time uses the landing area
        # Tests only: "flip_served" alters a served block after its verified read (what a bad NIC, a
        # bad owner or a bug would do); "serve_delay_s=X" holds each answer X s (time to kill the owner);
        # "kill_on_serve": the owner dies (SIGKILL) when the first request reaches it, unanswered.
        self.faults = dict(f.partition("=")[::2] for f in os.environ.get("TUTTI_CLUSTER_FAULTS", "").split(",") if f)

    @staticmethod
    def staging_bytes(block_bytes: int, batch_blocks: int) -> int:
        return 2 * batch_blocks * block_bytes + 4096

    # --- messages ------------------------------------------------------------------

    def _notify(self, peer: str, msg: dict, *, data=None) -> None:
        """Send ``msg`` to ``peer`` with a transfer: ``data`` = (srcs, dsts, lens) written to the peer
        first, else a one-word read of the peer's first registered buffer (a notify needs a transfer)."""
        link = self.link
        n = link.Notify()
        n.name, n.msg = NOTIFY_NAME, json.dumps(msg)
        e = link.engine
        if data is not None:
            srcs, dsts, lens = data
            rc = link.call(e.batch_transfer_sync, peer, srcs, dsts, lens, link.Opcode.Write, n,
                           timeout_s=self.cfg.fetch_timeout_s, what=f"send {len(srcs)} blocks to {peer}")
        else:
            remote = link.call(e.get_first_buffer_address, peer, what=f"find {peer}")
            if not remote:
                raise CallTimeout(f"peer {peer} has no registered memory (gone?)")
            rc = link.call(e.transfer_sync, peer, link.staging_addr + self.scratch_off, remote, 8,
                           link.Opcode.Read, n, timeout_s=self.cfg.fetch_timeout_s, what=f"notify {peer}")
        if rc != 0:
            raise CallTimeout(f"transfer to {peer} failed (mooncake rc {rc})")

    def on_notify(self, name: str, msg: str) -> None:
        """A notify from the dispatcher thread: a request to serve or a reply to a fetch."""
        if name != NOTIFY_NAME or len(msg) > MAX_MSG:
            return
        try:
            m = json.loads(msg)
            op = m["op"]
        except (ValueError, KeyError, TypeError):
            self.stats["bad_messages"] += 1
            return
        if op == "get":
            self._serve(m)
        elif op == "got":
            with self._pending_lock:
                waiter = self._pending.get(m.get("id"))
            if waiter is not None:
                waiter[1] = m
                waiter[0].set()

    # --- the owner's side ----------------------------------------------------------

    def _serve(self, m: dict) -> None:
        if "kill_on_serve" in self.faults:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            rid, peer, dst = str(m["id"]), str(m["from"]), int(m["dst"])
            blocks = [(bytes.fromhex(k), int(slot), int(gen), int(dsum)) for k, slot, gen, dsum in m["blocks"]]
        except (KeyError, TypeError, ValueError):
            self.stats["bad_messages"] += 1
            return
        if not 0 < len(blocks) <= self.cfg.batch_blocks:
            self.stats["bad_messages"] += 1
            blocks = []
        ok = self._read_for_peer(blocks) if blocks else []
        sent = [i for i, good in enumerate(ok) if good]
        base = self.link.staging_addr + self.serve_off
        if "flip_served" in self.faults and sent:
            self.link.staging[self.serve_off + sent[0] * self.bb] ^= 0x01
        if "serve_delay_s" in self.faults:
            time.sleep(float(self.faults["serve_delay_s"]))
        if sent:
            data = ([base + i * self.bb for i in sent], [dst + i * self.bb for i in sent], [self.bb] * len(sent))
        else:
            data = None
        try:
            self._notify(peer, {"op": "got", "id": rid, "ok": [int(x) for x in ok]}, data=data)
        except (CallTimeout, RuntimeError) as e:
            self.stats["serve_failures"] += 1
            log.info("tutti cluster: serving %s failed: %s", peer, e)
            return
        self.stats["blocks_served"] += len(sent)
        self.stats["bytes_served"] += len(sent) * self.bb

    def _read_for_peer(self, blocks) -> list:
        """Read the blocks whose slot still holds exactly what the requester was promised into the
        serve area (block i at offset i); per block True if it is there, verified."""
        st = self.store
        ok = [False] * len(blocks)
        want = []
        with self.lock:
            for i, (key, slot, gen, dsum) in enumerate(blocks):
                try:
                    rec = st.slot_record(slot)
                except (KeyError, IndexError, TypeError):
                    continue
                if rec["key"] == key and rec["gen"] == gen and rec["data_sum"] == dsum:
                    want.append(i)
            self.stats["stale_requests"] += len(blocks) - len(want)
            if not want:
                return ok
            ffi = st._owned.binding.ffi
            mm, keep = contiguous_memmap(ffi, self.link.staging_addr + self.serve_off, st.geometry, len(blocks))
            try:
                with st.read([blocks[i][1] for i in want]) as txn:
                    for layer in range(st.geometry.n_layers):
                        txn.layer(layer, mm, want)
                    status = txn.finish()
            except Exception as e:  # noqa: BLE001 - a failed read serves nothing; the store said why
                log.info("tutti cluster: store read for a peer failed: %s", e)
                return ok
            del keep
        for i, s in zip(want, status):
            ok[i] = s == 0
        return ok

    # --- the requester's side ------------------------------------------------------

    def fetch_from(self, peer: str, descs: list, into: list) -> list:
        """Fetch blocks of ``descs`` (all owned by ``peer``, at most batch_blocks) into the writable
        buffers ``into``; per block True only if its bytes in ``into`` match the owner's data_sum."""
        result = [False] * len(descs)
        rid = _uuid.uuid4().hex
        waiter: list = [threading.Event(), None]
        with self._fetch_lock:
            with self._pending_lock:
                self._pending[rid] = waiter
            try:
                msg = {"op": "get", "id": rid, "from": self.cfg.endpoint,
                       "dst": self.link.staging_addr + self.land_off,
                       "blocks": [[d.key.hex(), d.slot, d.gen, d.data_sum] for d in descs]}
                try:
                    self._notify(peer, msg)
                except (CallTimeout, RuntimeError) as e:
                    self.stats["misses_unreachable"] += len(descs)
                    log.info("tutti cluster: %s", e)
                    return result
                if not waiter[0].wait(self.cfg.fetch_timeout_s):
                    self.stats["misses_timeout"] += len(descs)
                    return result
            finally:
                with self._pending_lock:
                    self._pending.pop(rid, None)
            reply = waiter[1]
            sent = reply.get("ok") if isinstance(reply, dict) else None
            if not isinstance(sent, list) or len(sent) != len(descs):
                self.stats["bad_messages"] += 1
                return result
            land = self.land_off
            for i, (d, dst) in enumerate(zip(descs, into)):
                if not sent[i]:
                    self.stats["misses_stale"] += 1
                    continue
                view = memoryview(dst).cast("B")
                view[:] = self.link.staging[land + i * self.bb: land + (i + 1) * self.bb]
                if self.store.block_sum(view) == d.data_sum:
                    result[i] = True
                else:
                    self.stats["misses_corrupt"] += 1
        n = sum(result)
        self.stats["remote_hits"] += n
        self.stats["bytes_fetched"] += n * self.bb
        return result
