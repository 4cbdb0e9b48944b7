"""Run one vLLM engine on a list of prompts and write what happened as JSON.

    python -m tutti.vllm.runner SPEC.json OUT.json

The demo, the tests and the benchmark start one process per engine with this,
so "a second process" is real: nothing but the store survives between runs.
SPEC keys: model, connector ("none" | "tutti" | "example"), extra (connector
options), prompts (lists of token ids), max_tokens, block_size, max_model_len,
multiprocess (bool), ttft (measure time to first token per prompt, one at a
time), concurrent (all prompts in one batch), first_token_times (all prompts at
once through the engine's loop, each one's time to its first token),
max_num_batched_tokens,
prefix_caching (vLLM's own), abort_after_s (SIGKILL ourselves mid-run),
engine_args (more keyword arguments of vLLM's LLM, e.g. disable_hybrid_kv_cache_manager),
logprobs (with concurrent false: each generated token's top N tokens and logprobs, in "logprobs").
"""
import glob
import json
import os
import statistics
import subprocess
import sys
import threading
import time

from ..errors import RunnerFailed


def launch(work, name, spec, *, env_extra=None, timeout=None):
    """Run one engine in a fresh process under WORK/NAME and return its result.

    The demo, the TTFT benchmark and the tests all start engines this way, so
    nothing but the store survives between two runs.  Spec, result, stats and
    the full log (log.txt) are kept in WORK/NAME; vLLM's caches and RPC
    sockets go under WORK so runs never touch the user's ~/.cache.
    """
    d = os.path.join(work, name)
    os.makedirs(d, exist_ok=True)
    spec = dict(spec, stats_dir=os.path.join(d, "stats"))
    sp, op, lp = (os.path.join(d, f) for f in ("spec.json", "out.json", "log.txt"))
    with open(sp, "w") as f:
        json.dump(spec, f)
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    env.setdefault("VLLM_CACHE_ROOT", os.path.join(work, "vllm-cache"))
    env.setdefault("VLLM_RPC_BASE_PATH", os.path.join(work, "vllm-rpc"))
    env.update(env_extra or {})
    os.makedirs(env["VLLM_RPC_BASE_PATH"], exist_ok=True)
    rc = _via_zygote(os.environ.get("TUTTI_RUNNER_ZYGOTE"), sp, op, lp, env, timeout)
    if rc is None:
        with open(lp, "w") as log:
            rc = subprocess.call([sys.executable, "-m", "tutti.vllm.runner", sp, op], env=env,
                                 stdout=log, stderr=subprocess.STDOUT, timeout=timeout)
    if rc != 0:
        with open(lp, errors="replace") as f:
            raise RunnerFailed(name, rc, f.read(), lp)
    with open(op) as f:
        return json.load(f)


def _via_zygote(path, sp, op, lp, env, timeout):
    """Run through a zygote (tutti.vllm.zygote: a fork of a process that already imported vLLM): the
    run's exit code, or None when there is no zygote to ask (then a fresh interpreter runs it).
    Past ``timeout`` the run is killed and subprocess.TimeoutExpired raised, as subprocess.call does."""
    from . import zygote

    try:
        return zygote.call(path, {"spec": sp, "out": op, "log": lp, "env": env, "cwd": os.getcwd()}, timeout)
    except zygote.ZygoteGone:
        raise RunnerFailed(os.path.basename(os.path.dirname(sp)), -1,
                           "the zygote running this engine went away", lp) from None


def _stats_totals(stats_dir):
    out = {}
    for path in glob.glob(os.path.join(stats_dir, "*.json")):
        role = os.path.basename(path).split("-")[0]
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError):
            continue
        agg = out.setdefault(role, {})
        for k, v in data.items():
            agg[k] = agg.get(k, 0) + v
    return out


def _inspect_models_in_process():
    """vLLM inspects a model class it has not cached (VLLM_CACHE_ROOT) in a fresh interpreter, to
    keep CUDA uninitialised in the engine's process: ~12 s of imports on 2 cores per architecture.
    Without a GPU there is nothing to keep uninitialised, so inspect it here."""
    import torch
    if torch.cuda.is_available():
        return
    try:
        from vllm.model_executor.models import registry
    except ImportError:  # pragma: no cover - another vLLM layout: the subprocess it is
        return
    if hasattr(registry, "_run_in_subprocess"):
        registry._run_in_subprocess = lambda fn: fn()


def run(spec):
    stats_dir = spec["stats_dir"]
    os.makedirs(stats_dir, exist_ok=True)
    os.environ["TUTTI_VLLM_STATS_DIR"] = stats_dir
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if spec.get("multiprocess") else "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(spec.get("kv_cache_gib", 1)))
    # The same cores for the model with and without a connector (vLLM on CPU reserves one more for any
    # connector: tutti.bench.serve.RESERVED_CPUS), so runs that compare them compare like with like.
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "1")
    from vllm.config import KVTransferConfig

    from vllm import LLM, SamplingParams
    _inspect_models_in_process()

    kv = None
    connector = spec.get("connector", "tutti")
    if connector == "tutti":
        kv = KVTransferConfig(kv_connector="TuttiConnector", kv_connector_module_path="tutti.vllm",
                              kv_role="kv_both", kv_connector_extra_config=spec.get("extra", {}))
    elif connector == "example":
        kv = KVTransferConfig(kv_connector="ExampleConnector", kv_role="kv_both",
                              kv_connector_extra_config=spec.get("extra", {}))
    t0 = time.perf_counter()
    kwargs = dict(model=spec["model"], block_size=spec.get("block_size", 32),
                  max_model_len=spec.get("max_model_len", 4096), enforce_eager=True,
                  enable_prefix_caching=spec.get("prefix_caching", True), seed=0,
                  disable_log_stats=True, kv_transfer_config=kv)
    if spec.get("max_num_batched_tokens"):
        kwargs["max_num_batched_tokens"] = spec["max_num_batched_tokens"]
    kwargs.update(spec.get("engine_args") or {})
    llm = LLM(**kwargs)
    init_s = time.perf_counter() - t0
    if spec.get("abort_after_s"):
        def _kill():
            time.sleep(spec["abort_after_s"])
            os.kill(os.getpid(), 9)
        threading.Thread(target=_kill, daemon=True).start()
    greedy = SamplingParams(max_tokens=spec.get("max_tokens", 8), temperature=0.0, ignore_eos=True,
                            logprobs=spec.get("logprobs"))
    first = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    prompts = [{"prompt_token_ids": p} for p in spec["prompts"]]
    ttft = []
    outputs = []
    logprobs: list = []  # with spec "logprobs" and one prompt at a time
    t1 = time.perf_counter()
    if spec.get("ttft"):
        for p in prompts:
            t = time.perf_counter()
            llm.generate([p], first, use_tqdm=False)
            ttft.append(time.perf_counter() - t)
    first_token_s = []
    if spec.get("first_token_times"):
        # All prompts at once through the engine's own loop: when each got its first token.
        eng = llm.llm_engine
        t = time.perf_counter()
        index = {}
        for i, p in enumerate(prompts):  # outputs carry the id given or the engine's own: both known
            index[str(i)] = index[eng.add_request(str(i), p, greedy)] = i
        first_at, done = {}, {}
        while eng.has_unfinished_requests():
            for r in eng.step():
                i = index.get(r.request_id)
                if r.outputs and r.outputs[0].token_ids and i not in first_at:
                    first_at[i] = time.perf_counter() - t
                if r.finished:
                    done[i] = list(r.outputs[0].token_ids)
        first_token_s = [first_at.get(i) for i in range(len(prompts))]
        outputs = [done.get(i) for i in range(len(prompts))]
    elif spec.get("concurrent", True):
        res = llm.generate(prompts, greedy, use_tqdm=False)
        outputs = [list(r.outputs[0].token_ids) for r in res]
    else:
        for p in prompts:
            res = llm.generate([p], greedy, use_tqdm=False)
            outputs.append(list(res[0].outputs[0].token_ids))
            if spec.get("logprobs"):  # per generated token: the top tokens and their logprobs
                logprobs.append([[[t, v.logprob] for t, v in d.items()] for d in res[0].outputs[0].logprobs])
    gen_s = time.perf_counter() - t1
    del llm
    return {"outputs": outputs, "logprobs": logprobs, "ttft_s": ttft, "first_token_s": first_token_s,
            "pid": os.getpid(), "ppid": os.getppid(),
            "ttft_median_s": statistics.median(ttft) if ttft else None,
            "init_s": init_s, "gen_s": gen_s, "stats": _stats_totals(stats_dir)}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        spec = json.load(f)
    result = run(spec)
    result["stats"] = _stats_totals(spec["stats_dir"])
    with open(argv[1], "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
