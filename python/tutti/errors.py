"""Exceptions raised for libtutti failures.

libtutti returns a negative errno and keeps the reason in tt_errmsg(); one
exception type carries both, and the few conditions callers act on get their
own subclass.  A cache miss is a ``KeyError``, not a TuttiError.

Both bindings raise these: tutti.Store (the compiled extension) and
tutti.gpu.GpuStore (libtutti_gpu.so in ABI mode, on machines without the
extension), so this module imports neither; each passes its own ffi/lib.
"""
import errno as _errno
import os


class TuttiError(OSError):
    """A libtutti call failed; ``errno`` and ``strerror`` hold the C error and reason."""


class FingerprintMismatch(TuttiError):
    """The store holds KV cache of another model or layout (-EMEDIUMTYPE)."""


class CorruptBlockError(TuttiError):
    """Stored bytes failed their checksum; the slot was dropped (-EBADMSG)."""


class StoreBusyError(TuttiError):
    """A member is in use by another store handle or mounted (-EBUSY)."""


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
        from ._tutti import ffi, lib
    err = -rc
    reason = ffi.string(lib.tt_errmsg()).decode(errors="replace") or os.strerror(err)
    lib.tt_clearerr()  # so a later failure that sets no reason cannot show this one
    return (cls or _BY_ERRNO.get(err, TuttiError))(err, f"{what}: {reason}" if what else reason)


def check(rc: int) -> int:
    """Return ``rc`` if it is not negative, else raise the matching TuttiError."""
    if rc < 0:
        raise error_for(rc)
    return rc
