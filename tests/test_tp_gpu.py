"""Tensor-parallel ranks on separate GPUs: each rank process owns one CUDA device, an
NCCL group joins them (gloo carries the commit votes, as vLLM's CPU group does), and
each rank's store moves its shard between its member file and *its own* HBM through
a GPU data path (tutti.gpu.store): written from HBM, read back layer by layer into
HBM, reassembled bit-exact.  A rank SIGKILLed mid-save leaves no block committed
with a shard missing.  The rank program and the checks are test_tp_commit's; what
differs is where the bytes live.  Needs two CUDA devices (the nvidia-h200-x2
machine); CPU ranks are covered by test_tp_commit.py.
"""
import json
import signal

import pytest

torch = pytest.importorskip("torch", reason="needs torch with CUDA")
if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
    pytest.skip("needs 2 CUDA devices (one per TP rank); test_tp_commit.py covers CPU ranks",
                allow_module_level=True)
try:
    from tutti.gpu._ffi import lib as _gpu_lib

    _gpu_lib()
except Exception as e:  # noqa: BLE001 - any failure to load means: not here
    pytest.skip(f"libtutti_gpu.so does not load here ({e}); build it with make gpu-lib",
                allow_module_level=True)

import test_tp_commit as base

WORLD = 2
KEYS = base.KEYS


@pytest.mark.parametrize("path", ["staged", "gio"])
def test_shards_written_from_hbm_read_back_into_hbm_bit_exact(tmp_path, path):
    base.format_stores(tmp_path, WORLD)
    outs = base.wait_all(base.spawn(tmp_path, WORLD, "write", keys=",".join(map(str, KEYS)),
                                    gpu=True, path=path))
    for rc, out, err in outs:
        assert rc == 0, err[-3000:]
        assert json.loads(out)["committed"] == [KEYS[0:4], KEYS[4:8], KEYS[8:12]]
    assert base.held_keys(tmp_path, WORLD) == [set(KEYS)] * WORLD
    assert base.group_read(tmp_path, WORLD, KEYS + [40], gpu=True, path=path) == KEYS
    # The CPU path reads what the GPUs wrote: same format, same checksums.
    assert base.group_read(tmp_path, WORLD, KEYS) == KEYS
    present, dropped = base.reconcile_and_verify(tmp_path, WORLD)
    assert present == KEYS and dropped == []


@pytest.mark.parametrize("phase", sorted(base.CRASHES))
def test_rank_killed_mid_save_commits_nothing_anywhere(tmp_path, phase):
    base.format_stores(tmp_path, WORLD)
    victim = WORLD - 1
    procs = base.spawn(tmp_path, WORLD, "write", {victim: base.CRASHES[phase]},
                       keys=",".join(map(str, KEYS)), at_batch=1, gpu=True, path="staged")
    outs = base.wait_all(procs)
    assert outs[victim][0] == -signal.SIGKILL
    rc, _, err = outs[0]
    assert rc != 0 and "GroupError" in err, err[-3000:]
    assert not base.marks(tmp_path, 1, "agreed", [0])
    assert base.held_keys(tmp_path, WORLD) == [set(KEYS[:4])] * WORLD, "batch 1 committed somewhere"
    assert base.group_read(tmp_path, WORLD, KEYS, gpu=True) == KEYS[:4]
    present, dropped = base.reconcile_and_verify(tmp_path, WORLD)
    assert present == KEYS[:4] and dropped == []


def test_rank_killed_after_the_other_committed_rolls_back(tmp_path):
    base.format_stores(tmp_path, WORLD)
    procs = base.spawn(tmp_path, WORLD, "write", {1: ["--hold", "agreed"]},
                       keys=",".join(map(str, KEYS)), at_batch=1, gpu=True, path="staged")
    base.wait_for(lambda: base.marks(tmp_path, 1, "committed", [0])
                  and base.marks(tmp_path, 1, "agreed", [1]))
    procs[1].send_signal(signal.SIGKILL)
    outs = base.wait_all(procs)
    assert outs[0][0] != 0 and "GroupError" in outs[0][2], outs[0][2][-3000:]
    assert base.held_keys(tmp_path, WORLD) == [set(KEYS[:4])] * WORLD
    assert base.group_read(tmp_path, WORLD, KEYS, gpu=True) == KEYS[:4]
    present, dropped = base.reconcile_and_verify(tmp_path, WORLD)
    assert present == KEYS[:4] and dropped == []
