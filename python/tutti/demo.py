"""The main job, end to end: vLLM on CPU reloads a long prefix from a Tutti store.

    python -m tutti.demo [--workdir DIR] [--requests 3] [--prefix-tokens 3072] [--reference]

Makes a Llama-style model with random weights locally (no model hub), then runs
vLLM twice, in two separate processes, with TuttiConnector and a file-backed
store: the first (cold) computes each long prefix and stores its KV blocks, the
second (warm, a "restarted server") sends the same requests and loads the
prefixes from the store.  Prints time to first token cold vs warm, tokens
loaded from the store, and whether the greedy outputs are identical.
Needs vLLM (scripts/bootstrap.sh vllm installs the CPU build).
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile

from .vllm.runner import RunnerFailed, launch

BLOCK = 128


def _run(work, name, spec):
    try:
        return launch(work, name, spec)
    except RunnerFailed as e:
        raise SystemExit(f"tutti.demo: {e}") from None


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m tutti.demo", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", help="keep model, store and logs here (default: a temp dir, removed)")
    ap.add_argument("--requests", type=int, default=3)
    ap.add_argument("--prefix-tokens", type=int, default=3072)
    ap.add_argument("--model-size", default="small", choices=["tiny", "small", "bench"])
    ap.add_argument("--reference", action="store_true",
                    help="also run without the connector and compare outputs with it")
    args = ap.parse_args(argv)
    try:
        import vllm  # noqa: F401 - only: is it installed?
    except ImportError:
        print("tutti.demo: vLLM is not installed; run `scripts/bootstrap.sh vllm` first", file=sys.stderr)
        return 2
    from rich.console import Console
    from rich.table import Table

    from . import tiny_model

    console = Console()
    work = args.workdir or tempfile.mkdtemp(prefix="tutti-demo-")
    os.makedirs(work, exist_ok=True)
    store = os.path.join(work, "store", "kv.img")
    if os.path.exists(store):
        os.remove(store)  # the demo always starts cold
    try:
        console.print(f"[bold]Tutti demo[/]: vLLM (CPU) + TuttiConnector, store [cyan]{store}[/]")
        model = tiny_model.create(os.path.join(work, f"model-{args.model_size}"), args.model_size)
        with open(os.path.join(model, "config.json")) as f:
            mc = json.load(f)
        prompts = [tiny_model.make_prompt_ids(args.prefix_tokens + 21, seed=1000 + i,
                                              vocab_size=mc["vocab_size"])
                   for i in range(args.requests)]
        spec = dict(model=model, prompts=prompts, max_tokens=16, block_size=BLOCK,
                    max_model_len=args.prefix_tokens + 512, ttft=True, concurrent=False,
                    connector="tutti", extra={"path": store, "capacity": "2GiB"})
        console.print(f"model: {mc['num_hidden_layers']} layers, hidden {mc['hidden_size']}, random "
                      f"weights; {args.requests} requests of {args.prefix_tokens + 21} tokens")
        console.print("process 1 (cold): computes the prefixes and stores their KV ...")
        cold = _run(work, "cold", spec)
        console.print("process 2 (warm): a fresh vLLM, same requests, prefixes from the store ...")
        warm = _run(work, "warm", spec)
        ref = None
        if args.reference:
            console.print("process 3: no connector, for reference ...")
            ref = _run(work, "reference", dict(spec, connector="none"))
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)

    ws = warm["stats"].get("worker0", {})
    loaded_tokens = ws.get("load_blocks", 0) * BLOCK
    t = Table(title="TTFT with a long prefix: cold vs warm (a second process)")
    t.add_column("request", justify="right")
    t.add_column("prompt tokens", justify="right")
    t.add_column("TTFT cold", justify="right")
    t.add_column("TTFT warm", justify="right")
    t.add_column("speed-up", justify="right")
    t.add_column("outputs match", justify="center")
    for i, p in enumerate(prompts):
        c, w = cold["ttft_s"][i], warm["ttft_s"][i]
        match = cold["outputs"][i] == warm["outputs"][i] and (ref is None or ref["outputs"][i] == warm["outputs"][i])
        t.add_row(str(i), str(len(p)), f"{c:.3f} s", f"{w:.3f} s", f"{c / w:.1f}x",
                  "[green]yes[/]" if match else "[red]NO[/]")
    mc_, mw = statistics.median(cold["ttft_s"]), statistics.median(warm["ttft_s"])
    all_match = cold["outputs"] == warm["outputs"] and (ref is None or ref["outputs"] == warm["outputs"])
    t.add_row("median", "", f"{mc_:.3f} s", f"{mw:.3f} s", f"{mc_ / mw:.1f}x",
              "[green]yes[/]" if all_match else "[red]NO[/]", style="bold")
    console.print(t)
    console.print(f"tokens loaded from the store (warm): [bold]{loaded_tokens}[/] of "
                  f"{sum(len(p) for p in prompts)} prompt tokens ({ws.get('load_bytes', 0) / 2**20:.1f} MiB, "
                  f"layer by layer under the forward pass); load errors {ws.get('load_errors', 0)}; "
                  f"blocks stored by the cold process: "
                  f"{cold['stats'].get('worker0', {}).get('save_blocks', 0)}")
    if not all_match:
        console.print("[red]outputs differ: this is a bug[/]")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
