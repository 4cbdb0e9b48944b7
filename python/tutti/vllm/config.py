"""``kv_connector_extra_config`` of TuttiConnector: parsing, validation, the model fingerprint.

Every option has a default; an unknown option or a bad value is an error that
names the option, so a typo never silently turns the cache off.
"""
import hashlib
import os
import re
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 10**3, "kib": 1 << 10, "m": 1 << 20, "mb": 10**6,
          "mib": 1 << 20, "g": 1 << 30, "gb": 10**9, "gib": 1 << 30, "t": 1 << 40, "tb": 10**12,
          "tib": 1 << 40}


DEFAULT_DIR = os.path.join(os.path.expanduser("~"), ".cache", "tutti")


def parse_size(value, name="capacity") -> int:
    """Bytes from an int or a string like ``"2GiB"``, ``"512 MiB"``, ``"10GB"``."""
    if isinstance(value, bool):
        raise ConfigError(f"{name}: expected a size like '2GiB', got {value!r}")
    if isinstance(value, (int, float)):
        if value != value or value in (float("inf"), float("-inf")):
            raise ConfigError(f"{name}: expected a size like '2GiB' or a byte count, got {value!r}")
        n = int(value)
    else:
        m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", str(value))
        if not m or m.group(2).lower() not in _UNITS:
            raise ConfigError(f"{name}: expected a size like '2GiB' or a byte count, got {value!r}")
        n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if n <= 0:
        raise ConfigError(f"{name}: must be > 0, got {value!r}")
    return n


def _bool(value, name):
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        return value.lower() in ("1", "true", "yes", "on")
    raise ConfigError(f"{name}: expected true or false, got {value!r}")


@dataclass
class TuttiConfig:
    """Options of the connector (all keys of ``kv_connector_extra_config``)."""

    path: list = field(default_factory=list)  # member paths; "{rank}" is the TP rank
    capacity: int = 4 << 30                   # bytes of KV data, when the store is created
    create: bool = True                       # format a missing store
    preallocate: bool = True                  # ... reserving its whole size at once (False: sparse)
    engine: str = "auto"                      # libtutti I/O engine: auto, uring, psync
    data_path: str = "auto"                   # auto, cpu, staged, gds, gio, host (datapath.py)
    verify: bool = True                       # checksum every loaded block
    model_id: str = ""                        # default: the model's name or path
    load_failure_policy: str = "recompute"    # what vLLM does with a block that failed to load
    lookahead_layers: int = 2                 # layers of a load in flight ahead of the model
    cpu_threads: int = 0                      # Store.open's: the CPU's copies and checksums; 0 = auto
    service_cpus: str = "inherit"             # CPUs of tutti's own threads (tutti/affinity.py)
    write_policy: str = "slack"               # slack: writes wait for the reads; eager: at once;
    #                                           after_step: for the step's end (never beside the forward)
    save: bool = True                         # store new blocks
    load: bool = True                         # load stored blocks
    load_policy: str = "auto"                 # auto: load a hit only as far as loading beats recompute
    save_mode: str = "deferred"               # deferred: a save may outlive its step; step: committed in it
    max_pending_bytes: int | None = None      # deferred saves' bytes held at most (None: auto, pending.py)
    drain_bytes_per_step: int | None = None   # carried-over writes a step submits (None: auto, drain.py)
    shutdown_drain_s: float = 10.0            # time shutdown gives pending saves, then drops the rest
    write_budget: str | int | float | None = None  # SSD write budget (admission.py); None: no budget
    write_admission: str = "expected_value"   # which saves a spent budget still writes (admission.py)
    cluster: Any = None                       # tutti.cluster.ClusterConfig from the cluster_* keys; None: off
    profile: Any = None                       # tutti.sched.profile.ComputeProfile (load_policy auto's prior)

    KEYS = ("path", "capacity", "create", "preallocate", "engine", "data_path", "verify", "model_id",
            "load_failure_policy", "lookahead_layers", "cpu_threads", "service_cpus", "write_policy", "save", "load",
            "load_policy", "save_mode",
            "max_pending_bytes", "drain_bytes_per_step", "shutdown_drain_s", "write_budget", "write_admission",
            "profile")

    @classmethod
    def from_extra(cls, extra: dict) -> "TuttiConfig":
        extra = dict(extra or {})
        unknown = sorted(k for k in set(extra) - set(cls.KEYS) if not k.startswith("cluster_"))
        if unknown:
            raise ConfigError(f"TuttiConnector: unknown option(s) {unknown} in "
                              f"kv_connector_extra_config; known: {list(cls.KEYS)} and cluster_* "
                              "(docs/cluster.md)")
        c = cls()
        if "path" in extra:
            p = extra["path"]
            if not isinstance(p, (str, os.PathLike, list, tuple)):
                raise ConfigError(f"path: expected a path or a list of paths, got {p!r}")
            paths = [p] if isinstance(p, (str, os.PathLike)) else list(p)
            if not paths or not all(isinstance(x, (str, os.PathLike)) and str(x) for x in paths):
                raise ConfigError(f"path: expected a path or a list of paths, got {p!r}")
            c.path = [os.fspath(x) for x in paths]
        if "capacity" in extra:
            c.capacity = parse_size(extra["capacity"])
        for name in ("create", "preallocate", "verify", "save", "load"):
            if name in extra:
                setattr(c, name, _bool(extra[name], name))
        if "engine" in extra:
            if extra["engine"] not in ("auto", "uring", "psync"):
                raise ConfigError(f"engine: expected auto, uring or psync, got {extra['engine']!r}")
            c.engine = extra["engine"]
        if "data_path" in extra:
            from .datapath import DATA_PATHS
            if extra["data_path"] not in DATA_PATHS:
                raise ConfigError(f"data_path: expected one of {', '.join(DATA_PATHS)} (auto: cpu for a "
                                  "KV cache in host memory, staged for one on a GPU), got "
                                  f"{extra['data_path']!r}")
            c.data_path = extra["data_path"]
        if "model_id" in extra:
            if not isinstance(extra["model_id"], str) or not extra["model_id"]:
                raise ConfigError(f"model_id: expected a non-empty string, got {extra['model_id']!r}")
            c.model_id = extra["model_id"]
        if "load_failure_policy" in extra:
            if extra["load_failure_policy"] not in ("recompute", "fail"):
                raise ConfigError("load_failure_policy: expected 'recompute' or 'fail', got "
                                  f"{extra['load_failure_policy']!r}")
            c.load_failure_policy = extra["load_failure_policy"]
        if "lookahead_layers" in extra:
            n = extra["lookahead_layers"]
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ConfigError(f"lookahead_layers: expected an integer >= 1, got {n!r}")
            c.lookahead_layers = n
        if "cpu_threads" in extra:
            n = extra["cpu_threads"]
            if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= 1024:
                raise ConfigError(f"cpu_threads: expected an integer from 0 (auto) to 1024, got {n!r}")
            c.cpu_threads = n
        if "service_cpus" in extra:
            v = extra["service_cpus"]
            if isinstance(v, int) and not isinstance(v, bool):
                v = str(v)
            if not isinstance(v, str):
                raise ConfigError(f"service_cpus: expected auto, inherit or a CPU list like 0-3,8, got {v!r}")
            if v not in ("auto", "inherit"):
                from ..affinity import parse_cpu_list
                try:
                    parse_cpu_list(v)
                except ValueError as e:
                    raise ConfigError(f"service_cpus: {e} (expected auto, inherit or a CPU list like "
                                      "0-3,8)") from None
            c.service_cpus = v
        # Options with a few named values: the message says what each value does.
        for name, meanings in (
                ("write_policy", {"slack": "a layer's write waits while the step's reads are in flight",
                                  "eager": "each layer's write goes at once",
                                  "after_step": "a step's writes wait for its end (deferred saves: the "
                                                "drains of later steps), none beside the forward"}),
                ("load_policy", {"auto": "load a stored prefix only as far as loading beats recomputing "
                                         "it, from rates measured while serving",
                                 "all": "always the whole hit"}),
                ("save_mode", {"deferred": "a save may be written and committed in later steps, the "
                                           "request's blocks held until then",
                               "step": "committed in the step that computed it"})):
            if name in extra:
                if not isinstance(extra[name], str) or extra[name] not in meanings:
                    said = " or ".join(f"{v!r} ({m})" for v, m in meanings.items())
                    raise ConfigError(f"{name}: expected {said}, got {extra[name]!r}")
                setattr(c, name, extra[name])
        if extra.get("max_pending_bytes", "auto") != "auto":
            c.max_pending_bytes = parse_size(extra["max_pending_bytes"], "max_pending_bytes")
        if extra.get("drain_bytes_per_step", "auto") != "auto":
            c.drain_bytes_per_step = parse_size(extra["drain_bytes_per_step"], "drain_bytes_per_step")
        if "shutdown_drain_s" in extra:
            t = extra["shutdown_drain_s"]
            if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t <= 3600:
                raise ConfigError(f"shutdown_drain_s: expected seconds between 0 and 3600, got {t!r}")
            c.shutdown_drain_s = float(t)
        _write_admission(c, extra)
        c.cluster = _cluster(extra)
        if extra.get("profile") is not None:
            c.profile = _profile(extra["profile"])
        return c

    def member_paths(self, model_id: str, rank: int, tp_size: int) -> list:
        """This rank's member paths (each rank keeps its own store)."""
        from ..tp.shard import rank_paths
        return rank_paths(self.path or [os.path.join(DEFAULT_DIR, _safe_name(model_id) + ".tutti")],
                          rank, tp_size)


def _profile(value):
    """A profile table (``tutti-admin profile``), read and checked now: a bad one fails the engine's
    start in one line, not the first request.  That it fits the served model is checked by the
    scheduler side, which knows the model."""
    from ..errors import ProfileError
    from ..sched.profile import ComputeProfile
    if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
        raise ConfigError(f"profile: expected the path of a profile table (tutti-admin profile), got {value!r}")
    try:
        return ComputeProfile.from_json(value)
    except ProfileError as e:
        raise ConfigError(f"profile: {e}") from None


def _write_admission(c, extra):
    """``write_budget`` is kept as given (a dwpd budget needs the store's real capacity, which the
    scheduler side reads from the store); here it is only checked, against ``capacity``."""
    from ..admission import POLICIES, parse_budget
    if extra.get("write_budget") is not None:
        try:
            parse_budget(extra["write_budget"], c.capacity)
        except ValueError as e:
            raise ConfigError(f"write_budget: {e} (e.g. '200GB/day', '10GiB/h', '0.3dwpd' or bytes "
                              "per day)") from None
        c.write_budget = extra["write_budget"]
    if "write_admission" in extra:
        if extra["write_admission"] not in POLICIES:
            raise ConfigError(f"write_admission: expected one of {', '.join(POLICIES)}, got "
                              f"{extra['write_admission']!r}")
        c.write_admission = extra["write_admission"]


def _cluster(extra):
    """The cluster tier's settings (docs/cluster.md), or None when no ``cluster_*`` key is given (or
    ``cluster_enable`` is false).  Checked here, so a typo fails the engine's start in one line;
    Mooncake itself is imported only when a node starts."""
    keys = {k: v for k, v in extra.items() if k.startswith("cluster_")}
    if not keys:
        return None
    if not _bool(keys.get("cluster_enable", True), "cluster_enable"):
        return None
    from ..cluster.config import ClusterConfig
    from ..errors import ClusterError
    try:
        return ClusterConfig.from_extra_config(keys)
    except ClusterError as e:
        raise ConfigError(f"TuttiConnector: {e}") from None


def _safe_name(model_id):
    base = re.sub(r"[^A-Za-z0-9._-]+", "_", model_id.strip("/"))[-64:] or "model"
    return f"{base}-{hashlib.sha256(model_id.encode()).hexdigest()[:8]}"


@dataclass(frozen=True)
class ModelShape:
    """What identifies the KV cache of one served model (both connector roles derive it)."""

    model_id: str
    dtype: str
    n_layers: int
    kv_heads: int      # per TP rank
    head_dim: int
    block_size: int
    tp_size: int

    @classmethod
    def from_vllm(cls, vllm_config, cfg: TuttiConfig) -> "ModelShape":
        mc, cc, pc = vllm_config.model_config, vllm_config.cache_config, vllm_config.parallel_config
        if pc.pipeline_parallel_size > 1:
            raise ConfigError("TuttiConnector does not support pipeline parallelism yet "
                              f"(pipeline_parallel_size={pc.pipeline_parallel_size})")
        tp = pc.tensor_parallel_size
        dtype = cc.cache_dtype
        if dtype in (None, "auto"):
            dtype = str(mc.dtype).removeprefix("torch.")
        return cls(model_id=cfg.model_id or str(mc.model), dtype=str(dtype),
                   n_layers=mc.get_num_layers(pc), kv_heads=mc.get_num_kv_heads(pc),
                   head_dim=mc.get_head_size(), block_size=cc.block_size, tp_size=tp)

    def block_bytes_per_rank(self) -> int:
        """Bytes of one block's K and V over all layers on one TP rank (what a load moves)."""
        from ..sched.model import dtype_bytes
        try:
            elem = dtype_bytes(self.dtype)
        except ValueError:
            elem = 2  # an unusual cache dtype: only the load planner's estimate uses this
        return 2 * self.n_layers * self.block_size * self.kv_heads * self.head_dim * elem

    def fingerprint(self, tp_rank: int):
        from ..model import Fingerprint
        def cut(text, n):  # the fields hold n UTF-8 bytes (TT_MODEL_ID_LEN - 1, TT_DTYPE_LEN - 1), not n characters
            return text.encode("utf-8", "surrogateescape")[:n].decode("utf-8", "ignore")
        return Fingerprint(model_id=cut(self.model_id, 127), dtype=cut(self.dtype, 15),
                           n_layers=self.n_layers, kv_heads=self.kv_heads, head_dim=self.head_dim,
                           block_size=self.block_size, tp_rank=tp_rank, tp_size=self.tp_size)

    def key_prefix(self) -> bytes:
        """Bytes put before vLLM's block hash to make a store key: the same prefix of tokens
        under another model, dtype or block size is another key."""
        ident = (f"tutti-vllm-v1|{self.model_id}|{self.dtype}|{self.n_layers}|{self.kv_heads}|"
                 f"{self.head_dim}|{self.block_size}|{self.tp_size}|")
        return ident.encode()
