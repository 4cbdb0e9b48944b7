"""Planning a prefill that reloads its prefix from SSD: the profile table, the analytic model, the scheduler.

Pure Python (no GPU, no torch): ``tutti-admin plan`` and tests run it anywhere; the prefill
harness uses SlackScheduler / ScheduleState at run time.  Equations and rules: docs/scheduler.md.
"""
from .model import (
    LLAMA3_8B,
    LLAMA3_70B,
    MISTRAL_7B,
    PRESETS,
    QWEN25_7B,
    QWEN25_32B,
    Hardware,
    ModelShape,
    Prediction,
    TokenSplit,
    best_load_blocks,
    crossover_hit_rate,
    loading_stops_paying,
    predict,
)
from .pipeline import Timeline, place_writes, simulate_pipeline
from .profile import ComputePoint, ComputeProfile, LayerFit, ProfileError, fit_layer_time, plan_io
from .scheduler import IoOp, PrefillPlan, ScheduleState, SlackScheduler

__all__ = [
    "LLAMA3_8B", "LLAMA3_70B", "MISTRAL_7B", "QWEN25_7B", "QWEN25_32B", "PRESETS", "Hardware", "ModelShape",
    "Prediction", "TokenSplit", "best_load_blocks", "crossover_hit_rate", "loading_stops_paying", "predict",
    "Timeline", "place_writes", "simulate_pipeline", "ComputePoint", "ComputeProfile", "LayerFit", "ProfileError",
    "fit_layer_time", "plan_io", "IoOp", "PrefillPlan", "ScheduleState", "SlackScheduler",
]
