"""Real vLLM (CPU): loads only where they pay (load_policy auto, the default).

A store whose reads the fault engine paces at 1 MB/s (TUTTI_FAULTS=rate:read:mbps=1) takes ~32 ms per
32 KiB block of the tiny model, far longer than recomputing its 32 tokens: once the planner has measured a
few loads and prefills, it cuts the hits (load_cut_tokens) and vLLM recomputes instead, outputs unchanged.
The same run on an unthrottled store loads every hit whole.  vLLM's own prefix cache is off, so every
reuse goes to the store.
"""
import os
import random

import pytest

from vllm_engine import BLOCK, run_engine, scheduler_stats, worker_stats


def _workload(vocab):
    """Three cold documents (the planner's compute samples), then each asked again twice with new tails
    (the first reuses measure the store, the later ones are planned)."""
    rng = random.Random(11)
    docs = [[rng.randrange(3, vocab) for _ in range(20 * BLOCK)] for _ in range(3)]
    tail = lambda: [rng.randrange(3, vocab) for _ in range(rng.randrange(20, 40))]  # noqa: E731
    return [d + tail() for d in docs] + [d + tail() for d in docs] + [d + tail() for d in docs]


@pytest.mark.parametrize("throttled", [True, False], ids=["slow-store", "fast-store"])
def test_hits_cut_only_where_loading_does_not_pay(vtmp, model, vocab, throttled):
    seq = _workload(vocab)
    spec = dict(model=model, prompts=seq, max_tokens=4, concurrent=False, prefix_caching=False)
    tag = "slow" if throttled else "fast"
    expect = run_engine(vtmp, f"loadpol-none-{tag}", connector="none", **spec)["outputs"]
    env = {"TUTTI_FAULTS": "rate:read:mbps=1"} if throttled else {}
    res = run_engine(vtmp, f"loadpol-{tag}", store=os.path.join(vtmp, f"loadpol-{tag}", "kv.img"),
                     extra={"capacity": "32MiB"}, env_extra=env, **spec)
    assert res["outputs"] == expect
    sched, work = scheduler_stats(res), worker_stats(res)
    assert work.get("load_errors", 0) == 0
    stored = 6 * 20 * BLOCK  # the six reuses: every one of their prefix blocks is in the store
    cut, hit = sched.get("load_cut_tokens", 0), sched["hit_tokens"]
    assert hit + cut == stored, (hit, cut)
    if throttled:
        assert cut >= 2 * 20 * BLOCK // 2, f"the slow store's hits were not cut ({cut} of {stored} tokens)"
        assert hit >= 3 * 20 * BLOCK, "the first reuses load whole: they measure the store"
    else:
        assert cut == 0, f"a fast store's hit was cut ({cut} tokens)"
