"""Reads first: the worker side never has a write in flight while a read is (write_policy), on every data path.

WorkerSide is driven as vLLM's model runner drives it (start_load_kv, then per layer
wait_for_layer_load, the layer's compute, save_kv_layer; then wait_for_save), with every
read and write transaction of its store logged: each layer's submit and wait, and the
transaction's prepare/finish/abort (which wait for everything still in flight).  No vLLM is
needed (tutti.vllm's worker side imports without it), so the GPU machine runs the "staged" cases.
"""
import os
import time

import pytest

torch = pytest.importorskip("torch")

from tutti import Store
from tutti.vllm.config import ConfigError, ModelShape, TuttiConfig
from tutti.vllm.metadata import BlockTransfer, TuttiMetadata
from tutti.vllm.stats import TuttiStats
from tutti.vllm.worker import WorkerSide

N_LAYERS, KV_HEADS, BLOCK, HEAD_DIM = 4, 2, 16, 32
NUM_BLOCKS, N = 32, 4            # blocks in vLLM's cache; blocks per transfer
PREFIX_IDS = list(range(0, N))   # step 1 computes the prefix here and saves it
LOAD_IDS = list(range(8, 8 + N))  # step 2 loads the prefix here ...
NEW_IDS = list(range(16, 16 + N))  # ... and computes and saves new blocks here
COMPUTE_S = 0.004                 # one layer's "compute": long enough for an overlap to show


def layer_name(layer):
    return f"model.layers.{layer}.self_attn.attn"


def keys(tag):
    return [f"{tag}-block{b}".encode() for b in range(N)]


def reference(seed):
    """[layers, N, KV_HEADS, BLOCK, 2 * HEAD_DIM] int16 (vLLM's CPU layout, per layer)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-32768, 32768, (N_LAYERS, N, KV_HEADS, BLOCK, 2 * HEAD_DIM),
                         generator=g, dtype=torch.int16)


class Log:
    """Ordered (kind, op, layer, time) of every store transaction; kind 'R' or 'W'."""

    def __init__(self):
        self.events = []

    def add(self, kind, op, layer=None):
        self.events.append((kind, op, layer, time.perf_counter()))

    def violations(self):
        """Submits of one kind while a layer of the other kind was submitted, not waited for."""
        flight = {"R": {}, "W": {}}  # txn id -> layers in flight
        bad = []
        for i, (kind, op, layer, _) in enumerate(self.events):
            kind, tid = kind
            other = "W" if kind == "R" else "R"
            mine = flight[kind].setdefault(tid, set())
            if op == "submit":
                if any(flight[other].values()):
                    bad.append((i, kind, layer))
                mine.add(layer)
            elif op == "wait":
                mine.discard(layer)
            else:  # prepare, finish, abort: nothing of the transaction is in flight after it
                mine.clear()
        return bad

    def of(self, kind, op):
        return [layer for (k, _), o, layer, _ in self.events if k == kind and o == op]


class LoggedTxn:
    def __init__(self, txn, kind, log):
        self._t, self._kind, self._log = txn, (kind, id(txn)), log

    def __getattr__(self, name):
        return getattr(self._t, name)

    def __len__(self):
        return len(self._t)

    def layer(self, layer, *a, **kw):
        self._log.add(self._kind, "submit", layer)
        return self._t.layer(layer, *a, **kw)

    def wait_layer(self, layer):
        r = self._t.wait_layer(layer)
        self._log.add(self._kind, "wait", layer)
        return r

    def _whole(op):
        def f(self, *a):
            r = getattr(self._t, op)(*a)
            self._log.add(self._kind, op)
            return r
        return f

    prepare, finish, abort = _whole("prepare"), _whole("finish"), _whole("abort")


def make_worker(d, policy, lookahead=2, data_path="cpu", save_mode="step", **extra):
    """save_mode "step" (commits in the step): these tests check what one step does."""
    cfg = TuttiConfig.from_extra({"path": os.path.join(d, "kv.img"), "capacity": "4MiB",
                                  "write_policy": policy, "lookahead_layers": lookahead,
                                  "data_path": data_path, "save_mode": save_mode, **extra})
    shape = ModelShape(model_id="tests/write-policy", dtype="float16", n_layers=N_LAYERS,
                       kv_heads=KV_HEADS, head_dim=HEAD_DIM, block_size=BLOCK, tp_size=1)
    stats = TuttiStats()
    w = WorkerSide(cfg, shape, 0, stats)
    device = "cpu" if data_path in ("cpu", "host") else "cuda"
    kv = {layer_name(l): torch.zeros(NUM_BLOCKS, KV_HEADS, BLOCK, 2 * HEAD_DIM, dtype=torch.int16,
                                     device=device) for l in range(N_LAYERS)}
    w.register_kv_caches(kv, NUM_BLOCKS)
    assert ("data path host" in w.io.name) == (data_path == "host"), w.io.name
    log = Log()
    read, write = w.store.read, w.store.write
    w.store.read = lambda *a: LoggedTxn(read(*a), "R", log)
    w.store.write = lambda *a: LoggedTxn(write(*a), "W", log)
    return w, kv, log, stats


def step(w, kv, meta, computed=None, wait_layers=range(N_LAYERS)):
    """One forward as vLLM runs it; ``computed``: (block ids, reference) the model writes."""
    w.start_load(meta)
    for l in range(N_LAYERS):
        if l in wait_layers:
            w.wait_layer(layer_name(l))
        if computed is not None:  # the layer's attention writes its new KV into the cache
            ids, ref = computed
            kv[layer_name(l)][ids] = ref[l].to(kv[layer_name(l)].device)
        time.sleep(COMPUTE_S)
        w.save_layer(meta, layer_name(l))
    w.finish_save(meta)
    errors = w.take_load_errors()
    wm = w.take_worker_meta()
    return errors, {ev.key for ev in (wm.events if wm else []) if ev.key}


def n(result, counter):
    """A worker counter of the step under test (TuttiStats adds keys as they are counted)."""
    return result["stats"].get(counter, 0)


def run(d, policy, lookahead=2, wait_layers=range(N_LAYERS), data_path="cpu"):
    """Step 1 stores a prefix; step 2 loads it and stores new blocks (the step under test)."""
    w, kv, log, stats = make_worker(d, policy, lookahead, data_path)
    prefix, new = reference(1), reference(2)
    seed = TuttiMetadata(saves=[BlockTransfer("r1", keys("prefix"), PREFIX_IDS)])
    errors, committed = step(w, kv, seed, (PREFIX_IDS, prefix))
    assert not errors and committed == set(keys("prefix"))
    seed_stats = dict(stats.data)
    stats.reset()
    n_seed = len(log.events)
    meta = TuttiMetadata(loads=[BlockTransfer("r2", keys("prefix"), LOAD_IDS)],
                         saves=[BlockTransfer("r2", keys("new"), NEW_IDS)])
    errors, committed = step(w, kv, meta, (NEW_IDS, new), wait_layers)
    log.events = log.events[n_seed:]
    out = dict(errors=errors, committed=committed, stats=dict(stats.data), seed_stats=seed_stats,
               loaded=[kv[layer_name(l)][LOAD_IDS].cpu() for l in range(N_LAYERS)], log=log)
    w.close()
    with Store.open([os.path.join(d, "kv.img")], readonly=True, shared=True) as s:
        out["stored"] = {k: s.get(k) if s.lookup([k])[0] is not None else None
                         for k in keys("prefix") + keys("new")}
    return out


def gpu_store_lib(request, data_path):
    """GpuStore needs libtutti_gpu.so (the gpu_lib fixture); its GPU paths a CUDA device."""
    if data_path != "host" and not torch.cuda.is_available():
        pytest.skip(f"data path {data_path}: needs a CUDA device")
    request.getfixturevalue("gpu_lib")


# "cpu": tutti.Store into host memory; "host": tutti.gpu.GpuStore's data-path code on CPU tensors
# (the worker's GPU-memory path: DeviceKV, DeviceTxn, marks), its C reference path moving the bytes;
# "staged": the same on a CUDA device, file -> pinned chunks -> HBM (skips without a GPU).
DATA_PATHS = ["cpu", "host", "staged"]


@pytest.mark.parametrize("data_path", DATA_PATHS)
@pytest.mark.parametrize("lookahead", [1, 2, N_LAYERS])
def test_slack_never_overlaps_and_stores_what_eager_stores(tmp_path, lookahead, data_path, request):
    if data_path != "cpu":
        gpu_store_lib(request, data_path)
    slack = run(str(tmp_path / "slack"), "slack", lookahead, data_path=data_path)
    eager = run(str(tmp_path / "eager"), "eager", lookahead, data_path=data_path)
    for r in (slack, eager):
        assert not r["errors"]
        assert r["committed"] == set(keys("new"))  # the new blocks, committed in the step
        assert n(r, "save_blocks") == N and n(r, "load_blocks") == N
        assert sorted(r["log"].of("R", "submit")) == list(range(N_LAYERS))
        assert sorted(r["log"].of("W", "submit")) == list(range(N_LAYERS))
        for l in range(N_LAYERS):  # the loaded prefix is bit-exact
            assert torch.equal(r["loaded"][l], reference(1)[l])
    # Same bytes loaded and stored in both modes (stored: every layer of every block).
    assert all(torch.equal(a, b) for a, b in zip(slack["loaded"], eager["loaded"]))
    assert slack["stored"] == eager["stored"]
    new = reference(2)
    for b, k in enumerate(keys("new")):
        assert slack["stored"][k] == new[:, b].contiguous().numpy().tobytes()

    # Slack: no write submitted while a read is in flight; eager: there are such writes.
    assert slack["log"].violations() == []
    assert eager["log"].violations() != []
    ev = slack["log"].events  # every write goes after the last read was waited for
    last_read = max(i for i, ((k, _), op, _, _) in enumerate(ev) if k == "R" and op != "submit")
    assert min(i for i, ((k, _), op, _, _) in enumerate(ev) if k == "W") > last_read
    # ... and before the commit, which ends the step's I/O.
    assert ev[-1][0][0] == "W" and ev[-1][1] == "finish"

    # The counters say the same.
    assert n(slack, "rw_overlap_s") == 0
    assert n(slack, "writes_deferred") == N_LAYERS - 1  # the last layer's comes after
    assert n(eager, "rw_overlap_s") >= COMPUTE_S
    assert n(eager, "writes_deferred") == 0
    assert slack["seed_stats"].get("writes_deferred", 0) == 0  # no load: nothing to wait for


@pytest.mark.parametrize("data_path", DATA_PATHS)
def test_slack_load_left_open_is_finished_before_the_commit(tmp_path, data_path, request):
    """The model never waits for the last layer: wait_for_save finishes the load before it
    decides on the step's saves.  The unwaited load is reported for recompute, and the blocks
    the model computed over it are neither written nor committed (issue 12)."""
    if data_path != "cpu":
        gpu_store_lib(request, data_path)
    r = run(str(tmp_path), "slack", wait_layers=range(N_LAYERS - 1), data_path=data_path)
    assert r["log"].violations() == []
    assert r["errors"] == set(LOAD_IDS)
    assert r["committed"] == set()
    assert r["stored"][keys("new")[0]] is None
    assert n(r, "writes_deferred") == N_LAYERS and n(r, "rw_overlap_s") == 0
    assert n(r, "save_fenced") == N
    assert r["log"].of("W", "submit") == [] and r["log"].of("R", "finish") != []


def test_slack_load_waits_for_writes_in_flight(tmp_path):
    """A load that starts while a save's writes are in flight waits for them first."""
    w, kv, log, stats = make_worker(str(tmp_path), "slack")
    step(w, kv, TuttiMetadata(saves=[BlockTransfer("r1", keys("prefix"), PREFIX_IDS)]),
         (PREFIX_IDS, reference(1)))
    saves = TuttiMetadata(saves=[BlockTransfer("r2", keys("new"), NEW_IDS)])
    for l in range(2):  # writes submitted (no read in flight), then a load begins
        w.save_layer(saves, layer_name(l))
    w.start_load(TuttiMetadata(loads=[BlockTransfer("r3", keys("prefix"), LOAD_IDS)]))
    for l in range(N_LAYERS):
        w.wait_layer(layer_name(l))
    for l in range(2, N_LAYERS):
        w.save_layer(saves, layer_name(l))
    w.finish_save(saves)
    assert log.violations() == []
    assert log.of("W", "wait")[-2:] == [0, 1]  # waited before the first read went
    assert not w.take_load_errors() and stats.data["save_blocks"] == 2 * N
    w.close()


@pytest.mark.parametrize("data_path", DATA_PATHS)
@pytest.mark.parametrize("save_mode", ["step", "deferred"])
def test_after_step_submits_no_write_beside_the_forward(tmp_path, save_mode, data_path, request):
    """write_policy after_step: while the forward runs (its load and every layer's save_kv_layer) no
    write is submitted, with or without a load in the step; the step's end sends them (step: written
    and committed in wait_for_save; deferred: by the drains, committed at a later step), stored exact."""
    if data_path != "cpu":
        gpu_store_lib(request, data_path)
    w, kv, log, stats = make_worker(str(tmp_path), "after_step", data_path=data_path, save_mode=save_mode)
    committed = set()

    def forward(meta, computed):
        w.start_load(meta)
        for l in range(N_LAYERS):
            if meta.loads:
                w.wait_layer(layer_name(l))
            ids, ref = computed
            kv[layer_name(l)][ids] = ref[l].to(kv[layer_name(l)].device)
            w.save_layer(meta, layer_name(l))
        assert log.of("W", "submit") == [], "a write went beside the forward"
        w.finish_save(meta)
        assert not w.take_load_errors()
        wm = w.take_worker_meta()
        committed.update(ev.key for ev in (wm.events if wm else []) if ev.key)

    def settle(want):
        deadline = time.monotonic() + 20
        while not want <= committed:
            assert time.monotonic() < deadline, committed
            w.start_load(TuttiMetadata())
            w.finish_save(TuttiMetadata())
            wm = w.take_worker_meta()
            committed.update(ev.key for ev in (wm.events if wm else []) if ev.key)
            time.sleep(0.002)

    forward(TuttiMetadata(saves=[BlockTransfer("r1", keys("prefix"), PREFIX_IDS)]), (PREFIX_IDS, reference(1)))
    if save_mode == "step":
        assert committed == set(keys("prefix"))
    settle(set(keys("prefix")))
    log.events.clear()
    forward(TuttiMetadata(loads=[BlockTransfer("r2", keys("prefix"), LOAD_IDS)],
                          saves=[BlockTransfer("r2", keys("new"), NEW_IDS)]), (NEW_IDS, reference(2)))
    settle(set(keys("new")))
    assert log.violations() == []
    assert sorted(log.of("W", "submit")) == list(range(N_LAYERS))
    assert stats.data.get("writes_deferred", 0) == 2 * N_LAYERS
    for l in range(N_LAYERS):
        assert torch.equal(kv[layer_name(l)][LOAD_IDS].cpu(), reference(1)[l])
    w.close()
    with Store.open([os.path.join(str(tmp_path), "kv.img")], readonly=True, shared=True) as s:
        for tag, ref in (("prefix", reference(1)), ("new", reference(2))):
            for b, k in enumerate(keys(tag)):
                assert s.get(k) == ref[:, b].contiguous().numpy().tobytes(), (tag, b)


@pytest.mark.parametrize("save_mode", ["step", "deferred"])
def test_after_step_writes_wait_for_the_whole_step_on_the_device(tmp_path, save_mode):
    """On a GPU the host reaches the step's end (wait_for_save) while the forward's later layers still
    run: with after_step no write may start on the marks of the layers already done, only once the
    step's last kernel is. Marks faked here: each layer's done at once, the step's end done only when
    the test says (step: wait_for_save waits for it; deferred: no write until a later step finds it)."""
    w, kv, log, stats = make_worker(str(tmp_path), "after_step", save_mode=save_mode)
    marks = []

    class Mark:
        def __init__(self):
            self.done = len(marks) < N_LAYERS  # the layers' marks, then the step's end
            marks.append(self)

    def ready(mark, block=False):
        if block:
            mark.done = True  # a blocking wait: the step's kernels have ended by its return
        return mark.done

    w.io.mark, w.io.ready = Mark, ready
    meta = TuttiMetadata(saves=[BlockTransfer("r1", keys("prefix"), PREFIX_IDS)])
    _, committed = step(w, kv, meta, computed=(PREFIX_IDS, reference(1)), wait_layers=())
    assert len(marks) == N_LAYERS + 1  # one a layer, one at the step's end
    if save_mode == "step":  # written and committed in its step, after its end mark was waited for
        assert marks[-1].done and committed == set(keys("prefix"))
        assert sorted(log.of("W", "submit")) == list(range(N_LAYERS))
        return
    assert log.of("W", "submit") == [], "a write started before the step's kernels ended"
    step(w, kv, TuttiMetadata(), wait_layers=())  # the next step: the end mark still not done
    assert log.of("W", "submit") == []
    marks[N_LAYERS].done = True
    deadline = time.monotonic() + 20
    while not set(keys("prefix")) <= committed:
        assert time.monotonic() < deadline, committed
        committed |= step(w, kv, TuttiMetadata(), wait_layers=())[1]
    assert sorted(log.of("W", "submit")) == list(range(N_LAYERS))
    w.close()
    with Store.open([os.path.join(str(tmp_path), "kv.img")], readonly=True, shared=True) as s:
        for b, k in enumerate(keys("prefix")):
            assert s.get(k) == reference(1)[:, b].contiguous().numpy().tobytes(), b


@pytest.mark.parametrize("bad", ["lazy", "", None, 1])
def test_write_policy_is_validated(bad):
    assert TuttiConfig.from_extra({}).write_policy == "slack"
    assert TuttiConfig.from_extra({"write_policy": "eager"}).write_policy == "eager"
    assert TuttiConfig.from_extra({"write_policy": "after_step"}).write_policy == "after_step"
    with pytest.raises(ConfigError, match="write_policy: expected 'slack'"):
        TuttiConfig.from_extra({"write_policy": bad})


def test_counters_reach_the_log_line_and_prometheus():
    from tutti.vllm.stats import prometheus_text
    a, b = TuttiStats(), TuttiStats()
    a.add(writes_deferred=3, rw_overlap_s=0.002)
    b.add(writes_deferred=1)
    r = a.aggregate(b).reduce()
    assert r["writes_deferred"] == 4 and r["rw_overlap_ms"] == 2.0
    text = prometheus_text(a.data)
    assert "tutti_vllm_writes_deferred_total 4" in text
    assert "tutti_vllm_rw_overlap_seconds_total 0.002" in text
