"""What a store holds: the model fingerprint and the store geometry.

Plain dataclasses with no libtutti dependency, so configuration code (the CLI,
a vLLM connector's scheduler side) can use them without loading the extension.
"""
import json
import operator
import os
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Fingerprint:
    """Identity of the KV cache a store serves; a store never serves another model's KV.

    ``kv_heads`` is per tensor-parallel rank: each rank keeps its own store.
    """

    model_id: str
    dtype: str
    n_layers: int
    kv_heads: int
    head_dim: int
    block_size: int
    tp_rank: int = 0
    tp_size: int = 1

    def __post_init__(self):
        for name in ("n_layers", "kv_heads", "head_dim", "block_size", "tp_rank", "tp_size"):
            value = getattr(self, name)
            try:
                whole = operator.index(value) if not isinstance(value, bool) else None
            except TypeError:
                whole = None
            if whole is None:  # a float, str or None would only fail later, in C conversion, unnamed
                raise TypeError(f"fingerprint: {name} must be an int, not {type(value).__name__}")
            object.__setattr__(self, name, whole)  # frozen; a numpy integer becomes an int
        for name in ("n_layers", "kv_heads", "head_dim", "block_size", "tp_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"fingerprint: {name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.tp_rank < self.tp_size:
            raise ValueError(f"fingerprint: tp_rank {self.tp_rank} not in [0, tp_size={self.tp_size})")
        for name in ("model_id", "dtype"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise TypeError(f"fingerprint: {name} must be a str, not {type(value).__name__}")
            # The store keeps them as C strings: "a\0b" would be kept as "a", one identity for two models.
            if "\0" in value:
                raise ValueError(f"fingerprint: {name} {value[:40]!r} holds a NUL character")
        if not self.model_id:
            raise ValueError("fingerprint: model_id must not be empty")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_config(cls, path_or_dict, block_size=16, dtype=None, tp_rank=0, tp_size=1,
                    model_id=None) -> "Fingerprint":
        """Fingerprint of a Hugging Face model from its ``config.json``.

        ``path_or_dict`` is the model directory, the config file, or the parsed
        config.  The model id defaults to the config's ``_name_or_path``, then to
        the model directory's name.
        """
        if isinstance(path_or_dict, dict):
            config, where = path_or_dict, "config"
        else:
            path = os.fspath(path_or_dict)
            if os.path.isdir(path):
                path = os.path.join(path, "config.json")
            try:
                with open(path, encoding="utf-8") as f:
                    config = json.load(f)
            except FileNotFoundError:
                raise ValueError(f"{path}: no such model config") from None
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: not valid JSON: {e}") from None
            except UnicodeDecodeError:
                raise ValueError(f"{path}: not UTF-8 text, so not a JSON model config") from None
            except RecursionError:
                raise ValueError(f"{path}: JSON nested too deeply for a model config") from None
            where = path
            if not isinstance(config, dict):
                raise ValueError(f"{path}: a model config is a JSON object, not {_json_type(config)}")
            if model_id is None and not config.get("_name_or_path"):
                model_id = os.path.basename(os.path.dirname(os.path.abspath(path)))
        if not isinstance(config, dict):
            raise ValueError(f"{where}: a model config is a JSON object, not {_json_type(config)}")
        # Multimodal configs keep the language model's shape in text_config.
        if "num_hidden_layers" not in config and isinstance(config.get("text_config"), dict):
            config = {**config, **config["text_config"]}

        def count(key):
            """config[key] as a whole number >= 1, None if absent; ValueError if it is anything else."""
            v = config.get(key)
            if v is None:
                return None
            whole = (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer())
            if not whole or v < 1:
                raise ValueError(f"{where}: '{key}' must be a whole number >= 1, got {json.dumps(v)[:40]}")
            return int(v)

        n_layers = count("num_hidden_layers")
        if n_layers is None:
            raise ValueError(f"{where}: missing 'num_hidden_layers'")
        attn_heads = count("num_attention_heads")
        kv_heads = count("num_key_value_heads") or attn_heads
        if kv_heads is None:
            raise ValueError(f"{where}: missing 'num_key_value_heads' and 'num_attention_heads'")
        head_dim = count("head_dim")
        if head_dim is None:
            hidden = count("hidden_size")
            if attn_heads is None or hidden is None:
                raise ValueError(f"{where}: missing 'head_dim' (and 'hidden_size' / "
                                 "'num_attention_heads' to derive it)")
            head_dim = hidden // attn_heads
            if head_dim < 1:
                raise ValueError(f"{where}: 'hidden_size' {hidden} / 'num_attention_heads' {attn_heads} gives "
                                 "head_dim 0; give 'head_dim'")
        if dtype is None:
            dtype = config.get("torch_dtype") or config.get("dtype")
            if dtype is None:
                raise ValueError(f"{where}: missing 'torch_dtype'; pass dtype= explicitly")
            if isinstance(dtype, (dict, list, bool, int, float)):  # a torch.dtype (a parsed dict's) is fine
                raise ValueError(f"{where}: 'torch_dtype' must be a string, not {_json_type(dtype)}")
        dtype = str(dtype).removeprefix("torch.")
        model_id = model_id or config.get("_name_or_path")
        if not model_id:
            raise ValueError(f"{where}: no '_name_or_path'; pass model_id= explicitly")
        if not isinstance(model_id, str):
            raise ValueError(f"{where}: '_name_or_path' must be a string, not {_json_type(model_id)}")
        if tp_size < 1:
            raise ValueError(f"tp_size must be >= 1, got {tp_size}")
        try:
            return cls(model_id=model_id, dtype=dtype, n_layers=n_layers,
                       kv_heads=-(-kv_heads // tp_size), head_dim=head_dim,
                       block_size=block_size, tp_rank=tp_rank, tp_size=tp_size)
        except ValueError as e:  # say which config gave the value
            raise ValueError(f"{where}: {e}") from None


def _json_type(v) -> str:
    """The JSON name of a parsed value's type, for messages."""
    for t, name in ((dict, "an object"), (list, "an array"), (str, "a string"), (bool, "a boolean"),
                    (int, "a number"), (float, "a number")):
        if isinstance(v, t):
            return name
    return "null"


@dataclass(frozen=True)
class Geometry:
    """Shape of a store: a slot holds one KV block as n_layers * n_spans objects."""

    n_layers: int
    n_spans: int
    span_bytes: int
    obj_stride: int
    n_members: int
    stripe_objs: int
    n_slots: int
    data_off: int

    @property
    def block_bytes(self) -> int:
        """Payload of one block, the buffer size of ``Store.put``/``Store.get``."""
        return self.n_layers * self.n_spans * self.span_bytes

    @property
    def slot_bytes(self) -> int:
        """Disk space of one slot (objects rounded up to 4 KiB)."""
        return self.n_layers * self.n_spans * self.obj_stride

    def to_dict(self) -> dict:
        return asdict(self)


LLAMA3_8B = Fingerprint(model_id="meta-llama/Meta-Llama-3-8B", dtype="bfloat16", n_layers=32,
                        kv_heads=8, head_dim=128, block_size=16)
