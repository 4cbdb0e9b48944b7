"""The markdown section of benchmarks/serving.py: TTFT vs rate per configuration, from its JSON."""
import statistics

from .workload import max_rate_meeting_slo, rate_ratio

LABELS = {
    "none": "no connector (vLLM prefix caching)",
    "example": "ExampleConnector",
    "offloading": "OffloadingConnector",
    "tutti": "TuttiConnector (disk)",
    "tutti-slow": "TuttiConnector (writes throttled)",
}



def _save_share(meta: dict) -> float:
    """One document's throttled save as a percentage of the no-connector cold TTFT."""
    return meta["doc_bytes"] / (meta["throttle_mbps"] or 1) / 1e6 / meta["reference_cold_s"] * 100

def _med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _fmt_s(x):
    if x is None:
        return "—"
    return "∞" if x == float("inf") else f"{x:.3f}"


def _by_config(runs):
    """{config: [record of run 0, run 1, ...]} in the order the configurations ran."""
    out = {}
    for run in runs:
        for rec in run["records"]:
            out.setdefault(rec["config"], []).append(rec)
    return out


def _slo_rate(rec, slo_s, key="p_slo", which="summary"):
    if "failed" in rec:
        return None, "failed"
    return max_rate_meeting_slo({x["rate"]: x[which] for x in rec["rates"]}, slo_s, key)


def _fmt_rate(r):
    rate, kind = r
    if kind == "failed":
        return "—"
    if rate is None:
        return "< lowest rate swept"
    return f"{'≥ ' if kind == 'at least' else ''}{rate:.3f}"


def _met(ok):
    return "—" if ok is None else ("yes" if ok else "**no**")


def targets(meta, runs, cfgs, slo):
    """Issue 13's "Must show" lines for the CPU serving benchmark, as measured here."""
    ref = cfgs.get("none")
    if not ref or all("failed" in r for r in ref):
        return []
    out = ["", "| Target (issue 13) | Measured | Met |", "|---|---|---|"]
    share = None
    if meta.get("reference_cold_s") and meta.get("throttle_mbps") and "tutti-slow" in cfgs:
        share = meta["doc_bytes"] / (meta["throttle_mbps"] * 1e6) / meta["reference_cold_s"]
        out.append(f"| throttled store: a synchronous save of one document ≥ 30 % of the no-connector cold "
                   f"TTFT | {share * 100:.0f} % | {_met(share >= 0.3)} |")
    for name in ("tutti-slow", "tutti"):
        recs = [r for r in cfgs.get(name, []) if "failed" not in r]
        if not recs:
            continue
        ratio = _med([r["cold_p50"] / x["cold_p50"] for r, x in zip(cfgs[name], ref)
                      if "failed" not in r and "failed" not in x])
        out.append(f"| {LABELS[name]}: cold TTFT ≤ 1.05 × no connector | {ratio:.3f} | {_met(ratio <= 1.05)} |")
        for key, what in (("p_slo", f"p{meta['slo_quantile'] * 100:g}"), ("p50", "p50")):
            rates = [(_slo_rate(r, slo, key), _slo_rate(x, slo, key)) for r, x in zip(cfgs[name], ref)]
            vals = [None if a is None else (float("inf") if b is None else a / b) for (a, _), (b, _) in rates]
            shown = " / ".join(rate_ratio(a, b) for a, b in rates)
            ok = None if all(v is None for v in vals) else all(v is not None and v >= 2 for v in vals)
            out.append(f"| {LABELS[name]}: highest rate at the SLO ({what}) ≥ 2 × no connector | {shown} | "
                       f"{_met(ok)} |")
        outs = [run["outputs"].get(name) for run in runs if run["outputs"].get(name)]
        differ = sum(len(o["differ"]) for o in outs)
        out.append(f"| {LABELS[name]}: outputs identical to no connector | "
                   f"{sum(o['compared'] for o in outs) - differ} of {sum(o['compared'] for o in outs)} | "
                   f"{_met(differ == 0 if outs else None)} |")
    return out


def _order(meta, runs):
    w = meta["workload"]
    if w.get("order", "shuffled") != "sessions":
        return (f"in a random order (seed {w['seed']}), Poisson arrivals (a document's first question is "
                "the earliest of its questions' random places, so first sightings crowd the start of a "
                "run)")
    reuse = w["reuse"]
    windows = [x["summary"]["n"] / x["summary_all"]["n"] for run in runs for rec in run["records"]
               for x in rec.get("rates", []) if "summary_all" in x]
    return (f"as sessions (seed {w['seed']}): a document opens at every {w['questions']}th arrival of a "
            f"Poisson process of the rate, each document's next question an exponential gap of mean "
            f"{reuse:g}/rate s after the one before (about {reuse:g} other requests between; "
            f"{(w['questions'] - 1) * reuse / w['questions']:.0f} documents in use at once, "
            f"{(w['questions'] - 1) * reuse / w['questions'] * meta['doc_bytes'] / meta['kv_cache_bytes']:.1f}"
            "× vLLM's KV cache), so cold prefills arrive at a steady rate. TTFT statistics and the SLO are "
            f"over the steady window (sent between {w['questions'] - 1} mean gaps after the first opening "
            "and the last opening, where the load is the nominal rate"
            + (f": {min(windows):.0%}–{max(windows):.0%} of the requests" if windows else "")
            + "); every request is sent and its output compared")


def render(meta, runs, title):
    m, w = meta["machine"], meta["workload"]
    cfgs = _by_config(runs)
    ref = cfgs.get("none")
    slo = meta["slo_s"]
    lines = [f"## {title}", "", f"Measured {meta['date']} with:", "", "```", meta["command"], "```", "",
             f"- Machine: {m['node']}, {m['cpu']}, {m['cores']} cores, Linux {m['kernel']}, Python "
             f"{m['python']}, vLLM {m['vllm']} (CPU build). Load average at the end: "
             f"{m['loadavg_end'][0]:.1f} (other jobs share this machine: TTFTs move with them).",
             f"- Model: Llama-style, random weights made locally (`tutti.tiny_model` size "
             f"`{meta['model']['size']}`: {meta['model']['num_hidden_layers']} layers, hidden "
             f"{meta['model']['hidden_size']}, {meta['model']['num_attention_heads']} heads / "
             f"{meta['model']['num_key_value_heads']} KV heads, bf16), {meta['kv_per_token']} bytes of KV "
             f"per token, block {meta['block']} tokens.",
             f"- Server: vLLM's OpenAI API server, multiprocess mode, one fresh server per configuration "
             f"and run; KV cache {meta['kv_cache_bytes'] / 2**20:.0f} MiB (`--kv-cache-memory-bytes`).",
             f"- Workload: per rate, {w['docs']} documents of {w['doc_tokens']} tokens "
             f"({meta['doc_bytes'] / 2**20:.1f} MiB of KV each, "
             f"{w['docs'] * meta['doc_bytes'] / meta['kv_cache_bytes']:.1f}× vLLM's KV cache together), "
             f"each asked {w['questions']} questions of {w['question_tokens']} tokens (prompt = document + "
             f"question), {_order(meta, runs)}; every rate has its own "
             f"documents, the same in every configuration. Cold phase: {w['cold']} fresh documents, one "
             f"request at a time. Greedy, {w['max_tokens']} tokens; TTFT = client send → first streamed "
             "token (aiohttp).",
             f"- SLO: p{meta['slo_quantile'] * 100:g} TTFT ≤ {_fmt_s(slo)} s"
             + (f" ({slo / meta['reference_cold_s']:.1f}× the no-connector cold TTFT)"
                if meta.get("reference_cold_s") else "") + "; a rate counts when the SLO holds there and "
             "at every lower rate swept.",
             "- Stores: files in a temporary directory on the machine's disk (ext4 on a virtio disk)."
             + ((f" Throttled store: `TUTTI_FAULTS=rate:write:mbps={meta['throttle_mbps']}` (libtutti's fault "
                 "engine paces every write through one emulated pipe at that rate; reads untouched) — one "
                 f"document's save takes {meta['doc_bytes'] / (meta['throttle_mbps'] or 1) / 1e6 * 1e3:.0f} ms "
                 "there" + (f", {_save_share(meta):.0f} % of the no-connector cold TTFT"
                            if meta.get("reference_cold_s") else "") + ".") if "tutti-slow" in cfgs else ""),
             f"- Runs: {w['runs']}" + (" (medians over runs)" if w["runs"] > 1 else "") + ".", ""]
    # Failed configurations: the reason instead of numbers.
    for name, recs in cfgs.items():
        if all("failed" in r for r in recs):
            lines.append(f"- {LABELS.get(name, name)}: **{recs[0].get('failed_when', 'did not run')}**: "
                         f"`{recs[0]['failed']}`")
    lines.append("")
    live = {n: rs for n, rs in cfgs.items() if not all("failed" in r for r in rs)}
    # Cold TTFT
    lines += ["| Configuration | Cold TTFT p50 (s) | vs no connector | Server ready (s) |", "|---|---|---|---|"]
    for name, recs in live.items():
        ok = [r for r in recs if "failed" not in r]
        ratio = None
        if ref:
            ratio = _med([r["cold_p50"] / x["cold_p50"] for r, x in zip(recs, ref)
                          if "failed" not in r and "failed" not in x])
        lines.append(f"| {LABELS.get(name, name)} | {_fmt_s(_med([r['cold_p50'] for r in ok]))} | "
                     f"{'—' if ratio is None or name == 'none' else f'{ratio:.3f}'} | "
                     f"{_fmt_s(_med([r['ready_s'] for r in ok]))} |")
    # TTFT per rate
    rates = meta["rates"] or []
    lines += ["", "TTFT p50 / p99 (s) per arrival rate (requests/s):", "",
              "| Rate | " + " | ".join(LABELS.get(n, n) for n in live) + " |",
              "|---|" + "---|" * len(live)]
    for i, rate in enumerate(rates):
        cells = []
        for recs in live.values():
            ok = [r for r in recs if "failed" not in r and i < len(r["rates"])]
            p50 = _med([r["rates"][i]["summary"]["p50"] for r in ok])
            p99 = _med([r["rates"][i]["summary"]["p99"] for r in ok])
            bad = sum(r["rates"][i]["summary"]["failed"] for r in ok)
            cells.append(f"{_fmt_s(p50)} / {_fmt_s(p99)}" + (f" ({bad} failed)" if bad else ""))
        lines.append(f"| {rate:.3f} | " + " | ".join(cells) + " |")
    # Highest rate at the SLO
    q = f"p{meta['slo_quantile'] * 100:g}"
    lines += ["", f"| Configuration | Highest rate at the SLO, {q} (req/s) | vs no connector | Same with the "
              "median (p50) ≤ SLO | vs no connector | Outputs identical to no connector |",
              "|---|---|---|---|---|---|"]
    for name, recs in live.items():
        per_run = [_slo_rate(r, slo) for r in recs]
        ratios = [rate_ratio(a, _slo_rate(x, slo)) for a, x in zip(per_run, ref or [])] if ref else []
        per_run50 = [_slo_rate(r, slo, "p50") for r in recs]
        ratios50 = [rate_ratio(a, _slo_rate(x, slo, "p50")) for a, x in zip(per_run50, ref or [])] if ref else []
        same = "—"
        if name != "none":
            outs = [run["outputs"].get(name) for run in runs if run["outputs"].get(name)]
            compared = sum(o["compared"] for o in outs)
            differ = sum(len(o["differ"]) for o in outs)
            same = f"{compared - differ} of {compared}" + (
                f" (differ: {', '.join(outs[0]['differ'][:3])}{'…' if differ > 3 else ''})" if differ else "")
            checked = [v for o in outs for v in o.get("alone", {}).values()]
            if checked:
                same += (f"; of those, {sum(v['config'] == v['alone'] for v in checked)} equal the prompt run "
                         f"alone in a fresh engine, where no connector's output does in "
                         f"{sum(v['none'] == v['alone'] for v in checked)}")
        lines.append(f"| {LABELS.get(name, name)} | {' / '.join(_fmt_rate(r) for r in per_run)} | "
                     f"{'—' if name == 'none' else ' / '.join(ratios) or '—'} | "
                     f"{' / '.join(_fmt_rate(r) for r in per_run50)} | "
                     f"{'—' if name == 'none' else ' / '.join(ratios50) or '—'} | {same} |")
    if all("summary_all" in x for recs in live.values() for r in recs if "failed" not in r for x in r["rates"]):
        # Sessions: the same judged over every request, the ramp and the drain included.
        lines += ["", f"The same over every request sent (ramp and drain included), {q}:", "",
                  "| Configuration | Highest rate at the SLO (req/s) | vs no connector | "
                  + " | ".join(f"{q} at {r:.3f}" for r in rates) + " |", "|---|---|---|" + "---|" * len(rates)]
        for name, recs in live.items():
            per_run = [_slo_rate(r, slo, which="summary_all") for r in recs]
            ratios = ([rate_ratio(a, _slo_rate(x, slo, which="summary_all")) for a, x in zip(per_run, ref)]
                      if ref else [])
            cells = [_fmt_s(_med([r["rates"][i]["summary_all"]["p_slo"] for r in recs
                                  if "failed" not in r and i < len(r["rates"])])) for i in range(len(rates))]
            lines.append(f"| {LABELS.get(name, name)} | {' / '.join(_fmt_rate(r) for r in per_run)} | "
                         f"{'—' if name == 'none' else ' / '.join(ratios) or '—'} | " + " | ".join(cells) + " |")
    lines += targets(meta, runs, cfgs, slo)
    # Tutti's own counters
    for name in ("tutti", "tutti-slow"):
        for i, rec in enumerate(cfgs.get(name, [])):
            s, wk = rec.get("stats", {}).get("scheduler", {}), rec.get("stats", {}).get("worker0", {})
            if not s and not wk:
                continue
            lines.append("")
            lines.append(f"{LABELS[name]}, run {i}: scheduler promised {s.get('hit_tokens', 0)} of "
                         f"{s.get('query_tokens', 0)} prompt tokens from the store; worker loaded "
                         f"{wk.get('load_blocks', 0)} blocks ({wk.get('load_bytes', 0) / 2**20:.0f} MiB, "
                         f"{wk.get('load_s', 0):.2f} s), saved {wk.get('save_blocks', 0)} blocks "
                         f"({wk.get('save_bytes', 0) / 2**20:.0f} MiB, {wk.get('save_s', 0):.2f} s); "
                         f"{wk.get('load_errors', 0)} load errors, {wk.get('corrupt_blocks', 0)} corrupt, "
                         f"{wk.get('save_errors', 0)} save errors.")
    lines.append("")
    return "\n".join(lines)
