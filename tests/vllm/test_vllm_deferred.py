"""Real vLLM (CPU): saves that outlive their step (save_mode deferred, the default).

A request that finishes in the step that computed its prompt (max_tokens 1) still has its save
pending: the connector holds its blocks (request_finished returns True) and the worker reports it
finished (get_finished) once the save is committed, in a later step.  vLLM's own prefix cache is
off, so a later request with the same prefix can only get it from the store.
"""
import os
import random
import subprocess
import sys

import pytest

from vllm_engine import BLOCK, run_engine, scheduler_stats, worker_stats


@pytest.mark.parametrize("multiprocess", [False])  # True passed by hand (docs/reliability.md): +3 min
def test_request_finishing_while_its_save_is_pending(vtmp, model, vocab, prompts, multiprocess):
    rng = random.Random(5)
    other = [rng.randrange(3, vocab) for _ in range(4 * BLOCK + 3)]
    # a: finishes in its prefill step; c: a step that commits a's save; b: a's prefix again.
    a, b = prompts[0], prompts[1]
    seq = [a, other, b]
    tag = "mp" if multiprocess else "ip"
    path = os.path.join(vtmp, f"deferred-{tag}", "kv.img")
    spec = dict(model=model, prompts=seq, max_tokens=1, concurrent=False, prefix_caching=False)
    expect = run_engine(vtmp, f"deferred-none-{tag}", connector="none", **spec)["outputs"]
    res = run_engine(vtmp, f"deferred-{tag}", store=path, extra={"capacity": "32MiB"},
                     multiprocess=multiprocess, **spec)
    assert res["outputs"] == expect
    work, sched = worker_stats(res), scheduler_stats(res)
    assert sched["reqs_held"] >= 1, "no request finished while its save was pending"
    assert work["save_carried"] > 0 and work.get("save_dropped", 0) == 0
    shared = (len(os.path.commonprefix([a, b])) // BLOCK)
    assert work["load_blocks"] >= shared - 1, "the prefix was not loaded from the store"
    assert work.get("load_errors", 0) == 0
    check = subprocess.run([sys.executable, "-m", "tutti.cli", "check", path],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_the_pending_bound_reached_drops_saves_and_serving_goes_on(vtmp, model, prompts, baseline):
    """Writes paced at 1 MB/s (libtutti's fault engine) and chunked prefill (a save of 4 blocks, 128 KiB,
    each step): saves pile up faster than they are written, and max_pending_bytes (192 KiB: one step's
    save and a half) is reached. The oldest pending saves are dropped (counted), no step waits for the
    store, outputs stay exact, and what was stored is sound: a fresh engine loads it without errors."""
    path = os.path.join(vtmp, "deferred-bound", "kv.img")
    spec = dict(model=model, prompts=prompts[:1], concurrent=False, max_num_batched_tokens=4 * BLOCK)
    res = run_engine(vtmp, "deferred-bound", store=path, env_extra={"TUTTI_FAULTS": "rate:write:mbps=1"},
                     extra={"capacity": "32MiB", "max_pending_bytes": "192KiB", "shutdown_drain_s": 1}, **spec)
    assert res["outputs"] == baseline[:1]
    work = worker_stats(res)
    assert work["save_dropped"] > 0, work
    assert work.get("save_over_bound", 0) == 0 and work.get("save_errors", 0) == 0
    check = subprocess.run([sys.executable, "-m", "tutti.cli", "check", path], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    again = run_engine(vtmp, "deferred-bound-again", store=path, **spec)
    assert again["outputs"] == baseline[:1]
    assert worker_stats(again).get("load_errors", 0) == 0
