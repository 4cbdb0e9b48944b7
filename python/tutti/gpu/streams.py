"""CUDA stream handles as the C API takes them."""
from __future__ import annotations

from .._devpath import stream_ptr_of
from ._ffi import ffi


def stream_ptr(stream):
    """``cudaStream_t`` for None (legacy default stream), an int handle, or a torch stream (``.cuda_stream``)."""
    return stream_ptr_of(ffi, stream)
