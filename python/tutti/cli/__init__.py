"""tutti-admin: format, inspect, check and benchmark Tutti stores; list, attach, detach and check NVMe controllers.

Output follows nvme-cli: a table for people, ``--json`` for scripts, on every
command.  Exit codes are part of the interface (see EXIT_CODES).
"""
from . import cluster_cmd, device_cmds, doctor_cmd, gpu_cmd, plan_cmd, profile_cmd, store_cmds  # noqa: F401 - they register their commands on main
from .app import main
from .common import (
    EXIT_CODES,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_MISMATCH,
    EXIT_OK,
    EXIT_PROBLEMS,
    EXIT_STORE,
    EXIT_USAGE,
    CliError,
    _store_error,
    format_size,
    make_console,
    parse_size,
)
from .store_cmds import print_bench

__all__ = [
    "main", "parse_size", "format_size", "make_console", "print_bench", "CliError", "EXIT_CODES", "EXIT_OK",
    "EXIT_PROBLEMS", "EXIT_USAGE", "EXIT_STORE", "EXIT_MISMATCH", "EXIT_INTERNAL", "EXIT_INTERRUPTED", "_store_error",
]
