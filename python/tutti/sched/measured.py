"""The model against a measured prefill: predicted vs measured TTFT and crossover of a run of
``benchmarks/prefill.py run`` (its JSON), with the I/O rate the profile measured alone or beside GEMMs.

Pure Python: ``prefill.py model`` prints it, ``tests/test_sched_measured.py`` holds the model to the
H200 run committed in ``benchmarks/prefill_h200.json``.
"""
from __future__ import annotations

from .model import Hardware, crossover_hit_rate, predict
from .profile import ComputeProfile


def rates(run: dict, source: str) -> Hardware:
    """The run's measured I/O as Hardware: ``source`` "alone" (``*_gbps_idle``) or "gemms" (beside GEMMs)."""
    if source not in ("alone", "gemms"):
        raise ValueError(f"source must be 'alone' or 'gemms', got {source!r}")
    io = run["io"]
    sfx = "_idle" if source == "alone" else ""
    if f"read_gbps{sfx}" not in io:
        raise ValueError(f"the run measured no I/O rate {'alone' if sfx else 'beside GEMMs'} (io.read_gbps{sfx})")
    n = int(run["profile"]["io"]["n_ssd"])
    return Hardware(read_gbps=io["read_gbps" + sfx], write_gbps=io.get("write_gbps" + sfx, io["write_gbps"]),
                    n_ssd=n)


def check(run: dict, source: str = "alone", prefetch_depth: int = 2) -> dict:
    """Per Tutti point of the run: measured and predicted TTFT (s) and the relative error; per swept
    length: measured and predicted crossover.  ``max_abs_err``: the largest TTFT error."""
    prof = ComputeProfile.from_json(run["profile"])
    hw = rates(run, source)
    points = []
    for r in run["runs"]:
        if r.get("mode") != "tutti":
            continue
        p = predict(prof.shape, hw, prof, r["total_tokens"], 0.0, prefetch_depth, hit_tokens=r["hit_tokens"])
        points.append({"tokens": r["total_tokens"], "hit_rate": r["hit_tokens"] / r["total_tokens"],
                       "measured_s": r["ttft_s"], "predicted_s": p.ttft_s, "err": p.ttft_s / r["ttft_s"] - 1})
    cross = []
    for t, sw in sorted(run.get("sweeps", {}).items(), key=lambda kv: int(kv[0])):
        m = sw.get("measured_crossover")
        if m is not None:
            pc = crossover_hit_rate(prof.shape, hw, prof, int(t))
            cross.append({"tokens": int(t), "measured": m, "predicted": pc, "err": pc / m - 1})
    return {"source": source, "read_gbps": hw.read_gbps, "points": points, "crossovers": cross,
            "max_abs_err": max((abs(x["err"]) for x in points), default=0.0)}
