"""Real vLLM (CPU): a load that fails in a step that also saves never gets wrong KV stored.

Issue 12's most severe finding: a request loads a stored prefix and computes its own new
blocks in the same forward; one loaded block fails; the forward attends over a bad block,
and its saves used to be committed with valid checksums, so the next request with that
prefix was served wrong KV.  Here each of four prompts (distinct prefixes, stored by a first
process) is served one at a time by a second process while its load fails in a different way
(fault_hooks: a checksum failure on disk, a key gone from the store, an I/O error, a layer the
model did not wait for).  A third process then serves the same prompts from the store.
Both must produce exactly the outputs of vLLM without any connector, and the third must load
every full block from the store: what the second process stored after the failure (vLLM
recomputes from the failed block on) is sound.
"""
import os
import random

import pytest

from tutti import Store
from vllm_engine import BLOCK, run_engine, scheduler_stats, worker_stats

KINDS = ["checksum", "missing", "eio", "unwaited"]
PREFIX_BLOCKS, TAIL = 10, 6 * BLOCK + 7


@pytest.fixture(scope="module")
def fault_prompts(vocab):
    rng = random.Random(12)
    prefixes = [[rng.randrange(3, vocab) for _ in range(PREFIX_BLOCKS * BLOCK)] for _ in KINDS]
    return prefixes, [p + [rng.randrange(3, vocab) for _ in range(TAIL)] for p in prefixes]


@pytest.mark.parametrize("multiprocess", [False])  # vLLM's multiprocess mode: one more minute
def test_failed_loads_never_poison_the_store(vtmp, model, fault_prompts, multiprocess):
    prefixes, prompts = fault_prompts
    tag = "mp" if multiprocess else "ip"
    expect = run_engine(vtmp, f"lf-none-{tag}", model=model, prompts=prompts, connector="none",
                        concurrent=False)["outputs"]
    path = os.path.join(vtmp, f"lf-{tag}", "kv.img")
    run_engine(vtmp, f"lf-seed-{tag}", model=model, prompts=prefixes, store=path,
               extra={"capacity": "32MiB"}, concurrent=False)

    hurt = run_engine(vtmp, f"lf-faults-{tag}", model=model, prompts=prompts, store=path,
                      concurrent=False, multiprocess=multiprocess,
                      env_extra={"TUTTI_VLLM_TEST_LOAD_FAULTS": ",".join(KINDS)})
    again = run_engine(vtmp, f"lf-again-{tag}", model=model, prompts=prompts, store=path,
                       concurrent=False, multiprocess=multiprocess)
    assert hurt["outputs"] == expect
    assert again["outputs"] == expect, "the store served KV computed over a failed load"
    work = worker_stats(again)
    assert work.get("load_errors", 0) == 0 and work.get("corrupt_blocks", 0) == 0
    full = sum((len(p) - 1) // BLOCK for p in prompts)
    assert work["load_blocks"] == full, "blocks recomputed after the failures were not stored"
    with Store.open([path], readonly=True, shared=True, engine="psync") as s:
        assert s.check()["bad"] == 0

    work, sched = worker_stats(hurt), scheduler_stats(hurt)
    assert work["corrupt_blocks"] == 1
    assert work["load_errors"] >= len(KINDS)
    assert work["save_fenced"] > 0, "no save was ever held back: the failures were not in saving steps"
    assert sched["load_failures"] == len(KINDS)
