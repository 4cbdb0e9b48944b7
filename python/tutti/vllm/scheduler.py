"""Scheduler side of TuttiConnector: the index, matching, and each step's work.

The index maps a key to its slot on every TP rank's store.  It starts from a
read-only view of the on-disk slot tables (so a restarted server finds what was
stored before) and follows every change the workers report (commits, slots
reused or dropped).  A key counts as stored only when every rank has it.

The index is a hint, never the authority: workers look keys up in their own
store before reading and verify every block, and a miss there is reported as
a load error, so vLLM recomputes.  A stale hint costs time, never correctness:
a block that failed to load is never stored again under a key, and nothing
computed over it is saved (the workers' fence, then taint.py), until vLLM has
recomputed it.

Write admission (``write_budget``, admission.py): every request's first lookup tells the policy
which prompt blocks were asked for, and each step's saves go through it before they are offered.
A save it refuses is never offered to the workers (see ``_admit``).
"""
import logging
import os
import time

from ..admission import Admission, parse_budget
from ..admission import Save as SaveCandidate
from .metadata import BlockTransfer, TuttiMetadata
from .taint import KVTaint

MAX_SAVE_RETRIES = 2   # times a request's uncommitted saves are offered again

log = logging.getLogger("vllm.tutti")


class _ReqState:
    __slots__ = ("request", "next_save", "local_tokens", "retries", "last_save", "cut_blocks", "observed",
                 "gap", "remote_from", "fetched_from", "no_remote")

    def __init__(self, request):
        self.request = request
        self.next_save = 0       # first block not yet considered for saving
        self.local_tokens = 0    # vLLM's own prefix-cache hit, from the last match
        self.retries = 0         # uncommitted saves offered again so far
        self.last_save = 0       # last step that offered a save of its blocks
        self.cut_blocks = 0      # stored blocks the load planner left to be recomputed
        self.observed = False    # its prompt blocks were counted by the write admission
        self.gap = None          # first block the write admission refused (later ones go after it)
        self.remote_from = None  # first block of the last match that peers hold (cluster tier)
        self.fetched_from = None  # cluster_fetch async: first block its fetch asked peers for
        self.no_remote = False   # cluster_fetch async: its fetch is over; peers are not asked again


class _Fetch:
    """cluster_fetch async: a request's blocks being fetched from peers into the workers' stores."""

    __slots__ = ("deadline", "ranks")

    def __init__(self, deadline):
        self.deadline = deadline
        self.ranks = set()       # ranks whose worker reported it done


class RankIndex:
    """key -> slot of one rank's store, seeded lazily from a read-only snapshot."""

    def __init__(self, paths, fingerprint, engine):
        self.paths, self.fp, self.engine = paths, fingerprint, engine
        self.key_slot, self.slot_key = {}, {}
        self.touched = set()     # slots changed since the snapshot was taken
        self.snap_miss = set()
        self._snap = None
        self._snap_tried = False

    def _snapshot(self):
        if not self._snap_tried:
            self._snap_tried = True
            if all(os.path.exists(p) for p in self.paths):
                from ..store import Store
                try:
                    self._snap = Store.open(self.paths, expect=self.fp, readonly=True, shared=True,
                                            engine="psync")
                except Exception as e:  # noqa: BLE001 - the worker reports the real error
                    log.warning("tutti: scheduler could not read the slot table of %s: %s",
                                self.paths, e)
        return self._snap

    def slot_of(self, key):
        slot = self.key_slot.get(key)
        if slot is not None or key in self.snap_miss:
            return slot
        snap = self._snapshot()
        if snap is not None:
            slot = snap.lookup([key])[0]
            if slot is not None and slot not in self.touched and slot not in self.slot_key:
                self._set(slot, key)
                return slot
        self.snap_miss.add(key)
        return None

    def _set(self, slot, key):
        old = self.slot_key.pop(slot, None)
        if old is not None:
            self.key_slot.pop(old, None)
        if key is not None:
            prev = self.key_slot.pop(key, None)
            if prev is not None:
                self.slot_key.pop(prev, None)
            self.key_slot[key] = slot
            self.slot_key[slot] = key
            self.snap_miss.discard(key)

    def apply(self, slot, key):
        self.touched.add(slot)
        self._set(slot, key)

    def forget(self, key):
        slot = self.key_slot.pop(key, None)
        if slot is not None:
            self.slot_key.pop(slot, None)
            self.touched.add(slot)
        self.snap_miss.add(key)

    def close(self):
        if self._snap is not None:
            self._snap.close()
            self._snap = None


class SchedulerSide:
    def __init__(self, cfg, shape, vllm_config, stats, windowed=False):
        self.cfg, self.shape, self.stats = cfg, shape, stats
        # Sliding window: vLLM replaces a request's blocks that left the window with its null block.
        self.windowed = windowed
        self.block_size = shape.block_size
        self.prefix = shape.key_prefix()
        self.ranks = [RankIndex(cfg.member_paths(shape.model_id, r, shape.tp_size),
                                shape.fingerprint(r), cfg.engine) for r in range(shape.tp_size)]
        self.reqs = {}
        self.pending_loads = []
        self.taint = KVTaint(self.block_size, evict=self._evict)
        self.step = 0            # steps built
        self.acked = {}          # rank -> last LoadFailure.seq taken in
        self.kv_cache_manager = None
        # Deferred saves (saves.py): finished requests whose blocks wait for their saves.
        self.deferred = cfg.save_mode == "deferred"
        self.drained = {}        # rank -> last step none of whose saves still reads vLLM blocks
        self.hold_next = set()   # held since the last step: named in the next metadata
        self.holding = set()     # held until the workers report them in finished_sending
        self.bad_out = set()     # vLLM blocks found bad, for the next metadata
        # Loads only where they pay (load_policy auto): rates measured from the workers' reports.
        self.planner = None
        if cfg.load_policy == "auto":
            from ..sched.online import LoadPlanner
            self.planner = LoadPlanner(shape.block_bytes_per_rank(), self.block_size, shape.n_layers,
                                       prior=_checked_profile(cfg.profile, shape))
        self.step_tokens = {}    # step -> tokens it computed, until rank 0 reports its time
        self.admission = self._make_admission(cfg)  # None: no write budget (everything offered)
        self.cluster = None      # blocks peers hold (cluster_* keys: vllm/cluster.py)
        if cfg.cluster is not None and cfg.load:
            from .cluster import SchedulerCluster
            self.cluster = SchedulerCluster(cfg.cluster, shape.tp_size)
        # cluster_fetch async: requests waiting for their fetch, and the fetches for the next step.
        self.fetch_async = cfg.cluster is not None and cfg.cluster.fetch == "async"
        self.fetching: dict = {}
        self.fetch_out: list = []
        self._block_bytes = None
        algo = getattr(vllm_config.cache_config, "prefix_caching_hash_algo", "sha256")
        if not str(algo).startswith("sha256") and os.environ.get("PYTHONHASHSEED") is None:
            log.warning("tutti: prefix_caching_hash_algo=%s without PYTHONHASHSEED gives block hashes "
                        "that differ in every process: nothing stored will be found after a "
                        "restart (set PYTHONHASHSEED to one value everywhere, or use sha256)", algo)

    # --- keys and presence -------------------------------------------------------

    def key(self, block_hash) -> bytes:
        return self.prefix + bytes(block_hash)

    def present(self, key) -> bool:
        return all(r.slot_of(key) is not None for r in self.ranks)

    def _loadable_blocks(self, request):
        """Full prompt blocks that may come from the store: one token is always computed."""
        n = (request.num_prompt_tokens - 1) // self.block_size
        return min(n, len(request.block_hashes))

    # --- vLLM hooks ---------------------------------------------------------------

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        self._observe(request)
        if not self.cfg.load:
            return 0, False
        first = num_computed_tokens // self.block_size
        last = first
        limit = self._loadable_blocks(request)
        hashes = request.block_hashes
        while last < limit and self.present(self.key(hashes[last])):
            last += 1
        st = self.reqs.get(request.request_id)
        if st is None:
            st = self.reqs[request.request_id] = _ReqState(request)
        st.local_tokens = num_computed_tokens
        st.cut_blocks = 0
        # Blocks a finished fetch brought are local now, but still count as remote hits.
        st.remote_from = last if st.fetched_from is None else min(st.fetched_from, last)
        remote, owners = 0, []  # blocks still to fetch and their holders (none once a fetch is over)
        if self.cluster is not None and last < limit and self.fetch_async:
            if self._fetch_pending(request, st, first, last, limit):
                return None, False  # vLLM asks again next step; other requests' steps go on
        elif self.cluster is not None and last < limit:
            # Blocks after the local hit that peers hold: fetched into the store by the workers
            # before the step's read (vllm/cluster.py).
            remote = self._peers_hold(hashes, last, limit, owners)
            last += remote
        if self.planner is not None and last > first:
            # Blocks still to fetch (the hit's tail) are priced with their holders' measured fetch
            # rates: fetch + load.  Blocks an async fetch brought already are local: the fetch is paid.
            k = self.planner.blocks_to_load(last - first, request.num_prompt_tokens - num_computed_tokens,
                                            remote_blocks=remote, remote_owners=owners)
            st.cut_blocks, last = last - first - k, first + k
        return (last - first) * self.block_size, False

    def _peers_hold(self, hashes, last, limit, owners=None) -> int:
        """How many blocks from ``last`` on peers hold for every rank: one batched, bounded lookup;
        ``owners`` gets each one's holder (rank 0's)."""
        return self.cluster.remote_prefix([r._snapshot() for r in self.ranks],
                                          [self.key(h) for h in hashes[last:limit]], owners)

    def _fetch_pending(self, request, st, first, last, limit) -> bool:
        """cluster_fetch async: True while the request waits for blocks peers hold (fetched into
        every rank's store by the workers' fetch threads: vllm/cluster.py); False once there is
        nothing (more) to wait for: its fetch reported by every rank, past cluster_fetch_wait_s,
        peers holding nothing after the local hit, or fetching not paying (the load planner)."""
        req_id = request.request_id
        f = self.fetching.get(req_id)
        if f is not None:
            done = len(f.ranks) >= len(self.ranks)
            if not done and time.monotonic() < f.deadline:
                return True
            # Over: what arrived is local now; what did not is recomputed.
            del self.fetching[req_id]
            st.no_remote = True
            if not done:
                self.stats.add(fetch_timeouts=1)
                log.warning("tutti cluster: request %s waited %.0f s for its blocks from peers: served "
                            "with its local hit", req_id, self.cfg.cluster.fetch_wait_s)
            return False
        if st.no_remote:
            return False
        hashes = request.block_hashes
        owners: list = []
        n = self._peers_hold(hashes, last, limit, owners)
        if n <= 0:
            return False
        if self.planner is not None:
            k = self.planner.blocks_to_load(last + n - first, request.num_prompt_tokens - st.local_tokens,
                                            remote_blocks=n, remote_owners=owners)
            if first + k <= last:
                return False  # fetching would not pay: the local hit (or its planned part) goes now
        # The whole hit's keys: the workers touch the local ones too, so the fetched blocks do
        # not take their slots.
        keys = [self.key(h) for h in hashes[first:last + n]]
        self.fetching[req_id] = _Fetch(time.monotonic() + self.cfg.cluster.fetch_wait_s)
        self.fetch_out.append(BlockTransfer(req_id, keys, [], first=first, remote=n))
        st.fetched_from = last
        self.stats.add(fetch_requests=1, fetch_asked_blocks=n)
        return True

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        st = self.reqs.get(request.request_id)
        if st is None:
            st = self.reqs[request.request_id] = _ReqState(request)
        query = request.num_prompt_tokens - st.local_tokens
        self.stats.add(query_tokens=max(query, 0), hit_tokens=num_external_tokens,
                       load_cut_tokens=st.cut_blocks * self.block_size)
        st.cut_blocks = 0
        if num_external_tokens <= 0:
            return
        block_ids = blocks.get_block_ids()[0]
        first = st.local_tokens // self.block_size
        n = num_external_tokens // self.block_size
        keys = [self.key(h) for h in request.block_hashes[first:first + n]]
        ids = list(block_ids[first:first + n])
        # Sliding window: hit blocks before the window count as computed but are never read; vLLM
        # gave them its null block, which must stay untouched.  Only the window's blocks are loaded.
        null = self._null_block_id()
        keys, ids = [k for k, i in zip(keys, ids) if i != null], [i for i in ids if i != null]
        remote = max(0, first + n - st.remote_from) if st.remote_from is not None else 0
        self.stats.add(remote_hit_tokens=remote * self.block_size)
        if keys:
            self.pending_loads.append(BlockTransfer(request.request_id, keys, ids,
                                                    remote=min(remote, len(keys))))
        # Loaded blocks need no save.
        st.next_save = max(st.next_save, first + n)

    def build_connector_meta(self, scheduler_output):
        self.step += 1
        if self.planner is not None:
            self.step_tokens[self.step] = getattr(scheduler_output, "total_num_scheduled_tokens", 0)
            self.step_tokens.pop(self.step - 64, None)  # a step rank 0 never reported
        meta = TuttiMetadata(loads=self.pending_loads, step=self.step, acked=dict(self.acked),
                             fetches=self.fetch_out)
        self.pending_loads, self.fetch_out = [], []
        finished = set(getattr(scheduler_output, "finished_req_ids", None) or ())
        meta.held = sorted(self.hold_next & finished)
        self.hold_next -= finished
        meta.preempted = sorted(getattr(scheduler_output, "preempted_req_ids", None) or ())
        meta.bad_blocks, self.bad_out = sorted(self.bad_out), set()
        for req_id in getattr(scheduler_output, "finished_req_ids", None) or ():
            self.taint.drop(req_id)
        # Every step, also without saves: a failure reported later replays what it wrote.
        unsound = self.taint.observe(self.step, scheduler_output)
        if not self.cfg.save:
            return meta
        new_computed = {r.req_id: r.num_computed_tokens for r in scheduler_output.scheduled_new_reqs}
        new_blocks = {r.req_id: r.block_ids for r in scheduler_output.scheduled_new_reqs}
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            new_computed[req_id] = cached.num_computed_tokens[i]
        block_state = getattr(scheduler_output, "kv_connector_block_state", None)
        seen, offers = set(), []
        null = self._null_block_id()
        for req_id, n_sched in scheduler_output.num_scheduled_tokens.items():
            st = self.reqs.get(req_id)
            if st is None or req_id not in new_computed:
                continue
            if req_id in unsound:
                # It attends over a block that failed to load (or was computed over one): its
                # KV is not saved until vLLM has recomputed it (next_save stays).
                continue
            req = st.request
            done = min(new_computed[req_id] + n_sched, req.num_prompt_tokens)
            upto = min(done // self.block_size, len(req.block_hashes))
            if upto <= st.next_save:
                continue
            if self.windowed:
                # The request's block table as vLLM holds it now, after this step's allocation
                # (the tables vLLM sent the workers still name blocks it has freed since): blocks
                # that left the window are the null block (not saved), any other stays this
                # request's until its next step (the save is written within this one).
                block_ids = self._block_ids_fallback(req_id)
            else:
                block_ids = self.taint.table(req_id)
            if block_ids is not None and len(block_ids) < upto:
                block_ids = None
            if block_ids is None and block_state is not None:
                ids = block_state.get_block_ids(req_id)
                block_ids = ids[0] if ids else None
            if block_ids is None and req_id in new_blocks:
                block_ids = new_blocks[req_id][0]
            if block_ids is None:
                block_ids = self._block_ids_fallback(req_id)
            if block_ids is None or len(block_ids) < upto:
                continue
            blocks = [(b, self.key(req.block_hashes[b])) for b in range(st.next_save, upto)]
            blocks = [(b, k, block_ids[b]) for b, k in blocks if block_ids[b] != null and not self.present(k)]
            # Considered now, offered or not: a save admission refuses is not offered again (its
            # blocks stay unstored unless a later request saves them); a retry (unsaved) or a
            # failed load moves next_save back as before.
            st.next_save = upto
            if blocks:
                offers.append((req_id, st, upto, blocks))
        for req_id, st, _, blocks in self._admit(offers):
            keys, ids, first = [], [], None
            for b, k, i in blocks:
                if k in seen:
                    continue
                seen.add(k)
                keys.append(k)
                ids.append(i)
                first = b if first is None else first
            if keys:
                meta.saves.append(BlockTransfer(req_id, keys, ids, first))
                st.last_save = self.step
        return meta

    # --- write admission (admission.py) ---------------------------------------------

    def _make_admission(self, cfg):
        if cfg.write_budget is None:
            return None
        capacity = cfg.capacity
        snap = self.ranks[0]._snapshot() if self.ranks else None
        if snap is not None:  # the store exists: its real size, not the one a new store would get
            capacity = snap.geometry.n_slots * snap.geometry.block_bytes
        return Admission(parse_budget(cfg.write_budget, capacity), cfg.write_admission,
                         seen_capacity=1 << 18)

    def block_bytes(self):
        """Bytes one block costs to write on one rank's store (the budget is per rank: every rank
        writes its share of the same blocks): the store's own size when it exists, else the
        model's KV shape (K and V per layer)."""
        if self._block_bytes is None:
            snap = self.ranks[0]._snapshot() if self.ranks else None
            if snap is not None:
                self._block_bytes = snap.geometry.block_bytes
            else:  # an estimate until the store exists
                self._block_bytes = self.shape.block_bytes_per_rank()
        return self._block_bytes

    def _observe(self, request):
        """A request's first lookup: each of its full prompt blocks was asked for once more (a
        request looked up again, e.g. after waiting for memory or a preemption, counts once)."""
        if self.admission is None:
            return
        st = self.reqs.get(request.request_id)
        if st is None:
            st = self.reqs[request.request_id] = _ReqState(request)
        if st.observed:
            return
        st.observed = True
        n = min(request.num_prompt_tokens // self.block_size, len(request.block_hashes))
        self.admission.observe(hash(h) for h in request.block_hashes[:n])

    def _admit(self, offers):
        """The step's saves admission lets through (in the step's order), each with the blocks
        admitted of it.

        A request's new blocks are split where its prefix stops being one an earlier request
        asked for too: the *seen* head (the documents many requests share) and the rest (its own
        question); each is a candidate named by the hash of its last block and ranked by
        admission.py.  Heads are decided first; a tail is considered only when the blocks
        before it go too (a block is found only after its whole prefix: a tail stored after a
        refused head would be written for nothing), and for the same reason a request's later
        blocks are not offered while one it had refused is still not stored (``gap``).

        The bucket is charged with the bytes *offered* (admission.py charges in ``admit``), not
        the bytes committed: the decision is made now, while commits are reported steps later by
        the workers, and the drive wears with every write that goes out, also one whose save is
        later dropped or not committed.  A refused save is simply not offered: nothing of it
        reaches the workers, so it is neither an error nor a drop (counted as ``save_skipped``);
        next_save has moved past it, so it is not offered again."""
        adm = self.admission
        if adm is None or not offers:
            return offers
        bb = self.block_bytes()
        heads, tails = {}, {}
        for i, (_, st, _, blocks) in enumerate(offers):
            hashes = st.request.block_hashes
            if self._behind_gap(st, blocks[0][0]):
                continue  # an earlier block of it was refused and is still not stored
            n = 0
            while n < len(blocks) and adm.seen_before(hash(hashes[blocks[n][0]])):
                n += 1
            for part, pieces in ((blocks[:n], heads), (blocks[n:], tails)):
                if part:
                    last = part[-1][0]
                    pieces[i] = (SaveCandidate(hash(hashes[last]), (last + 1) * self.block_size,
                                               len(part) * bb), part)
        pressure = adm.counters["pressure_steps"]
        ok_heads = self._admitted(heads)
        ok_tails = self._admitted({i: t for i, t in tails.items() if i not in heads or i in ok_heads})
        picked, n_ok, n_skip, unseen = [], 0, 0, 0
        for i, (req_id, st, upto, blocks) in enumerate(offers):
            part = ok_heads.get(i, []) + (ok_tails.get(i, []) if i not in heads or i in ok_heads else [])
            n_ok += len(part)
            n_skip += len(blocks) - len(part)
            unseen += len(tails[i][1]) if i in tails and i not in ok_tails else 0
            if part:
                picked.append((req_id, st, upto, part))
            if len(part) < len(blocks):
                refused = blocks[len(part)][0]
                st.gap = refused if st.gap is None else min(st.gap, refused)
        self.stats.add(save_admitted=n_ok, save_admitted_bytes=n_ok * bb, save_skipped=n_skip,
                       save_skipped_bytes=n_skip * bb, save_skipped_unseen=unseen,
                       admission_pressure_steps=min(adm.counters["pressure_steps"] - pressure, 1))
        state = adm.stats()
        self.stats.set(write_budget_bytes_per_day=state["budget_bytes_per_day"],
                       write_budget_left_bytes=int(state["budget_tokens"]))
        return picked

    def _behind_gap(self, st, first):
        """Would blocks from ``first`` on be stored behind a refused block that is still not
        stored (so a lookup never reaches them)?  Clears the gap once it is filled (another
        request stored those blocks) or offered again (a retry starts at or before it)."""
        if st.gap is None:
            return False
        hashes = st.request.block_hashes
        if any(not self.present(self.key(hashes[b])) for b in range(st.gap, first)):
            return True
        st.gap = None
        return False

    def _admitted(self, cands):
        """{offer index: (candidate, blocks)} -> {offer index: blocks} of those admitted."""
        if not cands:
            return {}
        chosen = {id(c) for c in self.admission.admit([c for c, _ in cands.values()])}
        return {i: part for i, (c, part) in cands.items() if id(c) in chosen}

    def _null_block_id(self):
        """vLLM's null block (the first block of its pool: 0), never a request's own; None for full
        attention: only a sliding-window model's tables name it (blocks that left the window)."""
        if not self.windowed:
            return None
        mgr = getattr(self, "kv_cache_manager", None)
        try:
            return mgr.block_pool.null_block.block_id
        except AttributeError:
            return 0

    def _block_ids_fallback(self, req_id):
        mgr = getattr(self, "kv_cache_manager", None)
        if mgr is None:
            return None
        try:
            return mgr.get_block_ids(req_id)[0]
        except Exception:  # noqa: BLE001 - vLLM's manager API varies by version; no ids means no hold
            return None

    def update_connector_output(self, connector_output):
        self.holding -= set(getattr(connector_output, "finished_sending", None) or ())
        meta = getattr(connector_output, "kv_connector_worker_meta", None)
        if meta is None or not hasattr(meta, "events"):
            return
        for rank, step in getattr(meta, "drained", ()):
            self.drained[rank] = max(self.drained.get(rank, 0), step)
        for rank, req_id in getattr(meta, "fetched", ()):
            f = self.fetching.get(req_id)
            if f is not None:
                f.ranks.add(rank)
        if self.cluster is not None:
            for endpoint in getattr(meta, "unreachable", ()):
                self.cluster.quarantine.add(endpoint)
        if self.planner is not None:
            self._take_perf(meta)
        for ev in meta.events:
            if 0 <= ev.rank < len(self.ranks):
                self.ranks[ev.rank].apply(ev.slot, ev.key)
        for rank, key in meta.missing:
            if 0 <= rank < len(self.ranks):
                self.ranks[rank].forget(key)
        for f in getattr(meta, "failures", ()):
            self._take_failure(f)
        for req_id, first in getattr(meta, "unsaved", ()):
            st = self.reqs.get(req_id)
            if st is not None and first < st.next_save and st.retries < MAX_SAVE_RETRIES:
                st.retries += 1
                st.next_save = first

    def _take_perf(self, meta):
        """Rank 0's loads, fetches from peers and forwards teach the planner (every rank moves its
        shard alike)."""
        for rank, nbytes, wall_s, stall_s in getattr(meta, "load_perf", ()):
            if rank == 0:
                self.planner.observe_load(nbytes, wall_s, stall_s)
        for rank, nbytes, wall_s, *peers in getattr(meta, "fetch_perf", ()):
            if rank == 0:
                self.planner.observe_fetch(nbytes, wall_s, peers[0] if peers else None)
        for rank, step, forward_s, stall_s in getattr(meta, "step_perf", ()):
            tokens = self.step_tokens.pop(step, None) if rank == 0 else None
            if tokens:
                self.planner.observe_step(tokens, forward_s - stall_s)

    def _take_failure(self, f):
        """A worker's load failed in step ``f.step``: taint what was computed over it, offer the
        requests' blocks for saving again from their first bad block, acknowledge it."""
        if f.seq <= self.acked.get(f.rank, 0):
            return  # resent before our acknowledgement reached the worker
        self.acked[f.rank] = f.seq
        self.stats.add(load_failures=1)
        if not self.taint.fail(f.step, f.block_ids):
            log.error("tutti: a load failure of step %d was reported after %d steps; every "
                      "running request's KV is treated as unsound until recomputed",
                      f.step, self.step - f.step)
        self.bad_out |= self.taint.bad  # a pending save of one of them is vetoed at its commit
        for req_id, st in self.reqs.items():
            i = self.taint.first_bad(req_id)
            if i is not None and i < st.next_save:
                st.next_save = i

    def _evict(self, block_ids):
        """Bad blocks leave vLLM's prefix cache: no later request picks one up by its hash."""
        mgr = self.kv_cache_manager
        if mgr is None or not hasattr(mgr, "evict_blocks"):
            return False
        try:
            mgr.evict_blocks(set(block_ids))
        except Exception as e:  # noqa: BLE001 - our saves stay safe (taint); vLLM's cache is its own
            log.warning("tutti: could not drop %d blocks from vLLM's prefix cache: %s",
                        len(block_ids), e)
            return False
        return True

    def request_finished(self, request):
        """True (vLLM keeps the blocks until the workers report the request in get_finished)
        when a save of its blocks may still be pending: offered after the last step the workers
        reported drained.  With save_mode step, saves are durable at the end of their step."""
        req_id = request.request_id
        st = self.reqs.pop(req_id, None)
        self.taint.drop(req_id)
        self.fetching.pop(req_id, None)  # aborted while waiting: what arrives stays a local block
        drained = min((self.drained.get(r, 0) for r in range(len(self.ranks))), default=0)
        hold = self.deferred and st is not None and st.last_save > drained
        if hold:
            self.hold_next.add(req_id)
            self.holding.add(req_id)
            self.stats.add(reqs_held=1)
        return hold, None

    def is_holding(self) -> bool:
        return bool(self.holding)

    def close(self):
        if self.cluster is not None:
            self.cluster.close()
        for r in self.ranks:
            r.close()


def _checked_profile(profile, shape):
    """The profile table, if it was measured for this model's layers (a table of another model would
    price every request wrongly: refused in one line)."""
    if profile is None:
        return None
    from ..errors import ConfigError
    p = profile.shape
    mine = (shape.n_layers, shape.kv_heads, shape.head_dim)
    theirs = (p.n_layers, max(1, p.n_kv_heads // max(shape.tp_size, 1)), p.head_dim)  # KV heads per TP rank
    if mine != theirs:
        raise ConfigError(f"profile: measured for a model of {p.n_layers} layers, {p.n_kv_heads} KV heads of "
                          f"{p.head_dim}; this one has {shape.n_layers} layers, {shape.kv_heads} KV heads of "
                          f"{shape.head_dim} per rank (TP {shape.tp_size}): profile it with tutti-admin profile")
    return profile
