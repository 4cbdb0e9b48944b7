#!/usr/bin/env python3
"""Cluster fetches of a TP engine on vLLM's CPU backend: tutti's threads on the rank's bound core
(``service_cpus: inherit``, the default) vs on every allowed CPU (``auto``).

vLLM binds each rank's thread to its OpenMP cores (``VLLM_CPU_OMP_THREADS_BIND``; here one CPU a rank)
and threads started from it inherit the mask: the connector's and Mooncake's threads then share that core
with the rank's compute thread (docs/cluster.md#first-fetch).  One machine, loopback TCP, a real
mooncake_master; every engine vLLM (CPU) with tensor_parallel_size 2 in a fresh process:

  A      cluster on, computes the prompts into its store shards; then one ``tutti-admin cluster serve``
         per shard keeps them reachable;
  B      cluster on, a fresh empty store each run: every prompt's prefix comes from A's shards, each rank
         fetching its own heads — alternately with ``service_cpus`` inherit and auto, ``--runs`` times.

``--forked``: the engines are forks of a process that already imported torch and vLLM (tutti.vllm.zygote,
as the test suite starts them); by default each is a fresh interpreter, as ``vllm serve`` is.  The two
differ: forked, the rank's thread is already bound when the connector starts its threads; fresh, it is
not yet (threads started then stay free).

Reported per mode: each rank's seconds in fetches (worker stat ``remote_fetch_s``: from the ask to the
blocks in its store), the blocks fetched and not, and whether the outputs equal A's; medians over runs.

    .venv/bin/python benchmarks/cluster_tp_threads.py [--runs 3] [--prompts 3]

Writes the section "Cluster fetches of a TP engine: where tutti's threads run (CPU)" of docs/benchmarks.md
(", forked engines" added with ``--forked``) and the raw results to benchmarks/cluster_tp_threads_cpu.json
(``_forked``).
"""
import argparse
import datetime
import json
import os
import random
import statistics
import sys
from pathlib import Path

from tutti.bench import replace_section, scratch_dir, shown_command, vllm_cpu_machine
from tutti.cluster.local_master import LocalMaster, StoreOwner, free_port_pair
from tutti.errors import ClusterError, RunnerFailed
from tutti.vllm import zygote
from tutti.vllm.cluster import SCHEDULER_PORT_OFFSET
from tutti.vllm.runner import launch

ROOT = Path(__file__).resolve().parent.parent
TITLE = "Cluster fetches of a TP engine: where tutti's threads run (CPU)"  # + ", forked engines"
TP = 2
BLOCK = 32
MODES = ("inherit", "auto")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3, help="B runs per mode, alternating")
    ap.add_argument("--prompts", type=int, default=3, help="prompts (one shared prefix of --prefix tokens)")
    ap.add_argument("--prefix", type=int, default=700, help="tokens of the prefix the prompts share")
    ap.add_argument("--forked", action="store_true", help="engines forked from a zygote (as the tests do)")
    ap.add_argument("--workdir", default=None, help="default: a temporary directory on /var/tmp (removed)")
    ap.add_argument("--json", default=None, help="default: benchmarks/cluster_tp_threads_cpu[_forked].json")
    ap.add_argument("--output", default=str(ROOT / "docs" / "benchmarks.md"))
    args = ap.parse_args(argv)
    args.json = args.json or str(ROOT / "benchmarks" / f"cluster_tp_threads_cpu{'_forked' if args.forked else ''}.json")
    if not 1 <= args.runs <= 20 or not 1 <= args.prompts <= 16 or not 2 * BLOCK <= args.prefix <= 3000:
        ap.error(f"--runs 1-20, --prompts 1-16, --prefix {2 * BLOCK}-3000")
    return args


def run(work, name, spec, env):
    print(f"cluster_tp_threads: {name} ...", file=sys.stderr, flush=True)
    try:
        return launch(work, name, spec, env_extra=env, timeout=900)
    except RunnerFailed as e:
        raise SystemExit(f"cluster_tp_threads: {e}") from None


def measure(args, work):
    from tutti import tiny_model

    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < TP:
        raise SystemExit(f"cluster_tp_threads: needs {TP} CPUs, this process may use {len(cpus)}")
    model = tiny_model.create(os.path.join(work, "model"), "tiny", seed=0)
    with open(os.path.join(model, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    rng = random.Random(7)
    prefix = [rng.randrange(3, vocab) for _ in range(args.prefix)]
    prompts = [prefix + [rng.randrange(3, vocab) for _ in range(40 + 13 * i)] for i in range(args.prompts)]
    env = dict(VLLM_CPU_KVCACHE_SPACE="1", VLLM_ENABLE_V1_MULTIPROCESSING="0", TOKENIZERS_PARALLELISM="false",
               VLLM_CPU_OMP_THREADS_BIND="|".join(str(c) for c in cpus[:TP]))
    base = dict(model=model, prompts=prompts, max_tokens=8, block_size=BLOCK, connector="tutti",
                engine_args=dict(tensor_parallel_size=TP))
    runs = {m: [] for m in MODES}
    with LocalMaster(work, client_ttl=10) as master:
        def extra(store, mode):
            return {"path": store, "capacity": "32MiB", "service_cpus": mode,
                    "cluster_master": master.address, "cluster_metadata": master.metadata,
                    "cluster_port": free_port_pair(SCHEDULER_PORT_OFFSET, run=TP), "cluster_fetch_timeout_s": 10,
                    "cluster_call_timeout_s": 15, "cluster_fetch_wait_s": 120, "cluster_index_bytes": 16 << 20}
        store_a = os.path.join(work, "a", "kv.img")
        a = run(work, "A", dict(base, extra=extra(store_a, "auto")), env)
        owners = [StoreOwner(work, f"{store_a}.rank{r}", master) for r in range(TP)]
        try:
            for i in range(args.runs):
                for mode in MODES if i % 2 == 0 else MODES[::-1]:
                    name = f"B-{mode}-{i}"
                    res = run(work, name, dict(base, extra=extra(os.path.join(work, name, "kv.img"), mode)), env)
                    ranks = [res["stats"].get(f"worker{r}", {}) for r in range(TP)]
                    with open(os.path.join(work, name, "log.txt"), errors="replace") as f:
                        moved = sum(f"rank {r}'s threads run on CPUs" in line for line in f for r in range(TP))
                    runs[mode].append({
                        "fetch_s": [round(w.get("remote_fetch_s", 0.0), 4) for w in ranks],
                        "blocks": [w.get("remote_blocks", 0) for w in ranks],
                        "errors": [w.get("remote_errors", 0) for w in ranks],
                        "remote_hit_tokens": res["stats"].get("scheduler", {}).get("remote_hit_tokens", 0),
                        "same_outputs": res["outputs"] == a["outputs"], "ranks_moved": moved})
                    print(f"cluster_tp_threads: {name}: {runs[mode][-1]}", file=sys.stderr, flush=True)
        finally:
            for o in owners:
                o.stop()
    return dict(prompts=len(prompts), prefix=args.prefix, block=BLOCK, bind=env["VLLM_CPU_OMP_THREADS_BIND"],
                forked=args.forked, runs=runs)


def render(data, cmd):
    runs = data["runs"]

    def med_rank(mode):
        return [statistics.median(r["fetch_s"][k] for r in runs[mode]) for k in range(TP)]

    lines = [f"## {data['section']}", "", f"Measured {data['date']} with:", "", "```", cmd, "```", "",
             f"- Machine: {data['machine']}",
             f"- vLLM (CPU) with tensor_parallel_size {TP}, `VLLM_CPU_OMP_THREADS_BIND={data['bind']}` (one CPU a "
             f"rank); a random-weight tiny Llama (`tutti.tiny_model`), {data['prompts']} prompts sharing a "
             f"{data['prefix']}-token prefix, block {data['block']} tokens. A computes them into its store "
             "shards, an owner process per shard serves them; B (a fresh empty store each run) gets every "
             "prefix from the cluster, each rank its own heads; runs alternate between the modes.",
             "- Engines: " + ("forked from a process that had imported torch and vLLM (`--forked`: "
                              "`tutti.vllm.zygote`, as the tests start them)" if data["forked"] else
                              "each a fresh interpreter, as `vllm serve` is") + ".",
             "- `fetch s` = a rank's seconds in fetches (`remote_fetch_s`: from the ask to the blocks in its "
             "store, a few fetches a run); medians over runs, per rank.", "",
             "- `moved`: ranks whose worker found its thread bound and moved tutti's threads (the log's "
             "`rank R's threads run on CPUs`), summed over runs.", "",
             "| `service_cpus` | runs | fetch s rank 0 / rank 1 (median) | each run's | blocks fetched (all runs) "
             "| not arrived | outputs = A's | moved |", "|---|---|---|---|---|---|---|---|"]
    for mode in MODES:
        m = med_rank(mode)
        each = "; ".join(" / ".join(f"{x:.2f}" for x in r["fetch_s"]) for r in runs[mode])
        lines.append(f"| `{mode}` | {len(runs[mode])} | {m[0]:.3f} / {m[1]:.3f} | {each} | "
                     f"{sum(sum(r['blocks']) for r in runs[mode])} | {sum(sum(r['errors']) for r in runs[mode])} | "
                     f"{'all' if all(r['same_outputs'] for r in runs[mode]) else 'NOT all'} | "
                     f"{sum(r.get('ranks_moved', 0) for r in runs[mode])} |")
    inh, auto = med_rank("inherit"), med_rank("auto")
    lines += ["", f"`auto` / `inherit`: rank 0 {auto[0] / inh[0]:.2f}, rank 1 {auto[1] / inh[1]:.2f} "
              "(fetch seconds; lower is better).", ""]
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    try:
        with scratch_dir(args.workdir, "tutti-cluster-tp-threads-") as tmp:
            if args.forked:
                with zygote.running(os.path.join(tmp, "zygote.sock"), os.path.join(tmp, "zygote.log"), wait_s=120):
                    data = measure(args, tmp)
            else:
                data = measure(args, tmp)
    except ClusterError as e:
        raise SystemExit(f"cluster_tp_threads: {e}") from None
    data.update(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                machine=vllm_cpu_machine(), section=TITLE + (", forked engines" if args.forked else ""))
    cmd = shown_command(".venv/bin/python benchmarks/cluster_tp_threads.py", sys.argv[1:] if argv is None else argv)
    with open(args.json, "w") as f:
        json.dump(data, f, indent=1)
    text = render(data, cmd)
    print(text)
    replace_section(args.output, data["section"], text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
