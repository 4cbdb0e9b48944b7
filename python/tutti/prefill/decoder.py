"""A Llama-3-shaped decoder with random weights, prefilling against a vLLM-style paged KV cache.

Only the shapes matter for timing (what a layer costs, how much KV it reads),
so the weights are random: made on the target device in one pass, no model
hub.  Attention of the new tokens covers the cached prefix and themselves,
causal aligned to the lower right (query i sees keys up to prefix + i).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..sched.model import ModelShape
from .paged import PagedKVCache

LLAMA3_8B_SHAPE = ModelShape(32, 4096, 32, 8, 128, 14336, name="llama3-8b")
# Small enough for CPU tests, with GQA (4 query heads per KV head) like the real one.
TINY_SHAPE = ModelShape(2, 128, 8, 2, 16, 256, dtype_bytes=4, name="tiny")


@dataclass
class LayerWeights:
    norm_attn: torch.Tensor
    wqkv: torch.Tensor  # [(H + 2 KV) * D, hidden]
    wo: torch.Tensor  # [hidden, H * D]
    norm_mlp: torch.Tensor
    wgu: torch.Tensor  # [2 * intermediate, hidden]: gate and up stacked
    wd: torch.Tensor  # [hidden, intermediate]


def _randn(shape, fan_in, device, dtype, gen):
    # Scaled so activations stay O(1) through the layers (no NaN/inf in bf16).
    return torch.randn(shape, device=device, dtype=dtype, generator=gen) / math.sqrt(fan_in)


class Decoder:
    """Random-weight decoder of ``shape``: embeddings, ``n_layers`` blocks, final norm, tied LM head."""

    def __init__(self, shape: ModelShape, *, device="cpu", dtype=torch.float32, vocab: int = 1024,
                 rope_theta: float = 500000.0, eps: float = 1e-5, seed: int = 0):
        self.shape, self.device, self.dtype, self.eps = shape, torch.device(device), dtype, eps
        gen = torch.Generator(device=self.device).manual_seed(seed)
        s, h = shape, shape.hidden
        self.embed = _randn((vocab, h), 1, device, dtype, gen)
        self.layers = [
            LayerWeights(
                norm_attn=torch.ones(h, device=device, dtype=dtype),
                wqkv=_randn(((s.n_heads + 2 * s.n_kv_heads) * s.head_dim, h), h, device, dtype, gen),
                wo=_randn((h, s.n_heads * s.head_dim), s.n_heads * s.head_dim, device, dtype, gen),
                norm_mlp=torch.ones(h, device=device, dtype=dtype),
                wgu=_randn((2 * s.intermediate, h), h, device, dtype, gen),
                wd=_randn((h, s.intermediate), s.intermediate, device, dtype, gen),
            )
            for _ in range(s.n_layers)
        ]
        self.norm = torch.ones(h, device=device, dtype=dtype)
        self.inv_freq = 1.0 / (rope_theta ** (torch.arange(0, s.head_dim, 2, device=device,
                                                           dtype=torch.float32) / s.head_dim))

    # ------------------------------------------------------------- pieces

    def _rms(self, x, w):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * w

    def _rope(self, x, positions):
        # x: [T, heads, D]; rotate-half RoPE as in Llama
        ang = positions.float()[:, None] * self.inv_freq[None, :]
        cos, sin = torch.cat([ang.cos()] * 2, -1)[:, None, :], torch.cat([ang.sin()] * 2, -1)[:, None, :]
        half = x.shape[-1] // 2
        rot = torch.cat([-x[..., half:], x[..., :half]], -1)
        return (x.float() * cos + rot.float() * sin).to(x.dtype)

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.embed[tokens]

    def logits(self, x_last: torch.Tensor) -> torch.Tensor:
        return (self._rms(x_last, self.norm) @ self.embed.T).float()

    # ------------------------------------------------------------- one layer

    def layer(self, l: int, x: torch.Tensor, cache: PagedKVCache, block_table: torch.Tensor,
              prefix_len: int) -> torch.Tensor:
        """Layer ``l`` over the ``T`` new tokens ``x`` [T, hidden] at positions prefix_len.. .

        Writes their K and V into the paged cache (slots from ``block_table``),
        then attends over prefix + new keys gathered from the cache.
        """
        s, w = self.shape, self.layers[l]
        T = x.shape[0]
        H, KV, D = s.n_heads, s.n_kv_heads, s.head_dim
        positions = torch.arange(prefix_len, prefix_len + T, device=x.device)
        qkv = self._rms(x, w.norm_attn) @ w.wqkv.T
        q, k, v = qkv.split([H * D, KV * D, KV * D], dim=-1)
        q = self._rope(q.view(T, H, D), positions)
        k = self._rope(k.view(T, KV, D), positions)
        cache.write(l, block_table, prefix_len, k, v.view(T, KV, D))
        keys, values = cache.gather(l, block_table, prefix_len + T)
        o = attend(q, keys, values)
        x = x + o.reshape(T, H * D) @ w.wo.T
        g, u = (self._rms(x, w.norm_mlp) @ w.wgu.T).chunk(2, dim=-1)
        return x + (F.silu(g) * u) @ w.wd.T

    def prefill(self, tokens: torch.Tensor, cache: PagedKVCache, block_table: torch.Tensor, prefix_len: int,
                before_layer=None, after_layer=None) -> torch.Tensor:
        """Logits of the last token, after running every layer over ``tokens`` (the uncached suffix).

        ``before_layer(l)`` / ``after_layer(l)`` let a harness order each layer
        against I/O (wait for layer l's KV; start writes once it is computed).
        """
        x = self.embed_tokens(tokens)
        for l in range(self.shape.n_layers):
            if before_layer:
                before_layer(l)
            x = self.layer(l, x, cache, block_table, prefix_len)
            if after_layer:
                after_layer(l)
        return self.logits(x[-1:])


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Attention of T queries [T, H, D] over S >= T keys [S, KV, D], causal aligned to the lower right.

    GPU: flash attention (GQA native, lower-right causal when S > T) through
    SDPA with ``causal_lower_right``; restricted to flash so a silent fallback
    to a materialised S x T mask can never happen.  CPU: the same call, math
    kernel.
    """
    from torch.nn.attention.bias import causal_lower_right

    T, S = q.shape[0], k.shape[0]
    qh, kh, vh = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))  # [1, heads, len, D]
    mask = causal_lower_right(T, S)
    if q.is_cuda:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        try:
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, enable_gqa=True)
        except RuntimeError:  # a build whose flash kernel refuses GQA: expand heads, memory-efficient kernel
            rep = q.shape[1] // k.shape[1]
            kh, vh = kh.repeat_interleave(rep, dim=1), vh.repeat_interleave(rep, dim=1)
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
                o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask)
    else:
        rep = q.shape[1] // k.shape[1]
        kh, vh = kh.repeat_interleave(rep, dim=1), vh.repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask)
    return o.squeeze(0).transpose(0, 1)  # [T, H, D]
