"""The tutti-admin command group; the commands register themselves on it.

Every way a command can fail ends the same way: one line on stderr,
``tutti-admin: error: <command>: <reason>``, and an exit code from docs/cli.md.
click's own usage errors (unknown option, bad value) are said on that one line
too, and anything unexpected is caught here, at the top, instead of printing a
traceback; ``TUTTI_ADMIN_DEBUG=1`` lets it through for debugging.
"""
from __future__ import annotations

import errno
import os

import click

from .common import EXIT_CODES, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_STORE, EXIT_USAGE, CliError

DEBUG_ENV = "TUTTI_ADMIN_DEBUG"
_COMMAND = "tutti_admin.command"


def _debug() -> bool:
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


_NO_ARGS = getattr(click.exceptions, "NoArgsIsHelpError", ())  # click >= 8.2: a bare group is a usage error


def _usage(e: click.UsageError, command: str | None) -> CliError:
    """click's usage error as one line naming the command and where its help is."""
    prog = "tutti-admin" + (f" {command}" if command else "")
    where = f"{command}: " if command else ""
    if isinstance(e, _NO_ARGS):
        group = e.ctx.command if e.ctx is not None else None
        names = ", ".join(group.list_commands(e.ctx)) if isinstance(group, click.Group) else "a command"
        return CliError(f"{where}no command given: one of {names} (see '{prog} --help')", EXIT_USAGE)
    return CliError(f"{where}{e.format_message()} (see '{prog} --help')", e.exit_code or EXIT_USAGE)


def _named(e: CliError, command: str | None) -> CliError:
    """``e`` with its message starting with the command's name, as every error line does."""
    if command and not e.message.startswith(f"{command}:"):
        return CliError(f"{command}: {e.message}", e.exit_code)
    return e


def _unexpected(e: BaseException, command: str | None) -> CliError:
    """An exception no command expected, as one line with an exit code from the table."""
    where = f"{command}: " if command else ""
    if isinstance(e, OSError):  # a file or device failed under us (EIO, ENOSPC, EACCES on an output)
        name = f"{e.filename}: " if getattr(e, "filename", None) else ""
        return CliError(f"{where}{name}{e.strerror or e}", EXIT_STORE)
    if isinstance(e, MemoryError):
        return CliError(f"{where}out of memory", EXIT_INTERNAL)
    return CliError(f"{where}unexpected {type(e).__name__}: {e} (a bug in tutti-admin: please report it; "
                    f"{DEBUG_ENV}=1 shows where)", EXIT_INTERNAL)


def _path(ctx: click.Context) -> str:
    """The command as the user typed it after the program's name ("cluster serve")."""
    names = []
    while ctx.parent is not None:
        names.append(ctx.info_name or "")
        ctx = ctx.parent
    return " ".join(reversed(names))


class AdminGroup(click.Group):
    """click.Group whose every failure is one line with a documented exit code (nested groups too:
    errors name the whole command, "cluster serve")."""

    def resolve_command(self, ctx, args):
        name, cmd, rest = super().resolve_command(ctx, args)
        ctx.meta[_COMMAND] = " ".join(filter(None, [_path(ctx), cmd.name if cmd else name]))
        return name, cmd, rest

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.UsageError as e:
            raise _usage(e, None) from None
        except (click.ClickException, click.exceptions.Exit, click.Abort, KeyboardInterrupt, EOFError):
            raise
        except Exception as e:  # the one place that turns anything into a line
            if _debug():
                raise
            raise _unexpected(e, None) from None

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except CliError as e:
            raise _named(e, ctx.meta.get(_COMMAND)) from e
        except click.UsageError as e:
            command = _path(e.ctx) if e.ctx is not None and e.ctx is not ctx else ctx.meta.get(_COMMAND)
            raise _usage(e, command) from None
        except (click.ClickException, click.exceptions.Exit, SystemExit):
            raise
        except click.Abort:  # a confirmation answered no (or stdin closed): nothing was done
            raise CliError(f"{ctx.meta.get(_COMMAND)}: not confirmed: nothing was changed", EXIT_USAGE) from None
        except (KeyboardInterrupt, EOFError) as e:
            if isinstance(e, EOFError):
                raise CliError(f"{ctx.meta.get(_COMMAND)}: end of input: nothing was changed", EXIT_USAGE) from None
            raise CliError(f"{ctx.meta.get(_COMMAND)}: interrupted", EXIT_INTERRUPTED) from None
        except OSError as e:
            if e.errno == errno.EPIPE:
                raise  # the reader went away: click leaves quietly
            if _debug():
                raise
            raise _unexpected(e, ctx.meta.get(_COMMAND)) from None
        except Exception as e:  # see make_context
            if _debug():
                raise
            raise _unexpected(e, ctx.meta.get(_COMMAND)) from None


@click.group(cls=AdminGroup, epilog=EXIT_CODES, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tutti", prog_name="tutti-admin")
def main():
    """Administer Tutti stores: SSD-backed KV cache for vLLM.

    A store is one or more files or block devices formatted together (PATH...);
    give all of its members, in any order, to every store command (format,
    info, check, bench).  list, attach, detach and health work on NVMe
    controllers: which driver has them (nvme or tutti.ko) and their health.
    """
