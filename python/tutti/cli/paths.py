"""Paths given to tutti-admin, judged by stat() before anything opens them.

Opening the wrong kind of file can hang or act: a FIFO blocks the opener until
someone writes to it, a socket cannot be opened at all, and some character
devices do something when opened.  So every path is looked at first, and only a
regular file, a block device or a tutti.ko namespace node may be a store member;
only a regular file may be read as a config or written as an output.
"""
from __future__ import annotations

import errno
import os
import stat

from .text import shown

# stat() failures that say the path itself is malformed, not that the file is missing or locked away
_BAD_PATH = (errno.ENAMETOOLONG, errno.ENOTDIR, errno.ELOOP)


def kind_of(mode: int) -> str:
    for test, name in ((stat.S_ISREG, "regular file"), (stat.S_ISDIR, "directory"), (stat.S_ISBLK, "block device"),
                       (stat.S_ISCHR, "character device"), (stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "special file"


def not_a_member(path: str, st: os.stat_result) -> str | None:
    """Why the existing ``path`` cannot be a store member (None if it can): only regular files, block
    devices and tutti.ko namespace nodes can; a directory, a FIFO, a socket or another character
    device cannot, and is refused without being opened."""
    from ..devices import is_tutti_namespace_node

    mode = st.st_mode
    if stat.S_ISREG(mode) or stat.S_ISBLK(mode):
        return None
    if stat.S_ISCHR(mode) and is_tutti_namespace_node(st.st_rdev):
        return None
    what = "character device that is not a tutti.ko namespace node" if stat.S_ISCHR(mode) else kind_of(mode)
    return f"{shown(path)} is a {what}: a store member is a regular file, a block device or a tutti.ko node"


MISSING = "missing"


def _stat(path: str):
    """(stat result, MISSING, or None when it cannot be looked at; problem text or None)."""
    try:
        return os.stat(path), None
    except FileNotFoundError:
        return MISSING, None
    except OSError as e:
        if e.errno in _BAD_PATH:
            return None, f"{shown(path)}: {e.strerror}"
        return None, None  # not permitted and the like: whoever opens it reports that


def _directory_problem(path: str, parents: bool) -> str | None:
    """Can a file be created at ``path``: its directory exists (or, with ``parents``, can be made)?"""
    parent = os.path.dirname(os.path.abspath(path))
    while parents and not os.path.lexists(parent) and parent != os.path.dirname(parent):
        parent = os.path.dirname(parent)
    st, problem = _stat(parent)
    if problem or st is None:
        return problem
    if st is MISSING:
        return f"{shown(path)}: directory {shown(parent)} does not exist"
    if not stat.S_ISDIR(st.st_mode):
        return f"{shown(path)}: {shown(parent)} is a {kind_of(st.st_mode)}, not a directory"
    if not os.access(parent, os.W_OK):
        return f"{shown(path)}: cannot create files in {shown(parent)} (permission denied)"
    return None


def member_problem(path: str, create: bool = False, parents: bool = False) -> str | None:
    """Why ``path`` cannot be a store member, None if it may be.

    A missing path is fine when the command creates members (``create``: its directory must
    exist, or with ``parents`` be creatable); otherwise the store's open reports it (exit 3).
    """
    st, problem = _stat(path)
    if problem or st is None:
        return problem
    if st is MISSING:
        return _directory_problem(path, parents) if create else None
    return not_a_member(path, st)


def input_problem(path: str, dir_file: str | None = None, missing_ok: bool = False) -> str | None:
    """Why ``path`` cannot be read as a file (None if it can): it must be a regular file, or a
    directory holding ``dir_file``; ``missing_ok``: a path that does not exist is fine."""
    st, problem = _stat(path)
    if problem:
        return problem
    if st is None:
        return None if missing_ok else f"{shown(path)}: cannot be looked at (permission denied)"
    if st is MISSING:
        return None if missing_ok else f"{shown(path)}: no such file"
    if stat.S_ISDIR(st.st_mode):
        if dir_file is None:
            return f"{shown(path)} is a directory, not a file"
        return input_problem(os.path.join(path, dir_file))
    if not stat.S_ISREG(st.st_mode):
        return f"{shown(path)} is a {kind_of(st.st_mode)}, not a regular file"
    if not os.access(path, os.R_OK):
        return f"{shown(path)}: not readable (permission denied)"
    return None


def output_problem(path: str) -> str | None:
    """Why ``path`` cannot be written as a file (None if it can): an existing regular file, or a
    new file in an existing directory."""
    st, problem = _stat(path)
    if problem:
        return problem
    if st is None:
        return f"{shown(path)}: cannot be looked at (permission denied)"
    if st is MISSING:
        return _directory_problem(path, parents=False)
    if not stat.S_ISREG(st.st_mode):
        return f"{shown(path)} is a {kind_of(st.st_mode)}, not a regular file"
    if not os.access(path, os.W_OK):
        return f"{shown(path)}: not writable (permission denied)"
    return None
