"""TuttiConnector on architectures other than the tiny Llama: each either works (a second process
loads the shared prefix from the store and its greedy outputs equal recompute) or is refused at
start-up with a ConfigError that says why.  Models are tiny, random and made locally
(tutti.tiny_model's ``arch``).  Also run by hand, not here (each costs CI time and exercises no
path these do not): Qwen2, Qwen3, Gemma3 with only sliding layers, Llama with MQA / float16.
"""
import os
import random

import pytest

from tutti import tiny_model
from vllm_engine import BLOCK, EngineFailed, run_engine, scheduler_stats, worker_stats

PREFIX = 320   # 10 blocks
WINDOW = 64    # sliding window, in tokens: 2 blocks


def _model(vtmp, name, **kw):
    return tiny_model.create(os.path.join(vtmp, "models", name), "tiny", seed=0, **kw)


def _vocab(model):
    import json
    with open(os.path.join(model, "config.json")) as f:
        return json.load(f)["vocab_size"]


def _prompts(vocab, short=False):
    rng = random.Random(11)
    prefix = [rng.randrange(3, vocab) for _ in range(PREFIX)]
    prompts = [prefix + [rng.randrange(3, vocab) for _ in range(30 + 7 * i)] for i in range(2)]
    if short:  # its window lies over blocks that had left the long prompts' windows when they were saved
        prompts.append(prefix[:150] + [rng.randrange(3, vocab) for _ in range(25)])
    return prompts


def _cold_then_warm(vtmp, name, model, prompts, **kw):
    """A first process stores the prompts' blocks, a second one (same store) loads them (all of every
    hit: the comparisons below need the same split into cached and computed tokens as vLLM's own)."""
    store = os.path.join(vtmp, name, "kv.img")
    extra = {"capacity": "16MiB", "load_policy": "all"}
    cold = run_engine(vtmp, f"{name}-cold", model=model, prompts=prompts, store=store, extra=extra, **kw)
    warm = run_engine(vtmp, f"{name}-warm", model=model, prompts=prompts, store=store, extra=extra, **kw)
    assert worker_stats(cold).get("save_blocks", 0) >= PREFIX // BLOCK
    return cold, warm


NO_HMA = {"disable_hybrid_kv_cache_manager": True}
WORKS = {
    # name: (tiny_model.create keywords, vLLM engine arguments)
    # Gemma2's interleaved sliding/full layers as one full-attention group (vLLM without its
    # hybrid KV cache manager): what the refusal below tells the user to do.
    "gemma2-no-hma": (dict(arch="gemma2"), NO_HMA),
}


@pytest.mark.parametrize("name", list(WORKS))
def test_architecture_loads_prefix_and_matches(vtmp, name):
    """One prompt at a time.

    The reference is vLLM without a connector, given the prompts twice: the first time computed
    (the prefix of the second prompt from vLLM's own cache), the second time from vLLM's own cache
    for every full block.  That is the split the connector's runs make: cold computes the first
    prompt, warm loads every full block of both from the store."""
    model_kw, engine_args = WORKS[name]
    model = _model(vtmp, name, **model_kw)
    prompts = _prompts(_vocab(model))
    base = run_engine(vtmp, f"{name}-base", model=model, prompts=prompts + prompts, connector="none",
                      engine_args=engine_args, concurrent=False)
    computed, cached = base["outputs"][:len(prompts)], base["outputs"][len(prompts):]
    cold, warm = _cold_then_warm(vtmp, name, model, prompts, engine_args=engine_args, concurrent=False)
    assert cold["outputs"] == computed
    assert warm["outputs"] == cached
    assert worker_stats(warm).get("load_blocks", 0) >= PREFIX // BLOCK + 1
    assert worker_stats(warm).get("load_errors", 0) == 0


MLA_BLOCK = 16  # vLLM's CPU_MLA backend makes blocks 16 tokens


def test_mla_loads_exactly_what_was_saved(vtmp):
    """DeepSeek-V2-style multi-head latent attention: one latent span (kv_lora_rank 512 + rope 64) per
    token and layer.

    vLLM on CPU has no prefix caching with MLA, so no run without a connector splits a prompt into
    cached and computed tokens the way a connector's load does, and a prefix shared by two different
    prompts has no exact reference at all: vLLM computes the prefix's KV with slightly different
    sums in a longer prompt, and this random model amplifies them (two prompts' KV of the same 320
    tokens differ in a few rows of the second layer; the next greedy token can flip).  What must hold
    exactly: a prompt computed whole equals vLLM's own output; the same prompt asked again loads every
    full block and equals vLLM's own reference connector (ExampleConnector: the same split into
    loaded and computed tokens, KV bytes kept as tensors), in this process and in the next one; a
    different prompt with the same prefix loads the prefix's blocks."""
    model = _model(vtmp, "deepseek_v2-mla", arch="deepseek_v2")
    p1, p2 = _prompts(_vocab(model))
    base = run_engine(vtmp, "mla-base", model=model, prompts=[p1, p2], connector="none", concurrent=False)
    store = os.path.join(vtmp, "mla", "kv.img")
    extra = {"capacity": "16MiB", "load_policy": "all"}
    cold = run_engine(vtmp, "mla-cold", model=model, prompts=[p1, p1, p2], store=store, extra=extra,
                      concurrent=False)
    warm = run_engine(vtmp, "mla-warm", model=model, prompts=[p1, p1], store=store, extra=extra,
                      concurrent=False)
    example_dir = os.path.join(vtmp, "mla", "example")
    example = run_engine(vtmp, "mla-example", model=model, prompts=[p1, p1], connector="example",
                         extra={"shared_storage_path": example_dir}, concurrent=False)
    assert os.listdir(example_dir)                         # it saved, so its repeat loaded
    assert cold["outputs"][0] == base["outputs"][0]        # computed whole, nothing to load
    assert cold["outputs"][1] == example["outputs"][1]     # loaded: the reference's load, token for token
    assert warm["outputs"] == [cold["outputs"][1]] * 2
    full = len(p1) // MLA_BLOCK
    # cold: the repeat loads p1's full blocks, p2 the shared prefix's; warm: p1's twice.
    assert scheduler_stats(cold)["hit_tokens"] == full * MLA_BLOCK + PREFIX
    assert worker_stats(cold)["load_blocks"] == full + PREFIX // MLA_BLOCK
    assert worker_stats(warm)["load_blocks"] == 2 * full
    for r in (cold, warm):
        assert worker_stats(r).get("load_errors", 0) == 0
        assert worker_stats(r).get("corrupt_blocks", 0) == 0


def test_sliding_window_loads_only_the_window(vtmp):
    """Mistral-style, every layer a 64-token window (with one KV head of 128, float32), prompts of
    ~350 tokens prefilled in chunks of 128: vLLM frees blocks that leave the window (the null block
    in their place).  The hit covers the whole prefix, but only the blocks in the window are loaded
    (none into the null block), each chunk's saves hold the right KV (a shorter prompt's window lies
    over blocks that had left the long prompts' windows when they were saved), and outputs equal
    vLLM's without a connector."""
    model = _model(vtmp, "mistral-w64", arch="mistral", sliding_window=WINDOW, num_key_value_heads=1,
                   head_dim=128, dtype="float32")
    prompts = _prompts(_vocab(model), short=True)
    kw = dict(max_num_batched_tokens=128, engine_args={"dtype": "float32"})
    base = run_engine(vtmp, "mistral-base", model=model, prompts=prompts, connector="none", **kw)
    cold, warm = _cold_then_warm(vtmp, "mistral", model, prompts, **kw)
    assert cold["outputs"] == base["outputs"]
    assert warm["outputs"] == base["outputs"]
    hit_blocks = scheduler_stats(warm)["hit_tokens"] // BLOCK
    loaded = worker_stats(warm).get("load_blocks", 0)
    assert hit_blocks >= PREFIX // BLOCK
    assert 0 < loaded <= len(prompts) * -(-WINDOW // BLOCK) < hit_blocks
    assert worker_stats(warm).get("load_errors", 0) == 0


def test_interleaved_sliding_and_full_attention_is_refused(vtmp):
    """Gemma2 (sliding and full layers alternating) has two KV cache groups under vLLM's hybrid
    manager: one store block cannot follow two block tables, so the engine does not start."""
    model = _model(vtmp, "gemma2-no-hma", arch="gemma2")
    with pytest.raises(EngineFailed) as e:
        run_engine(vtmp, "gemma2-hma", model=model, prompts=_prompts(_vocab(model)),
                   store=os.path.join(vtmp, "gemma2-hma", "kv.img"))
    log = e.value.log
    assert "ConfigError" in log and "one group" in log
    assert "SlidingWindowSpec(window 64)" in log and "disable-hybrid-kv-cache-manager" in log
