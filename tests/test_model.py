"""Fingerprints from Hugging Face configs, and store planning."""
import json
import re

import pytest

from tutti import LLAMA3_8B, Fingerprint, Store, TuttiError, key_from_bytes

# Abridged from meta-llama/Meta-Llama-3-8B's config.json.
LLAMA3_8B_CONFIG = {
    "_name_or_path": "meta-llama/Meta-Llama-3-8B",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "torch_dtype": "bfloat16",
}


def test_from_config_llama3_8b():
    assert Fingerprint.from_config(LLAMA3_8B_CONFIG) == LLAMA3_8B


def test_from_config_file_and_directory(tmp_path):
    model = tmp_path / "my-model"
    model.mkdir()
    config = {k: v for k, v in LLAMA3_8B_CONFIG.items() if k != "_name_or_path"}
    (model / "config.json").write_text(json.dumps(config))
    by_dir = Fingerprint.from_config(model)
    assert by_dir.model_id == "my-model"
    assert Fingerprint.from_config(model / "config.json", model_id="x/y").model_id == "x/y"


def test_from_config_fallbacks_and_tensor_parallel():
    config = {"_name_or_path": "m", "num_hidden_layers": 2, "num_attention_heads": 6,
              "hidden_size": 384, "dtype": "torch.float16"}
    fp = Fingerprint.from_config(config, block_size=32, tp_rank=1, tp_size=4)
    assert (fp.kv_heads, fp.head_dim, fp.dtype) == (2, 64, "float16")  # ceil(6 / 4) heads
    assert (fp.block_size, fp.tp_rank, fp.tp_size) == (32, 1, 4)
    nested = {"_name_or_path": "vlm", "text_config": {**LLAMA3_8B_CONFIG}}
    assert Fingerprint.from_config(nested).n_layers == 32
    explicit = Fingerprint.from_config({**LLAMA3_8B_CONFIG, "head_dim": 96}, dtype="float16")
    assert (explicit.head_dim, explicit.dtype) == (96, "float16")


@pytest.mark.parametrize("drop, message", [
    ("num_hidden_layers", "num_hidden_layers"),
    ("torch_dtype", "torch_dtype"),
    ("_name_or_path", "model_id"),
    ("hidden_size", "head_dim"),
])
def test_from_config_missing_fields(drop, message):
    config = {k: v for k, v in LLAMA3_8B_CONFIG.items() if k != drop}
    with pytest.raises(ValueError, match=message):
        Fingerprint.from_config(config)


def test_from_config_bad_files(tmp_path):
    with pytest.raises(ValueError, match="no such model config"):
        Fingerprint.from_config(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        Fingerprint.from_config(tmp_path)


@pytest.mark.parametrize("config,message", [
    ([1, 2], "a model config is a JSON object, not an array"),
    ({**LLAMA3_8B_CONFIG, "num_hidden_layers": 2.5}, "'num_hidden_layers' must be a whole number >= 1, got 2.5"),
    ({**LLAMA3_8B_CONFIG, "num_hidden_layers": True}, "'num_hidden_layers' must be a whole number"),
    ({**LLAMA3_8B_CONFIG, "num_hidden_layers": "32"}, "'num_hidden_layers' must be a whole number"),
    ({**LLAMA3_8B_CONFIG, "num_attention_heads": 0, "num_key_value_heads": None}, "'num_attention_heads'"),
    ({**LLAMA3_8B_CONFIG, "torch_dtype": ["bf16"]}, "'torch_dtype' must be a string"),
])
def test_from_config_refuses_what_is_not_a_model(config, message, tmp_path):
    """What a config.json may hold but no model has: ValueError saying which key (never AttributeError,
    ZeroDivisionError, or a silently truncated 2.5 layers)."""
    if isinstance(config, dict):
        with pytest.raises(ValueError, match=re.escape(message)):
            Fingerprint.from_config(config)
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=re.escape(message)):
        Fingerprint.from_config(tmp_path)
    assert Fingerprint.from_config({**LLAMA3_8B_CONFIG, "num_hidden_layers": 32.0}).n_layers == 32


def test_fingerprint_that_does_not_fit_the_c_struct_is_a_value_error():
    huge = Fingerprint("m", "bfloat16", 1 << 32, 8, 128, 16)
    with pytest.raises(ValueError, match="n_layers 4294967296 does not fit"):
        Store.plan(1, huge, n_slots=4)
    with pytest.raises(ValueError, match="model_id longer than 127 bytes"):
        Store.plan(1, Fingerprint("m" * 128, "bfloat16", 2, 1, 64, 16), n_slots=4)


def test_fingerprint_validates():
    with pytest.raises(ValueError, match="tp_rank"):
        Fingerprint("m", "bfloat16", 32, 8, 128, 16, tp_rank=2, tp_size=2)
    with pytest.raises(ValueError, match="n_layers"):
        Fingerprint("m", "bfloat16", 0, 8, 128, 16)


def test_plan_by_capacity_counts_padded_objects():
    # 4 KiB objects need no padding; 3 KiB objects take 4 KiB on disk each.
    geo, need = Store.plan(2, LLAMA3_8B, capacity_bytes=1 << 30)
    assert geo.slot_bytes == geo.block_bytes == 2 << 20
    assert geo.n_slots == 512 and geo.n_members == 2
    assert need >= geo.data_off + 256 * geo.slot_bytes
    geo, _ = Store.plan(1, LLAMA3_8B, capacity_bytes=40 << 20, span_bytes=3 << 10)
    assert (geo.span_bytes, geo.obj_stride) == (3 << 10, 4 << 10)
    assert geo.n_slots == (40 << 20) // (32 * 2 * 4096)


def test_plan_by_member_size():
    geo, need = Store.plan(1, LLAMA3_8B, member_bytes=100 << 20)
    assert geo.n_slots > 0 and need <= 100 << 20
    assert geo.data_off + geo.n_slots * geo.slot_bytes <= 100 << 20


def test_plan_rejects_bad_requests():
    with pytest.raises(ValueError, match="not both"):
        Store.plan(1, LLAMA3_8B, n_slots=4, capacity_bytes=1 << 30)
    with pytest.raises(ValueError, match="holds no block"):
        Store.plan(1, LLAMA3_8B, capacity_bytes=1 << 20)
    with pytest.raises(ValueError, match="n_slots, capacity_bytes or member_bytes"):
        Store.plan(1, LLAMA3_8B)
    with pytest.raises(TuttiError, match="dtype"):
        Store.plan(1, Fingerprint("m", "float7", 2, 1, 64, 16), n_slots=4)
    with pytest.raises(TuttiError, match="members"):
        Store.plan(17, LLAMA3_8B, n_slots=4)


def test_key_from_bytes_hashes_every_key():
    k = key_from_bytes("prefix")
    assert len(k) == 16
    assert k == key_from_bytes(b"prefix") == key_from_bytes(memoryview(b"prefix"))
    assert key_from_bytes(k) != k  # a 16-byte key is hashed like any other
    assert key_from_bytes(b"") != key_from_bytes(b"\0")
