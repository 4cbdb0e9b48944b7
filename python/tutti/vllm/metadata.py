"""What the scheduler side tells the workers each step, and what they answer.

Loads and saves name blocks by *key* (model prefix + vLLM's chained block
hash), never by slot: a worker looks every key up in its own store right
before reading, so a slot reused since the scheduler last heard of it can
never be served under the wrong key.

Failed loads travel both ways (see worker.py, "Failed loads"): a worker reports
each step whose load failed (``LoadFailure``, resent until acknowledged) and
commits nothing until the scheduler's metadata acknowledges it (``acked``);
from then on the scheduler's own taint tracking (taint.py) keeps saves of
anything computed over a bad block out of the steps it builds, and tells the
workers which vLLM blocks it found bad (``bad_blocks``) so a save still pending
from an earlier step (saves.py, ``save_mode: deferred``) is checked again at
its commit.

Deferred saves (saves.py): a request that finishes while a save of its blocks is
pending is *held* (vLLM keeps its blocks); ``held`` names it to the workers, which
report it in ``get_finished`` once no pending save needs its blocks.  ``preempted``
names requests whose blocks vLLM freed: their pending writes are finished before
the step's forward may overwrite the blocks.
"""
from dataclasses import dataclass, field

try:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata
except ImportError:  # the worker side without vLLM (its tests on the GPU machine): plain classes
    KVConnectorMetadata = object

try:  # vLLM >= 0.32: workers can send metadata back to the scheduler
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorWorkerMetadata
except ImportError:  # pragma: no cover - older vLLM: no index updates from workers
    KVConnectorWorkerMetadata = object


@dataclass
class BlockTransfer:
    """Blocks of one request: ``keys[i]`` moves to/from vLLM block ``block_ids[i]``."""

    req_id: str
    keys: list
    block_ids: list
    first: int = 0   # saves: index in the request's blocks of keys[0] (a retry starts there)
    remote: int = 0  # loads: the last ``remote`` keys are held by peers (cluster tier), fetched first


@dataclass
class TuttiMetadata(KVConnectorMetadata):
    """One step's work for every worker."""

    loads: list = field(default_factory=list)   # BlockTransfer, before the forward
    saves: list = field(default_factory=list)   # BlockTransfer, layer by layer during it
    step: int = 0                                # the scheduler's count of steps built
    acked: dict = field(default_factory=dict)   # rank -> last LoadFailure.seq the scheduler took in
    held: list = field(default_factory=list)    # finished requests whose blocks wait for get_finished
    preempted: list = field(default_factory=list)   # requests whose blocks vLLM freed (preemption)
    bad_blocks: list = field(default_factory=list)  # vLLM blocks found bad (taint) since the last step
    # cluster_fetch async: BlockTransfer (no block ids) of requests waiting for blocks peers hold:
    # each worker fetches keys[-remote:] into its store in the background (touching the rest).
    fetches: list = field(default_factory=list)

    def is_empty(self) -> bool:
        return not self.loads and not self.saves and not self.fetches


@dataclass
class SlotEvent:
    """On TP rank ``rank``'s store, ``slot`` now holds ``key`` (None: nothing)."""

    rank: int
    slot: int
    key: bytes | None


@dataclass
class LoadFailure:
    """Rank ``rank``'s load in step ``step`` left vLLM blocks ``block_ids`` without valid KV.

    ``seq`` counts the rank's failures (from 1); the worker sends it every step until the
    scheduler's metadata acknowledges it (``TuttiMetadata.acked[rank] >= seq``).
    """

    rank: int
    seq: int
    step: int
    block_ids: list


@dataclass
class TuttiWorkerMeta(KVConnectorWorkerMetadata):
    """What the workers saw this step, for the scheduler side.

    ``events``: index changes; ``missing``: (rank, key) a worker looked up and did not find;
    ``failures``: LoadFailure not yet acknowledged; ``unsaved``: (req_id, first) of save
    transfers not committed (the scheduler may offer them again); ``drained``: (rank, step): no
    save offered in a step <= ``step`` still needs its vLLM blocks on that rank (so a request whose
    last save is that old can free its blocks at once when it finishes).  ``fetched``: (rank, req_id)
    of fetches (``TuttiMetadata.fetches``) that rank finished, its blocks' events sent with it or before.
    ``unreachable``: peers (endpoints) a rank's fetch could not reach or that let it time out: the
    scheduler's lookups skip them for cluster_peer_quarantine_s (tutti.cluster.quarantine).
    """

    events: list = field(default_factory=list)
    missing: list = field(default_factory=list)
    failures: list = field(default_factory=list)
    unsaved: list = field(default_factory=list)
    drained: list = field(default_factory=list)
    # For the load planner (tutti.sched.online): (rank, bytes, wall_s, stall_s) of finished loads,
    # (rank, step, forward_s, stall_s) of forwards, (rank, bytes, wall_s, {peer: blocks}) of fetches from peers.
    load_perf: list = field(default_factory=list)
    step_perf: list = field(default_factory=list)
    fetch_perf: list = field(default_factory=list)
    fetched: list = field(default_factory=list)
    unreachable: list = field(default_factory=list)

    def aggregate(self, other: "TuttiWorkerMeta | None") -> "TuttiWorkerMeta":
        if other is None:
            return self
        return TuttiWorkerMeta(events=self.events + other.events,
                               missing=self.missing + other.missing,
                               failures=self.failures + other.failures,
                               unsaved=self.unsaved + other.unsaved,
                               drained=self.drained + getattr(other, "drained", []),
                               load_perf=self.load_perf + getattr(other, "load_perf", []),
                               step_perf=self.step_perf + getattr(other, "step_perf", []),
                               fetch_perf=self.fetch_perf + getattr(other, "fetch_perf", []),
                               fetched=self.fetched + getattr(other, "fetched", []),
                               unreachable=self.unreachable + getattr(other, "unreachable", []))
