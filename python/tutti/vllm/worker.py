"""Worker side of TuttiConnector: moves KV blocks between vLLM's cache and the store.

One store per TP rank, opened read-write by that rank's worker (exclusive lock:
a second server on the same store is refused).  Loads are layer-wise: a step's
blocks are looked up, then ``lookahead`` layers are in flight ahead of the
model and ``wait_for_layer_load`` waits for exactly its layer.  Saves are
submitted layer by layer as the model computes them and committed in
``wait_for_save`` (``save_mode: step``) or in a later step's (``deferred``, the
default; the request's blocks are held until then): saves.py.  Either way the
data is durable first, then the commit records, so a block whose layers were not
all written is never committed.

Reads first (``write_policy: slack``, the default): reads and writes are never
in flight on the store at the same time (its members are striped, so every
layer's I/O touches every SSD).  While a step's load has reads in flight or
still to submit, ``save_kv_layer`` queues its layer instead of submitting it;
the queue goes out as soon as the load is over (its last layer waited for, or
aborted), at the latest in ``wait_for_save`` (``save_mode: step``: before the
commit; ``deferred``: what is left is carried over).  A load never starts while
a write is in flight.  ``eager`` submits each layer's write at once.

The data path follows the KV cache (datapath.py): host memory through tutti.Store; GPU memory
through tutti.gpu.GpuStore's path into HBM (staged by default), where a loaded layer is ordered
before the model's compute on the GPU (no host wait) and a layer's write goes out once the
model's kernels that wrote it have run (an event per layer, polled; at the latest at step end).

Eviction keeps prefixes: the store evicts least recently used blocks first, and a block is
useful only with every block before it, so the worker makes a chain's head its most recent
block: lookups touch a step's keys tail first, and a save commits them tail first (commit
order is also the LRU order a store reopens with).  A full store then loses the tails of
prefixes, never their heads.

With tensor parallelism each rank's store holds its shard of the KV heads and a
save is committed through tutti.tp: every rank's data durable, agreement over
vLLM's TP CPU group, then the records; a block is committed on every rank or on
none (a crash in between leaves orphans, dropped by reconcile at start-up).

Failed loads: nothing computed over a block that failed to load is ever committed.
vLLM calls ``wait_for_save`` before it asks for the load errors, and with async
scheduling the next step is already scheduled (and may attend over the bad block:
the same request's next chunk, or another request sharing the block through
vLLM's prefix cache) before the scheduler hears of the failure.  So a worker whose
load failed (a key gone, a checksum, an I/O error, a layer never waited for) is
*fenced*: it commits nothing, in this step or any later one, until the scheduler
has acknowledged the failure in its metadata; under TP the fenced rank votes
every block down, so no rank commits.  From the acknowledgement on, the scheduler
side (taint.py) knows which vLLM blocks hold KV computed over a bad block and
offers no save whose request attends over one.  Saves dropped by the fence are
reported back (``unsaved``) and offered again once their KV is sound.
"""
import collections
import errno
import logging
import os
import queue
import threading
import time

from .. import affinity
from . import fault_hooks
from .datapath import StoreMismatchError, open_io  # noqa: F401 - StoreMismatchError is public here
from .layout import from_kv_caches
from .metadata import LoadFailure, SlotEvent, TuttiWorkerMeta
from .saves import SavesMixin

log = logging.getLogger("vllm.tutti")


class _Overlap:
    """Seconds during which a read and a write were both in flight on this worker's store.

    In flight = submitted and not yet waited for (a write: until the step's save ends or a
    load waits for it).  The connector cannot poll the engine, so this is an upper bound of
    the overlap on the device.
    """

    def __init__(self, stats):
        self.stats = stats
        self.since = None

    def update(self, reads, writes):
        both = reads > 0 and writes > 0
        if both and self.since is None:
            self.since = time.perf_counter()
        elif not both and self.since is not None:
            self.stats.add(rw_overlap_s=time.perf_counter() - self.since)
            self.since = None


class _Load:
    """One step's layer-wise read transaction."""

    def __init__(self, txn, block_ids, slots, n_layers, t0, fault=None):
        self.txn, self.block_ids, self.slots = txn, block_ids, slots
        self.n_layers = n_layers
        self.submitted = 0
        self.waited = set()
        self.t0 = t0
        self.fault = fault  # fault_hooks
        self.stall = 0.0    # seconds the forward sat waiting for its layers


class WorkerSide(SavesMixin):
    def __init__(self, cfg, shape, rank, stats, group=None):
        self.cfg, self.shape, self.rank, self.stats = cfg, shape, rank, stats
        self._group = group     # TP group for commits (None: vLLM's, resolved when needed)
        self.store = None
        self.io = None          # datapath.HostIO / DeviceIO
        self.layout = None
        self._load = None
        self._slack = cfg.write_policy in ("slack", "after_step")   # reads first
        self._after_step = cfg.write_policy == "after_step"         # no write beside the forward
        self._overlap = _Overlap(stats)
        self._errors = set()    # vLLM blocks whose load failed in this step
        self._events = []
        self._missing = []
        self._meta = None       # the step's metadata (a new object every step)
        self._fail_seq = 0
        self._unacked = {}      # seq -> LoadFailure the scheduler has not acknowledged
        self._noted = set()     # this step's failed blocks already in a LoadFailure
        self._unsaved = []      # (req_id, first) of save transfers not committed
        # What the scheduler's load planner learns from (load_policy auto): finished loads and
        # forwards, sent with the worker metadata.
        self._perf = cfg.load_policy == "auto"
        self._load_perf, self._step_perf = [], []
        self._fetch_perf = []   # (rank, bytes asked, wall_s) of fetches from peers (cluster tier)
        self._fwd = None        # (start, step) of the forward in progress
        self._stall = 0.0       # its seconds waiting for loads
        self._init_saves(cfg)   # saves.py
        # Cluster tier (cluster_* keys, vllm/cluster.py): a ClusterNode serves peers from this store on
        # its own threads, so every use of the store holds store_lock (the facade takes it around each
        # worker hook, connector.py); without a cluster nothing else takes it.
        self.store_lock = threading.RLock()
        self.cluster = None
        # cluster_fetch async: this rank's fetch thread, its orders, and the requests it finished.
        self._fetch_q = None
        self._fetch_thread = None
        self._fetches_seen = None
        self._fetched = []      # (rank, req_id), sent with the worker metadata
        self._evictions_seen = 0  # the store's evictions counted into the stats so far (note_store)

    def note_store(self):
        """The store's evictions since the last call (a counter) and its occupancy (gauges), for vLLM's
        metrics; called with the stats' interval (the caller holds store_lock)."""
        if self.store is None:
            return
        try:
            o = self.store.occupancy()
        except Exception:  # noqa: BLE001 - a closed store reports nothing more
            return
        if o["evictions"] > self._evictions_seen:
            self.stats.add(store_evictions=o["evictions"] - self._evictions_seen)
        self._evictions_seen = o["evictions"]
        self.stats.set(store_committed_blocks=o["committed"], store_slots=o["slots"])

    # --- set-up ---------------------------------------------------------------------

    def register_kv_caches(self, kv_caches, num_blocks):
        self.layout = from_kv_caches(kv_caches, num_blocks)
        self._place_threads()
        with affinity.service_cpus():  # the store's threads start there
            self.io = open_io(self.cfg, self.shape, self.rank, self.layout, log)
        self.store = self.io.store
        self._set_pending_bound(num_blocks)
        log.info("tutti: rank %d store %s, %s, %d slots", self.rank, self.store.paths,
                 self.io.name, self.store.geometry.n_slots)
        if self.shape.tp_size > 1:
            from ..tp import reconcile_group
            dropped = reconcile_group(self.store, self.tp_group())
            if dropped:
                log.warning("tutti: rank %d dropped %d blocks that a crash left committed on "
                            "some ranks only", self.rank, len(dropped))
        if self.cfg.cluster is not None:  # after reconcile: only blocks every rank holds are published
            from .cluster import WorkerCluster
            with affinity.service_cpus():  # and Mooncake's
                self.cluster = WorkerCluster(self.store, self.cfg.cluster, self.rank, self.shape.tp_size,
                                             self.store_lock)

    def _place_threads(self):
        """Where this rank's tutti threads run (service_cpus; tutti/affinity.py): where vLLM put the
        calling thread by default (inherit); with auto, on the CPUs no rank computes on, if any."""
        cpus = affinity.choose(self.cfg.service_cpus)
        affinity.use(cpus)
        try:
            mine = affinity.describe(os.sched_getaffinity(0))
        except OSError:
            mine = "?"
        if cpus:
            log.info("tutti: rank %d's threads run on CPUs %s (this thread: %s)", self.rank,
                     affinity.describe(cpus), mine)
        elif self.cfg.service_cpus == "auto":
            log.info("tutti: rank %d's threads stay with this thread's CPUs %s (service_cpus auto: no "
                     "allowed CPU is free of the ranks' compute threads, or this thread is not bound)",
                     self.rank, mine)

    def tp_group(self):
        """The group the ranks' commits agree over: vLLM's TP group on the CPU (gloo)."""
        if self._group is None:
            from vllm.distributed.parallel_state import get_tp_group
            self._group = get_tp_group().cpu_group
        return self._group

    def layer_index(self, layer_name):
        return self.layout.name_to_layer.get(layer_name)

    # --- loads ------------------------------------------------------------------------

    def fetch_remote(self, meta):
        """cluster_fetch step: before the step's local read, bring the load's remote blocks (held
        by peers) into this rank's store.  Called *without* store_lock (the node's thread that
        takes a peer's answer may need it to serve another peer meanwhile); a block that does not
        arrive is not in the store, so start_load reports it as a load error and vLLM recomputes it."""
        if self.cluster is None or meta is None or self.store is None:
            return
        remote = [k for t in meta.loads if t.remote for k in t.keys[len(t.keys) - t.remote:]]
        if remote:
            self._fetch([k for t in meta.loads for k in t.keys], remote,
                        [(t.req_id, t.keys) for t in meta.loads if t.remote])

    def queue_fetches(self, meta):
        """cluster_fetch async: the step's fetch orders go to this rank's fetch thread; the step does
        not wait.  Each is reported done in the worker metadata (``fetched``) once its blocks are in
        the store or failed; the scheduler side holds the request back (vLLM asks it again each
        step) until every rank has reported it, then its blocks are local hits."""
        orders = getattr(meta, "fetches", None) if meta is not None else None
        if not orders or meta is self._fetches_seen:
            return
        self._fetches_seen = meta  # start_load_kv may be called twice with one step's metadata
        if self._fetch_q is None:
            self._fetch_q = queue.SimpleQueue()
            self._fetch_thread = threading.Thread(target=self._fetch_run, args=(self._fetch_q,),
                                                  name=f"tutti-fetch-{self.rank}", daemon=True)
            self._fetch_thread.start()
        for t in orders:
            self._fetch_q.put(t)

    def _fetch_run(self, orders):
        affinity.service_thread()
        while True:
            t = orders.get()
            if t is None:
                return
            try:
                self._fetch(t.keys, t.keys[len(t.keys) - t.remote:], [(t.req_id, t.keys)])
            except Exception as e:  # noqa: BLE001 - a failed fetch is a miss, never a dead thread
                log.warning("tutti cluster: fetching request %s's blocks failed: %s", t.req_id, e)
            with self.store_lock:
                self._fetched.append((self.rank, t.req_id))

    def _fetch(self, keys, remote, requests=()):
        """Fetch the ``remote`` keys not yet here from peers into the store, verified against their
        owner's committed checksum; ``keys`` (all the step's or request's) are looked up first, heads
        last, so the fetched blocks take older blocks' slots, not theirs.  ``requests``: (req_id, keys)
        that will load them (a copy this node may not keep stays until each has)."""
        cluster = self.cluster
        with self.store_lock:
            if cluster is None or self.store is None:
                return
            slots = dict(zip(keys[::-1], self.store.lookup(keys[::-1])))
            for req_id, rkeys in requests:  # a transient copy another request's fetch brought
                cluster.wait_for(rkeys, req_id)
        want = [k for k in remote if slots.get(k) is None]
        if not want:
            return
        t0 = time.perf_counter()
        wanted = set(want)
        owners: list = []
        ok = cluster.fetch(want, [r for r, rkeys in requests if wanted.intersection(rkeys)], owners)
        n = sum(ok)
        got = [k for k, good in zip(want, ok) if good]
        with self.store_lock:
            if self._perf:  # the planner prices remote blocks with it (failures included), per peer
                self._fetch_perf = self._fetch_perf[-15:] + [(self.rank, len(want) * self.layout.block_bytes,
                                                              time.perf_counter() - t0,
                                                              dict(collections.Counter(o for o in owners if o)))]
            self.stats.add(remote_blocks=n, remote_errors=len(want) - n, remote_fetch_s=time.perf_counter() - t0)
            if got and self.store is not None:  # the scheduler's index learns of the replicas
                self._events += [SlotEvent(self.rank, s, k) for k, s in zip(got, self.store.lookup(got))
                                 if s is not None]
        if n < len(want):
            log.warning("tutti cluster: %d of %d blocks did not arrive from peers: recomputed",
                        len(want) - n, len(want))

    def start_load(self, meta):
        self._finish_load()  # a previous step's load that never saw its last layer
        self._sync_step(meta)
        if self._perf and meta is not None:
            self._fwd, self._stall = (time.perf_counter(), meta.step), 0.0
        if not meta.loads or self.store is None:
            return
        keys, ids = [], []
        for t in meta.loads:
            keys += t.keys
            ids += t.block_ids
        if self.cluster is not None:  # transient copies fetched from peers: dropped once all have loaded
            for t in meta.loads:
                self.cluster.note_loaded(t.keys, t.req_id)
        t0 = time.perf_counter()
        fault = fault_hooks.next_load_fault(self.store, keys, self.rank)
        try:
            slots = self.store.lookup(keys[::-1])[::-1]  # heads touched last: evicted last
        except Exception as e:  # noqa: BLE001 - never fail the forward: recompute instead
            log.error("tutti: lookup failed, %d blocks will be recomputed: %s", len(keys), e)
            self._fail(ids)
            return
        found = [(s, b) for s, b, k in zip(slots, ids, keys) if s is not None]
        for s, b, k in zip(slots, ids, keys):
            if s is None:
                self._errors.add(b)
                self._missing.append((self.rank, k))
        if len(found) < len(keys):
            self.stats.add(load_errors=len(keys) - len(found))
        if not found:
            return
        fslots = [s for s, _ in found]
        fids = [b for _, b in found]
        try:
            txn = self.io.read(fslots, fids)
        except Exception as e:  # noqa: BLE001 - any failure of a load means recompute, never a crash of the step
            log.error("tutti: read of %d blocks failed to start: %s", len(fids), e)
            self._fail(fids)
            return
        if self._slack:
            self._wait_writes()  # a read never shares the SSDs with a write
        self._load = _Load(txn, fids, fslots, self.layout.n_layers, t0, fault)
        try:
            self._submit_upto(min(self.cfg.lookahead_layers, self.layout.n_layers))
        except Exception as e:  # noqa: BLE001 - as above: the blocks are recomputed
            log.error("tutti: load failed to start, blocks will be recomputed: %s", e)
            self._abort_load()

    def _submit_upto(self, n):
        ld = self._load
        while ld.submitted < n:
            ld.txn.layer(ld.submitted)
            ld.submitted += 1
            self._note_io()

    def wait_layer(self, layer_name):
        ld = self._load
        if ld is None:
            return
        layer = self.layer_index(layer_name)
        if layer is None or layer in ld.waited or fault_hooks.skip_wait(ld.fault, layer, ld.n_layers):
            return
        try:
            self._submit_upto(min(layer + 1, ld.n_layers))
            t = time.perf_counter()
            self.io.loaded(ld.txn, layer)
            t = time.perf_counter() - t
            ld.stall += t
            self._stall += t
            ld.waited.add(layer)
            self._note_io()
            # Reads first: the next read is due now (the model starts this layer), so it
            # goes before any queued write.
            self._submit_upto(min(layer + 1 + self.cfg.lookahead_layers, ld.n_layers))
        except Exception as e:  # noqa: BLE001 - as above: the blocks are recomputed
            log.error("tutti: load of layer %d failed, blocks will be recomputed: %s", layer, e)
            self._abort_load()
            return
        if layer == ld.n_layers - 1:
            self._finish_load()

    def _finish_load(self):
        ld, self._load = self._load, None
        if ld is None:
            return
        try:
            self._submit_upto_all(ld)
            status = fault_hooks.apply_eio(ld.fault, ld.txn.finish())
        except Exception as e:  # noqa: BLE001 - as above: the blocks are recomputed
            log.error("tutti: load failed, %d blocks will be recomputed: %s", len(ld.block_ids), e)
            ld.txn.abort()
            self._fail(ld.block_ids)
            self._reads_over()
            return
        dt = time.perf_counter() - ld.t0
        if len(ld.waited) < ld.n_layers:
            # The model ran some layer without waiting for it: its KV may be stale.
            log.warning("tutti: %d of %d layers were not waited for; %d blocks recomputed",
                        ld.n_layers - len(ld.waited), ld.n_layers, len(ld.block_ids))
            status = [rc or -errno.EAGAIN for rc in status]
        ok = 0
        for s, b, rc in zip(ld.slots, ld.block_ids, status):
            if rc == 0:
                ok += 1
                continue
            self._errors.add(b)
            if rc == -errno.EAGAIN:
                continue  # the block itself is fine
            if rc == -errno.EBADMSG:
                self.stats.add(corrupt_blocks=1)
                log.warning("tutti: block in slot %d failed its checksum: dropped, recomputed", s)
            self._events.append(SlotEvent(self.rank, s, None))
        self.stats.add(load_blocks=ok, load_bytes=ok * self.layout.block_bytes, load_s=dt,
                       load_errors=len(status) - ok)
        if self._perf and ok == len(status):
            self._load_perf = self._load_perf[-15:] + [(self.rank, ok * self.layout.block_bytes, dt, ld.stall)]
        self._reads_over()  # after the errors are known: a failed load fences the writes

    def _submit_upto_all(self, ld):
        self._load = ld
        try:
            self._submit_upto(ld.n_layers)
        finally:
            self._load = None

    def _abort_load(self):
        ld, self._load = self._load, None
        if ld is not None:
            ld.txn.abort()
            self._fail(ld.block_ids)
            self._reads_over()

    def _reads_over(self):
        """The step's load is over (self._load is None): the writes that waited for it go."""
        self._note_io()
        self._issue_writes()

    def _note_io(self):
        ld = self._load
        self._overlap.update(ld.submitted - len(ld.waited) if ld else 0, self._writes_in_flight())

    def _fail(self, block_ids):
        self._errors.update(block_ids)
        self.stats.add(load_errors=len(block_ids))

    def take_load_errors(self):
        self._finish_load()
        self._note_failure()  # before wait_for_save when vLLM defers it (spec decode)
        errs, self._errors, self._noted = self._errors, set(), set()
        return errs

    # --- failed loads: the fence --------------------------------------------------------

    def _sync_step(self, meta):
        """First hook of a step to see its metadata: take in the scheduler's acknowledgements."""
        if meta is None or meta is self._meta:
            return
        self._meta = meta
        acked = getattr(meta, "acked", None) or {}
        upto = acked.get(self.rank, 0)
        for seq in [q for q in self._unacked if q <= upto]:
            del self._unacked[seq]
        self._take_step_saves(meta)

    def _note_failure(self):
        """The step's failed blocks become a LoadFailure, sent until acknowledged."""
        new = self._errors - self._noted
        if not new:
            return
        self._noted |= new
        self._fail_seq += 1
        step = getattr(self._meta, "step", 0) if self._meta is not None else 0
        self._unacked[self._fail_seq] = LoadFailure(self.rank, self._fail_seq, step, sorted(new))
        log.warning("tutti: rank %d: %d blocks failed to load in step %d; nothing is committed "
                    "until the scheduler has taken that in", self.rank, len(new), step)

    def fenced(self) -> bool:
        """True while a failed load may have fed the model's KV: saves are not committed."""
        return bool(self._errors) or bool(self._unacked)

    def note_forward_end(self):
        """The model ran its last layer (wait_for_save): the forward's time, for the planner."""
        if self._fwd is not None:
            t0, step = self._fwd
            self._fwd = None
            self._step_perf = self._step_perf[-15:] + [(self.rank, step, time.perf_counter() - t0,
                                                        self._stall)]

    def take_worker_meta(self):
        drained = self.drained_step() if self._deferred else None
        new_drained = drained != self._drained_sent
        unreachable = self.cluster.take_unreachable() if self.cluster is not None else []
        self.drop_transient()
        if not (self._events or self._missing or self._unacked or self._unsaved or new_drained
                or self._load_perf or self._step_perf or self._fetch_perf or self._fetched or unreachable):
            return None
        if self.cluster is not None:  # this step's commits: published by the node's thread
            self.cluster.publish([e.key for e in self._events if e.key is not None])
        meta = TuttiWorkerMeta(events=self._events, missing=self._missing,
                               failures=list(self._unacked.values()), unsaved=self._unsaved,
                               drained=[(self.rank, drained)] if new_drained else [],
                               load_perf=self._load_perf, step_perf=self._step_perf,
                               fetch_perf=self._fetch_perf, fetched=self._fetched, unreachable=unreachable)
        self._drained_sent = drained
        self._events, self._missing, self._unsaved = [], [], []
        self._load_perf, self._step_perf, self._fetch_perf, self._fetched = [], [], [], []
        return meta

    def drop_transient(self):
        """Copies fetched from peers this node may not keep (cluster_replicas), once every request that
        waited for them loaded them or finished; never while a load is in flight (it may read them)."""
        if self.cluster is None or self._load is not None:
            return
        dropped = self.cluster.drop_used()
        if dropped:
            self.stats.add(remote_dropped=len(dropped))
            self._events += [SlotEvent(self.rank, slot, None) for slot in dropped]

    def close_cluster(self):
        """Leave the cluster (withdraw, stop serving); without store_lock: its threads may hold it."""
        if self._fetch_q is not None:
            self._fetch_q.put(None)  # the fetch thread stops after the fetch in progress
        cluster, self.cluster = self.cluster, None
        if cluster is not None:
            cluster.close()  # a fetch in progress fails now: the thread's join below is short
        if self._fetch_thread is not None:
            self._fetch_thread.join(cluster.cfg.call_timeout_s * 2 + 1 if cluster is not None else 5)
            self._fetch_thread = self._fetch_q = None

    def close(self):
        self.close_cluster()
        self.abort_save()  # first: an aborted load would issue the queued writes
        self._abort_load()
        if self.store is not None:
            self.close_saves()
        if self.io is not None:
            self.io.close()
            self.io = self.store = None
