"""Ask CUDA for 32 hardware work queues before it makes its context.

The emulated controller's copies must not share a hardware queue with kernels that spin for their
completions (libtutti/src/gpu/hw_queues.cu says why); the count is fixed when a CUDA context is made, from
CUDA_DEVICE_MAX_CONNECTIONS (default 8).  Importing tutti.gpu sets it when nobody chose and no context
exists yet, as libtutti_gpu.so itself does when loaded; later, it is too late and the emulated controller
refuses to start, saying so.
"""
import ctypes
import os

WANT = 32
_requested = False  # whether request() set the variable (so it is not the user's)


def context_exists() -> bool:
    """Whether this process already made a CUDA primary context (libcuda loaded and initialised)."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1", mode=os.RTLD_NOLOAD | os.RTLD_NOW)
    except OSError:
        return False
    n = ctypes.c_int(0)
    if cuda.cuDeviceGetCount(ctypes.byref(n)) != 0:  # not initialised: no context
        return False
    flags, active = ctypes.c_uint(0), ctypes.c_int(0)
    return any(cuda.cuDevicePrimaryCtxGetState(d, ctypes.byref(flags), ctypes.byref(active)) == 0 and active.value
               for d in range(n.value))


def request() -> bool:
    """Set CUDA_DEVICE_MAX_CONNECTIONS=32 if unset and still in time; return whether this call set it."""
    global _requested
    if "CUDA_DEVICE_MAX_CONNECTIONS" in os.environ or context_exists():
        return False
    os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = str(WANT)
    _requested = True
    return True


def user_setting():
    """The CUDA_DEVICE_MAX_CONNECTIONS the user chose (a string), or None if unset or set by request()."""
    v = os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS")
    return None if _requested and v == str(WANT) else v
