"""CUDA stream handles as the C API takes them."""
from __future__ import annotations

from ._ffi import ffi


def stream_ptr(stream):
    """``cudaStream_t`` for None (legacy default stream), an int handle, or a torch stream (``.cuda_stream``)."""
    if stream is None:
        return ffi.NULL
    handle = getattr(stream, "cuda_stream", stream)
    if not isinstance(handle, int):
        raise TypeError(f"not a CUDA stream: {stream!r}")
    return ffi.cast("void *", handle)
