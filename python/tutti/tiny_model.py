"""A Llama-style model with random weights, made locally (no model hub).

For the vLLM demo, tests and benchmark: a byte-level BPE tokenizer trained
offline on generated text, a ``LlamaConfig`` with a large ``initializer_range``
so greedy decoding produces varied tokens, and safetensors weights.  Everything
is deterministic in ``seed``, so two processes that build the same model get
identical weights.  Needs torch, transformers and tokenizers (they come with vLLM).

``arch`` picks another architecture with the same tokenizer and sizes (``ARCHS``:
Mistral, Qwen2/3, Gemma2/3, DeepSeek-V2's MLA), for the connector's model tests;
``overrides`` are passed to the config (``sliding_window``, ``head_dim``, ...).
"""
import json
import os
import random

SIZES = {
    # name: (hidden, layers, heads, kv_heads, intermediate)
    "tiny": (256, 2, 4, 2, 512),      # tests: loads in seconds
    "small": (768, 6, 12, 4, 2048),   # demo: prefill of a few K tokens takes seconds on 2 cores
    "bench": (1024, 8, 16, 4, 2816),  # benchmark: prefill clearly not trivial
}

_WORDS = ("the store keeps every block of the prefix on disk so a restarted server reads it back "
          "instead of computing attention again for each layer and each head of the model while "
          "requests share a long system prompt with documents tables code and questions").split()


def _corpus(seed, n_lines=4000):
    rng = random.Random(seed)
    for _ in range(n_lines):
        yield " ".join(rng.choice(_WORDS) + ("" if rng.random() < 0.8 else str(rng.randint(0, 999)))
                       for _ in range(rng.randint(5, 30)))


# arch: (transformers config class, model class, config keys of that architecture)
ARCHS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": None}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),               # q/k/v biases
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 64}),  # q/k norms
    # Interleaved sliding-window and full-attention layers; tied embeddings, as vLLM loads them.
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {"head_dim": 64, "query_pre_attn_scalar": 64,
                                                     "sliding_window": 64, "tie_word_embeddings": True}),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", {"head_dim": 64, "query_pre_attn_scalar": 64,
                                                         "sliding_window": 64, "tie_word_embeddings": True}),
    # Multi-head latent attention: one latent (kv_lora_rank + rope dims) per token and layer, 512 + 64
    # as in DeepSeek-V2/V3 (vLLM's CPU MLA kernel takes no other); dense MLPs.
    "deepseek_v2": ("DeepseekV2Config", "DeepseekV2ForCausalLM",
                    {"kv_lora_rank": 512, "q_lora_rank": None, "qk_nope_head_dim": 32,
                     "qk_rope_head_dim": 64, "v_head_dim": 32, "first_k_dense_replace": 1 << 10,
                     "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64}),
}


def make_prompt_ids(n_tokens, seed, vocab_size):
    """``n_tokens`` deterministic token ids (avoiding the special ids 0..2)."""
    rng = random.Random(seed)
    return [rng.randrange(3, vocab_size) for _ in range(n_tokens)]


def create(path, size="tiny", seed=0, vocab_size=2048, max_positions=16384, dtype="bfloat16",
           arch="llama", **overrides):
    """Write a random-weight model of ``arch`` and its tokenizer into ``path``; returns ``path``.

    Skips the work if ``path`` already holds a model made with the same arguments.
    """
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    hidden, layers, heads, kv_heads, inter = SIZES[size]
    config_cls, model_cls, arch_keys = ARCHS[arch]
    stamp = {"size": size, "seed": seed, "vocab_size": vocab_size, "max_positions": max_positions,
             "dtype": dtype, "version": 1}
    if arch != "llama" or overrides:
        stamp.update(arch=arch, overrides=overrides)
    stamp_path = os.path.join(path, "tutti_tiny_model.json")
    try:
        with open(stamp_path) as f:
            if json.load(f) == stamp:
                return path
    except (OSError, ValueError):
        pass
    os.makedirs(path, exist_ok=True)

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(_corpus(seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>")
    fast.model_max_length = max_positions
    fast.save_pretrained(path)

    keys = dict(vocab_size=tok.get_vocab_size(), hidden_size=hidden, intermediate_size=inter,
                num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                max_position_embeddings=max_positions, initializer_range=0.5, bos_token_id=1,
                eos_token_id=2, tie_word_embeddings=False, torch_dtype=dtype)
    keys.update(arch_keys)
    keys.update(overrides)
    config = getattr(transformers, config_cls)(**keys)
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config).to(getattr(torch, dtype))
    model.save_pretrained(path, safe_serialization=True)
    with open(stamp_path, "w") as f:
        json.dump(stamp, f)
    return path


if __name__ == "__main__":
    import sys
    print(create(sys.argv[1], *(sys.argv[2:3] or ["tiny"])))
