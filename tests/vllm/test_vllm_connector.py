"""TuttiConnector against real vLLM (CPU build), one engine process per run.

Each test states the property it checks; outputs are compared token for token
with a run that has no connector (greedy decoding).
"""
import os
import shutil
import subprocess
import sys

import pytest

from tutti import Store
from vllm_engine import EngineFailed, run_engine, scheduler_stats, worker_stats


def _committed(path):
    with Store.open([path], readonly=True, shared=True, engine="psync") as s:
        info = s.info()
        return info["n_committed"], info["geometry"]["n_slots"]


def test_cold_run_matches_and_stores(warm_store, baseline, prompts, block):
    """With the connector, a cold run's outputs equal the run without it, and the
    shared prefix plus each tail's full blocks are committed once."""
    path, cold = warm_store
    assert cold["outputs"] == baseline
    n_committed, _ = _committed(path)
    shared = len(prompts[0]) // block  # blocks of prompt 0, then the others' own tail blocks
    assert n_committed >= shared
    assert worker_stats(cold)["save_blocks"] == n_committed
    assert worker_stats(cold).get("load_blocks", 0) == 0


def test_second_process_loads_prefix(vtmp, model, warm_store, baseline, prompts, block):
    """A second process finds the stored prefix: it loads at least (prompt - one block)
    tokens of the first prompt from the store, and outputs stay identical."""
    path, _ = warm_store
    warm = run_engine(vtmp, "warm", model=model, prompts=prompts, store=path)
    assert warm["outputs"] == baseline
    sched, work = scheduler_stats(warm), worker_stats(warm)
    assert sched["hit_tokens"] >= len(prompts[0]) - block
    assert work["load_blocks"] * block >= len(prompts[0]) - block
    assert work.get("load_errors", 0) == 0 and work.get("corrupt_blocks", 0) == 0


def test_multiprocess_mode(vtmp, model, warm_store, baseline, prompts, block):
    """vLLM's default mode: scheduler side in the engine-core process, worker side in a
    worker process; the index comes from the on-disk table, loads still happen."""
    path, _ = warm_store
    mp_store = os.path.join(vtmp, "mp", "kv.img")
    os.makedirs(os.path.dirname(mp_store), exist_ok=True)
    shutil.copy(path, mp_store)
    res = run_engine(vtmp, "mp", model=model, prompts=prompts, store=mp_store, multiprocess=True)
    assert res["outputs"] == baseline
    assert worker_stats(res)["load_blocks"] * block >= len(prompts[0]) - block
    assert scheduler_stats(res)["hit_tokens"] >= len(prompts[0]) - block


def _corrupt_layer(path, layer):
    """Flip bytes of ``layer``'s object in every slot; returns how many committed slots went bad."""
    with Store.open([path], readonly=True, shared=True, engine="psync") as s:
        g = s.geometry
        spots = [s.locate(slot, layer, 0) for slot in range(g.n_slots)]
    with open(path, "r+b") as f:
        for _, off in spots:
            f.seek(off + 100)
            data = f.read(16)
            f.seek(off + 100)
            f.write(bytes(b ^ 0x5A for b in data))
    with Store.open([path], readonly=True, shared=True, engine="psync") as s:
        return s.check()["bad"]


def test_corrupt_store_is_detected_and_recomputed(vtmp, model, warm_store, baseline, prompts):
    """Bytes corrupted on disk are caught by the checksum, reported to vLLM as load
    errors, recomputed, and the outputs are still identical."""
    path, _ = warm_store
    bad_store = os.path.join(vtmp, "corrupt", "kv.img")
    os.makedirs(os.path.dirname(bad_store), exist_ok=True)
    shutil.copy(path, bad_store)
    n_bad = _corrupt_layer(bad_store, layer=1)
    assert n_bad > 0
    res = run_engine(vtmp, "corrupt-run", model=model, prompts=prompts, store=bad_store)
    assert res["outputs"] == baseline
    work = worker_stats(res)
    assert work["corrupt_blocks"] > 0
    assert work["load_errors"] >= work["corrupt_blocks"]
    # The corrupt slots were dropped (and the recomputed blocks may be stored again).
    with Store.open([bad_store], readonly=True, shared=True, engine="psync") as s:
        assert s.check()["bad"] == 0


def test_small_store_evicts_and_keeps_serving(vtmp, model, baseline, prompts, block):
    """A store smaller than the working set evicts least-recently-used slots, stays
    full but consistent, and outputs stay identical in a second process too."""
    path = os.path.join(vtmp, "small", "kv.img")
    n_prompt_blocks = len(prompts[0]) // block
    cap = 8 * 2 * 16384  # 8 slots of this model's blocks (2 layers x 16 KiB)
    # Chunked prefill: many steps, each saving a few blocks into a full store.
    r1 = run_engine(vtmp, "small1", model=model, prompts=prompts, store=path,
                    extra={"capacity": cap}, max_num_batched_tokens=4 * block)
    assert r1["outputs"] == baseline
    n_committed, n_slots = _committed(path)
    assert n_slots == 8 < n_prompt_blocks
    assert n_committed == n_slots
    ws = worker_stats(r1)
    assert ws["save_blocks"] > n_slots  # some were evicted
    # ... and vLLM's metrics say so: every block stored beyond the 8 free slots evicted one
    assert ws["store_evictions"] == ws["save_blocks"] - n_slots
    assert (ws["store_committed_blocks"], ws["store_slots"]) == (n_committed, n_slots)
    r2 = run_engine(vtmp, "small2", model=model, prompts=prompts, store=path,
                    extra={"capacity": cap}, max_num_batched_tokens=4 * block)
    assert r2["outputs"] == baseline
    with Store.open([path], readonly=True, shared=True, engine="psync") as s:
        assert s.check()["bad"] == 0


@pytest.mark.parametrize("data_path", ["cpu", "host"])
def test_crash_mid_save_commits_no_partial_slot(vtmp, model, baseline, prompts, block, data_path, request):
    """The engine is SIGKILLed in the middle of a save (some layers of a step's blocks
    submitted, not committed; an earlier step's save pending): only saves committed before the
    kill are stored, every
    committed block verifies, and a restarted engine serves correct outputs.  Both the
    host-memory path and the GPU-memory code (GpuStore, on CPU tensors: "host")."""
    if data_path == "host":
        request.getfixturevalue("gpu_lib")
    path = os.path.join(vtmp, f"crash-{data_path}", "kv.img")
    chunk = 4 * block  # chunked prefill: one save transaction per step of 4 blocks
    with pytest.raises(EngineFailed) as e:
        run_engine(vtmp, f"crash1-{data_path}", model=model, prompts=prompts[:1], store=path,
                   extra={"data_path": data_path},
                   max_num_batched_tokens=chunk, env_extra={
                       # 2 layers per step; saves are deferred (the default): the first step's
                       # is committed at the end of the second, whose own save is then pending.
                       # Die after layer 0 of the third step's save: in the deferred drain.
                       "TUTTI_VLLM_TEST_CRASH_AFTER_SAVED_LAYERS": "5"})
    assert e.value.rc in (-9, 137)
    n_committed, _ = _committed(path)
    assert n_committed == chunk // block  # the first step's blocks only
    with Store.open([path], readonly=True, shared=True, engine="psync") as s:
        res = s.check()
        assert res["bad"] == 0 and res["checked"] == n_committed
    check = subprocess.run([sys.executable, "-m", "tutti.cli", "check", path],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr  # every key exact or absent
    r2 = run_engine(vtmp, f"crash2-{data_path}", model=model, prompts=prompts[:1], store=path,
                    extra={"data_path": data_path}, max_num_batched_tokens=chunk)
    assert worker_stats(r2)["load_blocks"] == n_committed
    assert r2["outputs"] == baseline[:1]


def test_store_of_another_model_is_refused(vtmp, model, warm_store, prompts):
    """A store made for another model (fingerprint mismatch) stops the engine with a
    clear error instead of serving another model's KV."""
    path, _ = warm_store
    with pytest.raises(EngineFailed) as e:
        run_engine(vtmp, "mismatch", model=model, prompts=prompts[:1], store=path,
                   extra={"model_id": "some/other-model"})
    assert "made for another model" in e.value.log
    assert "some/other-model" in e.value.log


def test_gpu_memory_worker_path_in_vllm(vtmp, model, warm_store, baseline, prompts, block, gpu_lib):
    """The worker's GPU-memory code (tutti.gpu.GpuStore, DeviceKV, per-layer marks) inside real
    vLLM, moving bytes with its C reference path over CPU tensors (data_path "host"): it loads a
    store the CPU path wrote, and what it stores the CPU path loads, outputs identical throughout.
    (On a GPU the same code runs with the staged/gds/gio paths: tests/test_gpu_store_py.py.)"""
    path, _ = warm_store
    d = os.path.join(vtmp, "gpu-path")
    os.makedirs(d, exist_ok=True)
    copy = os.path.join(d, "warm.img")
    shutil.copy(path, copy)
    warm = run_engine(vtmp, "gpu-path-warm", model=model, prompts=prompts, store=copy,
                      extra={"data_path": "host"})
    assert warm["outputs"] == baseline
    work = worker_stats(warm)
    assert work["load_blocks"] * block >= len(prompts[0]) - block
    assert work.get("load_errors", 0) == 0 and work.get("corrupt_blocks", 0) == 0

    fresh = os.path.join(d, "fresh.img")
    cold = run_engine(vtmp, "gpu-path-cold", model=model, prompts=prompts, store=fresh,
                      extra={"data_path": "host", "capacity": "32MiB"})
    assert cold["outputs"] == baseline
    n_committed, _ = _committed(fresh)
    assert n_committed >= len(prompts[0]) // block
    assert worker_stats(cold)["save_blocks"] == n_committed
    back = run_engine(vtmp, "gpu-path-back", model=model, prompts=prompts, store=fresh)
    assert back["outputs"] == baseline
    assert worker_stats(back)["load_blocks"] * block >= len(prompts[0]) - block
    assert worker_stats(back).get("corrupt_blocks", 0) == 0


def test_data_path_for_the_wrong_memory_is_refused(vtmp, model, prompts):
    """A GPU data path for vLLM's CPU KV cache stops the engine with a reason, before serving."""
    with pytest.raises(EngineFailed, match="data_path 'staged' moves blocks into GPU memory"):
        run_engine(vtmp, "wrong-path", model=model, prompts=prompts,
                   store=os.path.join(vtmp, "wrong-path", "kv.img"), extra={"data_path": "staged"})
