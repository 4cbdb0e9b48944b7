#!/usr/bin/env python3
"""vLLM TTFT with a long prefix: no connector vs vLLM's ExampleConnector vs TuttiConnector.

Every configuration runs in fresh processes on the same machine, same model, same
prompts.  Each request has its own >= 4K-token prefix (so vLLM's in-memory prefix
cache never helps); a connector's "cold" process computes and stores the prefixes,
then a second "warm" process (a restarted server) sends the same requests and
loads them.  TTFT of one request = wall time of a 1-token greedy generation,
requests one at a time; medians reported.  The page cache is dropped before each
warm process when we may (root), so loads come from the disk.

    python benchmarks/vllm_ttft.py                # 3 requests, 4096-token prefixes
    python benchmarks/vllm_ttft.py --requests 5 --prefix-tokens 8192

Replaces the section "vLLM: TTFT with a shared prefix (CPU)" of docs/benchmarks.md.
"""
import argparse
import datetime
import json
import os
import platform
import shlex
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from tutti.bench import cpu_model, drop_page_cache, replace_section
from tutti.vllm.runner import RunnerFailed, launch

ROOT = Path(__file__).resolve().parent.parent
TITLE = "vLLM: TTFT with a shared prefix (CPU)"
BLOCK = 128


def run(tmp, name, spec):
    print(f"vllm_ttft: {name} ...", file=sys.stderr, flush=True)
    try:
        res = launch(tmp, name, spec)
    except RunnerFailed as e:
        raise SystemExit(f"vllm_ttft: {e}") from None
    print(f"vllm_ttft: {name}: TTFT {[round(t, 3) for t in res['ttft_s']]}", file=sys.stderr)
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=3)
    ap.add_argument("--prefix-tokens", type=int, default=4096)
    ap.add_argument("--model-size", default="bench", help="tutti.tiny_model size")
    ap.add_argument("--workdir", default=None, help="default: a temporary directory (removed)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="warm runs of each connector, alternating which goes first (the ratio is the "
                         "median of the per-round ratios)")
    ap.add_argument("--output", default=str(ROOT / "docs" / "benchmarks.md"))
    ap.add_argument("--section", default=TITLE, help="title of the section written in --output")
    args = ap.parse_args(argv)

    from tutti import tiny_model
    tmp = args.workdir or tempfile.mkdtemp(prefix="tutti-vllm-ttft-")
    try:
        model = tiny_model.create(os.path.join(tmp, "model"), args.model_size, seed=0)
        with open(os.path.join(model, "config.json")) as f:
            mc = json.load(f)
        prompts = [tiny_model.make_prompt_ids(args.prefix_tokens + 17, seed=100 + i,
                                              vocab_size=mc["vocab_size"])
                   for i in range(args.requests)]
        base = dict(model=model, prompts=prompts, max_tokens=4, block_size=BLOCK,
                    max_model_len=args.prefix_tokens + 256, ttft=True, concurrent=False,
                    kv_cache_gib=2)
        store = os.path.join(tmp, "tutti", "kv.img")
        example_dir = os.path.join(tmp, "example")
        os.makedirs(example_dir, exist_ok=True)
        tutti_extra = {"path": store, "capacity": "1GiB"}
        results = {}
        results["none"] = run(tmp, "none", dict(base, connector="none"))
        results["example-cold"] = run(tmp, "example-cold", dict(
            base, connector="example", extra={"shared_storage_path": example_dir}))
        results["tutti-cold"] = run(tmp, "tutti-cold", dict(base, connector="tutti",
                                                            extra=tutti_extra))
        # Warm runs in rounds, alternating the order, each from a dropped page cache: one round's
        # medians move by 10-20% with the machine's other load.
        warm_specs = {"example-warm": dict(base, connector="example",
                                           extra={"shared_storage_path": example_dir}),
                      "tutti-warm": dict(base, connector="tutti", extra=tutti_extra)}
        dropped, round_ratios = True, []
        for r in range(max(1, args.rounds)):
            order = list(warm_specs) if r % 2 == 0 else list(reversed(warm_specs))
            got = {}
            for key in order:
                dropped = drop_page_cache() and dropped
                got[key] = run(tmp, f"{key}-{r}", warm_specs[key])
            round_ratios.append(statistics.median(got["tutti-warm"]["ttft_s"]) /
                                statistics.median(got["example-warm"]["ttft_s"]))
            for key, res in got.items():
                if key not in results:
                    results[key] = res
                else:
                    results[key]["ttft_s"] += res["ttft_s"]
        same = {k: results[k]["outputs"] == results["none"]["outputs"] for k in results}
        med = {k: statistics.median(v["ttft_s"]) for k, v in results.items()}
        w = results["tutti-warm"]["stats"].get("worker0", {})
        s = results["tutti-warm"]["stats"].get("scheduler", {})
        n_layers, kvh = mc["num_hidden_layers"], mc["num_key_value_heads"]
        head_dim = mc["hidden_size"] // mc["num_attention_heads"]
        block_bytes = n_layers * 2 * BLOCK * kvh * head_dim * 2
    finally:
        if args.workdir is None:
            shutil.rmtree(tmp, ignore_errors=True)

    cmd = "python benchmarks/vllm_ttft.py " + " ".join(map(shlex.quote, sys.argv[1:] if argv is None else argv))
    import vllm
    rows = [
        ("no connector", "none", "—"),
        ("ExampleConnector, cold (computes, saves)", "example-cold", "—"),
        ("ExampleConnector, warm (fresh process per round)", "example-warm", "—"),
        ("TuttiConnector, cold (computes, saves)", "tutti-cold", "—"),
        ("TuttiConnector, warm (fresh process per round)", "tutti-warm",
         f"first round: {w.get('load_blocks', 0) * BLOCK} tokens ({w.get('load_bytes', 0) / 2**20:.0f} MiB) loaded "
         f"over {args.requests} requests; {w.get('load_s', 0) / args.requests * 1e3:.0f} ms per request "
         "from lookup to last layer verified, overlapping the forward"),
    ]
    lines = [f"## {args.section}", "",
             f"Measured {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')} with:",
             "", "```", cmd.strip(), "```", "",
             f"- Machine: {platform.node()}, {cpu_model()}, {os.cpu_count()} cores, Linux "
             f"{platform.release()}, Python {platform.python_version()}, vLLM {vllm.__version__} (CPU build)",
             f"- Model: Llama-style, random weights made locally (`tutti.tiny_model` size `{args.model_size}`): "
             f"{n_layers} layers, hidden {mc['hidden_size']}, {mc['num_attention_heads']} heads / {kvh} KV heads, "
             f"bf16; vLLM block size {BLOCK} tokens ({block_bytes / 2**20:.1f} MiB of KV per block)",
             f"- Workload: {args.requests} requests, each with its own {args.prefix_tokens}-token prefix + 17 "
             "tokens; one request at a time; TTFT = wall time of a 1-token greedy generation. Cold = the "
             "process that computes (and, with a connector, stores) the prefixes; warm = a second, fresh "
             "process sending the same requests (warm: one fresh process per connector per round, order "
             "alternating between rounds). Store: a file on the machine's disk (O_DIRECT); "
             f"page cache dropped before warm runs: {'yes' if dropped else 'no (not root)'}.",
             f"- Load average at the end of the run: {os.getloadavg()[0]:.1f} (other jobs share this "
             "machine; TTFTs of one configuration vary accordingly).",
             "- Greedy outputs identical to the no-connector run: "
             + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in same.items() if k != "none"),
             "", "| Configuration | TTFT median | Runs (s) | Notes |", "|---|---|---|---|"]
    for label, key, note in rows:
        runs = " / ".join(f"{t:.3f}" for t in results[key]["ttft_s"])
        lines.append(f"| {label} | {med[key]:.3f} s | {runs} | {note} |")
    r1 = med["tutti-warm"] / med["none"]
    r2 = statistics.median(round_ratios)
    lines += ["", "| Ratio | Value | Target | Met |", "|---|---|---|---|",
              f"| Tutti warm / cold (no connector) | {r1:.3f} | ≤ 0.3 | {'yes' if r1 <= 0.3 else 'no'} |",
              f"| Tutti warm / ExampleConnector warm (median of {len(round_ratios)} rounds: "
              f"{' / '.join(f'{x:.2f}' for x in round_ratios)}) | {r2:.3f} | ≤ 1 | {'yes' if r2 <= 1 else 'no'} |",
              "", f"Scheduler side (warm process): {s.get('hit_tokens', 0)} of {s.get('query_tokens', 0)} "
              f"prompt tokens promised from the store; worker: {w.get('load_errors', 0)} load errors, "
              f"{w.get('corrupt_blocks', 0)} corrupt blocks.", ""]
    text = "\n".join(lines)
    print(text)
    replace_section(args.output, args.section, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
