"""Shared pieces of tutti-admin: exit codes, sizes, output, model options, opening stores."""
from __future__ import annotations

import errno
import json
import os
import re
from decimal import Decimal, InvalidOperation

import click

from ..errors import TuttiBaseError
from .params import InputFile, MemberPath, c_field, dtype_text, model_id_text
from .text import number, one_line, shown

EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_USAGE = 2
EXIT_STORE = 3
EXIT_MISMATCH = 4
EXIT_INTERNAL = 5
EXIT_INTERRUPTED = 130

EXIT_CODES = """\b
Exit codes (docs/cli.md):
    0  success
    1  check (or bench verification) found problems that remain;
       health: the controller reports a critical warning
    2  usage error or bad input (bad option or value, size, path or
       model config; format refusing to overwrite a store without
       --force; a malformed PCI address, or a file that is not an NVMe
       device)
    3  the store cannot be opened: not a Tutti store, damaged, missing or
       foreign member, busy (locked by another process or mounted);
       attach/detach/health: no such device, in use (mounted, swap, held),
       tutti.ko or nvme driver not loaded, not permitted, command failed;
       a file or device failing under a command (I/O error)
    4  the store holds KV cache of another model (fingerprint mismatch)
    5  tutti-admin failed unexpectedly (a bug: TUTTI_ADMIN_DEBUG=1 shows
       the traceback) or ran out of memory
  130  interrupted (Ctrl-C)
Errors are one line on stderr: tutti-admin: error: COMMAND: REASON
"""

# ------------------------------------------------------------------- sizes

_UNITS = {
    "": 1, "b": 1,
    "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50, "e": 1 << 60,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40, "pib": 1 << 50, "eib": 1 << 60,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "pb": 10**15, "eb": 10**18,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_size(text: str | int) -> int:
    """'512MiB' -> 536870912, '1TB' -> 10**12, '4096' -> 4096.

    Binary units: K/M/G/T/P/E, KiB/MiB/GiB/TiB/PiB/EiB; decimal units: KB/MB/GB/TB/PB/EB;
    B or nothing: bytes.  Case-insensitive; a fraction is allowed when the result is
    a whole number of bytes (1.5GiB).  Raises ValueError with the reason otherwise.
    """
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"size {text} is negative")
        return text
    if not isinstance(text, str):
        raise ValueError(f"size must be a string like 2GiB, not {type(text).__name__}")
    m = _SIZE_RE.match(text)
    if not m:
        if text.strip().startswith("-"):
            raise ValueError(f"size {text!r} is negative")
        raise ValueError(f"{text!r} is not a size: use a number with an optional unit, e.g. 4096, 512MiB, 2GiB, 1TB")
    number, unit = m.group(1), m.group(2).lower()
    if unit not in _UNITS:
        raise ValueError(f"unknown unit {m.group(2)!r} in {text!r}: use B, KiB, MiB, GiB, TiB, PiB, EiB "
                         "(or K, M, G, T, P, E) or KB, MB, GB, TB, PB, EB")
    try:
        value = Decimal(number) * _UNITS[unit]
    except InvalidOperation:  # pragma: no cover - the regex only lets numbers through
        raise ValueError(f"{text!r} is not a size") from None
    if value != value.to_integral_value():
        raise ValueError(f"{text!r} is not a whole number of bytes")
    return int(value)


def format_size(n: int) -> str:
    """Exact when possible: 2147483648 -> '2 GiB', 1000 -> '1000 B', else two decimals."""
    for unit, mult in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= mult:
            return f"{n // mult} {unit}" if n % mult == 0 else f"{n / mult:.2f} {unit}"
    return f"{n} B"


class SizeType(click.ParamType):
    """A size in bytes, above zero and within the 64 bits libtutti counts bytes in."""

    name = "SIZE"

    def convert(self, value, param, ctx):
        from . import limits

        try:
            size = parse_size(value)
        except ValueError as e:
            self.fail(one_line(str(e)), param, ctx)
        if size <= 0:
            self.fail("size must be greater than zero", param, ctx)
        top = limits.field_max("tt_superblock", "member_bytes")
        if size > top:
            self.fail(f"{number(size)} bytes is too large: at most {top} (libtutti counts bytes in "
                      f"{limits.field_ctype('tt_superblock', 'member_bytes')})", param, ctx)
        return size


SIZE = SizeType()

# ------------------------------------------------------------------ output


def make_console(stderr: bool = False):
    from rich.console import Console

    con = Console(stderr=stderr, highlight=False, soft_wrap=False)
    if not con.is_terminal:
        con.width = max(con.width, 120)  # logs and pipes: no 80-column wrapping of tables
    return con


def _emit_json(obj) -> None:
    # allow_nan=False: NaN/Infinity are not JSON; a value that overflowed fails here, not in a reader
    click.echo(json.dumps(obj, indent=2, sort_keys=False, default=_json_default, allow_nan=False))


def _json_default(o):
    import dataclasses

    if dataclasses.is_dataclass(o):
        return dataclasses.asdict(o)
    if isinstance(o, (bytes, bytearray)):
        return o.hex()
    if isinstance(o, (set, tuple)):
        return list(o)
    return str(o)


class CliError(TuttiBaseError, click.ClickException):
    """An error with its own exit code, printed as 'tutti-admin: error: ...' (a click exception: how click
    prints and exits; the one exception of Tutti not in tutti/errors.py)."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.exit_code = code  # type: ignore[misc]  # click's stubs say ClassVar; click reads the instance's

    def show(self, file=None):
        click.echo(f"tutti-admin: error: {one_line(self.format_message())}", err=True)


def _store_error(e: OSError, what: str) -> CliError:
    """Map a failure to open or use a store to the CLI's exit codes.

    The message is libtutti's reason (it names the member and says what is wrong:
    "fingerprint mismatch: ...", "store is in use (open in another process, ...)", "not a Tutti
    store"), after the command; the errno picks only the exit code, so nothing is said twice.
    """
    from ..errors import FingerprintMismatch

    reason = e.strerror or str(e)
    if e.filename and not (isinstance(e, FileNotFoundError) or e.errno == errno.ENOENT):
        # Python's own OSError keeps the path apart from its reason ("Permission denied"); libtutti's
        # reasons already name the member
        name = e.filename if isinstance(e.filename, str) else os.fsdecode(e.filename)
        if name not in reason:
            reason = f"{shown(name)}: {reason}"
    if isinstance(e, FingerprintMismatch) or e.errno == errno.EMEDIUMTYPE:
        return CliError(f"{what}: {reason}", EXIT_MISMATCH)
    if (isinstance(e, FileNotFoundError) or e.errno == errno.ENOENT) and e.filename:
        return CliError(f"{what}: {e.filename}: no such file or device", EXIT_STORE)
    return CliError(f"{what}: {reason}", EXIT_STORE)


def _label(key: str) -> str:
    return key.replace("_", " ")


def _value_text(key: str, value) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if key in ("created_ns", "since_ns", "saved_ns") and isinstance(value, int) and value > 0:
        import datetime as dt

        when = dt.datetime.fromtimestamp(value / 1e9, dt.timezone.utc).isoformat(timespec="seconds")
        return f"{value} ({when})"
    if isinstance(value, int) and (key.endswith("_bytes") or key in ("bytes", "capacity", "size")) and value >= 1024:
        return f"{value} ({format_size(value)})"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value) if value else "-"
    if isinstance(value, (bytes, bytearray)):
        return value.hex()
    return str(value)


def _kv_table(title: str, items):
    from rich.table import Table

    t = Table(title=title, title_justify="left", show_header=False, box=None, pad_edge=False)
    t.add_column(style="bold")
    t.add_column()
    for k, v in items:
        t.add_row(_label(k), _value_text(k, v))
    return t


def _print_dict(console, title: str, d: dict) -> None:
    """Scalars of ``d`` as one table, each nested dict as its own table."""
    scalars = [(k, v) for k, v in d.items() if not isinstance(v, dict)]
    if scalars:
        console.print(_kv_table(title, scalars))
        console.print()
    for k, v in d.items():
        if isinstance(v, dict):
            _print_dict(console, f"{title} / {_label(k)}" if title != "Store" else _label(k).capitalize(), v)


# --------------------------------------------------------- common options


def _fingerprint_options(required: bool):
    """Model options: --model-config or explicit --layers/--kv-heads/--head-dim."""
    help_suffix = "" if required else " (expected model: open fails with exit 4 on mismatch)"

    def deco(f):
        fp = "tt_fingerprint"
        opts = [
            click.option("--model-config", type=InputFile(dir_file="config.json"),
                         help="HF config.json (or its directory) of the model" + help_suffix),
            click.option("--layers", type=c_field(fp, "n_layers"), help="number of layers (without --model-config)"),
            click.option("--kv-heads", type=c_field(fp, "kv_heads"), help="KV heads (without --model-config)"),
            click.option("--head-dim", type=c_field(fp, "head_dim"), help="head dimension (without --model-config)"),
            click.option("--dtype", type=dtype_text(),
                         help="KV cache dtype, e.g. bfloat16 (default: the config's, else bfloat16)"),
            click.option("--model-id", type=model_id_text(), help="model name stored in the fingerprint"),
            click.option("--block-size", type=c_field(fp, "block_size"), default=16, show_default=True,
                         help="tokens per KV block"),
            click.option("--tp-rank", type=c_field(fp, "tp_rank", min=0), default=0, show_default=True,
                         help="tensor-parallel rank"),
            click.option("--tp-size", type=c_field(fp, "tp_size"), default=1, show_default=True,
                         help="tensor-parallel size"),
        ]
        for opt in reversed(opts):
            f = opt(f)
        return f

    return deco


def _fingerprint(kw: dict, required: bool):
    """Build a Fingerprint from the model options, or None when none was given and not required."""
    from ..model import Fingerprint

    manual = [kw.get("layers"), kw.get("kv_heads"), kw.get("head_dim")]
    cfg = kw.get("model_config")
    if cfg and any(v is not None for v in manual):
        raise click.UsageError("give either --model-config or --layers/--kv-heads/--head-dim, not both")
    if kw.get("tp_rank", 0) >= kw.get("tp_size", 1):
        raise click.UsageError(f"--tp-rank {kw['tp_rank']} must be below --tp-size {kw['tp_size']}")
    if cfg:
        try:
            fp = Fingerprint.from_config(cfg, block_size=kw["block_size"], dtype=kw.get("dtype"),
                                         tp_rank=kw["tp_rank"], tp_size=kw["tp_size"],
                                         model_id=kw.get("model_id"))
        except OSError as e:
            raise CliError(f"model config {shown(e.filename or cfg)}: {e.strerror or e}", EXIT_USAGE) from None
        except ValueError as e:  # the reason starts with the config's path
            raise CliError(f"model config {e}", EXIT_USAGE) from None
        return _fits_libtutti(fp, f"model config {shown(cfg)}")
    if all(v is None for v in manual):
        if required:
            raise click.UsageError("give the model: --model-config config.json, or --layers, --kv-heads and "
                                   "--head-dim")
        alone = _given_alone(kw)
        if alone:  # an expectation that would be checked against nothing
            raise click.UsageError(f"{alone} states the expected model only with --model-config or "
                                   "--layers, --kv-heads and --head-dim")
        return None
    if any(v is None for v in manual):
        raise click.UsageError("--layers, --kv-heads and --head-dim go together")
    try:
        fp = Fingerprint(model_id=kw.get("model_id") or "unnamed", dtype=kw.get("dtype") or "bfloat16",
                         n_layers=kw["layers"], kv_heads=kw["kv_heads"], head_dim=kw["head_dim"],
                         block_size=kw["block_size"], tp_rank=kw["tp_rank"], tp_size=kw["tp_size"])
    except ValueError as e:
        raise CliError(f"bad model geometry: {e}", EXIT_USAGE) from None
    return _fits_libtutti(fp, "model")


def _given_alone(kw: dict) -> str | None:
    """The first model option given on the command line, or None (defaults do not count)."""
    ctx = click.get_current_context(silent=True)
    for name in ("dtype", "model_id", "block_size", "tp_rank", "tp_size"):
        if name not in kw:
            continue
        given = (ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE if ctx is not None
                 else kw[name] is not None)
        if given:
            return "--" + name.replace("_", "-")
    return None


def _fits_libtutti(fp, what: str):
    """``fp``, once it is known to fit struct tt_fingerprint (a config's numbers are not checked by click):
    each count within its C field, the model id and dtype UTF-8 within theirs (limits from the binding)."""
    from . import limits

    for name in ("n_layers", "kv_heads", "head_dim", "block_size", "tp_rank", "tp_size"):
        value, top = getattr(fp, name), limits.field_max("tt_fingerprint", name)
        if not 0 <= value <= top:
            raise CliError(f"{what}: {name} {number(value)} does not fit libtutti's "
                           f"{limits.field_ctype('tt_fingerprint', name)} (at most {top})", EXIT_USAGE)
    for name, text, top in (("model id", fp.model_id, limits.model_id_bytes()),
                            ("dtype", fp.dtype, limits.dtype_bytes())):
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError:
            raise CliError(f"{what}: the {name} {shown(text)} is not UTF-8 text", EXIT_USAGE) from None
        if size > top:
            raise CliError(f"{what}: the {name} {shown(text)} is {size} bytes long: at most {top}", EXIT_USAGE)
    return fp


def check_members(ctx, param, members):
    """A store's member list: at most TT_MAX_MEMBERS paths, none named twice (click callback)."""
    import os

    from . import limits

    members = tuple(members or ())
    if len(members) > limits.max_members():
        raise click.BadParameter(f"{len(members)} members: a store has at most {limits.max_members()} "
                                 "(TT_MAX_MEMBERS in format.h)", ctx, param)
    seen = {}
    for p in members:
        real = os.path.realpath(p)
        if real in seen:
            raise click.BadParameter(f"{shown(seen[real])} and {shown(p)} are the same member", ctx, param)
        seen[real] = p
    return members


def _paths_arg(create: bool = False):
    """PATH... of a store: members that exist (info, check) or may be created (format)."""
    def deco(f):
        return click.argument("paths", nargs=-1, required=True, metavar="PATH...",
                              type=MemberPath(create=create), callback=check_members)(f)
    return deco


def _json_opt(f):
    return click.option("--json", "as_json", is_flag=True, help="print JSON for scripts")(f)


def _open(paths, what: str, **kw):
    from ..store import Store

    try:
        return Store.open(list(paths), **kw)
    except OSError as e:
        err = _store_error(e, what)
        hint = _shard_hint(paths) if e.errno == errno.ENOENT else None
        if hint:
            err = CliError(f"{err.format_message()}; {hint}", err.exit_code)
        raise err from None


def _shard_hint(paths):
    """A path that is missing but has tensor-parallel shards (the connector appends .rank<N> to a
    path without {rank} when TP > 1): name them, each is a store of its own."""
    for p in map(os.fspath, paths):
        if os.path.exists(p) or "{rank}" in p:
            continue
        shards = []
        while os.path.exists(f"{p}.rank{len(shards)}"):
            shards.append(f"{p}.rank{len(shards)}")
        if shards:
            last = f" ... .rank{len(shards) - 1}" if len(shards) > 1 else ""
            return (f"it is a tensor-parallel store of {len(shards)} shard(s), each a store of its own: "
                    f"give the path with .rank0{last}")
    return None


def _store_summary(s) -> dict:
    info = s.info()
    return info if isinstance(info, dict) else dict(info)
