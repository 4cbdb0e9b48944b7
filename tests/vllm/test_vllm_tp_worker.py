"""TuttiConnector's worker side with TP > 1: ranks as gloo processes, no vLLM engine.

vLLM itself with TP = 2 runs in test_vllm_tp_engine.py; these tests put failures
where vLLM offers no hook (between the ranks' votes, one rank's KV final a step late) and
drive WorkerSide (register_kv_caches, save_kv_layer, wait_for_save,
start_load_kv, wait_for_layer_load) in 2 processes over a gloo group, as vLLM's
workers would over get_tp_group().cpu_group.
"""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")

HERE = os.path.dirname(__file__)
HELPER = os.path.join(HERE, "..", "helpers", "tp_worker_rank.py")
sys.path.insert(0, os.path.join(HERE, ".."))
from helpers import tp_worker_rank as wr
from tutti import Store

WORLD = 2


def _via_zygote(d, tag, argv, env):
    """A rank forked from the session's zygote (tutti.vllm.zygote: torch and the connector imported
    once): (rc, stdout, stderr), or None without a zygote."""
    from tutti.vllm import zygote
    out, err = os.path.join(d, f"{tag}.out"), os.path.join(d, f"{tag}.err")
    try:
        rc = zygote.call(os.environ.get("TUTTI_RUNNER_ZYGOTE"), {"argv": argv, "stdout": out, "log": err,
                                                                  "env": env, "cwd": os.getcwd()}, 180)
    except subprocess.TimeoutExpired:
        rc = -9
    if rc is None:
        return None
    with open(out) as fo, open(err) as fe:
        return rc, fo.read(), fe.read()


def run_ranks(d, mode, steps, env_by_rank=None, extra=()):
    rdv = os.path.join(d, f"rdv-{mode}-{time.monotonic_ns()}")
    argvs, envs = [], []
    for r in range(WORLD):
        envs.append(dict(os.environ, PYTHONPATH=os.path.join(HERE, "..") + os.pathsep
                         + os.environ.get("PYTHONPATH", ""), **(env_by_rank or {}).get(r, {})))
        argvs.append([HELPER, mode, "--rank", str(r), "--world", str(WORLD), "--dir", d,
                      "--rdv", rdv, "--steps", ",".join(map(str, steps)), *extra])
    if os.environ.get("TUTTI_RUNNER_ZYGOTE"):
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(WORLD) as ex:
            got = list(ex.map(lambda r: _via_zygote(d, f"{mode}-r{r}-{time.monotonic_ns()}", argvs[r], envs[r]),
                              range(WORLD)))
        if all(g is not None for g in got):
            return got
    procs = [subprocess.Popen([sys.executable, *argvs[r]], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=envs[r]) for r in range(WORLD)]
    out = []
    for p in procs:
        try:
            o, e = p.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            p.kill()
            o, e = p.communicate()
        out.append((p.returncode, o, e))
    return out


def held(d):
    """Per rank: the set of 16-byte keys committed in its store."""
    out = []
    for r in range(WORLD):
        with Store.open([os.path.join(d, f"kv{r}.img")], readonly=True, shared=True) as s:
            out.append(set(s.committed()))
    return out


def load_and_check(d, steps, stored_steps):
    """Load ``steps``; blocks of ``stored_steps`` load exactly, every other block fails on a rank."""
    for rc, _, err in run_ranks(d, "load", steps):
        assert rc == 0, err[-3000:]
    errors = set()
    for r in range(WORLD):  # vLLM unions the ranks' failed block ids
        with open(os.path.join(d, f"load.r{r}.json")) as f:
            errors |= set(json.load(f)["errors"])
    kvs = [torch.load(os.path.join(d, f"kv.r{r}.pt")) for r in range(WORLD)]
    for i, step in enumerate(steps):
        ids = [i * wr.BLOCKS_PER_STEP + b for b in range(wr.BLOCKS_PER_STEP)]
        if step not in stored_steps:
            assert set(ids) <= errors, f"step {step} loaded although it was never committed"
            continue
        assert not set(ids) & errors, f"step {step} failed to load"
        ref = wr.reference(step)
        for layer in range(wr.N_LAYERS):
            whole = torch.cat([kvs[r][wr.layer_name(layer)][ids] for r in range(WORLD)], dim=1)
            assert torch.equal(whole, ref[layer]), f"step {step} layer {layer} not bit-exact"


def test_tp_save_then_load_is_bit_exact(tmp_path):
    d = str(tmp_path)
    for rc, out, err in run_ranks(d, "save", [0, 1]):
        assert rc == 0, err[-3000:]
        keys = json.loads(out)["committed"]
        assert keys == [sorted(k.decode() for k in wr.step_keys(s)) for s in (0, 1)]
    h = held(d)
    assert h[0] == h[1] and len(h[0]) == 2 * wr.BLOCKS_PER_STEP
    load_and_check(d, [0, 1, 5], stored_steps={0, 1})


def test_tp_rank_killed_mid_save_commits_the_step_nowhere(tmp_path):
    d = str(tmp_path)
    # Rank 1 dies after the first layer of the second step's save.
    crash = {1: {"TUTTI_VLLM_TEST_CRASH_AFTER_SAVED_LAYERS": str(wr.N_LAYERS + 1)}}
    outs = run_ranks(d, "save", [0, 1], crash)
    assert outs[1][0] == -signal.SIGKILL
    assert outs[0][0] == 0, outs[0][2][-3000:]   # the survivor logs the broken group, no hang
    assert "GroupError" in outs[0][2] or "TP group" in outs[0][2]
    assert json.loads(outs[0][1])["committed"][1] == []
    h = held(d)
    assert h[0] == h[1] and len(h[0]) == wr.BLOCKS_PER_STEP
    load_and_check(d, [0, 1], stored_steps={0})


def test_tp_start_up_drops_blocks_on_one_rank_only(tmp_path):
    d = str(tmp_path)
    for rc, _, err in run_ranks(d, "save", [0, 1]):
        assert rc == 0, err[-3000:]
    # A crash between the ranks' commit records: drop step 1 from rank 1 only.
    with Store.open([os.path.join(d, "kv1.img")]) as s:
        assert s.invalidate(s.lookup(wr.step_keys(1))) == wr.BLOCKS_PER_STEP
    h = held(d)
    assert len(h[0]) == 2 * wr.BLOCKS_PER_STEP and len(h[1]) == wr.BLOCKS_PER_STEP
    # register_kv_caches reconciles: rank 0's orphans are dropped, step 0 still loads.
    load_and_check(d, [0, 1], stored_steps={0})
    h = held(d)
    assert h[0] == h[1] and len(h[0]) == wr.BLOCKS_PER_STEP


def test_tp_load_and_save_in_one_step_commit_everywhere(tmp_path):
    """A step that loads a prefix and saves new blocks (writes held back until the reads are
    over, write_policy slack) still commits the new blocks on every rank in that step."""
    d = str(tmp_path)
    for rc, out, err in run_ranks(d, "loadsave", [0, 1]):
        assert rc == 0, err[-3000:]
        r = json.loads(out)
        assert r["loaded"] and r["errors"] == []
        assert r["committed"] == sorted(k.decode() for k in wr.step_keys(1))
        assert r["stats"]["writes_deferred"] == wr.N_LAYERS - 1
        assert r["stats"].get("rw_overlap_s", 0) == 0
    h = held(d)
    assert h[0] == h[1] and len(h[0]) == 2 * wr.BLOCKS_PER_STEP


def test_tp_failed_load_on_one_rank_commits_nothing_computed_over_it(tmp_path):
    """Rank 1's load fails (its copy of a key is gone); rank 0's succeeds.  Every rank computed
    step 1's blocks over the bad block (attention spans all heads' outputs), and step 2 was
    scheduled before the scheduler heard of it: neither is committed on any rank.  Once the
    scheduler's metadata acknowledges the failure (step 3), saves are committed again."""
    d = str(tmp_path)
    out = run_ranks(d, "poison", [10, 11, 12, 13])
    for rc, _, err in out:
        assert rc == 0, err[-3000:]
    steps = [json.loads(o) for _, o, _ in out]
    names = lambda s: sorted(k.decode() for k in wr.step_keys(s))
    for r in range(WORLD):
        assert steps[r][0]["committed"] == names(10)
        assert steps[r][1]["committed"] == [], f"rank {r} committed step 1's blocks"
        assert steps[r][2]["committed"] == [], f"rank {r} committed step 2's blocks"
        assert steps[r][3]["committed"] == names(13)
    assert steps[1][1]["errors"] == [wr.BLOCKS_PER_STEP + 1] and steps[0][1]["errors"] == []
    assert steps[1][1]["failures"] == [1] and steps[1][2]["failures"] == [1]  # sent until acked
    assert steps[1][3]["failures"] == []
    poisoned = {wr.step_keys(s)[i] for s in (11, 12) for i in range(wr.BLOCKS_PER_STEP)}
    from tutti import key_from_bytes
    for r, keys in enumerate(held(d)):
        assert not keys & {key_from_bytes(k) for k in poisoned}, f"rank {r} holds a poisoned block"


def test_tp_deferred_commit_waits_for_the_slower_rank(tmp_path):
    """Deferred saves: rank 1's KV of each step becomes final a step later than rank 0's, so
    rank 0 is ready to commit first.  The ranks agree at each step which pending saves are ready
    everywhere: each step's blocks are committed at the same step on both ranks, after both
    wrote them, and load back bit-exact."""
    d = str(tmp_path)
    out = run_ranks(d, "lag", [0, 1, 2])
    for rc, _, err in out:
        assert rc == 0, err[-3000:]
    per_rank = [json.loads(o) for _, o, _ in out]
    assert per_rank[0] == per_rank[1]
    names = lambda s: sorted(k.decode() for k in wr.step_keys(s))  # noqa: E731
    # Saved in steps 1, 2, 3; rank 1 writes each in the next step: committed two steps later.
    assert per_rank[0] == [[], [], names(0), names(1), names(2), []]
    h = held(d)
    assert h[0] == h[1] and len(h[0]) == 3 * wr.BLOCKS_PER_STEP
    load_and_check(d, [0, 1, 2], stored_steps={0, 1, 2})


def test_tp_shutdown_commits_pending_saves_on_every_rank(tmp_path):
    """vLLM stops its workers together: a save still pending at shutdown is committed on both
    ranks (agreed, bounded by shutdown_drain_s), not dropped, and loads back bit-exact."""
    d = str(tmp_path)
    out = run_ranks(d, "shutdown", [0, 1])
    for rc, o, err in out:
        assert rc == 0, err[-3000:]
        r = json.loads(o)
        assert r["held"] == [True] * (2 * wr.BLOCKS_PER_STEP) and r["dropped"] == 0
    h = held(d)
    assert h[0] == h[1] and len(h[0]) == 2 * wr.BLOCKS_PER_STEP
    load_and_check(d, [0, 1], stored_steps={0, 1})


def test_tp_shutdown_with_a_rank_gone_drops_within_the_deadline(tmp_path):
    """Rank 1 is gone when rank 0 closes: rank 0 waits for the agreement no longer than
    shutdown_drain_s, then drops the pending save (counted): its blocks are on no rank."""
    d = str(tmp_path)
    out = run_ranks(d, "shutdown", [0, 1], extra=["--gone-rank", "1", "--drain-s", "2"])
    assert out[1][0] == 0
    rc, o, err = out[0]
    assert rc == 0, err[-3000:]
    r = json.loads(o)
    assert r["close_s"] < 2 + 3, r   # bounded by the deadline (+ slack for a loaded machine)
    assert r["held"] == [True] * wr.BLOCKS_PER_STEP + [False] * wr.BLOCKS_PER_STEP
    assert r["dropped"] == wr.BLOCKS_PER_STEP
    h = held(d)
    assert h[0] == h[1] and len(h[0]) == wr.BLOCKS_PER_STEP
