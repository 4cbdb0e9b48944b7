"""Run a vLLM engine (or server) in its own process for the connector tests."""
import json
import os
import subprocess
import sys

BLOCK = 32  # CPU attention needs a multiple of 32


def engine_env(tmp):
    env = dict(os.environ)
    env.update(VLLM_CACHE_ROOT=os.path.join(tmp, "vllm-cache"),
               VLLM_RPC_BASE_PATH=os.path.join(tmp, "vllm-rpc"), VLLM_CPU_KVCACHE_SPACE="1",
               VLLM_ENABLE_V1_MULTIPROCESSING="0", TOKENIZERS_PARALLELISM="false")
    os.makedirs(env["VLLM_RPC_BASE_PATH"], exist_ok=True)
    return env


class EngineFailed(RuntimeError):
    def __init__(self, rc, log):
        super().__init__(f"engine exited with {rc}; log tail:\n{log[-4000:]}")
        self.rc, self.log = rc, log


def run_engine(tmp, name, *, model, prompts, store=None, connector="tutti", extra=None,
               max_tokens=8, multiprocess=False, env_extra=None, timeout=300, **spec_extra):
    """One engine in a fresh process; returns the runner's JSON result (EngineFailed if it fails)."""
    work = os.path.join(tmp, name)
    os.makedirs(work, exist_ok=True)
    extra = dict(extra or {})
    if store is not None:
        extra.setdefault("path", store)
    spec = dict(model=model, connector=connector, extra=extra, prompts=prompts,
                max_tokens=max_tokens, block_size=BLOCK, multiprocess=multiprocess,
                stats_dir=os.path.join(work, "stats"), **spec_extra)
    spec_path, out_path = os.path.join(work, "spec.json"), os.path.join(work, "out.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    env = engine_env(tmp)
    env.update(env_extra or {})
    p = subprocess.run([sys.executable, "-m", "tutti.vllm.runner", spec_path, out_path], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    with open(os.path.join(work, "log.txt"), "w") as f:
        f.write(p.stdout)
    if p.returncode != 0:
        raise EngineFailed(p.returncode, p.stdout)
    with open(out_path) as f:
        return json.load(f)


def worker_stats(result):
    return result["stats"].get("worker0", {})


def scheduler_stats(result):
    return result["stats"].get("scheduler", {})
