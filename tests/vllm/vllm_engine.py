"""Run a vLLM engine (or server) in its own process for the connector tests."""
import os

from tutti.vllm.runner import RunnerFailed, launch

BLOCK = 32  # CPU attention needs a multiple of 32


ENGINE_ENV = dict(VLLM_CPU_KVCACHE_SPACE="1", VLLM_ENABLE_V1_MULTIPROCESSING="0")
EngineFailed = RunnerFailed
TEST_CAPACITY = "64MiB"  # a store run_engine creates, unless the test says


def engine_env(tmp):
    """The environment run_engine gives an engine, for tests that start a server themselves."""
    env = dict(os.environ, **ENGINE_ENV, TOKENIZERS_PARALLELISM="false",
               VLLM_CACHE_ROOT=os.path.join(tmp, "vllm-cache"),
               VLLM_RPC_BASE_PATH=os.path.join(tmp, "vllm-rpc"))
    os.makedirs(env["VLLM_RPC_BASE_PATH"], exist_ok=True)
    return env


def run_engine(tmp, name, *, model, prompts, store=None, connector="tutti", extra=None,
               max_tokens=8, multiprocess=False, env_extra=None, timeout=300, **spec_extra):
    """One engine in a fresh process; returns the runner's JSON result (EngineFailed if it fails)."""
    extra = dict(extra or {})
    if store is not None:
        extra.setdefault("path", store)
        # The connector's default (4 GiB a store, space reserved; a TP engine one per rank) filled the CI
        # machine's disk over a full run (a TP store creation failed with ENOSPC): no test needs more.
        extra.setdefault("capacity", TEST_CAPACITY)
    spec = dict(model=model, connector=connector, extra=extra, prompts=prompts,
                max_tokens=max_tokens, block_size=BLOCK, multiprocess=multiprocess, **spec_extra)
    return launch(tmp, name, spec, env_extra=dict(ENGINE_ENV, **(env_extra or {})), timeout=timeout)


def worker_stats(result):
    return result["stats"].get("worker0", {})


def scheduler_stats(result):
    return result["stats"].get("scheduler", {})


TP = 2


def tp_bind():
    """VLLM_CPU_OMP_THREADS_BIND for TP ranks of one CPU each (vLLM binds a rank per NUMA node unless told
    which CPUs to use; this machine has one node). Skips the test where there are not TP CPUs."""
    import pytest
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < TP:
        pytest.skip(f"vLLM with tensor_parallel_size={TP} on CPU needs {TP} CPUs, this process may use {len(cpus)}")
    return "|".join(str(c) for c in cpus[:TP])


def run_tp(tmp, name, **kw):
    """run_engine with tensor_parallel_size=TP: one worker process per rank, each its own store shard."""
    env = dict(kw.pop("env_extra", None) or {}, VLLM_CPU_OMP_THREADS_BIND=tp_bind())
    return run_engine(tmp, name, engine_args=dict(tensor_parallel_size=TP), env_extra=env, **kw)


def tp_ranks(result):
    """Each rank's worker stats."""
    return [result["stats"].get(f"worker{r}", {}) for r in range(TP)]


def tp_shard(path, r):
    """Rank r's store: the connector appends .rank<r> to a path without {rank}."""
    return f"{path}.rank{r}"
