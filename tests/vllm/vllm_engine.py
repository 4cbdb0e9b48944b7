"""Run a vLLM engine (or server) in its own process for the connector tests."""
import os

from tutti.vllm.runner import RunnerFailed, launch

BLOCK = 32  # CPU attention needs a multiple of 32


ENGINE_ENV = dict(VLLM_CPU_KVCACHE_SPACE="1", VLLM_ENABLE_V1_MULTIPROCESSING="0")
EngineFailed = RunnerFailed


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
    spec = dict(model=model, connector=connector, extra=extra, prompts=prompts,
                max_tokens=max_tokens, block_size=BLOCK, multiprocess=multiprocess, **spec_extra)
    return launch(tmp, name, spec, env_extra=dict(ENGINE_ENV, **(env_extra or {})), timeout=timeout)


def worker_stats(result):
    return result["stats"].get("worker0", {})


def scheduler_stats(result):
    return result["stats"].get("scheduler", {})
