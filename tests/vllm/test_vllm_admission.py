"""Real vLLM (CPU): a write budget that the workload outruns (write_budget, write_admission).

One engine serves, one request at a time (vLLM's own prefix cache off, so a prefix can only come
from the store): ``w`` (36 blocks nobody asks for again) while the bucket is full, which takes it
below half; then three prompts sharing a 20-block document ``P``, each with its own question.
Under ``second_hit`` the first sighting of ``P`` (prompt a) is not written, the second (b) is, and
the third (c) loads it.  The bucket holds 64 blocks and refills at under one block a minute, so the
run is deterministic.  Outputs must equal an engine without the connector.
"""
import os
import random
import subprocess
import sys

from conftest import PREFIX
from vllm_engine import BLOCK, run_engine, scheduler_stats, worker_stats

BLOCK_BYTES = 2 * 2 * 2 * 64 * BLOCK * 2  # K, V x 2 layers x 2 KV heads x 64 dims x 32 tokens x bf16
BUCKET = 64 * BLOCK_BYTES                 # an hour of the budget


def test_a_spent_budget_writes_second_sightings_and_serving_goes_on(vtmp, model, vocab, prompts):
    rng = random.Random(11)
    w = [rng.randrange(3, vocab) for _ in range(36 * BLOCK + 5)]
    seq = [w, prompts[0], prompts[1], prompts[2]]
    path = os.path.join(vtmp, "admission", "kv.img")
    spec = dict(model=model, prompts=seq, max_tokens=4, concurrent=False, prefix_caching=False)
    expect = run_engine(vtmp, "admission-none", connector="none", **spec)["outputs"]
    res = run_engine(vtmp, "admission", store=path, extra={
        "capacity": "32MiB", "write_budget": BUCKET * 24, "write_admission": "second_hit"}, **spec)
    assert res["outputs"] == expect
    sched, work = scheduler_stats(res), worker_stats(res)
    doc = PREFIX // BLOCK
    own = sum(len(p) // BLOCK - doc for p in prompts)  # each prompt's blocks past the document
    # Offered: w, then the document once (b's sighting); refused: a's document, every question.
    assert sched["save_admitted"] == 36 + doc
    assert sched["save_skipped"] == doc + own and sched["save_skipped_bytes"] == (doc + own) * BLOCK_BYTES
    assert sched["admission_pressure_steps"] >= 3
    assert sched["write_budget_bytes_per_day"] == BUCKET * 24
    assert sched["write_budget_left_bytes"] < BUCKET / 2
    # Every block offered was written; nothing refused is an error or a drop.
    assert work["save_blocks"] == sched["save_admitted"]
    assert work.get("save_errors", 0) == 0 and work.get("save_dropped", 0) == 0
    # c loaded the document b stored (nothing else was in the store for it).
    assert work["load_blocks"] == doc and work.get("load_errors", 0) == 0
    check = subprocess.run([sys.executable, "-m", "tutti.cli", "check", path], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
