"""Saves of the worker side: layer writes while the model computes, commits in the step or later.

``save_mode: step``: a step's save is written during its forward (``save_kv_layer`` per layer,
reads first: see worker.py) and committed in its ``wait_for_save`` (data durable, then the
records).  Everything saved in a step is durable when the step returns, and the step's time
includes whatever of the writes the forward did not hide, the flush and the commit.

``save_mode: deferred`` (the default): the same writes go out during the forward, but
``wait_for_save`` neither waits for them nor commits.  The step's save becomes a *pending* save,
first in, first out:

- At each later ``wait_for_save`` the pending saves from earlier steps whose layers have all been
  submitted and whose writes have all completed (``Txn.poll``, which never waits: a save on a slow
  store does not stretch the step that commits it) are committed (the store's commit: flush,
  records; with TP ``tutti.tp.commit``, agreed at that step on every rank: see below), oldest
  first; then layers still queued (their KV not yet final in GPU memory, or held back by reads)
  are submitted, oldest save first, up to ``drain_bytes_per_step`` bytes per step (``auto``:
  drain.py, what the store writes in about a step: cut when a drain is still being written two step
  ends later or held up a load; at least one layer a step, so every save progresses.  A fixed size is
  a rate: a layer larger than it goes once the steps' unspent bytes add up to it, drain.DrainRate).
- A request that finishes while a save of its blocks is pending keeps its blocks: the scheduler
  side returns True from ``request_finished`` (vLLM's delay-free) and names the request in the
  next step's metadata (``held``); the worker reports it in ``get_finished`` (finished_sending)
  once no pending save needs its blocks, and only then does vLLM free them.  Blocks of a running
  request are never rewritten by vLLM (full prompt blocks only are saved), so nothing but
  preemption can take them: ``handle_preemptions`` (called by vLLM before the step's forward)
  writes out every pending save holding a preempted request's blocks first.
- A bound on pending bytes (``max_pending_bytes``; default a quarter of this rank's KV cache, at
  most half the store): when a new save would exceed it, the oldest pending saves are dropped
  (their transactions aborted, nothing of them committed), counted as ``save_dropped``.  Serving
  never waits for the store, but for one case: a single save larger than the whole bound is written
  and committed in its step (as ``save_mode: step``; counted ``save_over_bound``) rather than never
  stored (single rank; with TP it is dropped).
- At shutdown pending saves get ``shutdown_drain_s`` seconds to be written and committed; the
  rest are dropped (counted).  With TP the ranks agree at shutdown too (vLLM stops its workers
  together), with every collective bounded by the same deadline: a rank already gone costs the
  others that wait, then the saves are dropped.

Nothing computed over a block that failed to load is committed (worker.py, "Failed loads"): a
save computed while the worker is fenced is void from the end of its step (aborted, reported
``unsaved``); a pending save is not committed while the worker is fenced; and at its commit, the
keys of blocks the scheduler has since found bad (``TuttiMetadata.bad_blocks``, taint.py) are
vetoed.  A crash at any point leaves every key exact or absent: a pending save is an open write
transaction, committed by the same protocol as in ``step`` mode.

TP: every rank keeps the same list of pending saves (each step's save list; sizes, the bound and
drops depend only on it), so the decision points are the same on
every rank.  At each ``wait_for_save`` with pending saves from earlier steps, the ranks agree
(all-reduce MIN over ``tutti.tp.agree``) which of them is ready everywhere, and each rank commits
the ready ones in order, each through ``tutti.tp.commit`` (a rank whose save was void abstains:
all or nothing per block, as before).
"""
import errno
import logging
import time
from collections import deque

from . import fault_hooks
from .drain import DrainRate
from .metadata import SlotEvent

log = logging.getLogger("vllm.tutti")

MAX_PARTS = 64   # a carried-over save is cut into at most this many transactions (_split_carried)


def save_list(meta):
    """The step's blocks to save, each key once, in the same order on every rank."""
    keys, ids, seen = [], [], set()
    for t in meta.saves:
        for k, b in zip(t.keys, t.block_ids):
            if k not in seen:
                seen.add(k)
                keys.append(k)
                ids.append(b)
    return keys, ids


class Save:
    """One step's layer-wise write transaction (in deferred mode also a pending save).

    ``keys``/``ids``: this rank's blocks, tail first (committed tail first: a chain's head is its
    most recently used block); ``common``: the step's list of keys, the same on every rank (this
    rank's keys are a prefix of it, the slot cap keeps the first).  ``queued``: (layer, mark) the
    model has handed over whose write waits for the step's reads or, in GPU memory, for the
    model's kernels (mark: datapath's event).  The transaction is begun with the first write that
    goes out (beginning it may write the slot table: emptied victims).
    """

    def __init__(self, keys, ids, common, transfers, step, meta_step, nbytes):
        self.keys, self.ids, self.common = keys, ids, common
        self.transfers = list(transfers)
        self.req_ids = {t.req_id for t in transfers}
        self.step, self.meta_step = step, meta_step
        self.bytes = nbytes   # planned: the same on every rank
        self.planned = len(common)  # blocks it may pin (set by the worker: the slot cap)
        self.txn = None
        self.t0 = None
        self.busy_s = 0.0
        self.seen = set()      # layers handed over by the model
        self.queued = []       # handed over, write not submitted yet (in layer order)
        self.inflight = set()  # submitted, not waited for
        self.void = False      # nothing of it is committed on this rank
        self.vetoed = set()    # keys found bad since (TuttiMetadata.bad_blocks)
        self.data_out = False  # its vLLM blocks are no longer read

    def ready(self):
        """Every layer handed over is submitted (or nothing will be written here)."""
        return self.void or not self.queued


class SavesMixin:
    """The save half of WorkerSide (worker.py holds loads, the fence and set-up)."""

    def _init_saves(self, cfg):
        self._deferred = cfg.save_mode == "deferred"
        self._save = None           # this step's Save (None: not begun)
        self._fifo = deque()        # pending saves (deferred mode), oldest first
        self._steps = 0             # wait_for_save calls: the same count on every rank
        self._held = set()          # finished requests waiting for their pending saves
        self._drained_sent = None
        self._max_pending = None
        self._drain_budget = None   # drain.DrainBudget with drain_bytes_per_step auto; None: _drain_rate
        self._drains = deque()      # the last drains still being written: [saves, cut for it yet?]
        self._step_end = None       # perf_counter at the last finish_save
        self._drain_rate = DrainRate(cfg.drain_bytes_per_step or 1)   # a fixed size's pacing

    def _set_pending_bound(self, num_blocks):
        """Bytes of pending saves held at most: a quarter of this rank's KV cache and half the
        store by default (blocks held past their request are taken from vLLM's free pool)."""
        bb = self.layout.block_bytes
        auto = min(num_blocks * bb // 4, self.store.geometry.n_slots * bb // 2)
        self._max_pending = self.cfg.max_pending_bytes or max(auto, bb)
        if self.cfg.drain_bytes_per_step is None:
            from ..sched.profile import plan_io
            from .drain import GPU_STEP_CEILING, DrainBudget, slack_fit_for
            pi = plan_io(getattr(self.cfg.profile, "io", None))
            wbps = pi["write_gbps"] * 1e9 if pi and pi["write_gbps"] else 0.0
            ceiling = self._max_pending
            if getattr(self.io, "on_gpu", False):  # the drain's work runs beside the next steps' kernels
                ceiling = min(ceiling, GPU_STEP_CEILING)
            self._drain_budget = DrainBudget(floor=bb // max(self.layout.n_layers, 1), ceiling=ceiling,
                                             write_bps=wbps or None)
            self._drain_budget.slack_fit = slack_fit_for(getattr(self.io, "path", None))

    def _layer_bytes(self, sv):
        return len(sv.keys) * self.layout.block_bytes // max(self.layout.n_layers, 1)

    def _all_saves(self):
        out = list(self._fifo)
        if self._save:
            out.append(self._save)
        return out

    # --- during the forward ------------------------------------------------------------

    def save_layer(self, meta, layer_name):
        self._sync_step(meta)
        if not meta.saves or self.store is None:
            return
        layer = self.layer_index(layer_name)
        if layer is None:
            return
        if self._save is None:
            self._save = self._new_save(meta)
        sv = self._save
        if not sv.keys or layer in sv.seen:
            return
        sv.seen.add(layer)
        sv.queued.append((layer, self.io.mark()))
        if self._after_step or (self._slack and self._load is not None):
            # Reads first: this layer's KV stays in vLLM's cache (nothing overwrites it before
            # the step ends) until the load is over; after_step: until the step's end.
            self.stats.add(writes_deferred=1)
            return
        self._issue(sv)

    def _new_save(self, meta):
        # A key may also be in a pending save of an earlier step (offered again before that one
        # was committed): both are written, the later commit finds it stored and keeps the first.
        common, cids = save_list(meta)
        # A transaction pins its slots: never ask for more than the store can give.
        # Earlier blocks first: a block is useful only after its whole prefix.  ``planned``
        # (the same on every rank) is what the pending-bytes bound counts.
        room = max(self.store.geometry.n_slots - sum(e.planned for e in self._fifo), 0)
        planned = min(room, len(common))
        cap = min(planned, max(room - (len(self._load.slots) if self._load else 0), 0))
        keys, ids = common[:cap], cids[:cap]
        if len(common) > cap:
            self.stats.add(save_errors=len(common) - cap)
        step = getattr(meta, "step", 0)
        sv = Save(keys[::-1], ids[::-1], common, meta.saves, self._steps + 1, step,
                  planned * self.layout.block_bytes)
        sv.planned = planned
        return sv

    def _issue_writes(self, block=False):
        """The current step's queued writes (called when the reads are over; after_step: not yet)."""
        if self._save and not self._after_step:
            self._issue(self._save, block)

    def _issue(self, sv, block=False, budget=None):
        """Submit ``sv``'s queued layers' writes (the caller made sure no read is in flight), in
        layer order, each once its KV is final; ``block``: wait for that; ``budget``: bytes (one
        layer at least).  Returns the bytes submitted."""
        if not sv.queued or sv.void or self.fenced():
            return 0  # fenced: these blocks will not be committed, so they are not written
        if not self.io.ready(sv.queued[0][1], block):
            return 0
        t = time.perf_counter()
        if sv.txn is None:
            try:
                sv.txn = self.io.write(sv.keys, sv.ids)
            except Exception as e:  # noqa: BLE001 - a save that cannot start is a future miss
                log.warning("tutti: cannot store %d blocks: %s", len(sv.keys), e)
                self.stats.add(save_errors=len(sv.keys))
                self._void(sv)
                return 0
            sv.t0 = t
            for s, p in zip(sv.txn.slots, sv.txn.present):
                if not p:  # the slot's old content is gone from now on
                    self._events.append(SlotEvent(self.rank, s, None))
        sent, per = 0, self._layer_bytes(sv)
        while sv.queued and self.io.ready(sv.queued[0][1], block):
            if budget is not None and sent and sent + per > budget:
                break
            layer = sv.queued.pop(0)[0]
            try:
                sv.txn.layer(layer)
            except Exception as e:  # noqa: BLE001 - a failed save is a future miss, never a failed step
                log.warning("tutti: storing layer %d failed; these blocks are not committed: %s",
                            layer, e)
                continue
            sent += per
            sv.inflight.add(layer)
            self._note_io()
            fault_hooks.crash_point(self.rank)
        sv.busy_s += time.perf_counter() - t
        return sent

    def _wait_writes(self):
        """Wait for the writes in flight (before a load starts: never both at once); the time a
        load waited is counted and, with drain_bytes_per_step auto, shrinks the next drains."""
        if not self._writes_in_flight():
            self._note_io()
            return
        t = time.perf_counter()
        for sv in self._all_saves():
            self._wait_inflight(sv)
        t = time.perf_counter() - t
        self.stats.add(load_write_wait_s=t)
        if self._drain_budget is not None:
            self._drain_budget.load_waited(t)
        self._note_io()

    def _wait_inflight(self, sv):
        for layer in sorted(sv.inflight):
            try:
                sv.txn.wait_layer(layer)
            except Exception as e:  # noqa: BLE001 - the block is marked failed: not committed
                log.warning("tutti: storing layer %d failed; these blocks are not committed: %s",
                            layer, e)
        sv.inflight.clear()

    def _writes_in_flight(self):
        return sum(len(sv.inflight) for sv in self._all_saves())

    # --- the step's end -----------------------------------------------------------------

    def finish_save(self, meta=None):
        self.note_forward_end()  # worker.py: before anything here waits
        self._sync_step(meta)
        # End of the step: the model has run every layer, so the reads are over (finish the
        # load if a layer was never waited for: its blocks count as failed).  Whether this
        # step's saves may be committed is known only once the load is.
        self._finish_load()
        self._note_failure()
        self._steps += 1
        sv, self._save = self._save, None
        if sv is not None and self._after_step and sv.queued:
            # Behind the whole step's kernels, not each layer's: the host reaches this long before
            # the GPU ends the forward, and a write after layer 0's would run beside the rest.
            end = self.io.mark()
            sv.queued = [(layer, end) for layer, _ in sv.queued]
        has_saves = meta is not None and meta.saves and self.store is not None
        if sv is None and has_saves:
            sv = self._new_save(meta)  # no layer handed over: TP still counts it
        if sv is not None and self.fenced():
            self._drop_fenced(sv)
        if not self._deferred:
            if sv is not None and sv.queued:
                # What waited for the reads goes now and is committed in this step.
                self._issue(sv, block=True)
            self._note_io()
            if sv is not None:
                self._commit(sv)
            return
        if sv is not None:
            self._fifo.extend(self._split_carried(sv))
        fit = self._drain_budget is not None and self._drain_budget.slack_fit
        spilled = fit and self._drain_spilled()  # before the commits: they take complete saves away
        self._commit_ready()
        if self._drain_budget is not None:
            b, now = self._drain_budget, time.perf_counter()
            if self._step_end is not None:
                b.step_time(now - self._step_end)
            self._step_end = now
            if spilled:
                # A drain has had a whole step after the next to be written and still is: more
                # than the slack.  Nothing goes out until it is done (a load waits for two drains
                # at most), and the size shrinks once for it.
                if not self._drains[0][1]:
                    self._drains[0][1] = True
                    b.spilled()
                    self.stats.add(drain_spills=1)
                spent, more = 0, False
            else:
                # Grown only when the last drain was written within its step (the store kept up).
                caught_up = not self._drains
                spent, more = self._drain(b.bytes, track=fit)
                more = more and caught_up
            b.step_drained(spent, more)
        else:
            self._drain_paced()
        self._bound()
        self._note_io()

    def _split_carried(self, sv):
        """A save carried over whole (no write went out in its step: on a GPU, the kernels of its
        first layer had not finished by the step's end) whose layer is larger than a step's drain
        is cut into parts of consecutive blocks, each its own transaction, whose layer fits: a
        drain then sends a part's layer a step, not a whole layer of the save (a 128K-token
        prompt's layer is 512 MiB on Llama-3-8B).  The parts keep the save's order (tail first) and are committed one by
        one as each is written.  Not with TP (whether a rank's transaction has begun depends on
        its own kernels' timing, and every rank must keep the same list of pending saves), nor
        for a save over the pending bound (written in its step, ``_bound``)."""
        budget = self._drain_budget.bytes if self._drain_budget is not None else self.cfg.drain_bytes_per_step
        per = self._layer_bytes(sv)
        if (not budget or per <= budget or sv.txn is not None or sv.void or not sv.queued
                or self.shape.tp_size > 1 or sv.bytes > self._max_pending):
            return [sv]
        n = min(-(-per // budget), MAX_PARTS, len(sv.keys))
        size = -(-len(sv.keys) // n)
        bb = self.layout.block_bytes
        parts = []
        for i in range(0, len(sv.keys), size):
            keys, ids = sv.keys[i:i + size], sv.ids[i:i + size]
            last = i + size >= len(sv.keys)
            # ``planned`` may exceed the blocks kept (the slot cap): the last part keeps the rest.
            planned = len(keys) + (sv.planned - len(sv.keys) if last else 0)
            p = Save(keys, ids, keys[::-1], sv.transfers, sv.step, sv.meta_step, planned * bb)
            p.planned = planned
            p.seen = set(sv.seen)
            p.queued = list(sv.queued)
            p.vetoed = sv.vetoed & set(keys)
            parts.append(p)
        self.stats.add(save_parts=len(parts))
        return parts

    def _commit_ready(self):
        """Commit the pending saves of earlier steps that every rank has written, oldest first.

        Only saves whose writes have all completed (``Txn.poll``): a commit then waits for no data I/O,
        only for its flushes and records, so a slow store does not stretch the step that commits (a save
        still in flight waits for a later step; its blocks stay held meanwhile)."""
        cands = [e for e in self._fifo if e.step < self._steps]
        if not cands:
            return
        fenced = self.fenced()
        flags = self._agreed_ready(cands, lambda e: e.ready() and not fenced and self._written(e))
        if flags is None:
            self._drop_all("a broken TP group")
            return
        for e, ok in zip(cands, flags):
            if not ok:
                break
            self._fifo.popleft()
            self._commit(e)
            e.data_out = True

    def _agreed_ready(self, saves, ready, timeout=None):
        """Per pending save of ``saves`` (oldest first): may it be committed now, here (a void save
        always, another when ``ready(e)``) and, with TP, on every rank (agreed, waiting at most
        ``timeout()`` seconds, asked once the saves were, if given).  Saves are committed in order,
        so the first that may not ends the run and the ones after it are not asked.  None: the TP
        agreement failed."""
        flags = []
        for e in saves:
            flags.append(e.void or ready(e))
            if not flags[-1]:
                break
        flags += [False] * (len(saves) - len(flags))
        if self.shape.tp_size > 1:
            from ..tp import agree
            try:
                flags = agree(flags, self.tp_group(), timeout() if timeout else None)
            except Exception as err:  # noqa: BLE001 - a broken group, or one already taken down (shutdown)
                log.warning("tutti: TP agreement on pending saves failed: %s", err)
                return None
        return flags

    @staticmethod
    def _written(e):
        """Have the writes of pending save ``e`` all completed?  (Never waits.)"""
        if e.txn is None:
            return True
        try:
            return e.txn.poll()
        except Exception:  # noqa: BLE001 - its commit (finish) reports what went wrong
            return True

    def _drain_spilled(self):
        """Is a drain from before the last step's end still being written (never waits)?  Drains
        go out one a step and the next may start before the last is done (the store never idles
        between them), but not while an older one is still in flight."""
        for d in self._drains:
            d[0] = [e for e in d[0] if not e.void and not e.data_out and not self._written(e)]
        while self._drains and not self._drains[0][0]:
            self._drains.popleft()
        return len(self._drains) > 1

    def _drain(self, budget, track=False):
        """Carry over: queued layers of pending saves, oldest save first, ``budget`` bytes a step
        (one layer at least, so every save progresses); ``track``: remember the drain's saves (the
        slack fit asks whether they were written in time).  Return: (bytes submitted, whether the
        budget left layers queued whose KV was final)."""
        if self._load is not None or self.fenced():
            return 0, False
        spent, more, saves = 0, False, []
        for e in self._fifo:
            if e.void or not e.queued:
                continue
            if spent < budget:
                n = self._issue(e, budget=budget - spent)
                if n:
                    spent += n
                    saves.append(e)
                if not e.queued:
                    continue
            # Its next layer's KV is not final yet, or the budget is spent (then: left queued by it).
            more = self.io.ready(e.queued[0][1])
            break
        if saves and track:
            self._drains.append([saves, False])
        return spent, more

    def _drain_paced(self):
        """A fixed ``drain_bytes_per_step``: a rate (drain.DrainRate).  A save split into parts
        (_split_carried) has layers that fit it."""
        budget = self._drain_rate.budget(self._next_drain_bytes())
        if budget:
            self._drain_rate.spent(self._drain(budget)[0])

    def _next_drain_bytes(self):
        """Bytes of the layer the next drain would send first (None: none queued with its KV final)."""
        for e in self._fifo:
            if e.void or not e.queued:
                continue
            return self._layer_bytes(e) if self.io.ready(e.queued[0][1]) else None
        return None

    def _bound(self):
        """Drop the oldest pending saves while their bytes exceed the bound (never wait), except
        that one save larger than the whole bound is written and committed now, as save_mode step
        would: dropped, a prompt longer than the bound would never be stored (single rank only:
        with TP that commit needs every rank's agreement at this point, so it is dropped)."""
        total = sum(e.bytes for e in self._fifo)
        while self._fifo and total > self._max_pending:
            if len(self._fifo) == 1 and self._write_now(self._fifo[0]):
                self._fifo.popleft()
                return
            e = self._fifo.popleft()
            total -= e.bytes
            if not e.void:
                self.stats.add(save_dropped=len(e.keys))
                log.warning("tutti: rank %d: %d pending blocks dropped (over max_pending_bytes=%d)",
                            self.rank, len(e.keys), self._max_pending)
            self._abort(e)

    def _write_now(self, sv):
        """Write and commit ``sv`` in this step (it alone is over the pending bound); False when it
        cannot be (TP, void, fenced): then it is dropped."""
        if self.shape.tp_size > 1 or sv.void or self.fenced():
            return False
        log.info("tutti: rank %d: a save of %d bytes is over max_pending_bytes=%d: written in its step",
                 self.rank, sv.bytes, self._max_pending)
        self.stats.add(save_over_bound=len(sv.keys))
        if sv.queued:
            self._issue(sv, block=True)
        self._commit(sv)
        sv.data_out = True
        return True

    def _commit(self, sv, timeout=None):
        """Commit ``sv`` (this rank's part of it; with TP agreed with every rank, each agreement
        waiting at most ``timeout()`` seconds if given).  False if the commit itself failed (with TP:
        the group may be broken)."""
        tp = self.shape.tp_size > 1
        if sv.void or sv.txn is None:
            sv.data_out = True
            if tp:  # the other ranks commit these blocks: agree that none is here
                from ..tp import abstain
                try:
                    abstain(self.tp_group(), len(sv.common), timeout)
                except Exception as e:  # noqa: BLE001 - a broken group: nothing is committed here
                    log.warning("tutti: TP commit agreement failed: %s", e)
                    return False
            return True
        t = time.perf_counter()
        txn, keys = sv.txn, sv.keys
        for i, k in enumerate(keys):
            if k in sv.vetoed:  # found bad since it was computed (taint): never committed
                txn.veto(i)
        if sv.vetoed:
            self.stats.add(save_fenced=len(sv.vetoed & set(keys)))
        sv.inflight.clear()  # finish (or prepare) waits for them
        try:
            if tp:
                from ..tp import commit
                # Every rank's keys are a prefix of the same list (the slot cap keeps the
                # first), held in reverse: block i is entry n - 1 - i of that list.
                n = len(keys)
                everywhere = commit(txn, self.tp_group(), width=len(sv.common),
                                    positions=range(n - 1, -1, -1), timeout=timeout)
                status = [0 if ok else -errno.ECANCELED for ok in everywhere]
            else:
                status = txn.finish()  # layers never submitted: -ENODATA, not committed
        except Exception as e:  # noqa: BLE001 - as above: not committed, a future miss
            log.warning("tutti: committing %d blocks failed: %s", len(keys), e)
            txn.abort()
            sv.data_out = True
            self.stats.add(save_errors=len(keys))
            self._report_unsaved(sv, set(keys))
            return False
        sv.data_out = True
        sv.busy_s += time.perf_counter() - t
        dt = sv.busy_s if self._deferred else time.perf_counter() - sv.t0
        # Where each key is now: a key another pending save committed first kept that slot.
        where = dict(zip(keys, txn.slots))
        if self._deferred:
            done = [k for k, rc in zip(keys, status) if rc == 0]
            where.update(zip(done, self.store.lookup(done)))  # tail first, as committed
        for k, p, rc in zip(keys, txn.present, status):
            if (p or rc == 0) and where[k] is not None:  # (already stored: make sure the scheduler knows where)
                self._events.append(SlotEvent(self.rank, where[k], k))
        # Stored by this commit: not those stored before it began, nor those another pending save of
        # the same blocks (an earlier request's) committed first, whose slot was kept.
        fresh = [k for k, s, p, rc in zip(keys, txn.slots, txn.present, status) if rc == 0 and not p and where[k] == s]
        ok = len(fresh)
        if self.cluster is not None and fresh:  # computed here: kept, even if a fetched copy was transient
            self.cluster.kept(fresh)
        self.stats.add(save_blocks=ok, save_bytes=ok * self.layout.block_bytes, save_s=dt,
                       save_errors=sum(1 for k, p, rc in zip(keys, txn.present, status)
                                       if not p and rc and k not in sv.vetoed))
        if self._deferred and sv.step < self._steps:
            self.stats.add(save_carried=ok)
        failed = {k for k, p, rc in zip(keys, txn.present, status) if not p and rc}
        if failed:
            self._report_unsaved(sv, failed)
        return True

    def _drop_fenced(self, sv):
        """A failed load may have fed this step's KV: abort its save, report it unsaved."""
        if sv.void:
            return
        if sv.keys:
            self.stats.add(save_fenced=len(sv.keys))
            log.warning("tutti: rank %d: %d blocks of this step not stored: a load failed and "
                        "the scheduler has not yet taken that in", self.rank, len(sv.keys))
            self._report_unsaved(sv, set(sv.keys))
        self._void(sv)

    def _void(self, sv):
        """Nothing of ``sv`` is committed on this rank (it still takes part in a TP vote)."""
        self._abort(sv)
        sv.void = True

    def _abort(self, sv):
        if sv.txn is not None:
            sv.txn.abort()  # waits for the I/O in flight: the blocks are no longer read
        sv.queued.clear()
        sv.inflight.clear()
        sv.data_out = True

    def _drop_all(self, why):
        n = 0
        while self._fifo:
            e = self._fifo.popleft()
            if not e.void:
                n += len(e.keys)
            self._abort(e)
        if n:
            self.stats.add(save_dropped=n)
            log.warning("tutti: rank %d: %d pending blocks dropped (%s)", self.rank, n, why)

    def _report_unsaved(self, sv, keys):
        for t in sv.transfers:
            if any(k in keys for k in t.keys):
                self._unsaved.append((t.req_id, t.first))

    def abort_save(self):
        sv, self._save = self._save, None
        if sv:
            self._abort(sv)
        self._note_io()

    # --- blocks held past their request -----------------------------------------------------

    def _take_step_saves(self, meta):
        """The parts of a step's metadata about pending saves (worker.py's _sync_step)."""
        self._held.update(getattr(meta, "held", None) or ())
        bad = set(getattr(meta, "bad_blocks", None) or ())
        if bad:
            for e in self._fifo:
                e.vetoed.update(k for k, b in zip(e.keys, e.ids) if b in bad)

    def _busy_reqs(self):
        return set().union(*[e.req_ids for e in self._all_saves() if not e.data_out])

    def get_finished(self, finished_req_ids=(), meta=None):
        """Held requests none of whose blocks a pending save still reads (vLLM frees them)."""
        self._sync_step(meta)
        if self.cluster is not None and finished_req_ids:  # they load no transient copy any more
            self.cluster.forget(finished_req_ids)
            self.drop_transient()
        if not self._held:
            return None, None
        done = self._held - self._busy_reqs()
        self._held -= done
        return (done or None), None

    def handle_preemptions(self, meta):
        """vLLM freed the preempted requests' blocks; this step's forward may overwrite them: the
        pending saves reading them are written out first (or dropped, when that cannot be)."""
        self._sync_step(meta)
        pre = set(getattr(meta, "preempted", None) or ())
        if not pre:
            return
        for e in list(self._fifo):
            if e.data_out or not e.req_ids & pre:
                continue
            if self.fenced():
                self.stats.add(save_dropped=len(e.keys))
                self._void(e)
                continue
            self._issue(e, block=True)
            self._wait_inflight(e)
            if e.queued:  # could not be written (the transaction did not begin)
                self._void(e)
            e.data_out = True
        self._note_io()

    def drained_step(self):
        """Highest metadata step none of whose saves still reads vLLM blocks on this rank."""
        busy = [e.meta_step for e in self._all_saves() if not e.data_out]
        last = getattr(self._meta, "step", 0) if self._meta is not None else 0
        return min(busy) - 1 if busy else last

    def close_saves(self):
        """Shutdown: pending saves get ``shutdown_drain_s`` to be committed; the rest are dropped."""
        self.abort_save()
        if not self._fifo:
            return
        deadline = time.monotonic() + self.cfg.shutdown_drain_s
        if self.shape.tp_size > 1:
            self._close_saves_tp(deadline)
            return
        while self._fifo and time.monotonic() < deadline and not self.fenced():
            e = self._fifo[0]
            if not e.void and not self._write_out(e, deadline):
                break
            self._fifo.popleft()
            self._commit(e)
        self._drop_all("shutdown: out of time (shutdown_drain_s)")

    def _close_saves_tp(self, deadline):
        """Shutdown with TP. vLLM stops its workers together and every rank holds the same pending
        saves, so each writes out what it can by the deadline, then the ranks agree which saves are
        written everywhere and commit those in order. Every collective waits only until the
        deadline: a rank that is gone or late ends the others' wait there, and what is left is
        dropped (absent on every rank, or committed on some only: never served, dropped by the next
        start's reconcile)."""
        def left():
            return max(deadline - time.monotonic(), 0.001)
        fenced = self.fenced()
        flags = self._agreed_ready(list(self._fifo), lambda e: not fenced and self._write_out(e, deadline), left)
        for ok in flags or ():
            if not ok or not self._commit(self._fifo.popleft(), left):
                break
        self._drop_all("shutdown: out of time (shutdown_drain_s) or not written on every rank")

    def _write_out(self, e, deadline):
        """Issue the rest of pending save ``e``'s layers, waiting for room, until ``deadline``; all issued?"""
        while e.queued and time.monotonic() < deadline:
            if not self._issue(e, block=True):
                break
        return not e.queued
