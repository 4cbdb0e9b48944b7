"""vLLM-style paged KV cache: per layer, K and V as [num_blocks, block_size, kv_heads, head_dim].

One tensor [n_layers, 2, num_blocks, block_size, kv_heads, head_dim] (vLLM's
flash-attention layout per layer), so in every layer object (block b, span s)
sits at base(layer) + b * block_stride + s * span_stride: exactly what one
gio layer descriptor describes.
"""
from __future__ import annotations

import torch

from ..sched.model import ModelShape


class PagedKVCache:
    def __init__(self, shape: ModelShape, num_blocks: int, *, device="cpu", dtype=torch.float32):
        self.shape, self.num_blocks, self.block_size = shape, num_blocks, shape.block_size
        self.kv = torch.zeros((shape.n_layers, 2, num_blocks, shape.block_size, shape.n_kv_heads, shape.head_dim),
                              device=device, dtype=dtype)

    # ---- geometry for the I/O path (bytes)

    @property
    def span_bytes(self) -> int:
        """One object: K (or V) of one block in one layer."""
        return self.kv[0, 0, 0].numel() * self.kv.element_size()

    @property
    def block_stride(self) -> int:
        return self.kv.stride(2) * self.kv.element_size()

    @property
    def span_stride(self) -> int:
        return self.kv.stride(1) * self.kv.element_size()

    def layer_base(self, layer: int) -> int:
        return self.kv[layer].data_ptr()

    # ---- token access

    def write(self, layer: int, block_table: torch.Tensor, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store K/V [T, kv_heads, D] of the tokens at positions start.. into their blocks."""
        pos = torch.arange(start, start + k.shape[0], device=k.device)
        blocks, offs = block_table[pos // self.block_size].long(), pos % self.block_size
        self.kv[layer, 0, blocks, offs] = k
        self.kv[layer, 1, blocks, offs] = v

    def gather(self, layer: int, block_table: torch.Tensor, n_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V [n_tokens, kv_heads, D] of positions 0..n_tokens-1 (what a paged attention kernel reads)."""
        nb = -(-n_tokens // self.block_size)
        ids = block_table[:nb].long()
        k = self.kv[layer, 0, ids].flatten(0, 1)[:n_tokens]
        v = self.kv[layer, 1, ids].flatten(0, 1)[:n_tokens]
        return k, v
