"""Every relative link in the README and docs/ names a file that exists and, with #anchor, a heading or
explicit anchor in it: the docs cross-reference each other by anchor, and a renamed heading silently
broke one before."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]*)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def _slug(heading: str) -> str:
    # GitHub's rule: lower case, drop punctuation other than '-' and '_', spaces become '-'.
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set:
    text = FENCE.sub("", path.read_text())
    seen: dict = {}
    out = set()
    for heading in re.findall(r"^#{1,6} (.*)$", text, re.M):
        slug = _slug(heading)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    out.update(re.findall(r'<a (?:id|name)="([^"]+)"', text))
    return out


def _links(path: Path):
    text = FENCE.sub("", path.read_text())
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("/"):
            continue  # a URL or an absolute path: not this repository's to check
        yield target


def test_slug_follows_githubs_rule():
    assert _slug("Side by side with LMCache's disk engines (into GPU memory, H200)") == (
        "side-by-side-with-lmcaches-disk-engines-into-gpu-memory-h200")
    assert _slug("The drain rule on the GPU paths (H200, 2026-12-03)") == (
        "the-drain-rule-on-the-gpu-paths-h200-2026-12-03")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(doc):
    broken = []
    for target in _links(doc):
        file_part, _, anchor = target.partition("#")
        dest = (doc.parent / file_part).resolve() if file_part else doc
        if not dest.exists():
            broken.append(f"{target}: no such file")
            continue
        if anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading or anchor '{anchor}' in {dest.relative_to(ROOT)}")
    assert not broken, f"{doc.relative_to(ROOT)}:\n  " + "\n  ".join(broken)
