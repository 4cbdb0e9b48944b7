"""The worker keeps the KV cache tensors it was given alive: a caller that drops its own references (vLLM keeps
them; a script or another framework may not) must not leave the store moving bytes through freed memory.
Found by benchmarks/write_budget.py, which passed temporaries: heap corruption, then a crash in malloc
(AddressSanitizer: heap-use-after-free in tt_txn_layer's memcpy from the freed tensor)."""
import gc
import weakref

import pytest
import torch

from tutti.vllm.config import ModelShape, TuttiConfig
from tutti.vllm.metadata import BlockTransfer, TuttiMetadata
from tutti.vllm.stats import TuttiStats
from tutti.vllm.worker import WorkerSide

BS, L, NB = 16, 2, 8


def name(l):
    return f"model.layers.{l}.self_attn.attn"


@pytest.mark.parametrize("data_path", ["cpu", "host"])
def test_registered_kv_caches_outlive_the_callers_references(tmp_path, data_path, request):
    if data_path == "host":
        request.getfixturevalue("gpu_lib")
    cfg = TuttiConfig.from_extra({"path": str(tmp_path / "kv.img"), "capacity": "64MiB", "data_path": data_path,
                                  "save_mode": "step"})
    shape = ModelShape(model_id="tests/kv-lifetime", dtype="float16", n_layers=L, kv_heads=1, head_dim=16,
                       block_size=BS, tp_size=1)
    w = WorkerSide(cfg, shape, 0, TuttiStats())
    g = torch.Generator().manual_seed(3)
    kv = {name(l): torch.randn(2, NB, BS, 1, 16, generator=g).half() for l in range(L)}
    want = {k: t[:, :2].clone() for k, t in kv.items()}
    refs = [weakref.ref(t) for t in kv.values()]
    w.register_kv_caches(kv, NB)
    del kv
    gc.collect()
    assert all(r() is not None for r in refs), "the worker let its KV cache tensors be freed"
    junk = [torch.full((2, NB, BS, 1, 16), 7.0).half() for _ in range(64)]  # would reuse freed memory
    try:
        keys = [b"k0", b"k1"]
        meta = TuttiMetadata(saves=[BlockTransfer("r", keys, [0, 1])], step=1)
        w.start_load(meta)
        for l in range(L):
            w.save_layer(meta, name(l))
        w.finish_save(meta)
        w.take_worker_meta()
        meta = TuttiMetadata(loads=[BlockTransfer("q", keys, [4, 5])], step=2)
        w.start_load(meta)
        for l in range(L):
            w.wait_layer(name(l))
        w.finish_save(meta)
        assert not w.take_load_errors()
        for l, r in enumerate(refs):
            t = r()
            assert torch.equal(t[:, 4:6], want[name(l)]), f"layer {l}: the loaded blocks differ from the saved"
    finally:
        w.close()
    del junk
