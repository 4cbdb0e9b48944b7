"""tutti-admin doctor: what this machine can run of Tutti and, for what it cannot, why and the fix.

Read-only: it opens nothing for writing except a probe file it removes again in a store directory (to
try O_DIRECT there).  The checks live in tutti.doctor; this is the command line and the output.
"""
from __future__ import annotations

import os

import click

from .app import main
from .common import EXIT_CODES, EXIT_OK, EXIT_PROBLEMS, EXIT_STORE, _emit_json, make_console
from .params import _PathType

EXIT_BY_VERDICT = {"ready": EXIT_OK, "degraded": EXIT_PROBLEMS, "unusable": EXIT_STORE}
_STYLE = {"ok": "green", "degraded": "yellow", "unusable": "red", "n/a": "dim"}


class StorePlace(_PathType):
    """A store member (file, block device, tutti.ko node; it may not exist yet) or the directory of one."""

    name = "PATH"

    def problem(self, path):
        from . import paths

        if os.path.isdir(path):
            return None
        return paths.member_problem(path, create=True)


class Root(click.ParamType):
    """A directory standing for /sys, /proc, /dev or /etc (tests point these at fake trees)."""

    name = "DIR"

    def convert(self, value, param, ctx):
        if not os.path.isdir(value):
            self.fail(f"{value!r} is not a directory", param, ctx)
        return value


@main.command("doctor", epilog=EXIT_CODES + "doctor: 0 ready, 1 degraded, 3 unusable (docs/cli.md)\n")
@click.argument("paths", nargs=-1, metavar="[PATH...]", type=StorePlace())
@click.option("--json", "as_json", is_flag=True, help="print JSON for scripts")
@click.option("--sysfs-root", type=Root(), default="/sys", hidden=True)
@click.option("--procfs-root", type=Root(), default="/proc", hidden=True)
@click.option("--dev-root", type=Root(), default="/dev", hidden=True)
@click.option("--etc-root", type=Root(), default="/etc", hidden=True)
def doctor_cmd(paths, as_json, sysfs_root, procfs_root, dev_root, etc_root):
    """Check what this machine can run of Tutti, each problem with its fix.

    PATH... are a store's members (or the directory a store will be made in): their file system's
    O_DIRECT and the device under them are checked too.  Exit 0: ready; 1: degraded (Tutti runs, some
    path is missing or slower); 3: unusable (the store cannot run here as asked).
    """
    from .. import doctor

    m = doctor.Machine(sysfs=sysfs_root, procfs=procfs_root, dev=dev_root, etc=etc_root)
    checks = doctor.run(m, tuple(paths))
    rep = doctor.report(checks)
    if as_json:
        _emit_json(rep)
    else:
        print_report(make_console(), rep)
    raise SystemExit(EXIT_BY_VERDICT[rep["verdict"]])


def print_report(con, rep: dict) -> None:
    """One line per check (status, name, what was found), the fix indented below it."""
    width = max((len(c["name"]) for c in rep["checks"]), default=0)
    area = None
    for c in rep["checks"]:
        if c["area"] != area:
            area = c["area"]
            con.print(f"[bold]{area}[/bold]")
        con.print(f"  [{_STYLE[c['status']]}]{c['status']:<9}[/] ", end="")
        con.print(f"{c['name']:<{width}}  {c['detail']}", markup=False, highlight=False, soft_wrap=True)
        if c["fix"]:
            con.print(f"  {'':<9} {'':<{width}}  fix: {c['fix']}", markup=False, highlight=False, soft_wrap=True)
    style = {"ready": "green", "degraded": "yellow", "unusable": "red"}[rep["verdict"]]
    con.print(f"verdict: [{style}]{rep['verdict']}[/]")
