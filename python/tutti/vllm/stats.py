"""Connector statistics: vLLM's KVConnectorStats, and a Prometheus form.

Workers and the scheduler each count what they see during a step; vLLM
aggregates the dicts across ranks and logging intervals and calls reduce()
for its periodic log line.
"""
from dataclasses import dataclass, field
from typing import Any

try:
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats
except ImportError:  # the worker side without vLLM (its tests on the GPU machine): vLLM's shape
    @dataclass
    class KVConnectorStats:  # type: ignore[no-redef]  # vLLM's, or this stand-in
        data: dict = field(default_factory=dict)

COUNTERS = (
    "hit_tokens",        # scheduler: tokens promised from the store
    "remote_hit_tokens", # scheduler: of those, tokens peers hold (cluster tier), fetched before the load
    "remote_blocks",     # worker: blocks fetched from peers into the store, verified
    "remote_errors",     # worker: remote blocks that did not arrive verified: recomputed
    "remote_fetch_s",    # worker: seconds its fetches from peers took (each from the ask to the blocks stored)
    "remote_dropped",    # worker: of remote_blocks, copies not kept after their load (cluster_replicas)
    # cluster_fetch async (scheduler): requests held back for a fetch, blocks asked, waits given up.
    "fetch_requests", "fetch_asked_blocks", "fetch_timeouts",
    "query_tokens",      # scheduler: prompt tokens asked about
    "load_cut_tokens",   # scheduler: stored tokens recomputed because loading them would not pay
    "load_blocks", "load_bytes", "load_s",
    "load_errors",       # blocks missing or failing their checksum: recomputed
    "corrupt_blocks",
    "save_blocks", "save_bytes", "save_s",
    "save_errors",
    "save_fenced",       # blocks not stored because a load had failed (their KV may be bad)
    "load_failures",     # steps whose load failed (scheduler: failures taken in)
    "writes_deferred",   # layer writes held back: the step's reads were in flight (after_step: always)
    "rw_overlap_s",      # time a read and a write were both in flight (0 with write_policy slack)
    "load_write_wait_s", # time loads waited for writes in flight before starting (reads first)
    "drain_spills",      # drains still being written two step ends after they went out (drain.py)
    "save_carried",      # blocks committed in a later step than the one that computed them
    "save_parts",        # transactions carried-over saves were cut into (a part's layer fits a drain)
    "save_dropped",      # pending blocks dropped: over max_pending_bytes, or at shutdown
    "save_over_bound",   # blocks of a save larger than max_pending_bytes, written in their step
    "reqs_held",         # scheduler: finished requests whose blocks waited for a pending save
    # Write admission under write_budget (scheduler; admission.py): blocks offered or not.
    "save_admitted", "save_admitted_bytes",
    "save_skipped", "save_skipped_bytes",   # refused: never offered (a future miss, not an error)
    "save_skipped_unseen",                  # of those, blocks no earlier request had asked for
    "admission_pressure_steps",             # steps that found the budget's bucket below half
    "store_evictions",   # worker: committed blocks the store evicted to make room for saves (summed over ranks)
)

# The budget's state: the latest value wins when intervals or roles are aggregated.
GAUGES = (
    "write_budget_bytes_per_day",
    "write_budget_left_bytes",   # bytes in the bucket now (negative: overdrawn, write_admission all)
    "store_committed_blocks",    # worker: blocks committed in this rank's store
    "store_slots",               # worker: its slots (occupancy: committed / slots)
)


class TuttiStats(KVConnectorStats):
    """Counters of one interval; ``aggregate`` adds, ``reduce`` derives rates."""

    def __post_init__(self) -> None:
        for k in COUNTERS:
            self.data.setdefault(k, 0)

    def add(self, **kv: float) -> None:
        for k, v in kv.items():
            self.data[k] = self.data.get(k, 0) + v

    def set(self, **kv: float) -> None:
        """Gauges (GAUGES): a value, not an increment."""
        self.data.update(kv)

    def reset(self) -> None:
        zeros: dict[str, float] = {k: 0 for k in COUNTERS}  # ints stay ints (the exposition prints them)
        self.data = zeros

    def aggregate(self, other: "KVConnectorStats | None") -> "TuttiStats":
        if other is not None:
            for k, v in other.data.items():
                self.data[k] = v if k in GAUGES else self.data.get(k, 0) + v
        return self

    def is_empty(self) -> bool:
        return not any(self.data.get(k) for k in COUNTERS)

    def reduce(self) -> dict[str, float]:
        d = self.data
        out: dict[str, float] = {k: d.get(k, 0) for k in ("hit_tokens", "load_blocks", "save_blocks",
                                        "load_errors", "corrupt_blocks", "save_errors")}
        out["load_GBps"] = round(d["load_bytes"] / d["load_s"] / 1e9, 3) if d.get("load_s") else 0.0
        out["save_GBps"] = round(d["save_bytes"] / d["save_s"] / 1e9, 3) if d.get("save_s") else 0.0
        out["load_ms"] = round(d.get("load_s", 0) * 1e3, 1)
        out["save_ms"] = round(d.get("save_s", 0) * 1e3, 1)
        out["writes_deferred"] = d.get("writes_deferred", 0)
        out["save_fenced"] = d.get("save_fenced", 0)
        out["load_failures"] = d.get("load_failures", 0)
        out["save_carried"] = d.get("save_carried", 0)
        out["save_dropped"] = d.get("save_dropped", 0)
        out["rw_overlap_ms"] = round(d.get("rw_overlap_s", 0) * 1e3, 1)
        if "write_budget_bytes_per_day" in d:
            out["save_skipped"] = d.get("save_skipped", 0)
            out["save_skipped_GB"] = round(d.get("save_skipped_bytes", 0) / 1e9, 3)
        q = d.get("query_tokens", 0)
        out["hit_rate"] = round(d.get("hit_tokens", 0) / q, 3) if q else 0.0
        out["load_cut_tokens"] = d.get("load_cut_tokens", 0)
        out["store_evictions"] = d.get("store_evictions", 0)
        if d.get("store_slots"):
            out["store_occupancy"] = round(d.get("store_committed_blocks", 0) / d["store_slots"], 3)
        return out


def prometheus_text(data: dict, prefix: str = "tutti_vllm") -> str:
    """Counters in the Prometheus text exposition format (e.g. for a textfile collector)."""
    lines = []
    for k in COUNTERS:
        family = f"{prefix}_{k[:-2]}_seconds" if k.endswith("_s") else f"{prefix}_{k}"
        lines.append(f"# TYPE {family} counter")
        lines.append(f"{family}_total {data.get(k, 0)}")
    for k in GAUGES:
        if data.get(k) is not None:
            lines.append(f"# TYPE {prefix}_{k} gauge")
            lines.append(f"{prefix}_{k} {data[k]}")
    return "\n".join(lines) + "\n"


def build_prom_metrics(vllm_config: Any, metric_types: dict, labelnames: list,
                       per_engine_labelvalues: dict) -> Any:
    """Prometheus counters registered through vLLM's connector metrics hook."""
    from prometheus_client import Counter, Gauge
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics

    class TuttiPromMetrics(KVConnectorPromMetrics):
        def __init__(self) -> None:
            super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
            counter = metric_types.get(Counter, Counter)
            self._counters: dict[str, dict] = {}
            for k in COUNTERS:
                name = (f"tutti:{k[:-2]}_seconds" if k.endswith("_s") else f"tutti:{k}")
                c = counter(name=name, documentation=f"Tutti connector: {k}",
                            labelnames=labelnames)
                self._counters[k] = {idx: c.labels(*vals)
                                     for idx, vals in per_engine_labelvalues.items()}
            gauge = metric_types.get(Gauge, Gauge)
            self._gauges: dict[str, dict] = {}
            for k in GAUGES:
                g = gauge(name=f"tutti:{k}", documentation=f"Tutti connector: {k}",
                          labelnames=labelnames, multiprocess_mode="mostrecent")
                self._gauges[k] = {idx: g.labels(*vals) for idx, vals in per_engine_labelvalues.items()}

        def observe(self, transfer_stats_data: dict, engine_idx: int = 0) -> None:
            for k, per_engine in self._counters.items():
                v = transfer_stats_data.get(k, 0)
                if v and engine_idx in per_engine:
                    per_engine[engine_idx].inc(v)
            for k, per_engine in self._gauges.items():
                v = transfer_stats_data.get(k)
                if v is not None and engine_idx in per_engine:
                    per_engine[engine_idx].set(v)

    return TuttiPromMetrics()
