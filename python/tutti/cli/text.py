"""Text in tutti-admin's messages: every error is one line, whatever the value or path in it."""
from __future__ import annotations


def _decoded(text: str) -> str:
    """``text`` with the bytes a non-UTF-8 argument left as surrogate escapes shown as \\x.."""
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a surrogate no byte maps to
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def shown(value, width: int = 60) -> str:
    """``value`` quoted for a message: escapes, undecodable bytes as \\x.., long values cut."""
    text = f"'{one_line(value)}'" if isinstance(value, str) else repr(value)
    return text if len(text) <= width else text[: width - 4] + "...'"


def one_line(message: str) -> str:
    """``message`` printable on one line: newlines and other control characters escaped."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in _decoded(message))


def number(n: int) -> str:
    """``n`` in a message; a huge one by its size (Python refuses to print ints of over 4300 digits)."""
    digits = int(n.bit_length() * 0.30103) + 1
    return str(n) if digits <= 40 else f"a number of about {digits} digits"
