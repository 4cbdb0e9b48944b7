"""Library files named by the environment (TUTTI_GPU_LIB, TUTTI_CUFILE), looked at before dlopen.

dlopen opens the path it is given: a FIFO blocks it until someone writes to it (a hang), so a path that
is not a regular file is refused with what it is instead.
"""
from __future__ import annotations

import os
import stat


def library_problem(name: str) -> str | None:
    """Why ``name`` cannot be loaded as a library file, None if it may be (a bare name, without a '/', is
    the loader's to search for)."""
    if "/" not in name:
        return None
    try:
        st = os.stat(name)
    except FileNotFoundError:
        return f"{name}: no such file"
    except OSError as e:
        return f"{name}: {e.strerror}"
    if not stat.S_ISREG(st.st_mode):
        from .cli.paths import kind_of

        return f"{name} is a {kind_of(st.st_mode)}, not a library file"
    return None
