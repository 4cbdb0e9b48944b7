"""Every exception Tutti raises on purpose, on one base: ``TuttiBaseError``.

libtutti returns a negative errno and keeps the reason in tt_errmsg(); one
exception type (``TuttiError``, an ``OSError``) carries both, and the few
conditions callers act on get their own subclass.  A cache miss is a
``KeyError``, not a TuttiError.  The other failures (configuration, devices,
the scheduler's profiles, the TP group, benchmarks) keep the built-in base
they always had (``ValueError``, ``RuntimeError``, ...), so existing
``except`` clauses see them as before, and add ``TuttiBaseError``, so one
clause catches whatever Tutti raises.  The modules that raised them before
import them from here, so their old names still work (``tutti.vllm.config.
ConfigError`` is ``tutti.errors.ConfigError``).  One lives elsewhere:
``tutti.cli.common.CliError``, a click exception (how click prints and exits),
also on this base.

Both bindings raise these: tutti.Store (the compiled extension) and
tutti.gpu.GpuStore (libtutti_gpu.so in ABI mode, on machines without the
extension), so this module imports neither; each passes its own ffi/lib.
"""
from __future__ import annotations

import errno as _errno
import os


class TuttiBaseError(Exception):
    """The base of every exception Tutti raises on purpose."""


# ---- libtutti failures (a negative errno and libtutti's reason)

class TuttiError(TuttiBaseError, OSError):
    """A libtutti call failed; ``errno`` and ``strerror`` hold the C error and reason."""


class FingerprintMismatch(TuttiError):
    """The store holds KV cache of another model or layout (-EMEDIUMTYPE)."""


class CorruptBlockError(TuttiError):
    """Stored bytes failed their checksum; the slot was dropped (-EBADMSG)."""


class StoreBusyError(TuttiError):
    """A member is in use by another store handle or mounted (-EBUSY)."""


class GdsUnavailable(TuttiError):
    """cuFile is missing or its driver would not open here; use the staged path."""


class StoreMismatchError(FingerprintMismatch, RuntimeError):
    """The vLLM connector refuses a store made for another model or KV layout: a FingerprintMismatch
    (-EMEDIUMTYPE) whose message says what to do; still a RuntimeError, as it always was."""

    def __init__(self, message: str):
        super().__init__(_errno.EMEDIUMTYPE, message)

    def __str__(self) -> str:
        return str(self.strerror)

    def __reduce__(self):  # OSError's would call __init__ with (errno, strerror)
        return (type(self), (str(self.strerror),))


# ---- bindings and configuration

class GpuLibraryMissing(TuttiBaseError, ImportError):
    """libtutti_gpu.so is not where tutti.gpu looks for it."""


class ConfigError(TuttiBaseError, ValueError):
    """A bad ``kv_connector_extra_config`` for TuttiConnector."""


class LayoutError(TuttiBaseError, ValueError):
    """A KV cache tensor whose blocks are not dense spans."""


class DataPathError(TuttiBaseError, RuntimeError):
    """The configured data path cannot run with this KV cache or on this machine."""


class ProfileError(TuttiBaseError, ValueError):
    """A profile table that cannot be used, with where and why."""


class CdefError(TuttiBaseError, ValueError):
    """A header's cffi section holds something the generator or cffi cannot take."""


# ---- devices, the TP group, runs

class DeviceError(TuttiBaseError):
    """A device command failed: ``usage`` True for bad input (exit 2), else the device cannot be used (exit 3)."""

    def __init__(self, message: str, usage: bool = False, errno_: int = 0):
        super().__init__(message)
        self.usage = usage
        self.errno = errno_


class SmartError(TuttiBaseError, OSError):
    """Reading the log failed: ``errno`` for a failed system call, ``status`` for an NVMe error."""

    def __init__(self, err: int, reason: str, status: int = 0):
        super().__init__(err, reason)
        self.status = status


class GroupError(TuttiBaseError, RuntimeError):
    """A collective of the TP group failed (typically: a rank died)."""


class RunnerFailed(TuttiBaseError, RuntimeError):
    """The engine process exited non-zero; ``log`` holds its output."""

    def __init__(self, name: str, rc: int, log: str, log_path: str):
        super().__init__(f"the {name} run failed (exit {rc}); log {log_path}, tail:\n{log[-4000:]}")
        self.rc, self.log, self.log_path = rc, log, log_path


class BenchError(TuttiBaseError):
    """The benchmark could not run or found wrong data; ``code`` is the exit status to use."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


_BY_ERRNO = {
    _errno.EMEDIUMTYPE: FingerprintMismatch,
    _errno.EBADMSG: CorruptBlockError,
    _errno.EBUSY: StoreBusyError,
}


def error_for(rc: int, what: str = "", *, ffi=None, lib=None, cls=None) -> TuttiError:
    """The exception for negative return code ``rc``, with libtutti's reason (``what: reason``).

    ``ffi``/``lib``: the binding whose tt_errmsg() holds the reason (default: tutti._tutti);
    ``cls``: the class to raise instead of the one the errno picks.
    """
    if lib is None:
        from . import _tutti
        ffi, lib = _tutti.ffi, _tutti.lib
    err = -rc
    reason = ffi.string(lib.tt_errmsg()).decode(errors="replace") or os.strerror(err)
    lib.tt_clearerr()  # so a later failure that sets no reason cannot show this one
    return (cls or _BY_ERRNO.get(err, TuttiError))(err, f"{what}: {reason}" if what else reason)


def check(rc: int) -> int:
    """Return ``rc`` if it is not negative, else raise the matching TuttiError."""
    if rc < 0:
        raise error_for(rc)
    return rc


# The cluster tier (tutti.cluster): each a one-line reason, never a traceback for a user.
class ClusterError(TuttiBaseError, RuntimeError):
    """The cluster tier cannot do what was asked (Mooncake missing, master unreachable, bad config)."""


class DescriptorError(TuttiBaseError, ValueError):
    """A value in the cluster index that is not a location descriptor this tutti trusts: wrong magic,
    version, length or check, another model, or a geometry unlike the local store's."""


class CallTimeout(TuttiBaseError, TimeoutError):
    """A cluster call (Mooncake RPC or transfer) that did not return within its deadline."""
