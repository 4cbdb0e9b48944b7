"""tutti-admin plan: predicted TTFT of SSD-backed prefill vs recompute and HBM, from a profile or FLOPs."""
from __future__ import annotations

import re

import click

from . import limits
from .app import main
from .common import EXIT_CODES, EXIT_USAGE, CliError, _emit_json, _json_opt, make_console
from .params import Choice, Finite, InputFile, Parsed, Whole, c_field
from .text import shown

# H200 SXM datasheet: 989 dense BF16 TFLOP/s, 4.8 TB/s HBM3e.  Used only without --profile.
H200_TFLOPS = 989.0
H200_HBM_GBPS = 4800.0

# Rates and speeds span what hardware does, from 1 MB/s to 1 PB/s (an exaflop for compute): far
# beyond it the model's float arithmetic would round a time to zero or overflow it to infinity.
_RATE = Finite(1e-3, min_open=False, max=1e6)
_TOKENS_RE = re.compile(r"^\s*([0-9]{1,30})\s*([kKmM]?)\s*$")


def parse_tokens(text: str) -> list[int]:
    """'32K,64K,128K' -> [32768, 65536, 131072] (K = 1024 tokens, M = 1024 K)."""
    out = []
    for part in text.split(","):
        m = _TOKENS_RE.match(part)
        if not m:
            raise click.BadParameter(f"{shown(part.strip())} is not a token count: use e.g. 32768, 32K, 1M")
        n = int(m.group(1)) * {"": 1, "k": 1024, "m": 1 << 20}[m.group(2).lower()]
        if n < 1:
            raise click.BadParameter(f"token count must be >= 1, got {shown(part.strip())}")
        out.append(n)
    return out


def parse_rates(text: str) -> list[float]:
    out = []
    for part in text.split(","):
        try:
            v = float(part.rstrip("% ")) / (100 if part.strip().endswith("%") else 1)
        except ValueError:
            raise click.BadParameter(f"{shown(part.strip())} is not a hit rate: use e.g. 0.9 or 90%") from None
        if not 0.0 <= v <= 1.0:
            raise click.BadParameter(f"hit rate {shown(part.strip())} is not in [0, 1]")
        out.append(v)
    return out


def longest_prompt(block_size: int) -> int:
    """Tokens of the longest prompt a store serves in one lookup: tt_store_lookup() takes its block
    count as an unsigned int."""
    return limits.arg_max("tt_store_lookup", 2) * block_size


def _ms(s: float) -> str:
    return f"{s * 1e3:.1f}"


def _pct(v: float | None) -> str:
    return "never" if v is None else f"{v * 100:.1f}%"


def plan_lengths(shape, hw, profile, tokens: list[int], hit_rates: list[float], depth: int,
                 hw_gemms=None) -> list[dict]:
    """Per length: the predictions with ``hw``; with ``hw_gemms`` (the I/O rate the profile measured
    beside GEMMs, when ``hw`` is the rate alone) also the crossover that rate gives: a pessimistic bound."""
    from ..sched import best_load_blocks, crossover_hit_rate, loading_stops_paying, predict

    out = []
    for t in tokens:
        rows = []
        for h in hit_rates:
            r = predict(shape, hw, profile, t, h, depth).to_dict()
            # Loading only part of the hit (the rest recomputed) when the pipeline is I/O-bound.
            k = best_load_blocks(shape, hw, profile, t, r["hit_tokens"], depth)
            best = predict(shape, hw, profile, t, h, depth, hit_tokens=r["hit_tokens"], load_blocks=k)
            r.update(best_load_tokens=best.load_tokens, best_ttft_s=best.ttft_s)
            rows.append(r)
        cross = crossover_hit_rate(shape, hw, profile, t)
        ln = {"tokens": t, "recompute_ttft_s": shape.n_layers * profile.layer_time(t, 0),
              "crossover_hit_rate": cross,
              "loading_stops_paying_hit_rate": loading_stops_paying(shape, hw, profile, t, depth),
              "rows": rows}
        if hw_gemms is not None:
            ln["crossover_hit_rate_io_beside_gemms"] = crossover_hit_rate(shape, hw_gemms, profile, t)
        out.append(ln)
    return out


def _preset_names() -> list[str]:
    from ..sched import PRESETS

    return list(PRESETS)


@main.command("plan", epilog=EXIT_CODES)
@click.option("--model", "model_name", type=Choice(_preset_names(), case_sensitive=False),
              help="model shape preset; compute time from FLOPs (--tflops, --mfu, --hbm-gbps)")
@click.option("--profile", "profile_path", type=InputFile(),
              help="profile table from `tutti-admin profile`: the model's shape and measured layer times")
@click.option("--ssd-gbps", type=_RATE, help="read rate of one SSD, GB/s (default: the profile's io, else 7)")
@click.option("--ssd-write-gbps", type=_RATE, help="write rate of one SSD, GB/s (default: the read rate)")
@click.option("--n-ssd", type=Whole(1, limits.max_members, "a store has at most TT_MAX_MEMBERS members"),
              help="SSDs the store is striped over (default: the profile's io, else 4)")
@click.option("--pcie-gbps", type=_RATE, help="cap of the link between the SSDs and the GPU, GB/s (default: none)")
@click.option("--tokens", "tokens", type=Parsed(parse_tokens, "N,N,..."), default="32K,64K,128K", show_default=True,
              help="prompt lengths")
@click.option("--hit-rates", "rates", type=Parsed(parse_rates, "R,R,..."), default="0.5,0.75,0.9,1.0",
              show_default=True,
              help="fractions of each prompt stored in Tutti")
@click.option("--prefetch-depth", type=c_field("tt_fingerprint", "n_layers"), default=2, show_default=True,
              help="layers a read may run ahead of compute")
@click.option("--tflops", type=_RATE, default=H200_TFLOPS, show_default=True,
              help="peak dense TFLOP/s for the FLOP model (H200 BF16)")
@click.option("--mfu", type=Finite(1e-3, min_open=False, max=1), default=0.5, show_default=True,
              help="fraction of --tflops a prefill achieves (an assumption: measure with a profile)")
@click.option("--hbm-gbps", type=_RATE, default=H200_HBM_GBPS, show_default=True, help="HBM bandwidth, GB/s")
@_json_opt
def plan_cmd(model_name, profile_path, ssd_gbps, ssd_write_gbps, n_ssd, pcie_gbps, tokens, rates,
             prefetch_depth, tflops, mfu, hbm_gbps, as_json):
    """Predict TTFT of SSD-backed prefill: recompute vs all-in-HBM vs Tutti.

    For each prompt length and hit rate: the TTFT when every token is
    recomputed, when the stored prefix is already in HBM (compute only), and
    with Tutti (prefix loaded layer by layer, overlapped with compute), the
    bubble (TTFT - compute: the GPU waiting for KV), and how much of the new
    KV's write fits into I/O slack during prefill (the rest is deferred to
    decode).  Per length: the crossover hit rate above which loading a layer
    takes longer than computing it (bubbles open), and the hit rate at which
    loading stops paying against recompute.  Equations: docs/scheduler.md.

    Needs --model or --profile.  Runs anywhere: no GPU, no torch.
    """
    from ..sched import PRESETS, ComputeProfile, Hardware, ProfileError, plan_io

    if bool(model_name) == bool(profile_path):
        raise CliError("give exactly one of --model NAME and --profile TABLE.json", EXIT_USAGE)
    if profile_path:
        try:
            profile = ComputeProfile.from_json(profile_path)
        except ProfileError as e:
            raise CliError(str(e), EXIT_USAGE) from None
        shape = profile.shape
    else:
        shape = PRESETS.get(model_name.lower())
        if shape is None:
            raise CliError(f"unknown model {model_name!r}: one of {', '.join(PRESETS)} (or --profile)", EXIT_USAGE)
        profile = ComputeProfile.analytic(shape, tflops * mfu, hbm_gbps)
    most = longest_prompt(shape.block_size)
    if max(tokens) > most:
        raise CliError(f"--tokens {max(tokens)}: longer than one store lookup serves ({most} tokens: "
                       "tt_store_lookup() counts blocks in an unsigned int)", EXIT_USAGE)
    io = profile.io or {}
    pio = plan_io(io)  # the rate measured alone when the profile has it (docs/scheduler.md)
    # Both rates from the profile, or the second column would mix a given rate with a measured one.
    rates_from_profile = ssd_gbps is None and ssd_write_gbps is None and pio is not None
    read_source = "given" if ssd_gbps is not None else pio["source"] if pio else "default"
    if ssd_gbps is None:
        ssd_gbps = pio["read_gbps"] / pio["n_ssd"] if pio else 7.0
    if ssd_write_gbps is None:
        ssd_write_gbps = pio["write_gbps"] / pio["n_ssd"] if pio else ssd_gbps
    if n_ssd is None:
        n_ssd = io.get("n_ssd", 4)
    hw = Hardware.per_ssd(ssd_gbps, n_ssd, ssd_write_gbps, pcie_gbps)
    hw_gemms = None
    if rates_from_profile and pio["source"] == "alone":
        n = io["n_ssd"]
        hw_gemms = Hardware.per_ssd(io["read_gbps"] / n, n_ssd, io["write_gbps"] / n, pcie_gbps)

    lengths = plan_lengths(shape, hw, profile, tokens, rates, prefetch_depth, hw_gemms)
    if as_json:
        _emit_json({"model": {**shape.to_dict(), "name": shape.name},
                    "hardware": {"read_gbps": hw.read_gbps, "write_gbps": hw.write_gbps, "n_ssd": hw.n_ssd,
                                 "pcie_gbps": hw.pcie_gbps, "effective_read_gbps": hw.read_bps / 1e9,
                                 "effective_write_gbps": hw.write_bps / 1e9,
                                 "io_source": read_source,
                                 "read_gbps_io_beside_gemms": hw_gemms.read_gbps if hw_gemms else None},
                    "compute": profile.describe(), "prefetch_depth": prefetch_depth, "lengths": lengths})
        return
    print_plan(shape, hw, profile, lengths, prefetch_depth)


def print_plan(shape, hw, profile, lengths: list[dict], depth: int) -> None:
    from rich.table import Table

    con = make_console()
    link = f", link {hw.pcie_gbps:g} GB/s" if hw.pcie_gbps else ""
    con.print(f"model {shape.name or '(profile)'}: {shape.n_layers} layers, "
              f"{shape.kv_bytes_per_token_layer * shape.n_layers / 1024:.0f} KiB KV per token; "
              f"SSDs: {hw.n_ssd} x {hw.read_gbps / hw.n_ssd:g} GB/s read, {hw.write_gbps / hw.n_ssd:g} GB/s write"
              f"{link} -> {hw.read_bps / 1e9:g} GB/s read; prefetch depth {depth}")
    d = profile.describe()
    line = f"compute: {d['source']}"
    if profile.points:
        line += (f" on {d['device']} ({d['date']}): {d['points']} points, fit error rms "
                 f"{d['rms_rel_err'] * 100:.1f}% max {d['max_rel_err'] * 100:.1f}%")
    con.print(line)
    if profile.points and d["max_rel_err"] > 0.15:  # the a + b*n + c*n*(p + n/2) shape does not fit this GPU well
        con.print(f"[yellow]warning: the fitted layer time misses a measured point by {d['max_rel_err'] * 100:.0f}% "
                  f"(new {profile.fit.worst.new_tokens}, prefix {profile.fit.worst.prefix_tokens}): "
                  "predictions near it are rough[/yellow]")
    t = Table(title="Prefill TTFT (ms)")
    for col in ("tokens", "hit", "recompute", "in HBM", "Tutti", "bubble", "speedup", "best load (loaded)",
                "writes in slack", "deferred to decode"):
        t.add_column(col, justify="right")
    for ln in lengths:
        for i, r in enumerate(ln["rows"]):
            slack = (f"{r['write_in_slack_s'] / r['write_s'] * 100:.0f}% of {_ms(r['write_s'])}"
                     if r["write_s"] > 0 else "-")
            deferred = f"{r['deferred_write_bytes'] / 2**20:.1f} MiB" if r["deferred_write_bytes"] else "-"
            best = ("same" if r["best_load_tokens"] == r["load_tokens"] else
                    f"{_ms(r['best_ttft_s'])} ({r['best_load_tokens'] / r['total_tokens'] * 100:.0f}%)")
            t.add_row(f"{ln['tokens']}" if i == 0 else "", f"{r['hit_rate'] * 100:.0f}%", _ms(r["recompute_ttft_s"]),
                      _ms(r["hbm_ttft_s"]), _ms(r["ttft_s"]), _ms(r["bubble_s"]), f"{r['speedup']:.2f}x", best, slack,
                      deferred, end_section=i == len(ln["rows"]) - 1)
    con.print(t)
    s = Table(title="Per length")
    band = any("crossover_hit_rate_io_beside_gemms" in ln for ln in lengths)
    cols = ["tokens", "recompute (ms)", "crossover hit rate"]
    cols += ["crossover, I/O beside GEMMs"] if band else []
    for col in cols + ["loading stops paying at"]:
        s.add_column(col, justify="right")
    for ln in lengths:
        extra = [_pct(ln.get("crossover_hit_rate_io_beside_gemms"))] if band else []
        s.add_row(str(ln["tokens"]), _ms(ln["recompute_ttft_s"]), _pct(ln["crossover_hit_rate"]), *extra,
                  _pct(ln["loading_stops_paying_hit_rate"]))
    con.print(s)
    if band:
        con.print("planned with the store's I/O rate measured alone (inside a prefill on the H200 the loads ran "
                  "at it: every TTFT predicted within 9%); the profile's rate beside GEMMs gives the pessimistic "
                  "crossover of the other column")
    con.print("bubble = TTFT - compute (includes the first layer's load); best load: load only that much of the "
              "prompt, recompute the rest of the hit; crossover: above it a layer's load outlasts its compute")
