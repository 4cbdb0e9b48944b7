"""The results as rows: for the console tables of ``tutti-admin bench`` and the markdown section."""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Iterable, Sequence

from .common import human_bytes

SECTION_TITLE = "Store: layer-wise retrieve (file engine)"


def _fmt(v, spec: str = ".2f", none: str = "n/a") -> str:
    return none if v is None else format(v, spec)


def result_rows(res: dict) -> list[tuple[str, str, str, str]]:
    """(measurement, median, every run, note) rows shared by the table and the markdown."""
    med, runs = res["median"], res["runs"]
    fio_note = res["fio"]["note"]

    def each(key, spec=".2f"):
        vals = [r.get(key) for r in runs]
        return " / ".join(_fmt(v, spec) for v in vals) if any(v is not None for v in vals) else "n/a"

    req = med.get("retrieve_reqs_per_layer")
    per_layer = res["workload"]["blocks"] * res["workload"]["n_spans"] * res["workload"]["span_bytes"]
    avg_req = f"{human_bytes(per_layer / req)} per request" if req else "engine counter"
    return [
        ("store: layer-wise write", f"{_fmt(med.get('store_gbps'))} GB/s", each("store_gbps"),
         "one txn, one call per layer, finish (data and records durable)"),
        ("retrieve: layer-wise read", f"{_fmt(med.get('retrieve_gbps'))} GB/s", each("retrieve_gbps"),
         "submit layer l+1 before waiting for l; checksums verified"),
        ("retrieve: CPU per layer", f"{_fmt(med.get('retrieve_cpu_us_per_layer'), '.0f')} µs",
         each("retrieve_cpu_us_per_layer", ".0f"), "user+sys of the process / layers"),
        ("retrieve, checksums off", f"{_fmt(med.get('unverified_gbps'))} GB/s", each("unverified_gbps"),
         "store formatted again and opened with verify=False (not the default), its own store pass first"),
        ("retrieve, checksums off: CPU per layer", f"{_fmt(med.get('unverified_cpu_us_per_layer'), '.0f')} µs",
         each("unverified_cpu_us_per_layer", ".0f"), "the difference to the row above is XXH3 hashing"),
        ("retrieve: syscalls per layer", _fmt(med.get("retrieve_syscalls_per_layer"), ".1f"),
         each("retrieve_syscalls_per_layer", ".1f"), "engine counter"),
        ("retrieve: requests per layer", _fmt(req, ".1f"), each("retrieve_reqs_per_layer", ".1f"), avg_req),
        ("naive: one preadv per object", f"{_fmt(med.get('naive_gbps'))} GB/s", each("naive_gbps"),
         "Python, O_DIRECT, one thread, layer by layer"),
        ("naive: CPU per layer", f"{_fmt(med.get('naive_cpu_us_per_layer'), '.0f')} µs",
         each("naive_cpu_us_per_layer", ".0f"), "user+sys / layers"),
        ("fio: sequential read", f"{_fmt(med.get('fio_read_gbps'))} GB/s", each("fio_read_gbps"), fio_note),
        ("fio: sequential write", f"{_fmt(med.get('fio_write_gbps'))} GB/s", each("fio_write_gbps"), fio_note),
    ]


def ratio_rows(res: dict) -> list[tuple[str, str, str, str]]:
    rows = []
    for name, r in res["ratios"].items():
        met = "n/a" if r["met"] is None else ("yes" if r["met"] else "NO")
        rows.append((name, _fmt(r["value"]), f"≥ {r['target']:g}", met))
    return rows


def sweep_rows(res: dict) -> list[tuple[str, str, str, str, str]]:
    return [
        (str(s["blocks"]), human_bytes(s["bytes"]), _fmt(s["gbps"]), _fmt(s["cpu_us_per_layer"], ".0f"),
         _fmt(s["syscalls_per_layer"], ".1f"))
        for s in res["sweep"]
    ]


def _md_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def markdown_section(res: dict, title: str = SECTION_TITLE) -> str:
    m, w, s = res["machine"], res["workload"], res["store"]
    storage = "\n".join(f"  - {x}" for x in m["storage"])
    out = [
        f"## {title}",
        "",
        f"Measured {res['date']} with:",
        "",
        "```",
        res["command"] or "(library call)",
        "```",
        "",
        f"- Machine: {m['host']}, {m['cpu']}, {m['cores']} cores, {m['kernel']}, Python {m['python']}",
        f"- Storage ({s['n_members']} member(s), engine `{s['engine']}`):",
        storage,
        f"- Workload: `{w['model_id']}` geometry, {w['n_layers']} layers × {w['n_spans']} spans × "
        f"{human_bytes(w['span_bytes'])} per {w['block_size']}-token block; prefix of {w['prefix_tokens']} tokens = "
        f"{w['blocks']} blocks = {human_bytes(w['bytes'])}; host buffer laid out like vLLM's paged cache with "
        f"shuffled block ids; store of {s['n_slots']} slots; {len(res['runs'])} run(s), medians; "
        f"page cache dropped before reads: {'yes' if res['page_cache_dropped'] else 'no (not root)'}.",
        f"- Baselines on the same member(s): fio ({res['fio']['settings']}) over the store's data region "
        f"({human_bytes(res['fio']['bytes_per_member'] or 0)} per member) — {res['fio']['note']}; naive path: "
        "one `os.preadv` per object from Python into the same buffer.",
        "- Every retrieve and naive read was checked byte for byte against the stored data.",
        "",
        _md_table(("Measurement", "Median", "Runs", "Notes"), result_rows(res)),
        "",
        _md_table(("Ratio (median of per-run ratios)", "Value", "Target", "Met"), ratio_rows(res)),
        "",
        "Retrieve cost as the number of blocks grows (first N blocks of the prefix, layer-wise):",
        "",
        _md_table(("Blocks", "Bytes", "GB/s", "CPU µs / layer", "Syscalls / layer"), sweep_rows(res)),
        "",
    ]
    return "\n".join(out)


def replace_section(path: str | os.PathLike, title: str, section: str) -> None:
    """Replace the section ``## title`` of ``path`` (up to the next ``## ``) with ``section``, or append it."""
    path = Path(path)
    fresh = "# Benchmarks\n\nEvery number here was measured by the command shown with it.\n"
    text = path.read_text() if path.exists() else fresh
    heading = re.compile(r"^## " + re.escape(title) + r"[ \t]*$", re.M)
    m = heading.search(text)
    if m:
        nxt = re.compile(r"^## ", re.M).search(text, m.end())
        end = nxt.start() if nxt else len(text)
        text = text[: m.start()] + section + ("\n" if nxt else "") + text[end:]
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def write_markdown(path: str | os.PathLike, res: dict, title: str = SECTION_TITLE) -> None:
    """Write the store benchmark's results as the section ``## title`` of ``path``."""
    replace_section(path, title, markdown_section(res, title))


OUTPUT_OPTIONS = ("--workdir", "--json", "--output", "--section", "--render")


def shown_command(program: str, argv: Sequence[str], output_options: Sequence[str] = OUTPUT_OPTIONS) -> str:
    """``program`` and ``argv`` as a shell line, without the options that only say where files go (the
    same measurement written elsewhere is the same command)."""
    import shlex

    out, skip = [], False
    opts = tuple(output_options)
    for a in argv:
        if skip:
            skip = False
        elif a in opts:
            skip = True
        elif not a.startswith(tuple(o + "=" for o in opts)):
            out.append(a)
    return " ".join([program] + [shlex.quote(a) for a in out])
