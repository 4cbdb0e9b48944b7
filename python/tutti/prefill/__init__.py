"""Layer-wise prefill on a Llama-3-shaped decoder with a vLLM-style paged KV cache (needs torch).

  Decoder, LLAMA3_8B_SHAPE, TINY_SHAPE   random-weight decoder (decoder.py)
  PagedKVCache                           per layer K and V [num_blocks, block_size, kv_heads, head_dim]
  PrefillHarness, RunResult, MODES       recompute / hbm / tutti runs with TTFT and bubble timing
  StoreKV, open_store                    a real store through its GPU data path (tutti.gpu.GpuStore)
  GioKV, HostKV                          raw gio_uring (tutti-admin profile --io); host tensors (CPU tests)
  profile_layer                          one layer's prefill time over a (new, prefix) grid (profiling.py)

Design and numbers: docs/prefill.md.
"""
from .decoder import LLAMA3_8B_SHAPE, TINY_SHAPE, Decoder, attend
from .harness import MODES, PrefillHarness, RunResult, new_block_table
from .kvio import GioKV, HostKV, StoreKV, open_store
from .paged import PagedKVCache

__all__ = ["Decoder", "LLAMA3_8B_SHAPE", "TINY_SHAPE", "attend", "PagedKVCache", "PrefillHarness", "RunResult",
           "MODES", "new_block_table", "GioKV", "HostKV", "StoreKV", "open_store"]
