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
