#!/usr/bin/env python3
"""Write the usage examples of libtutti's public headers as C files, so `make ctest` compiles them
and they cannot drift from the API (staged_path.h's once closed its path with tt_staged_close(),
which never existed).

An example is the tab-indented code after a comment line starting "Example"; it is written as it
stands after an #include of its header, one file per example: OUT/<header>_<n>.c.

usage: header_examples.py OUT_DIR [HEADER...]   (default: libtutti/include/tutti/*.h)
"""
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
INCLUDE = ROOT / "libtutti" / "include"


def examples(header: Path) -> list[str]:
    """The examples of ``header``'s comments, as C source."""
    out: list[str] = []
    code: list[str] = []
    state = None
    for line in header.read_text().splitlines():
        if state is None and re.match(r"\s\*\s+Example\b", line):
            state = "intro"
        elif state == "intro":
            if line.startswith(" *\t"):
                state, code = "code", [line[3:]]
        elif state == "code":
            if line.startswith(" *\t") or line.rstrip() == " *":
                code.append(line[3:])
            else:
                out.append("\n".join(code).rstrip() + "\n")
                state = None
    return out


def write(out_dir: Path, headers: list[Path]) -> list[Path]:
    """One C file per example; their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = []
    for h in headers:
        for i, code in enumerate(examples(h)):
            f = out_dir / f"{h.stem}_{i}.c"
            f.write_text(f"/* {h.name}'s example {i}, written by scripts/header_examples.py */\n"
                         f'#include "tutti/{h.name}"\n\n{code}')
            files.append(f)
    return files


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    headers = [Path(a) for a in argv[1:]] or sorted((INCLUDE / "tutti").glob("*.h"))
    files = write(Path(argv[0]), headers)
    if not files:
        print("header_examples.py: no example found", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
