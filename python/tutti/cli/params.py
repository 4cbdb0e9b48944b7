"""Typed option values of tutti-admin: every value is checked when the command line is parsed.

A value that cannot be right (not a number, negative, beyond what the C field
it ends up in can hold, NaN, a text that is not UTF-8 or holds a control
character, a path to a FIFO) is refused here, as a usage error (exit 2) that
names the option, before any file is opened.  Limits that come from libtutti
are read from the binding (``limits``), never restated.
"""
from __future__ import annotations

import math
import re
import unicodedata
from typing import Callable

import click

from . import limits, paths
from .text import shown


def _limit(value):
    return value() if callable(value) else value


# ---------------------------------------------------------------- numbers

_WHOLE = re.compile(r"^\s*([0-9]+)\s*$")


class Whole(click.ParamType):
    """A whole number in [min, max]; ``max`` may be a callable (a limit read from the binding)
    and ``why`` says where it comes from.  There is always a max: a number of 5000 digits is
    bad input, not a request."""

    name = "integer"

    def __init__(self, min: int, max: int | Callable[[], int], why: str | Callable[[], str] = ""):
        self.min, self.max, self.why = min, max, why

    def convert(self, value, param, ctx):
        if isinstance(value, int) and not isinstance(value, bool):
            n = value
        else:
            m = _WHOLE.match(value) if isinstance(value, str) else None
            if not m:
                if isinstance(value, str) and re.match(r"^\s*-\s*[0-9]+\s*$", value):
                    self.fail(f"{shown(value)} is negative: give a whole number >= {self.min}", param, ctx)
                self.fail(f"{shown(value)} is not a whole number", param, ctx)
            digits = m.group(1).lstrip("0") or "0"
            top = _limit(self.max)
            if len(digits) > len(str(top)):
                cut = digits if len(digits) <= 40 else f"{digits[:20]}...({len(digits)} digits)"
                self.fail(f"{cut} is too large: at most {top}{self._why()}", param, ctx)
            n = int(digits)
        if n < self.min:
            self.fail(f"{n} is too small: at least {self.min}", param, ctx)
        top = _limit(self.max)
        if n > top:
            self.fail(f"{n} is too large: at most {top}{self._why()}", param, ctx)
        return n

    def _why(self) -> str:
        why = _limit(self.why)
        return f" ({why})" if why else ""


def c_field(struct: str, field: str, min: int = 1) -> Whole:
    """A whole number that libtutti keeps in ``struct <struct>.<field>``."""
    return Whole(min, lambda: limits.field_max(struct, field),
                 lambda: f"libtutti's struct {struct}.{field} is {limits.field_ctype(struct, field)}")


def c_arg(function: str, index: int, min: int = 1) -> Whole:
    """A whole number passed as argument ``index`` of libtutti's ``function``."""
    return Whole(min, lambda: limits.arg_max(function, index),
                 lambda: f"libtutti's {function}() takes it as {limits.arg_ctype(function, index)}")


class Finite(click.ParamType):
    """A finite decimal number above ``min`` (or at least, with ``min_open=False``), at most ``max``."""

    name = "number"

    def __init__(self, min: float = 0.0, min_open: bool = True, max: float | None = None):
        self.min, self.min_open, self.max = min, min_open, max

    def convert(self, value, param, ctx):
        try:
            x = float(value)
        except (TypeError, ValueError):
            self.fail(f"{shown(value)} is not a number", param, ctx)
        if not math.isfinite(x):
            self.fail(f"{shown(value)} is not a finite number", param, ctx)
        if x < self.min or (self.min_open and x == self.min):
            self.fail(f"{shown(value)} must be {'above' if self.min_open else 'at least'} {self.min:g}", param, ctx)
        if self.max is not None and x > self.max:
            self.fail(f"{shown(value)} must be at most {self.max:g}", param, ctx)
        return x


class WholeList(click.ParamType):
    """Comma-separated whole numbers, each in [min, max]."""

    name = "N,N,..."

    def __init__(self, min: int, max: int | Callable[[], int], why: str | Callable[[], str] = ""):
        self.item = Whole(min, max, why)

    def convert(self, value, param, ctx):
        if isinstance(value, (list, tuple)):
            return list(value)
        parts = [p for p in str(value).split(",") if p.strip()]
        if not parts:
            self.fail(f"{shown(value)}: give comma-separated whole numbers, e.g. 64,256", param, ctx)
        return [self.item.convert(p, param, ctx) for p in parts]


class Parsed(click.ParamType):
    """A value read by ``parse(text)``, which raises click.BadParameter or ValueError with the reason."""

    def __init__(self, parse: Callable[[str], object], name: str):
        self.parse, self.name = parse, name

    def convert(self, value, param, ctx):
        if not isinstance(value, str):
            return value
        try:
            return self.parse(value)
        except click.BadParameter as e:
            self.fail(e.message, param, ctx)
        except ValueError as e:
            self.fail(str(e), param, ctx)


# ------------------------------------------------------------------ text


class Text(click.ParamType):
    """Printable UTF-8 text, not empty, at most ``max_bytes`` bytes (a callable: a C field's size)."""

    name = "text"

    def __init__(self, max_bytes: int | Callable[[], int] | None = None, why: str = ""):
        self.max_bytes, self.why = max_bytes, why

    def convert(self, value, param, ctx):
        if not isinstance(value, str):
            return value
        try:
            raw = value.encode("utf-8")
        except UnicodeEncodeError:
            self.fail(f"{shown(value)} is not valid UTF-8 text", param, ctx)
        if not value.strip():
            self.fail("must not be empty", param, ctx)
        if any(unicodedata.category(c) == "Cc" for c in value):
            self.fail(f"{shown(value)} contains a control character", param, ctx)
        top = _limit(self.max_bytes)
        if top is not None and len(raw) > top:
            self.fail(f"{shown(value)} is {len(raw)} bytes long: at most {top}"
                      + (f" ({self.why})" if self.why else ""), param, ctx)
        return value


def model_id_text() -> Text:
    return Text(limits.model_id_bytes, "the fingerprint's model id field, TT_MODEL_ID_LEN in format.h, "
                                       "ends with a NUL")


def dtype_text() -> Text:
    return Text(limits.dtype_bytes, "the fingerprint's dtype field, TT_DTYPE_LEN in format.h, ends with a NUL")


class Choice(click.Choice):
    """click.Choice whose message shows an undecodable value escaped (click's would fail to print it)."""

    def convert(self, value, param, ctx):
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                self.fail(f"{shown(value)} is not one of {', '.join(self.choices)}", param, ctx)
        return super().convert(value, param, ctx)


# ----------------------------------------------------------------- paths


class _PathType(click.ParamType):
    name = "path"

    def convert(self, value, param, ctx):
        if not isinstance(value, str):
            return value
        if not value:
            self.fail("an empty path", param, ctx)
        problem = self.problem(value)
        if problem:
            self.fail(problem, param, ctx)
        return value

    def problem(self, path: str) -> str | None:  # pragma: no cover - every subclass defines it
        raise NotImplementedError


class MemberPath(_PathType):
    """A store member: a regular file, a block device or a tutti.ko namespace node (see paths.member_problem).

    ``create``: may not exist yet (format, bench); ``parents``: its directory may not exist either (bench).
    """

    name = "PATH"

    def __init__(self, create: bool = False, parents: bool = False):
        self.create, self.parents = create, parents

    def problem(self, path):
        return paths.member_problem(path, create=self.create, parents=self.parents)


class InputFile(_PathType):
    """A regular file to read; a directory holding ``dir_file`` names that file; ``missing_ok``: may not exist."""

    name = "FILE"

    def __init__(self, dir_file: str | None = None, missing_ok: bool = False):
        self.dir_file, self.missing_ok = dir_file, missing_ok

    def problem(self, path):
        return paths.input_problem(path, dir_file=self.dir_file, missing_ok=self.missing_ok)


class OutputFile(_PathType):
    """A regular file to write (created if missing; its directory must exist)."""

    name = "FILE"

    def problem(self, path):
        return paths.output_problem(path)
