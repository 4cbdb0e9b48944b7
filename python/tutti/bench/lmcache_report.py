"""What the LMCache comparison reports (lmcache_compare.py): the engines' rows, the summary, the markdown
section of docs/benchmarks.md and the console table."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from .common import (
    human_bytes,
)
from .lmcache_compare import COMPARE_TITLE, TARGET

if TYPE_CHECKING:
    pass


def _f(v: float | None, spec: str = ".2f") -> str:
    return "n/a" if v is None else format(v, spec)


def engine_rows(res: dict) -> list[tuple[str, ...]]:
    """(engine, verifies, retrieve GB/s, runs, CPU s/GB, × fio, Tutti ÷ it, store GB/s, store+fsync GB/s,
    store CPU s/GB) per engine, Tutti's rows first."""
    med, ratios = res["median"], res["ratios"]
    out: list[tuple[str, ...]] = []
    for n in res["engines"]:
        m = med.get(n, {})
        g, s, d = m.get("retrieve"), m.get("store"), m.get("store_durable")
        each = ratios["tutti/each"].get(n)
        label = res["engines"][n]["label"] + (" **(best LMCache)**" if n == res["best_lmcache"] else "")
        out.append((
            label, res["engines"][n]["verifies"],
            f"**{_f(g['gbps'])}**" if g else "n/a",
            " / ".join(_f(x) for x in g["runs_gbps"]) if g else "n/a",
            _f(g["cpu_s_per_gb"], ".3f") if g else "n/a",
            _f(ratios["vs_fio"].get(n)) if n != "fio" else "—",
            _f(each) if each is not None else "—",
            _f(s["gbps"]) if s else "—",
            _f(d["gbps"]) if d else "—",
            _f(s["cpu_s_per_gb"], ".3f") if s else "—",
        ))
    return out


ENGINE_HEADER = ("Engine", "Checks on read", "Retrieve GB/s", "Runs (GB/s)", "Retrieve CPU s/GB", "× fio",
                 "Tutti ÷ engine", "Store GB/s", "Store + fsync GB/s", "Store CPU s/GB")


def summary_row(res: dict) -> tuple[str, ...]:
    med, r, best = res["median"], res["ratios"], res["best_lmcache"]

    def g(n: str | None) -> str:
        return _f(med[n]["retrieve"]["gbps"]) if n and n in med and "retrieve" in med[n] else "n/a"

    def met(k: str) -> str:
        v = res["met"][k]
        return "n/a" if v is None else ("yes" if v else "**no**")

    return (res["medium"]["kind"], str(res["workload"]["prefix_tokens"]), human_bytes(res["workload"]["bytes"]),
            f"{res['engines'][best]['label'] if best else 'n/a'}: {g(best)}", g("tutti"),
            f"{_f(r['tutti/best_lmcache_retrieve'])} ({met('tutti/best_lmcache_retrieve')})", g("tutti_unverified"),
            f"{_f(r['tutti_unverified/best_lmcache_retrieve'])} ({met('tutti_unverified/best_lmcache_retrieve')})",
            g("fio"), _f(r["tutti/best_lmcache_store_durable"]))


SUMMARY_HEADER = ("Medium", "Tokens", "KV", "Best LMCache engine: retrieve GB/s", "Tutti (checksums) GB/s",
                  f"Tutti ÷ best (≥ {TARGET:g})", "Tutti (no checksums) GB/s", f"no checksums ÷ best (≥ {TARGET:g})",
                  "fio read GB/s", "Tutti store ÷ best LMCache store + fsync")


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def markdown_section(results: Sequence[dict], command: str, title: str = COMPARE_TITLE,
                     date: str | None = None, notes: Sequence[str] = ()) -> str:
    """One section for one or more comparisons (e.g. disk and tmpfs, 8K and 32K tokens)."""
    first = results[0]
    m, lay = first["machine"], first["layout"]
    rb = first["raw_block"]
    lmc = next((r["lmcache"] for r in results if r["lmcache"].get("version")), first["lmcache"])
    out = [
        f"## {title}", "",
        f"Measured {date or first['date']} with:", "",
        "```", command or first["command"] or "(library call)", "```", "",
        f"- Machine: {m['host']}, {m['cpu']}, {m['cores']} cores, {m['kernel']}, Python {m['python']}.",
        "- Media: " + "; ".join(dict.fromkeys(f"{r['medium']['kind']} = {r['medium']['description']}"
                                              for r in results)) + ".",
        f"- Workload: `{first['workload']['model_id']}` geometry ({first['workload']['n_layers']} layers, "
        f"K and V of {human_bytes(first['workload']['span_bytes'])} per {first['workload']['block_size']}-token "
        f"block), prefixes of " + ", ".join(dict.fromkeys(str(r["workload"]["prefix_tokens"]) for r in results))
        + f" tokens; LMCache's {lay['chunk_tokens']}-token chunks of {human_bytes(lay['chunk_bytes'])} "
        f"({lay['memory_format']}). {len(first['runs'])} run(s) per row, medians; engine order rotated run by run; "
        "ratios are medians of per-run ratios.",
        f"- Engines: Tutti (engine `{first['tutti']['engine']}`); {rb['package']} {rb['version']} "
        f"(fixed buffers registered: {'yes' if rb['fixed_buffers'] else 'no'}); LMCache's local-disk I/O "
        "reproduced in plain Python (open/readinto/write, 4 threads, as lmcache 0.5.6 does it); "
        + (f"lmcache {lmc['version']} itself (`RawBlockCore`) through `{lmc['python']}`."
           if lmc.get("version") else "lmcache itself not run (no --lmcache-python)."),
        "- Page cache: "
        + ("dropped before every read on the disk (as root; `sync` first)"
           + ("" if all(r["page_cache_dropped"] for r in results if r["medium"]["kind"] == "disk") else
              " (**not** in every row: not root)") + "; "
           if any(r["medium"]["kind"] == "disk" for r in results) else "")
        + "every engine but `local-disk, buffered` reads with O_DIRECT"
        + ("; tmpfs has no cache to drop (its files are memory)" if any(r["medium"]["kind"] == "tmpfs"
                                                                        for r in results) else "") + ".",
        f"- Baseline: fio sequential read of Tutti's store file in the same run ({first['fio']['note']}; "
        f"{first['fio']['settings']}).",
        "- Every read is compared byte for byte with the source; the destination is overwritten before each.",
        "", _md_table(SUMMARY_HEADER, [summary_row(r) for r in results]), "",
    ]
    for r in results:
        chosen = r["fio"].get("chosen")
        out += [f"**{r['medium']['kind']}, {r['workload']['prefix_tokens']} tokens "
                f"({human_bytes(r['workload']['bytes'])})** — fio: "
                + (f"{chosen[0]}/QD{chosen[1]} chosen by the calibration" if chosen else r["fio"]["note"])
                + "; store durable: Tutti's `finish` fsyncs, the LMCache engines do not (`Store GB/s`), "
                "`Store + fsync` adds an fdatasync of their files.", "",
                _md_table(ENGINE_HEADER, engine_rows(r)), ""]
    out += list(notes)
    return "\n".join(out).rstrip("\n") + "\n"


def print_compare(con: Any, res: dict) -> None:
    """Console tables of one comparison."""
    from rich.table import Table

    w = res["workload"]
    con.print(f"{w['model_id']} geometry; prefix {w['prefix_tokens']} tokens = {human_bytes(w['bytes'])}; "
              f"{res['medium']['kind']}: {res['medium']['description']}; {len(res['runs'])} run(s)")
    t = Table(title="Retrieve and store (medians; GB/s, CPU s per GB)", title_justify="left")
    keep = (0, 2, 4, 5, 6, 7, 8, 9)  # the console drops the checks (listed below) and every run's value
    for i in keep:
        t.add_column(ENGINE_HEADER[i].replace(" GB/s", "").replace("Retrieve CPU s/GB", "CPU s/GB"),
                     justify="left" if i == 0 else "right")
    for row in engine_rows(res):
        t.add_row(*(row[i].replace("**", "").replace(" (best LMCache)", " *") for i in keep))
    con.print(t)
    con.print("* the best LMCache engine.  Checks on read: " + "; ".join(
        f"{e['label']}: {e['verifies']}" for n, e in res["engines"].items() if n != "fio"))
    best = res["best_lmcache"]
    for k, label in (("tutti/best_lmcache_retrieve", "Tutti (checksums on) ÷ best LMCache"),
                     ("tutti_unverified/best_lmcache_retrieve", "Tutti (checksums off) ÷ best LMCache")):
        v, met = res["ratios"][k], res["met"][k]
        style = "green" if met else "red"
        con.print(f"[{style}]{label} ({best}): {_f(v)} (target ≥ {TARGET:g}: "
                  f"{'n/a' if met is None else 'met' if met else 'NOT met'})[/]")
    con.print("[green]every read verified byte for byte[/]")
