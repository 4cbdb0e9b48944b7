"""The connector facade vLLM loads: one class, two roles.

vLLM builds it twice: with role SCHEDULER in the engine core (index, matching,
per-step metadata: scheduler.py) and with role WORKER in every worker (data
movement: worker.py).  In vLLM's default multiprocess mode the two live in
different processes and talk only through the metadata vLLM carries.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorRole,
)

from .config import ConfigError, ModelShape, TuttiConfig
from .metadata import TuttiMetadata
from .stats import TuttiStats, build_prom_metrics

try:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import SupportsHMA
except ImportError:  # pragma: no cover - vLLM without the hybrid allocator interface
    SupportsHMA = object

try:
    from vllm.v1.metrics.cache_hit_source import CacheHitSource
    _DISK = getattr(CacheHitSource, "DISK", None)
except ImportError:  # pragma: no cover
    _DISK = None

if TYPE_CHECKING:
    from .scheduler import SchedulerSide
    from .worker import WorkerSide

log = logging.getLogger("vllm.tutti")



def _stats_dir() -> str | None:
    """Tests and the demo read totals from here (each role writes its own file)."""
    return os.environ.get("TUTTI_VLLM_STATS_DIR")


def _tp_rank() -> int:
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank
        return get_tensor_model_parallel_rank()
    except Exception:  # noqa: BLE001 - not initialised (single process)
        return 0


def _describe(spec: Any) -> str:
    window = getattr(spec, "sliding_window", None)
    return type(spec).__name__ + (f"(window {window})" if window is not None else "")


def _sliding_window(groups: Any) -> int | None:
    """The model's sliding window in tokens, None for full attention; ConfigError for a KV cache
    the connector cannot serve correctly (a store block holds one block of every layer, so all
    layers must share one block table: one KV cache group, of a kind tested here)."""
    if not groups:
        return None  # vLLM did not say (older vLLM): the layout checks in the worker still run
    if len(groups) > 1:
        kinds = ", ".join(f"{_describe(g.kv_cache_spec)} x{len(g.layer_names)}" for g in groups)
        raise ConfigError(
            f"TuttiConnector supports models whose KV cache is one group (every layer full attention, "
            f"or every layer the same sliding window); this model's has {len(groups)}: {kinds}. Layers "
            f"that mix sliding-window and full attention become one full-attention group with vLLM's "
            f"--disable-hybrid-kv-cache-manager (LLM(..., disable_hybrid_kv_cache_manager=True))")
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec, SlidingWindowSpec

    spec = groups[0].kv_cache_spec
    specs = list(getattr(spec, "kv_cache_specs", {}).values()) or [spec]  # UniformTypeKVCacheSpecs
    kinds = ", ".join(sorted({_describe(s) for s in specs}))
    log.info("tutti: KV cache: %s", kinds)
    # Exact types: subclasses (R-SWA, attention sinks, ...) free or share blocks in ways not tested.
    if all(type(s) in (FullAttentionSpec, MLAAttentionSpec) for s in specs):
        return None
    windows = {s.sliding_window for s in specs if type(s) is SlidingWindowSpec}
    if len(windows) == 1 and all(type(s) is SlidingWindowSpec for s in specs):
        return windows.pop()
    raise ConfigError(f"TuttiConnector supports full attention and sliding-window attention (one "
                      f"window for every layer); this model's KV cache is {kinds}")


class TuttiConnector(KVConnectorBase_V1, SupportsHMA):
    """Long shared prefixes load from SSD instead of being recomputed."""

    if _DISK is not None:
        _cache_hit_source = _DISK

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self.cfg = TuttiConfig.from_extra(self._kv_transfer_config.kv_connector_extra_config)
        self.shape = ModelShape.from_vllm(vllm_config, self.cfg)
        # Sliding-window models: vLLM frees a running request's blocks once they fall out of the
        # window (the null block takes their place in its block table) and may hand them to
        # another request at the next step.  So a save must be written within its step
        # (save_mode step), and neither loads nor saves may touch the null block (scheduler.py).
        window = _sliding_window(getattr(kv_cache_config, "kv_cache_groups", None))
        if window is not None and self.cfg.save_mode != "step":
            log.info("tutti: sliding window of %d tokens: saves are committed in their step "
                     "(save_mode step)", window)
            self.cfg.save_mode = "step"
        self._stats = TuttiStats()
        self._totals = TuttiStats()   # since start, for TUTTI_VLLM_STATS_DIR
        self._sched: SchedulerSide | None = None
        self._worker: WorkerSide | None = None
        if role == KVConnectorRole.SCHEDULER:
            from .scheduler import SchedulerSide
            policy = self.cfg.load_failure_policy
            if self._kv_transfer_config.kv_load_failure_policy != policy:
                # A block that fails its checksum is recomputed, not an error for the user.
                log.info("tutti: kv_load_failure_policy set to %r", policy)
                self._kv_transfer_config.kv_load_failure_policy = policy
            self._sched = SchedulerSide(self.cfg, self.shape, vllm_config, self._stats,
                                        windowed=window is not None)
        else:
            from .worker import WorkerSide
            self._worker = WorkerSide(self.cfg, self.shape, _tp_rank(), self._stats)

    @property
    def _w(self) -> WorkerSide:
        """The worker side; vLLM calls worker hooks on the worker role only."""
        if self._worker is None:
            raise RuntimeError("TuttiConnector: a worker-side call on the scheduler role")
        return self._worker

    @property
    def _s(self) -> SchedulerSide:
        """The scheduler side; vLLM calls scheduler hooks on the scheduler role only."""
        if self._sched is None:
            raise RuntimeError("TuttiConnector: a scheduler-side call on a worker role")
        return self._sched

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # a cache: a dropped save is a future miss

    # --- worker side --------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        num_blocks = getattr(self._kv_cache_config, "num_blocks", None)
        if num_blocks is None:
            num_blocks = next(iter(kv_caches.values())).shape[0]
        self._w.register_kv_caches(kv_caches, num_blocks)

    def _meta(self) -> TuttiMetadata | None:
        meta = self._connector_metadata
        return meta if isinstance(meta, TuttiMetadata) else None

    # Every worker hook that uses the store holds the worker's store_lock: with the cluster tier a
    # ClusterNode's threads serve peers from the same store (vllm/cluster.py, docs/cluster.md).

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        meta = self._meta()
        if meta is not None and self._worker is not None:
            # Blocks held by peers, into the store (each takes the lock itself): cluster_fetch step
            # fetches the step's remote loads now; async hands requests' fetches to a thread.
            self._worker.fetch_remote(meta)
            self._worker.queue_fetches(meta)
            with self._worker.store_lock:
                self._worker.start_load(meta)

    def wait_for_layer_load(self, layer_name: str) -> None:
        if self._worker is not None:
            with self._worker.store_lock:
                self._worker.wait_layer(layer_name)

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        meta = self._meta()
        if meta is not None and self._worker is not None:
            with self._worker.store_lock:
                self._worker.save_layer(meta, layer_name)

    def wait_for_save(self) -> None:
        if self._worker is not None:
            with self._worker.store_lock:
                self._worker.finish_save(self._meta())

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        if self._worker is None:
            return None, None
        with self._worker.store_lock:
            return self._worker.get_finished(finished_req_ids, self._meta())

    def handle_preemptions(self, kv_connector_metadata: Any) -> None:
        if self._worker is not None and isinstance(kv_connector_metadata, TuttiMetadata):
            with self._worker.store_lock:
                self._worker.handle_preemptions(kv_connector_metadata)

    def get_block_ids_with_load_errors(self) -> set:
        if self._worker is None:
            return set()
        with self._worker.store_lock:
            return self._worker.take_load_errors()

    def build_connector_worker_meta(self) -> Any:
        if self._worker is None:
            return None
        with self._worker.store_lock:
            return self._worker.take_worker_meta()

    def get_kv_connector_stats(self) -> TuttiStats | None:
        # A worker's fetch thread adds to the stats under store_lock: taken and reset under it too.
        with self._worker.store_lock if self._worker is not None else contextlib.nullcontext():
            if self._worker is not None:
                self._worker.note_store()
            if self._stats.is_empty():
                return None
            out = TuttiStats(data=dict(self._stats.data))
            self._stats.reset()
        self._totals.aggregate(out)
        if _stats_dir():
            self._dump_totals()
        return out

    def _dump_totals(self) -> None:
        d = _stats_dir()
        if d is None:
            return
        role = "scheduler" if self._sched is not None else f"worker{self._w.rank}"
        path = os.path.join(d, f"{role}-{os.getpid()}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(self._totals.data, f)
        os.replace(path + ".tmp", path)

    @classmethod
    def build_kv_connector_stats(cls, data: dict | None = None) -> TuttiStats:
        return TuttiStats(data=dict(data)) if data is not None else TuttiStats()

    @classmethod
    def build_prom_metrics(cls, vllm_config: Any, metric_types: dict, labelnames: list,
                           per_engine_labelvalues: dict) -> Any:
        return build_prom_metrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def shutdown(self) -> None:
        if self._worker is not None:
            self._worker.close_cluster()  # first, without the lock: the node's threads may hold it
            with self._worker.store_lock:
                self._worker.close()  # pending saves: committed or dropped (bounded: shutdown_drain_s)
        if self._sched is not None:
            self._sched.close()
        if _stats_dir():
            self.get_kv_connector_stats()  # what the shutdown committed reaches the totals
            self._dump_totals()

    # --- scheduler side -----------------------------------------------------------

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int, bool]:
        return self._s.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        self._s.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> TuttiMetadata:
        return self._s.build_connector_meta(scheduler_output)

    def update_connector_output(self, connector_output: Any) -> None:
        self._s.update_connector_output(connector_output)

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        return self._s.request_finished(request)

    def request_finished_all_groups(self, request: Any,
                                    block_ids: tuple[list[int], ...]) -> tuple[bool, dict[str, Any] | None]:
        return self._s.request_finished(request)

    def has_pending_block_frees(self) -> bool:
        # Held blocks come back once their saves are written: vLLM waits instead of preempting.
        return self._sched is not None and self._sched.is_holding()

    def bind_kv_cache_manager(self, kv_cache_manager: Any) -> None:
        super().bind_kv_cache_manager(kv_cache_manager)
        if self._sched is not None:
            self._sched.kv_cache_manager = kv_cache_manager
