"""Real vLLM (CPU) with tensor_parallel_size=2: the connector inside vLLM's own TP workers.

vLLM's CPU build runs TP > 1 as one worker process per rank (gloo for its groups); it binds
each rank's OpenMP threads to a NUMA node unless told which CPUs to use, so on a one-node
machine these tests give each rank one CPU (VLLM_CPU_OMP_THREADS_BIND). Each rank opens its
own store shard (`path` + `.rank<N>`), holding its half of the KV heads; a block is loaded
only if both ranks have it, and a save is committed on both or on neither.

tests/vllm/test_vllm_tp_worker.py drives the worker side over gloo directly (crash points
between the votes); here vLLM drives it: the scheduler, the aggregation of both workers'
results, and vLLM's recompute of the blocks any rank failed.
"""
import os
import random
import shutil
import subprocess
import sys

import pytest

from tutti import Store, affinity
from vllm_engine import BLOCK, TP, EngineFailed, run_tp, scheduler_stats, tp_bind, tp_ranks, tp_shard

PREFIX_BLOCKS, TAIL = 12, 2 * BLOCK + 5


def held(path):
    out = []
    for r in range(TP):
        with Store.open([tp_shard(path, r)], readonly=True, shared=True, engine="psync") as s:
            assert s.check()["bad"] == 0
            out.append(set(s.committed()))
    return out


def admin_check(path):
    for r in range(TP):
        p = subprocess.run([sys.executable, "-m", "tutti.cli", "check", tp_shard(path, r)],
                           capture_output=True, text=True)
        assert p.returncode == 0, p.stdout + p.stderr


@pytest.fixture(scope="module")
def tp_prompts(vocab):
    rng = random.Random(21)
    prefixes = [[rng.randrange(3, vocab) for _ in range(PREFIX_BLOCKS * BLOCK)] for _ in range(3)]
    return prefixes, [p + [rng.randrange(3, vocab) for _ in range(TAIL)] for p in prefixes]


@pytest.fixture(scope="module")
def tp_expect(vtmp, model, tp_prompts):
    """vLLM with TP=2 and no connector: what every run must reproduce."""
    return run_tp(vtmp, "tp-none", model=model, prompts=tp_prompts[1], connector="none",
                  concurrent=False)["outputs"]


@pytest.fixture(scope="module")
def tp_store(vtmp, model, tp_prompts, tp_expect):
    """A TP=2 store written by a first engine (saves deferred, the default). Each request stops
    after its first token: it finishes in the step that computed it, while its save is pending."""
    path = os.path.join(vtmp, "tp-engine", "kv.img")
    cold = run_tp(vtmp, "tp-cold", model=model, prompts=tp_prompts[1], store=path,
                  extra={"capacity": "32MiB"}, concurrent=False, max_tokens=1)
    assert cold["outputs"] == [o[:1] for o in tp_expect]
    return path, cold


def full_blocks(prompts):
    return sum((len(p) - 1) // BLOCK for p in prompts)


def test_tp2_engine_stores_and_a_second_engine_loads_on_both_ranks(vtmp, model, tp_prompts, tp_expect,
                                                                   tp_store):
    path, cold = tp_store
    _, prompts = tp_prompts
    full = full_blocks(prompts)
    assert scheduler_stats(cold)["reqs_held"] >= 1, "no request finished while its save was pending"
    for w in tp_ranks(cold):
        assert w["save_blocks"] >= full and w["save_carried"] > 0 and w.get("save_errors", 0) == 0
    kept = held(path)
    assert kept[0] == kept[1] and len(kept[0]) >= full, "a save committed on one rank only"

    warm = run_tp(vtmp, "tp-warm", model=model, prompts=prompts, store=path, concurrent=False,
                  extra={"service_cpus": "auto"})
    assert warm["outputs"] == tp_expect
    for w in tp_ranks(warm):
        assert w["load_blocks"] == full and w.get("load_errors", 0) == 0
        assert w["load_bytes"] == tp_ranks(warm)[0]["load_bytes"] > 0
    assert scheduler_stats(warm)["hit_tokens"] == full * BLOCK
    admin_check(path)
    # vLLM bound each rank's thread to its one CPU (VLLM_CPU_OMP_THREADS_BIND, tp_bind); with service_cpus
    # auto (asked for: the default is inherit) tutti's threads go to the CPUs no rank computes on, and
    # stay where they are when there is none, as on a 2-CPU machine (tutti/affinity.py).
    with open(os.path.join(vtmp, "tp-warm", "log.txt")) as f:
        log = f.read()
    bound = [int(c) for c in tp_bind().split("|")]
    free = affinity.allowed_cpus() - set(bound)
    for r in range(TP):
        if free:
            assert f"tutti: rank {r}'s threads run on CPUs {affinity.describe(free)} " in log
        else:
            assert f"tutti: rank {r}'s threads stay with this thread's CPUs {bound[r]} " in log


def test_tp2_engine_load_failing_on_one_rank_is_recomputed_on_both(vtmp, model, tp_prompts, tp_expect,
                                                                   tp_store):
    """Rank 1 alone finds a block's checksum wrong, then reads a block with an I/O error: vLLM
    recomputes those blocks (the workers' failed ids are united), outputs stay exact, and what
    is saved after is sound on both ranks: a third engine loads every full block from both."""
    src, _ = tp_store
    path = os.path.join(vtmp, "tp-fault", "kv.img")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    for r in range(TP):
        shutil.copy(tp_shard(src, r), tp_shard(path, r))
    _, prompts = tp_prompts
    full = full_blocks(prompts)
    hurt = run_tp(vtmp, "tp-fault", model=model, prompts=prompts, store=path, concurrent=False,
                  env_extra={"TUTTI_VLLM_TEST_LOAD_FAULTS": "checksum,eio", "TUTTI_VLLM_TEST_FAULT_RANK": "1"})
    assert hurt["outputs"] == tp_expect
    w0, w1 = tp_ranks(hurt)
    assert w1["corrupt_blocks"] == 1 and w0.get("corrupt_blocks", 0) == 0
    assert w1["load_errors"] >= 2 and w0.get("load_errors", 0) == 0
    assert scheduler_stats(hurt)["load_failures"] == 2

    again = run_tp(vtmp, "tp-fault-again", model=model, prompts=prompts, store=path, concurrent=False)
    assert again["outputs"] == tp_expect
    for w in tp_ranks(again):
        assert w["load_blocks"] == full and w.get("load_errors", 0) == 0, "a recomputed block was not stored"
    kept = held(path)
    assert kept[0] == kept[1]
    admin_check(path)


def test_tp2_engine_killed_mid_save_leaves_each_key_on_both_ranks_or_neither(vtmp, model, tp_prompts,
                                                                             tp_expect):
    """Rank 1's worker is SIGKILLed in the middle of a deferred save (chunked prefill: a save per
    step of 4 blocks). vLLM stops; the next engine keeps only what both ranks committed, serves
    exact outputs and loads the same blocks on both ranks."""
    _, prompts = tp_prompts
    path = os.path.join(vtmp, "tp-crash", "kv.img")
    chunk = 4 * BLOCK
    with pytest.raises(EngineFailed):
        run_tp(vtmp, "tp-crash1", model=model, prompts=prompts[:1], store=path, concurrent=False,
               max_num_batched_tokens=chunk,
               env_extra={"TUTTI_VLLM_TEST_CRASH_AFTER_SAVED_LAYERS": "5", "TUTTI_VLLM_TEST_FAULT_RANK": "1"})
    before = held(path)
    assert len(before[1]) < full_blocks(prompts[:1]), "rank 1 died after its saves were all committed"
    after = run_tp(vtmp, "tp-crash2", model=model, prompts=prompts[:1], store=path, concurrent=False,
                   max_num_batched_tokens=chunk)
    assert after["outputs"] == tp_expect[:1]
    w0, w1 = tp_ranks(after)
    assert w0.get("load_blocks", 0) == w1.get("load_blocks", 0) == len(before[0] & before[1])
    assert w0.get("load_errors", 0) == w1.get("load_errors", 0) == 0
    kept = held(path)
    assert kept[0] == kept[1] and len(kept[0]) == full_blocks(prompts[:1])
    admin_check(path)
