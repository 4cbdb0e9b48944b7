"""Analytic model of a prefill that reloads its prefix from SSD layer by layer.

ModelShape and Hardware describe what is served and on what; predict() runs the
layer pipeline (pipeline.py) with per-layer load and compute times and says what
the TTFT is, where the bubbles are and how much of the new KV's write fits into
the prefill's I/O slack.  Pure Python: the planner must run without a GPU.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from .pipeline import place_writes, simulate_pipeline

if TYPE_CHECKING:  # pragma: no cover
    from .profile import ComputeProfile

OBJ_ALIGN = 4096  # TT_OBJ_ALIGN (format.h): every object starts on a 4 KiB boundary on disk
GB = 1e9  # bandwidths are decimal GB/s, as SSD and PCIe datasheets state them

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4,
               "float8_e4m3fn": 1, "float8_e5m2": 1, "fp8": 1, "int8": 1}


def dtype_bytes(name: str) -> int:
    try:
        return DTYPE_BYTES[str(name).removeprefix("torch.").lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}: one of {', '.join(sorted(DTYPE_BYTES))}") from None


@dataclass(frozen=True)
class ModelShape:
    """The dimensions of a decoder-only transformer that decide KV size and prefill FLOPs (one GPU, no TP)."""

    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate: int
    dtype_bytes: int = 2
    block_size: int = 16
    name: str = ""

    def __post_init__(self):
        for k in ("n_layers", "hidden", "n_heads", "n_kv_heads", "head_dim", "intermediate", "dtype_bytes",
                  "block_size"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"model shape: {k} must be an integer >= 1, got {v!r}")

    @property
    def kv_bytes_per_token_layer(self) -> int:
        """K and V of one token in one layer."""
        return 2 * self.n_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def span_bytes(self) -> int:
        """One object: K (or V) of one block in one layer."""
        return self.block_size * self.n_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def block_layer_io_bytes(self) -> int:
        """Bytes moved per block per layer: K and V objects, each padded to 4 KiB as the store lays them out."""
        return 2 * (-(-self.span_bytes // OBJ_ALIGN) * OBJ_ALIGN)

    @property
    def layer_weight_params(self) -> int:
        """Q, K, V, O projections and a gated MLP (three matrices); norms are negligible."""
        qkv = self.hidden * (self.n_heads + 2 * self.n_kv_heads) * self.head_dim
        return qkv + self.n_heads * self.head_dim * self.hidden + 3 * self.hidden * self.intermediate

    @property
    def linear_flops_per_token(self) -> int:
        return 2 * self.layer_weight_params

    @property
    def attn_flops_per_pair(self) -> int:
        """QK^T and PV for one (query, key) pair over all heads."""
        return 4 * self.n_heads * self.head_dim

    def to_dict(self, dtype: str | None = None) -> dict:
        """The profile table's "model" object."""
        d = {k: v for k, v in asdict(self).items() if k not in ("dtype_bytes", "name")}
        d["dtype"] = dtype or {1: "float8_e4m3fn", 2: "bfloat16", 4: "float32"}[self.dtype_bytes]
        return d

    @classmethod
    def from_dict(cls, d: dict, name: str = "") -> "ModelShape":
        """From the profile table's "model" object (dtype by name)."""
        if not isinstance(d, dict):
            raise ValueError(f"model must be an object, got {type(d).__name__}")
        missing = [k for k in ("n_layers", "hidden", "n_heads", "n_kv_heads", "head_dim", "intermediate", "dtype",
                               "block_size") if k not in d]
        if missing:
            raise ValueError(f"model: missing {', '.join(missing)}")
        return cls(n_layers=d["n_layers"], hidden=d["hidden"], n_heads=d["n_heads"], n_kv_heads=d["n_kv_heads"],
                   head_dim=d["head_dim"], intermediate=d["intermediate"], dtype_bytes=dtype_bytes(d["dtype"]),
                   block_size=d["block_size"], name=name or str(d.get("name", "")))


LLAMA3_8B = ModelShape(32, 4096, 32, 8, 128, 14336, name="llama3-8b")
LLAMA3_70B = ModelShape(80, 8192, 64, 8, 128, 28672, name="llama3-70b")
MISTRAL_7B = ModelShape(32, 4096, 32, 8, 128, 14336, name="mistral-7b")
QWEN25_7B = ModelShape(28, 3584, 28, 4, 128, 18944, name="qwen2.5-7b")
QWEN25_32B = ModelShape(64, 5120, 40, 8, 128, 27648, name="qwen2.5-32b")
PRESETS = {s.name: s for s in (LLAMA3_8B, LLAMA3_70B, MISTRAL_7B, QWEN25_7B, QWEN25_32B)}


@dataclass(frozen=True)
class Hardware:
    """The SSDs a store is striped over, and the PCIe link they share to the GPU. Rates in GB/s (1e9)."""

    read_gbps: float  # aggregate over all SSDs
    write_gbps: float
    n_ssd: int = 1
    pcie_gbps: float | None = None  # None: the link is not the bottleneck

    def __post_init__(self):
        for k in ("read_gbps", "write_gbps") + (("pcie_gbps",) if self.pcie_gbps is not None else ()):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ValueError(f"hardware: {k} must be a positive number, got {v!r}")
        if isinstance(self.n_ssd, bool) or not isinstance(self.n_ssd, int) or self.n_ssd < 1:
            raise ValueError(f"hardware: n_ssd must be an integer >= 1, got {self.n_ssd!r}")

    @classmethod
    def per_ssd(cls, read_gbps: float, n_ssd: int = 1, write_gbps: float | None = None,
                pcie_gbps: float | None = None) -> "Hardware":
        """From one SSD's rates; objects are striped over all SSDs, so rates add up."""
        return cls(read_gbps * n_ssd, (write_gbps if write_gbps is not None else read_gbps) * n_ssd, n_ssd, pcie_gbps)

    @property
    def read_bps(self) -> float:
        """Effective read rate in bytes/s: the SSDs' aggregate, capped by the link."""
        return min(self.read_gbps, self.pcie_gbps or float("inf")) * GB

    @property
    def write_bps(self) -> float:
        return min(self.write_gbps, self.pcie_gbps or float("inf")) * GB


@dataclass(frozen=True)
class TokenSplit:
    """Which tokens of a request are loaded, computed and written; everything in whole blocks.

    The store holds full blocks only, and vLLM always computes at least one token (it needs
    the logits), so a full hit still computes the prompt's last block.
    """

    total_tokens: int
    hit_blocks: int  # stored prefix blocks
    load_blocks: int  # of those, loaded (the rest, if any, is recomputed)
    block_size: int

    @classmethod
    def of(cls, shape: ModelShape, total_tokens: int, hit_tokens: int, load_blocks: int | None = None) -> "TokenSplit":
        if total_tokens < 1:
            raise ValueError(f"total_tokens must be >= 1, got {total_tokens}")
        if not 0 <= hit_tokens <= total_tokens:
            raise ValueError(f"hit_tokens must be in [0, total_tokens={total_tokens}], got {hit_tokens}")
        bs = shape.block_size
        hit_blocks = hit_tokens // bs
        loadable = min(hit_blocks, (total_tokens - 1) // bs)
        lb = loadable if load_blocks is None else max(0, min(int(load_blocks), loadable))
        return cls(total_tokens, hit_blocks, lb, bs)

    @property
    def load_tokens(self) -> int:
        return self.load_blocks * self.block_size

    @property
    def new_tokens(self) -> int:
        return self.total_tokens - self.load_tokens

    @property
    def write_blocks(self) -> int:
        """Full blocks the store does not hold yet: written after their layer is computed."""
        return self.total_tokens // self.block_size - self.hit_blocks


@dataclass(frozen=True)
class Prediction:
    """Predicted prefill of one request. Times in seconds, sizes in bytes."""

    total_tokens: int
    hit_tokens: int
    load_tokens: int
    new_tokens: int
    prefetch_depth: int
    layer_io_s: float
    layer_compute_s: float
    layer_write_s: float
    ttft_s: float
    compute_s: float
    io_s: float
    bubble_s: float  # ttft - compute: time the GPU waits for KV
    fill_s: float  # of the bubble: the first layer's load, always exposed
    stall_s: float  # of the bubble: waits between layers (I/O-bound pipeline)
    recompute_ttft_s: float  # no cache: every token computed
    hbm_ttft_s: float  # the whole hit already in HBM: compute only
    write_bytes: int
    write_s: float
    write_in_slack_s: float  # of write_s: done during prefill without overlapping a read
    deferred_write_bytes: int
    deferred_layers: list[int] = field(default_factory=list)

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.total_tokens

    @property
    def speedup(self) -> float:
        """Over recomputing everything."""
        return self.recompute_ttft_s / self.ttft_s

    def to_dict(self) -> dict:
        d = asdict(self)
        d["hit_rate"] = self.hit_rate
        d["speedup"] = self.speedup
        return d


def layer_times(shape: ModelShape, hw: Hardware, profile: "ComputeProfile", split: TokenSplit) -> tuple:
    """(load, compute, write) seconds of one layer."""
    io = split.load_blocks * shape.block_layer_io_bytes / hw.read_bps
    c = profile.layer_time(split.new_tokens, split.load_tokens)
    w = split.write_blocks * shape.block_layer_io_bytes / hw.write_bps
    return io, c, w


def predict(shape: ModelShape, hw: Hardware, profile: "ComputeProfile", total_tokens: int, hit_rate: float,
            prefetch_depth: int = 2, *, hit_tokens: int | None = None, load_blocks: int | None = None) -> Prediction:
    """Predict the prefill of ``total_tokens`` of which ``hit_rate`` (or exactly ``hit_tokens``) are stored.

    ``load_blocks`` caps how many stored blocks are loaded (the rest are recomputed); default all.
    """
    if hit_tokens is None:
        if not 0.0 <= hit_rate <= 1.0:
            raise ValueError(f"hit rate must be in [0, 1], got {hit_rate}")
        hit_tokens = int(hit_rate * total_tokens)
    split = TokenSplit.of(shape, total_tokens, hit_tokens, load_blocks)
    io, c, w = layer_times(shape, hw, profile, split)
    L = shape.n_layers
    tl = simulate_pipeline(L, io, c, prefetch_depth)
    placed = place_writes(tl, w if split.write_blocks else 0.0)
    compute = L * c
    full = TokenSplit.of(shape, total_tokens, hit_tokens)
    deferred = [j for j, p in enumerate(placed) if p is None] if split.write_blocks else []
    write_bytes_layer = split.write_blocks * shape.block_layer_io_bytes
    return Prediction(
        total_tokens=total_tokens, hit_tokens=hit_tokens, load_tokens=split.load_tokens, new_tokens=split.new_tokens,
        prefetch_depth=prefetch_depth, layer_io_s=io, layer_compute_s=c, layer_write_s=w,
        ttft_s=tl.ttft, compute_s=compute, io_s=L * io, bubble_s=tl.ttft - compute,
        fill_s=tl.compute_start[0], stall_s=tl.ttft - compute - tl.compute_start[0],
        recompute_ttft_s=L * profile.layer_time(total_tokens, 0),
        hbm_ttft_s=L * profile.layer_time(full.new_tokens, full.load_tokens),
        write_bytes=L * write_bytes_layer, write_s=L * w,
        write_in_slack_s=(L - len(deferred)) * w if split.write_blocks else 0.0,
        deferred_write_bytes=len(deferred) * write_bytes_layer, deferred_layers=deferred)


def _balance(shape: ModelShape, hw: Hardware, profile: "ComputeProfile", total_tokens: int, h: float) -> float:
    """Per-layer load time minus compute time at hit rate h, with the hit as a continuous token count."""
    hit = h * total_tokens
    io = hit / shape.block_size * shape.block_layer_io_bytes / hw.read_bps
    return io - profile.layer_time(total_tokens - hit, hit)


def crossover_hit_rate(shape: ModelShape, hw: Hardware, profile: "ComputeProfile", total_tokens: int,
                       tol: float = 1e-9) -> float:
    """The hit rate h* where loading a layer's cached prefix takes as long as computing its uncached suffix.

    Below h* the pipeline is compute-bound (only the fill is exposed); above it, I/O-bound and
    bubbles open between layers.  1.0 when loading never takes longer than computing, up to the
    largest hit a request can load (all but the last block).
    """
    # The most a request can load: vLLM computes at least the prompt's last block.
    h_max = TokenSplit.of(shape, total_tokens, total_tokens).load_tokens / total_tokens
    if _balance(shape, hw, profile, total_tokens, h_max) <= 0:
        return 1.0
    lo, hi = 0.0, h_max  # balance(0) = -compute < 0: load time grows and compute time shrinks with h
    while hi - lo > tol:
        mid = (lo + hi) / 2
        if _balance(shape, hw, profile, total_tokens, mid) < 0:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def loading_stops_paying(shape: ModelShape, hw: Hardware, profile: "ComputeProfile", total_tokens: int,
                         prefetch_depth: int = 2) -> float | None:
    """The smallest hit rate at which loading the whole hit is no faster than recomputing everything.

    None when loading pays at every hit rate.  TTFT rises with the hit rate above the crossover
    (every extra block adds load time to an I/O-bound pipeline), so this searches blocks above it.
    """
    bs = shape.block_size

    def ttft(blocks: int) -> float:
        return predict(shape, hw, profile, total_tokens, 0.0, prefetch_depth, hit_tokens=blocks * bs).ttft_s

    recompute = shape.n_layers * profile.layer_time(total_tokens, 0)
    hi = (total_tokens - 1) // bs
    if hi < 1 or ttft(hi) < recompute:
        return None
    lo = min(hi, int(crossover_hit_rate(shape, hw, profile, total_tokens) * total_tokens) // bs)
    if ttft(lo) >= recompute:
        return lo * bs / total_tokens
    while hi - lo > 1:  # ttft(lo) < recompute <= ttft(hi)
        mid = (lo + hi) // 2
        if ttft(mid) < recompute:
            lo = mid
        else:
            hi = mid
    return hi * bs / total_tokens


def best_load_blocks(shape: ModelShape, hw: Hardware, profile: "ComputeProfile", total_tokens: int,
                     hit_tokens: int, prefetch_depth: int = 2) -> int:
    """How many of the stored prefix blocks to load (the rest recomputed) for the lowest predicted TTFT.

    Above the crossover, loading fewer blocks and recomputing the rest shortens an I/O-bound
    pipeline.  Coarse-to-fine search over block counts: TTFT is close to unimodal in them
    (falls while compute-bound, rises while I/O-bound).
    """
    hi = TokenSplit.of(shape, total_tokens, hit_tokens).load_blocks
    cache: dict[int, float] = {}

    def ttft(k: int) -> float:
        if k not in cache:
            cache[k] = predict(shape, hw, profile, total_tokens, 0.0, prefetch_depth, hit_tokens=hit_tokens,
                               load_blocks=k).ttft_s
        return cache[k]

    lo, n = 0, 32
    while hi - lo > n:
        step = (hi - lo) / n
        ks = sorted({lo + round(i * step) for i in range(n + 1)})
        i = min(range(len(ks)), key=lambda j: (ttft(ks[j]), -ks[j]))
        lo, hi = ks[max(0, i - 1)], ks[min(len(ks) - 1, i + 1)]
    return min(range(lo, hi + 1), key=lambda k: (ttft(k), -k))
