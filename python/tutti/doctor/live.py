"""The doctor's live calls: what cannot be read from a file (system calls, ioctls, library loads).

Each is small and answers in plain values so that tests can replace it (``Machine(uring_setup=...)``).
"""
from __future__ import annotations

import ctypes
import errno
import mmap
import os
import stat
import struct

_SYS_IO_URING_SETUP = {"x86_64": 425, "aarch64": 425}
_URING_PARAMS_BYTES = 120


def uring_setup() -> int:
    """0 when io_uring_setup(2) gives this process a ring (closed again at once), else its errno."""
    nr = _SYS_IO_URING_SETUP.get(os.uname().machine)
    if nr is None:
        return errno.ENOSYS
    libc = ctypes.CDLL(None, use_errno=True)
    params = ctypes.create_string_buffer(_URING_PARAMS_BYTES)
    libc.syscall.restype = ctypes.c_long
    fd = libc.syscall(ctypes.c_long(nr), ctypes.c_uint(4), params)
    if fd < 0:
        return ctypes.get_errno() or errno.EIO
    os.close(fd)
    return 0


def _aligned(n: int) -> mmap.mmap:
    return mmap.mmap(-1, n)  # page aligned, as O_DIRECT wants


def odirect(path: str) -> tuple[str, str] | None:
    """None when O_DIRECT works for ``path``, else (kind, why): kind "unsupported" when the file system
    refuses O_DIRECT, "error" when the path cannot be opened or read at all.  Tried with a read of an
    existing member, or a probe file written and removed in a directory (the directory of a member that
    does not exist yet)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return odirect(os.path.dirname(os.path.abspath(path)))
    except OSError as e:
        return "error", f"{path}: {e.strerror}"
    buf = _aligned(4096)
    try:
        if stat.S_ISDIR(st.st_mode):
            probe = os.path.join(path, f".tutti-doctor-{os.getpid()}")
            try:
                fd = os.open(probe, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_DIRECT | os.O_CLOEXEC, 0o600)
            except OSError as e:
                return _why(path, "open", e)
            try:
                os.pwritev(fd, [buf], 0)
            except OSError as e:
                return _why(path, "write", e)
            finally:
                os.close(fd)
                os.unlink(probe)
            return None
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECT | os.O_CLOEXEC)
        except OSError as e:
            return _why(path, "open", e)
        try:
            os.preadv(fd, [buf], 0)
        except OSError as e:
            return _why(path, "read", e)
        finally:
            os.close(fd)
        return None
    finally:
        buf.close()


def _why(path: str, op: str, e: OSError) -> tuple[str, str]:
    if e.errno == errno.EINVAL:
        return "unsupported", f"{path}: the file system refuses O_DIRECT ({op}: {e.strerror})"
    return "error", f"{path}: {op} with O_DIRECT: {e.strerror}"


# Identify Controller (CNS 01h) fields (NVM Express Base Specification)
_ID_MN = (24, 40)
_ID_MDTS = 77
_ID_NN = 516
_ID_SGLS = 536


def parse_id_ctrl(page: bytes) -> dict:
    """MDTS (as the exponent the controller reports), SGLS, NN and the model from an Identify page."""
    return {
        "model": page[_ID_MN[0]:_ID_MN[0] + _ID_MN[1]].decode("ascii", errors="replace").strip(),
        "mdts": page[_ID_MDTS],
        "nn": struct.unpack_from("<I", page, _ID_NN)[0],
        "sgls": struct.unpack_from("<I", page, _ID_SGLS)[0],
    }


def id_ctrl(driver: str, node: str) -> dict | None:
    """Identify facts of a controller: {"mdts_bytes" (0: no limit), "sgls", "nn"}; None if it cannot be asked.

    nvme: Identify Controller through NVME_IOCTL_ADMIN_CMD (MDTS taken in 4 KiB units, CAP.MPSMIN of every
    controller seen so far); tutti: the module's INFO ioctl, which reports MDTS in bytes.
    """
    if driver == "tutti":
        from ..devices import _kinfo

        info = _kinfo(node)
        return None if info is None else {"mdts_bytes": info["mdts_bytes"], "sgls": info["sgls"], "nn": info["nn"]}
    if driver != "nvme":
        return None
    import fcntl

    from ..smart import NVME_IOCTL_ADMIN_CMD, pack_admin_cmd

    buf = ctypes.create_string_buffer(4096)
    cmd = pack_admin_cmd(0x06, 0, ctypes.addressof(buf), 4096, 1)
    try:
        fd = os.open(node, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if fcntl.ioctl(fd, NVME_IOCTL_ADMIN_CMD, cmd, True):
            return None
    except OSError:
        return None
    finally:
        os.close(fd)
    ident = parse_id_ctrl(buf.raw)
    return {"mdts_bytes": (4096 << ident["mdts"]) if ident["mdts"] else 0, "sgls": ident["sgls"], "nn": ident["nn"]}


def cuda() -> dict:
    from ..cli.gpu_cmd import _cuda

    return _cuda()


def green() -> dict:
    """Green contexts: cuda-bindings present and its driver module has cuGreenCtxCreate."""
    try:
        from cuda.bindings import driver
    except ImportError:
        return {"ok": False, "detail": "cuda-bindings is not installed"}
    if not hasattr(driver, "cuGreenCtxCreate"):
        return {"ok": False, "detail": "cuda-bindings has no cuGreenCtxCreate (CUDA 12.4 or later needed)"}
    return {"ok": True, "detail": "cuda-bindings with cuGreenCtxCreate"}


def cufile_lib() -> dict:
    from ..cli.gpu_cmd import _cufile

    return _cufile()


def libtutti() -> str | None:
    try:
        from .. import _tutti  # noqa: F401 - imported only to see that the extension loads
    except ImportError as e:
        return str(e)
    return None


def store_kind(path: str) -> dict | None:
    """What a member holds: devices.store_probe (None when it cannot be read)."""
    from ..devices import store_probe

    return store_probe(path)


def version_of(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def uname() -> str:
    return os.uname().release
