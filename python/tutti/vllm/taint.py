"""Which of vLLM's KV blocks hold KV computed over a block that failed to load.

The scheduler side's half of "nothing computed over a bad block is ever committed"
(the worker's half is the fence in worker.py).  A block that failed to load is
*bad*; so is every block a step writes for a request that attends over a bad
block.  A bad block becomes good again when a request rewrites it from a sound
context: vLLM's ``recompute`` policy truncates the request that loaded it and
recomputes in place.  Saves are offered only for requests whose step is sound.

Failures are reported a step or more after they happened (vLLM schedules step
N+1 before it has N's output), so every step's writes are kept for a while
(``HISTORY`` steps) and a failure taken in replays them: anything written since
over a bad block turns bad too.  The rules, per request and step, with ``a`` the
tokens computed before the step, ``c`` after it and ``B`` the block size:

* the step attends over blocks ``[0, ceil(a / B))`` of the request's table (a
  partly computed block included: its earlier tokens are read);
* it writes blocks ``[a // B, ceil(c / B))``;
* sound if none it attends over is bad: its written blocks are good afterwards,
  else bad.  Within one step a block rewritten soundly is sound for every request
  of the step (vLLM writes a layer's KV before the layer's attention reads it), so
  the step is evaluated to a fixpoint.

Block tables follow vLLM's scheduler output (new requests' tables, appended
blocks, a resumed request's new table, copy-on-write copies).  Bad blocks are
dropped from vLLM's prefix cache (``evict``) so no later request picks one up by
its hash, and forgotten once no live table holds them: a free block is written
from its first token before anything reads it.
"""
from collections import deque
from dataclasses import dataclass

HISTORY = 64  # steps kept for replay; a failure is normally taken in 1-2 steps later


def _cdiv(a, b):
    return -(-a // b)


@dataclass
class _Work:
    req_id: str
    table: list      # the request's block table (a list object that is only appended to)
    a: int           # tokens computed before the step
    c: int           # after it

    def reads(self, bs):
        return self.table[:_cdiv(self.a, bs)]

    def writes(self, bs):
        return self.table[self.a // bs:_cdiv(self.c, bs)]


def _resolve(so, req_id, fallback):
    state = getattr(so, "kv_connector_block_state", None)
    ids = state.get_block_ids(req_id) if state is not None else None
    return ids[0] if ids else fallback


class KVTaint:
    def __init__(self, block_size, evict=None):
        self.bs = block_size
        self.evict = evict           # callable(set of ids) -> dropped from vLLM's prefix cache?
        self.kept = set()            # bad blocks that could not be dropped from it
        self.tables = {}             # req_id -> block ids (list; replaced on resume)
        self.refs = {}               # block id -> live tables holding it
        self.bad = set()
        self.history = deque(maxlen=HISTORY)  # (step, copies, [_Work])
        self.lost_history = 0        # failures older than the history (handled conservatively)

    # --- tables ---------------------------------------------------------------------

    def _ref(self, ids, d):
        for b in ids:
            n = self.refs.get(b, 0) + d
            if n > 0:
                self.refs[b] = n
            else:
                self.refs.pop(b, None)

    def _set_table(self, req_id, ids):
        old = self.tables.get(req_id)
        if old is not None:
            self._ref(old, -1)
        self.tables[req_id] = table = list(ids)
        self._ref(table, +1)
        return table

    def _extend(self, req_id, ids):
        table = self.tables.get(req_id)
        if table is None:
            return self._set_table(req_id, ids)
        table.extend(ids)
        self._ref(ids, +1)
        return table

    def drop(self, req_id):
        """The request finished or was preempted: its blocks may be freed."""
        old = self.tables.pop(req_id, None)
        if old is not None:
            self._ref(old, -1)
            self._forget_unheld()

    def table(self, req_id):
        return self.tables.get(req_id)

    # --- steps ----------------------------------------------------------------------

    def observe(self, step, so) -> set:
        """Take in scheduler output ``so`` of ``step``; return the requests whose step is unsound."""
        for req_id in getattr(so, "preempted_req_ids", None) or ():
            self.drop(req_id)
        work = []
        for r in so.scheduled_new_reqs:
            table = self._set_table(r.req_id, r.block_ids[0] if r.block_ids else [])
            work.append((r.req_id, table, r.num_computed_tokens))
        cached = so.scheduled_cached_reqs
        resumed = getattr(cached, "resumed_req_ids", None) or set()
        for i, req_id in enumerate(cached.req_ids):
            new = cached.new_block_ids[i] if i < len(cached.new_block_ids) else None
            ids = new[0] if new else []
            if req_id in resumed:
                table = self._set_table(req_id, ids)
            elif req_id not in self.tables:  # not seen from its start: ask vLLM for the table
                table = self._set_table(req_id, _resolve(so, req_id, ids))
            elif ids:
                table = self._extend(req_id, ids)
            else:
                table = self.tables[req_id]
            work.append((req_id, table, cached.num_computed_tokens[i]))
        n_sched = so.num_scheduled_tokens
        steps = [_Work(rid, t, a, a + n_sched.get(rid, 0)) for rid, t, a in work if rid in n_sched]
        copies = [(c.src_block_id, c.dst_block_id)
                  for c in getattr(so, "kv_cache_block_copies", None) or ()]
        self.history.append((step, copies, steps))
        return self._apply(copies, steps, sound_rewrites=True)

    def _apply(self, copies, steps, sound_rewrites):
        """Bad blocks after a step's copies and writes; returns the unsound requests."""
        for src, dst in copies:  # the copy runs before the step's forward
            if src in self.bad:
                self._mark({dst})
            elif sound_rewrites:
                self.bad.discard(dst)
                self.kept.discard(dst)
        if not self.bad:
            return set()
        bad = self.bad
        left = list(steps)
        changed = True
        while changed and left:
            changed = False
            for w in list(left):
                if bad.isdisjoint(w.reads(self.bs)):
                    left.remove(w)
                    if sound_rewrites:
                        before = len(bad)
                        bad.difference_update(w.writes(self.bs))
                        self.kept.difference_update(w.writes(self.bs))
                        changed |= len(bad) != before
        unsound = set()
        for w in left:
            unsound.add(w.req_id)
            self._mark(set(w.writes(self.bs)))
        return unsound

    def _mark(self, ids):
        new = ids - self.bad
        if new:
            self.bad |= new
            if self.evict is None or not self.evict(new):
                self.kept |= new  # still findable by its hash: never forgotten

    def fail(self, step, block_ids) -> bool:
        """Blocks ``block_ids`` failed to load in ``step``: they and what was computed over them
        since are bad.  Returns False when that step is older than the history kept (then every
        live table's blocks are marked bad: nothing of theirs is saved until rewritten)."""
        self._mark(set(block_ids))
        known = bool(self.history) and self.history[0][0] <= step
        if not known:
            self.lost_history += 1
            for t in self.tables.values():
                self._mark(set(t))
            return False
        for s, copies, steps in self.history:
            if s >= step:  # add only: nothing written before we knew can count as a sound rewrite
                self._apply(copies, steps, sound_rewrites=False)
        return True

    def first_bad(self, req_id):
        """Index of the request's first bad block, or None."""
        t = self.tables.get(req_id)
        if not t or not self.bad:
            return None
        for i, b in enumerate(t):
            if b in self.bad:
                return i
        return None

    def _forget_unheld(self):
        if self.bad:
            self.bad = {b for b in self.bad if b in self.refs or b in self.kept}
