"""What the scheduler side tells the workers each step, and what they answer.

Loads and saves name blocks by *key* (model prefix + vLLM's chained block
hash), never by slot: a worker looks every key up in its own store right
before reading, so a slot reused since the scheduler last heard of it can
never be served under the wrong key.
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


@dataclass
class TuttiMetadata(KVConnectorMetadata):
    """One step's work for every worker."""

    loads: list = field(default_factory=list)   # BlockTransfer, before the forward
    saves: list = field(default_factory=list)   # BlockTransfer, layer by layer during it

    def is_empty(self):
        return not self.loads and not self.saves


@dataclass
class SlotEvent:
    """On TP rank ``rank``'s store, ``slot`` now holds ``key`` (None: nothing)."""

    rank: int
    slot: int
    key: bytes | None


@dataclass
class TuttiWorkerMeta(KVConnectorWorkerMetadata):
    """Index changes seen by the workers this step, for the scheduler's index.

    ``missing`` lists (rank, key) a worker looked up and did not find.
    """

    events: list = field(default_factory=list)
    missing: list = field(default_factory=list)

    def aggregate(self, other):
        if other is None:
            return self
        return TuttiWorkerMeta(events=self.events + other.events,
                               missing=self.missing + other.missing)
