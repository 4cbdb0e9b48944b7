"""The profile table: measured time of one decoder layer's prefill, and the model fitted to it.

Format (JSON, version 1), written by ``tutti-admin profile``::

    {"version": 1, "device": "NVIDIA H200", "date": "2026-11-29T15:00:00+00:00",
     "model": {"n_layers": 32, "hidden": 4096, "n_heads": 32, "n_kv_heads": 8, "head_dim": 128,
               "intermediate": 14336, "dtype": "bfloat16", "block_size": 16},
     "compute": [{"new_tokens": 4096, "prefix_tokens": 28672, "layer_s": 0.0123}, ...],
     "io": {"read_gbps": 26.0, "write_gbps": 20.0, "n_ssd": 4,           # optional
            "read_gbps_idle": 48.0, "write_gbps_idle": 40.0}}                # optional

``io``: the store's rates measured while GEMMs fill the GPU (``read_gbps``, ``write_gbps``) and,
optionally, with the I/O alone (``*_gbps_idle``); ``plan_io`` says which the model plans with.

``layer_s`` is one decoder layer's prefill forward for ``new_tokens`` new tokens that attend
to ``prefix_tokens`` cached tokens and (causally) to themselves.

Between and beyond the measured points the time follows the shape of the work:

    t(n, p) = a + b*n + c*n*(p + n/2)

a: fixed cost per layer (weights streamed from HBM, kernel launches), b: the linear layers'
work per token, c: attention's work per (query, key) pair (n*p pairs with the prefix, n*n/2
causal pairs among the new tokens).  The coefficients are fitted by non-negative least squares
on relative error, so short and long points count alike.
"""
from __future__ import annotations

import itertools
import json
import math
import os
from dataclasses import asdict, dataclass

from ..errors import ProfileError
from .model import GB, ModelShape

VERSION = 1


@dataclass(frozen=True)
class ComputePoint:
    new_tokens: int
    prefix_tokens: int
    layer_s: float


@dataclass(frozen=True)
class LayerFit:
    """t = a + b*n + c*n*(p + n/2) seconds, and how well it matches the measured points (relative error)."""

    a: float
    b: float
    c: float
    rms_rel_err: float = 0.0
    max_rel_err: float = 0.0
    worst: ComputePoint | None = None

    def __call__(self, new_tokens: float, prefix_tokens: float) -> float:
        n, p = float(new_tokens), float(prefix_tokens)
        if n <= 0:
            return 0.0
        return self.a + self.b * n + self.c * n * (p + n / 2)


def _features(n: float, p: float) -> tuple[float, float, float]:
    return (1.0, n, n * (p + n / 2))


def _solve(m: list[list[float]], v: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None when singular."""
    k = len(v)
    a = [row[:] + [v[i]] for i, row in enumerate(m)]
    for col in range(k):
        piv = max(range(col, k), key=lambda r: abs(a[r][col]))
        if abs(a[piv][col]) < 1e-12:
            return None
        a[col], a[piv] = a[piv], a[col]
        for r in range(k):
            if r != col:
                f = a[r][col] / a[col][col]
                a[r] = [x - f * y for x, y in zip(a[r], a[col])]
    return [a[i][k] / a[i][i] for i in range(k)]


def fit_layer_time(points: list[ComputePoint]) -> LayerFit:
    """Non-negative least squares on relative error, exact: every support set is tried (3 coefficients)."""
    rows = [[f / pt.layer_s for f in _features(pt.new_tokens, pt.prefix_tokens)] for pt in points]
    # Scale columns to unit norm so a, b (~1e-4 s/token) and c (~1e-10 s/pair) condition alike.
    norms = [math.sqrt(sum(r[j] ** 2 for r in rows)) or 1.0 for j in range(3)]
    x = [[r[j] / norms[j] for j in range(3)] for r in rows]
    best, best_res = (0.0, 0.0, 0.0), float("inf")
    for size in (1, 2, 3):
        for support in itertools.combinations(range(3), size):
            m = [[sum(r[i] * r[j] for r in x) for j in support] for i in support]
            v = [sum(r[i] for r in x) for i in support]  # target: every scaled row predicts 1
            sol = _solve(m, v)
            if sol is None or any(s < 0 for s in sol):
                continue
            coef = [0.0, 0.0, 0.0]
            for i, s in zip(support, sol):
                coef[i] = s / norms[i]
            res = sum((sum(coef[j] * r[j] for j in range(3)) - 1.0) ** 2 for r in rows)
            if res < best_res:
                best, best_res = (coef[0], coef[1], coef[2]), res
    fit = LayerFit(*best)
    errs = [(abs(fit(pt.new_tokens, pt.prefix_tokens) - pt.layer_s) / pt.layer_s, pt) for pt in points]
    worst = max(errs, key=lambda e: e[0])
    return LayerFit(*best, rms_rel_err=math.sqrt(sum(e * e for e, _ in errs) / len(errs)), max_rel_err=worst[0],
                    worst=worst[1])


def _need(d: dict, key: str, kind, where: str, minimum: int | None = None):
    """d[key], checked to be of ``kind`` (bools are not numbers) and >= minimum."""
    if key not in d:
        raise ProfileError(f"{where}: missing {key!r}")
    v = d[key]
    ok = isinstance(v, kind) and not isinstance(v, bool)
    if ok and isinstance(v, float):
        ok = math.isfinite(v)
    if not ok or (minimum is not None and v < minimum):
        want = {int: "an integer", str: "a string"}.get(kind, "a number")
        raise ProfileError(f"{where}: {key!r} must be {want}{'' if minimum is None else f' >= {minimum}'}, got {v!r}")
    return v


def _rate(v) -> float | None:
    """``v`` as a rate in GB/s: a finite number > 0, else None."""
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 and math.isfinite(v)
    return float(v) if ok else None


def plan_io(io: dict | None) -> dict | None:
    """The I/O rates (GB/s) the model plans with, from a profile table's ``io``: the rates measured
    with the I/O alone when the table has them, else the ones measured beside GEMMs.

    Checked against a measured prefill (the H200 run in benchmarks/prefill_h200.json, 23 points, 32K
    to 128K tokens, hit rates 0.25 to 1): with the rate alone every predicted TTFT is within 8.7 % of
    the measured one and the 32K crossover within 0.1 %; with the rate beside GEMMs the TTFT above the
    crossover is up to 2.5x too long (the loads inside the prefill ran at the rate alone: prefill's
    attention and MLP do not slow them as back-to-back tensor-core GEMMs do).  ``docs/scheduler.md``.
    Returns ``{"read_gbps", "write_gbps", "n_ssd", "source"}`` (source: "alone" or "beside GEMMs"; a
    rate the table lacks is None), or None when it has no rate at all."""
    if not isinstance(io, dict) or not io:
        return None

    def num(k):
        return _rate(io.get(k))

    n_ssd = io.get("n_ssd")
    n = n_ssd if isinstance(n_ssd, int) and not isinstance(n_ssd, bool) and n_ssd > 0 else 1
    if num("read_gbps_idle"):
        return {"read_gbps": num("read_gbps_idle"), "write_gbps": num("write_gbps_idle") or num("write_gbps"),
                "n_ssd": n, "source": "alone"}
    if num("read_gbps") or num("write_gbps"):
        return {"read_gbps": num("read_gbps"), "write_gbps": num("write_gbps"), "n_ssd": n, "source": "beside GEMMs"}
    return None


class ComputeProfile:
    """Per-layer prefill time, from a measured table (fitted) or from FLOPs and bandwidth (analytic)."""

    def __init__(self, shape: ModelShape, points: list[ComputePoint], *, device: str = "", date: str = "",
                 model: dict | None = None, io: dict | None = None, fit: LayerFit | None = None,
                 source: str = "measured"):
        if source == "measured" and len({(p.new_tokens, p.prefix_tokens) for p in points}) < 3:
            raise ProfileError("compute: need at least 3 distinct (new_tokens, prefix_tokens) points to fit "
                               "a + b*n + c*n*(p + n/2)")
        self.shape = shape
        self.points = list(points)
        self.device = device
        self.date = date
        self.model = model if model is not None else shape.to_dict()
        self.io = io
        self.source = source
        self.fit = fit if fit is not None else fit_layer_time(self.points)

    def layer_time(self, new_tokens: float, prefix_tokens: float) -> float:
        """Seconds for one layer's prefill of ``new_tokens`` attending to ``prefix_tokens`` cached ones."""
        if new_tokens < 0 or prefix_tokens < 0:
            raise ValueError(f"token counts must be >= 0, got new={new_tokens} prefix={prefix_tokens}")
        return self.fit(new_tokens, prefix_tokens)

    def measured_range(self) -> dict:
        """The box the table covers; layer_time extrapolates along the fitted shape outside it."""
        if not self.points:
            return {}
        ns = [p.new_tokens for p in self.points]
        ps = [p.prefix_tokens for p in self.points]
        return {"new_tokens": [min(ns), max(ns)], "prefix_tokens": [min(ps), max(ps)]}

    # ------------------------------------------------------------ analytic

    @classmethod
    def analytic(cls, shape: ModelShape, tflops: float, mem_gbps: float) -> "ComputeProfile":
        """From FLOP counts at ``tflops`` achieved (not peak) TFLOP/s and weights read at ``mem_gbps`` GB/s.

        a = one layer's weights / HBM bandwidth, b = linear FLOPs per token / rate, c = attention
        FLOPs per pair / rate.  Adding the weight read instead of overlapping it slightly
        overestimates small prefills; for long ones the FLOP terms dominate.
        """
        if not tflops > 0 or not mem_gbps > 0:
            raise ValueError(f"tflops and mem_gbps must be > 0, got {tflops}, {mem_gbps}")
        rate = tflops * 1e12
        fit = LayerFit(a=shape.layer_weight_params * shape.dtype_bytes / (mem_gbps * GB),
                       b=shape.linear_flops_per_token / rate, c=shape.attn_flops_per_pair / rate)
        return cls(shape, [], fit=fit, source=f"analytic ({tflops:g} TFLOP/s, {mem_gbps:g} GB/s HBM)")

    # ------------------------------------------------------------ JSON

    @classmethod
    def from_json(cls, path_or_dict) -> "ComputeProfile":
        """Load and validate a profile table (a path or the parsed object); ProfileError says what is wrong."""
        if isinstance(path_or_dict, dict):
            d, where = path_or_dict, "profile"
        else:
            where = os.fspath(path_or_dict)
            try:
                with open(where, encoding="utf-8") as f:
                    d = json.load(f)
            except OSError as err:
                raise ProfileError(f"{where}: {err.strerror or err}") from None
            except json.JSONDecodeError as err:
                raise ProfileError(f"{where}: not valid JSON: {err}") from None
            except UnicodeDecodeError:
                raise ProfileError(f"{where}: not UTF-8 text, so not a JSON profile table") from None
            except RecursionError:
                raise ProfileError(f"{where}: JSON nested too deeply for a profile table") from None
        if not isinstance(d, dict):
            raise ProfileError(f"{where}: a profile table is a JSON object, got {type(d).__name__}")
        version = d.get("version")
        if version != VERSION:
            raise ProfileError(f"{where}: unsupported profile version {version!r} (this tutti reads version {VERSION})")
        device = _need(d, "device", str, where)
        date = _need(d, "date", str, where)
        model = d.get("model")
        if not isinstance(model, dict):
            raise ProfileError(f"{where}: 'model' must be an object with the model's shape")
        try:
            shape = ModelShape.from_dict(model)
        except ValueError as err:
            raise ProfileError(f"{where}: {err}") from None
        comp = d.get("compute")
        if not isinstance(comp, list) or not comp:
            raise ProfileError(f"{where}: 'compute' must be a non-empty list of measured points")
        points = []
        for i, e in enumerate(comp):
            w = f"{where}: compute[{i}]"
            if not isinstance(e, dict):
                raise ProfileError(f"{w}: must be an object, got {type(e).__name__}")
            layer_s = _need(e, "layer_s", (int, float), w)
            if not layer_s > 0:
                raise ProfileError(f"{w}: 'layer_s' must be a number > 0, got {layer_s!r}")
            points.append(ComputePoint(_need(e, "new_tokens", int, w, 1), _need(e, "prefix_tokens", int, w, 0),
                                       float(layer_s)))
        io = d.get("io")
        if io is not None:
            if not isinstance(io, dict):
                raise ProfileError(f"{where}: 'io' must be an object")
            for k in ("read_gbps", "write_gbps"):
                _need(io, k, (int, float), f"{where}: io")
            _need(io, "n_ssd", int, f"{where}: io", 1)
            for k in ("read_gbps", "write_gbps", "read_gbps_idle", "write_gbps_idle"):  # the last two optional
                if io.get(k) is not None and _rate(io[k]) is None:
                    raise ProfileError(f"{where}: io: {k!r} must be a finite number > 0, got {io[k]!r}")
        try:
            return cls(shape, points, device=device, date=date, model=dict(model), io=io)
        except ProfileError as e:
            raise ProfileError(f"{where}: {e}") from None

    def to_json(self) -> dict:
        """The table as a JSON-ready object (from_json(to_json()) gives the same profile)."""
        if not self.points:
            raise ValueError("an analytic profile has no measured points to write")
        d = {"version": VERSION, "device": self.device, "date": self.date, "model": dict(self.model),
             "compute": [asdict(p) for p in self.points]}
        if self.io is not None:
            d["io"] = dict(self.io)
        return d

    def save(self, path) -> None:
        with open(path, "w") as f:
            json.dump(self.to_json(), f, indent=1)
            f.write("\n")

    def describe(self) -> dict:
        """Where the times come from and how good the fit is, for plan's output."""
        f = self.fit
        d = {"source": self.source, "device": self.device, "date": self.date,
             "a_s": f.a, "b_s_per_token": f.b, "c_s_per_pair": f.c}
        if self.points:
            d.update(points=len(self.points), rms_rel_err=f.rms_rel_err, max_rel_err=f.max_rel_err,
                     measured_range=self.measured_range())
        return d
