"""The cluster tier with tensor parallelism (TP = 2), at the worker level, with a real mooncake_master.

vLLM itself with TP = 2 and the cluster runs in test_vllm_cluster.py (-k tp2); here, to place failures
between the hooks, as in test_vllm_tp_worker.py, the ranks are gloo processes driving
tutti.vllm.worker.WorkerSide (tests/helpers/tp_cluster_rank.py), each with its own store and the
cluster configured: rank r's WorkerCluster runs a ClusterNode at cluster_port + r.  Node A's two ranks
save two steps of a prompt's blocks (the TP commit) and publish them.  Node B's two ranks (other
stores, other ports) and B's scheduler side (SchedulerSide, whose SchedulerCluster looks the prompt up
for every rank) are then driven step by step as vLLM drives them: the request waits while each rank's
fetch thread fetches its blocks from A's rank of the same number (cluster_fetch async, the default) or
the step fetches them (step); the load then brings every rank's own heads into its KV cache, bit-exact.
When A's rank 1 is killed (SIGKILL) before B fetches, B's rank 1 gets nothing and its blocks are
recomputed — reported as failed loads (step) or simply not loaded (async) — and no block outside vLLM's
union of the ranks' invalid block ids holds anything but the exact bytes.
"""
import base64
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("mooncake.store", reason="Mooncake is not installed (pip install 'tutti[cluster]')")

from helpers import tp_worker_rank as wr
from helpers.mooncake_master import Master
from tutti.vllm.cluster import SCHEDULER_PORT_OFFSET

HERE = os.path.dirname(os.path.abspath(__file__))
HELPER = os.path.join(HERE, "..", "helpers", "tp_cluster_rank.py")
WORLD = 2
N_BLOCKS = 2 * wr.BLOCKS_PER_STEP       # the prompt's full blocks: A saves them in two steps
PROMPT_TOKENS = N_BLOCKS * wr.BLOCK     # + 1: the last token is always computed
BLOCK_IDS = list(range(1, N_BLOCKS + 2))  # B's vLLM blocks of the request (0 is vLLM's null block)


def _ports(offsets):
    """A loopback port p with p + o free for every o in ``offsets``."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
        if p + max(offsets) > 65535:
            continue
        socks = []
        try:
            for o in offsets:
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p + o))
            return p
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free loopback ports")


class Proc:
    """A helper process (forked from the session's zygote when there is one), driven over a Unix socket:
    ``cmd`` sends one command and waits, bounded, for its answer."""

    def __init__(self, d, sockdir, name, argv):
        self.name, self.d = name, d
        self.err = os.path.join(d, f"{name}.err")
        path = os.path.join(sockdir, f"{name}.sock")  # short: a Unix socket path is at most 107 bytes
        self.lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.lsock.bind(path)
        self.lsock.listen(1)
        self.conn, self.buf, self.pid, self.rc = None, b"", None, None
        argv = [HELPER, *argv, "--ctl", path]
        env = dict(os.environ, PYTHONPATH=os.path.join(HERE, "..") + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.thread = threading.Thread(target=self._run, args=(argv, env), daemon=True)
        self.thread.start()

    def _run(self, argv, env):
        zyg = os.environ.get("TUTTI_RUNNER_ZYGOTE")
        rc = None
        if zyg:
            from tutti.vllm import zygote
            try:
                rc = zygote.call(zyg, {"argv": argv, "stdout": self.err + ".out", "log": self.err, "env": env,
                                       "cwd": os.getcwd()}, 300)
            except (subprocess.TimeoutExpired, zygote.ZygoteGone):
                rc = -signal.SIGKILL
        if rc is None:  # no zygote: a fresh interpreter
            with open(self.err, "w") as err:
                rc = subprocess.run([sys.executable, *argv], stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                                    env=env, timeout=300).returncode
        self.rc = rc

    def _log(self):
        try:
            with open(self.err) as f:
                return f.read()[-3000:]
        except OSError:
            return ""

    def read(self, timeout):
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{self.name}: no answer in {timeout} s\n{self._log()}")
            self.conn.settimeout(left)
            try:
                chunk = self.conn.recv(1 << 20)
            except socket.timeout:
                continue
            if not chunk:
                raise RuntimeError(f"{self.name} exited ({self.rc})\n{self._log()}")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        import json
        return json.loads(line)

    def ready(self, timeout=120):
        self.lsock.settimeout(timeout)
        try:
            self.conn, _ = self.lsock.accept()
        except socket.timeout:
            raise TimeoutError(f"{self.name} did not start in {timeout} s\n{self._log()}") from None
        hello = self.read(timeout)
        self.pid = hello.get("pid")
        assert "ready" in hello, f"{self.name}: {hello.get('error')}\n{self._log()}"
        return hello["ready"]

    def send(self, op, **kw):
        import json
        self.conn.sendall((json.dumps({"op": op, **kw}) + "\n").encode())

    def answer(self, timeout=60):
        out = self.read(timeout)
        assert "error" not in out, f"{self.name}: {out['error']}\n{self._log()}"
        return out["ok"]

    def cmd(self, op, timeout=60, **kw):
        self.send(op, **kw)
        return self.answer(timeout)

    def kill(self):
        """SIGKILL, and wait (bounded) until it is gone."""
        os.kill(self.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while self.rc is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert self.rc == -signal.SIGKILL, f"{self.name}: {self.rc}"

    def close(self, timeout=30):
        if self.rc is None and self.conn is not None:
            try:
                self.cmd("close", timeout=timeout)
            except (AssertionError, OSError, RuntimeError, TimeoutError):
                pass
        self.thread.join(timeout)
        if self.rc is None and self.pid is not None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.thread.join(10)
        self.lsock.close()
        if self.conn is not None:
            self.conn.close()


def all_cmd(procs, op, timeout=60, **kw):
    """One command to every rank at once (their hooks meet in the TP group's collectives), then their
    answers."""
    for p in procs:
        p.send(op, **kw)
    return [p.answer(timeout) for p in procs]


class Cluster:
    """Node A (2 ranks), node B (2 ranks) and B's scheduler side, on one master; all stopped by close()."""

    def __init__(self, tmp, master, fetch, data_path="cpu"):
        self.tmp, self.master, self.fetch, self.data_path = str(tmp), master, fetch, data_path
        self.sockdir = tempfile.mkdtemp(prefix="tpc-")
        self.procs = []

    def _common(self, d, port):
        return ["--dir", d, "--port", str(port), "--master", self.master.address,
                "--metadata", self.master.metadata, "--fetch", self.fetch, "--data-path", self.data_path]

    def node(self, name, port):
        d = os.path.join(self.tmp, name)
        os.makedirs(d, exist_ok=True)
        rdv = os.path.join(d, "rdv")
        ranks = [Proc(self.tmp, self.sockdir, f"{name}{r}",
                      ["rank", "--rank", str(r), "--rdv", rdv, *self._common(d, port)]) for r in range(WORLD)]
        self.procs += ranks
        hellos = [p.ready() for p in ranks]
        assert [h["endpoint"] for h in hellos] == [f"127.0.0.1:{port + r}" for r in range(WORLD)]  # cluster_port + r
        assert all(h["joined"] for h in hellos), hellos
        # The ranks claim replicas as one engine (cluster/claims.py): under the first rank's endpoint.
        assert [h["claims_as"] for h in hellos] == [f"127.0.0.1:{port}"] * WORLD
        return ranks

    def scheduler(self, name, port):
        p = Proc(self.tmp, self.sockdir, f"{name}-sched", ["sched", *self._common(os.path.join(self.tmp, name), port)])
        self.procs.append(p)
        hello = p.ready()
        assert hello["client"] == f"127.0.0.1:{port + SCHEDULER_PORT_OFFSET}" and hello["joined"], hello
        return p

    def close(self):
        # All at once (each is bounded): the ranks of a node leave the cluster independently.
        threads = [threading.Thread(target=p.close) for p in self.procs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        shutil.rmtree(self.sockdir, ignore_errors=True)


@pytest.fixture
def master(tmp_path):
    # A master per test: a killed node's names stay with the master until its client_ttl (60 s: B is really
    # sent to the dead owner), and every test publishes the same prompt's names.
    m = Master(tmp_path / "master", client_ttl=60).start()
    yield m
    m.kill()


@pytest.fixture
def cluster_of(tmp_path, master):
    made = []

    def make(fetch, data_path="cpu"):
        c = Cluster(tmp_path, master, fetch, data_path)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def _node_a(c):
    """A's ranks save the prompt's blocks (steps 0 and 1, committed on both ranks) and publish them."""
    a = c.node("a", _ports([0, 1]))
    for out in all_cmd(a, "save", steps=[0, 1]):
        assert out["committed"] == N_BLOCKS
    for p in a:
        assert p.cmd("published", n=N_BLOCKS).get("published", 0) == N_BLOCKS, f"{p.name} did not publish"
    return a


def _node_b(c):
    port = _ports([0, 1, SCHEDULER_PORT_OFFSET])
    b = c.node("b", port)   # first: vLLM registers the KV caches (the stores) before the scheduler starts
    return b, c.scheduler("b", port)


def _step(sched, ranks, new=(), cached=()):
    """One vLLM step: the scheduler's metadata, every rank's hooks, the ranks' outputs aggregated."""
    built = sched.cmd("build", new=new, cached=cached)
    outs = all_cmd(ranks, "step", meta=built["meta"])
    sched.cmd("output", worker_metas=[o["worker_meta"] for o in outs])
    return built, outs, set().union(*(o["errors"] for o in outs))


def _wait_fetched(sched, ranks, timeout=20):
    """cluster_fetch async: vLLM asks again each step until every rank reported the fetch done."""
    deadline = time.monotonic() + timeout
    outs_all = []
    while True:
        m = sched.cmd("match", req_id="doc", n_blocks=N_BLOCKS)
        if m["tokens"] is not None:
            return m["tokens"], outs_all
        assert time.monotonic() < deadline, "the ranks' fetches were not reported in time"
        _, outs, invalid = _step(sched, ranks)
        assert not invalid
        outs_all.append(outs)
        time.sleep(0.05)


def _kv(text):
    return pickle.loads(base64.b64decode(text))


def _expected(i, rank):
    """Prompt block i's KV on TP rank ``rank``: that rank's heads of what A computed."""
    first, end = wr.head_range(wr.KV_HEADS, rank, WORLD)
    return wr.reference(i // wr.BLOCKS_PER_STEP)[:, i % wr.BLOCKS_PER_STEP, first:end]


def _check_exact(outs, invalid, ids=BLOCK_IDS):
    """Every loaded block outside vLLM's union of invalid block ids holds, on every rank, exactly that
    rank's heads of what A stored: never wrong bytes, whatever failed."""
    for r, out in enumerate(outs):
        for b, kv in out["loaded"].items():
            b = int(b)
            if b in invalid:
                continue
            i = ids.index(b)
            assert torch.equal(_kv(kv), _expected(i, r)), f"rank {r}: block {b} (prompt block {i}) not bit-exact"


def _per_rank(outs, key):
    """The worker counter ``key`` of each rank (since it started)."""
    return [o["stats"].get(key, 0) for o in outs]


@pytest.mark.parametrize("fetch", ["async", "step"])
def test_each_rank_loads_its_heads_from_the_same_rank_of_a_peer(cluster_of, fetch):
    _remote_hit(cluster_of(fetch), fetch)


# host: the GPU-memory data path's code (DeviceKV, DeviceTxn) on CPU tensors, its C reference path moving
# the bytes (needs libtutti_gpu.so); staged and gio: the KV caches on the CUDA device (skip without one).
@pytest.mark.parametrize("data_path", ["host", "staged", "gio"])
def test_a_remote_hit_through_the_gpu_data_paths(cluster_of, data_path, request):
    """A saves from, and B loads into, KV caches moved by a GPU-memory data path: the fetched blocks land
    in B's store, then the path brings each rank's heads into its KV cache, bit-exact."""
    if data_path != "host" and not torch.cuda.is_available():
        pytest.skip(f"data path {data_path}: needs a CUDA device")
    request.getfixturevalue("gpu_lib")
    _remote_hit(cluster_of("async", data_path), "async")


def _remote_hit(c, fetch):
    """B finds A's whole prompt for every rank, each rank fetches its heads from A's rank of the same
    number and loads them bit-exact; A served each block once; B keeps them as replicas."""
    a = _node_a(c)
    b, sched = _node_b(c)
    first = sched.cmd("match", req_id="doc", n_blocks=N_BLOCKS)
    if fetch == "async":
        assert first["tokens"] is None                       # held back while the ranks fetch
        built, _, invalid = _step(sched, b)
        assert built["fetches"] == [["doc", N_BLOCKS, N_BLOCKS]] and not invalid
        tokens, _ = _wait_fetched(sched, b)
    else:
        tokens = first["tokens"]                             # fetched inside the load's step
    assert tokens == PROMPT_TOKENS                           # every rank's lookup found the whole prompt
    sched.cmd("alloc", req_id="doc", n_blocks=N_BLOCKS, block_ids=BLOCK_IDS, tokens=tokens)
    built, outs, invalid = _step(sched, b, new=[["doc", BLOCK_IDS, PROMPT_TOKENS, 1]])
    assert built["loads"] == [["doc", N_BLOCKS, BLOCK_IDS[:N_BLOCKS], N_BLOCKS]]
    assert invalid == set(), [o["errors"] for o in outs]
    assert all(len(o["loaded"]) == N_BLOCKS for o in outs)
    _check_exact(outs, invalid)                              # each rank: its own heads, bit-exact
    st = sched.cmd("stats")
    assert st["remote_hit_tokens"] == PROMPT_TOKENS and st.get("load_failures", 0) == 0
    # Every rank fetched its own blocks from A's rank of the same number (names carry the rank's
    # fingerprint), which served each of them once; they are replicas in B's stores now, every rank.
    assert _per_rank(outs, "remote_blocks") == [N_BLOCKS] * WORLD and _per_rank(outs, "remote_errors") == [0] * WORLD
    assert [p.cmd("served", n=N_BLOCKS)["blocks_served"] for p in a] == [N_BLOCKS] * WORLD
    assert [len(o["held"]) for o in outs] == [N_BLOCKS] * WORLD


def _recompute_and_store(sched, b, step_new=None, step_cached=None):
    """vLLM computes the prompt (its saves offered by the scheduler, the ranks' TP commit); empty steps
    until both ranks' commits are in (deferred saves commit once their writes completed)."""
    built, outs, invalid = _step(sched, b, new=step_new or (), cached=step_cached or ())
    assert not invalid
    assert built["saves"] == [["doc", N_BLOCKS, BLOCK_IDS[:N_BLOCKS], 0]], built["saves"]
    deadline = time.monotonic() + 20
    while [len(o["held"]) for o in outs] != [N_BLOCKS] * WORLD:
        assert time.monotonic() < deadline, [o["held"] for o in outs]
        _, outs, _ = _step(sched, b)
        time.sleep(0.02)


@pytest.mark.parametrize("fetch", ["async", "step"])
def test_a_peer_rank_killed_before_the_fetch_means_recompute_on_every_rank(cluster_of, fetch):
    c = cluster_of(fetch)
    a = _node_a(c)
    b, sched = _node_b(c)
    first = sched.cmd("match", req_id="doc", n_blocks=N_BLOCKS)
    if fetch == "step":
        assert first["tokens"] == PROMPT_TOKENS             # peers hold it for every rank: promised to vLLM
        sched.cmd("alloc", req_id="doc", n_blocks=N_BLOCKS, block_ids=BLOCK_IDS, tokens=first["tokens"])
        a[1].kill()                                          # A's rank 1 dies before B's step fetches
        built, outs, invalid = _step(sched, b, new=[["doc", BLOCK_IDS, PROMPT_TOKENS, 1]])
        assert built["loads"][0][3] == N_BLOCKS
        # Rank 1 got nothing: its blocks are failed loads (vLLM takes the union of the ranks' invalid
        # block ids and recomputes them on every rank); rank 0 loaded its own exactly, and it is fenced
        # by nothing but commits nothing either: rank 1, fenced until acknowledged, votes every block down.
        assert outs[1]["errors"] == BLOCK_IDS[:N_BLOCKS]
        assert outs[0]["errors"] == []
        assert invalid == set(BLOCK_IDS[:N_BLOCKS])
        assert _per_rank(outs, "remote_blocks") == [N_BLOCKS, 0] and _per_rank(outs, "remote_errors") == [0, N_BLOCKS]
        assert outs[1]["failures"] == [[1, 1, BLOCK_IDS[:N_BLOCKS]]] and outs[0]["failures"] == []
        _check_exact(outs, invalid)
        assert torch.equal(_kv(outs[0]["loaded"][str(BLOCK_IDS[0])]), _expected(0, 0))
        assert sched.cmd("stats")["load_failures"] == 1
        # vLLM's recompute policy: the request goes on from its first invalid block (block 0).
        recompute = {"step_cached": [["doc", 0, PROMPT_TOKENS + 1]]}
    else:
        assert first["tokens"] is None
        a[1].kill()                                          # A's rank 1 dies before B's fetch threads run
        tokens, steps = _wait_fetched(sched, b)
        # Nothing was promised to vLLM: every rank reported its fetch, rank 1's brought nothing, so the
        # prompt is not held by every rank and is computed: no load, no load error.
        assert tokens == 0
        outs = steps[-1]
        assert _per_rank(outs, "remote_blocks") == [N_BLOCKS, 0] and _per_rank(outs, "remote_errors") == [0, N_BLOCKS]
        assert sum(_per_rank(outs, "load_errors")) == 0
        st = sched.cmd("stats")
        assert st.get("remote_hit_tokens", 0) == 0 and st.get("fetch_timeouts", 0) == 0
        sched.cmd("alloc", req_id="doc", n_blocks=N_BLOCKS, block_ids=BLOCK_IDS, tokens=0)
        recompute = {"step_new": [["doc", BLOCK_IDS, 0, PROMPT_TOKENS + 1]]}
    # Rank 0 kept the replicas it fetched, rank 1 has none: the scheduler counts a block only when every
    # rank holds it, and the peers' lookup now misses on rank 1 (the smallest answer counts).
    assert [len(o["held"]) for o in outs] == [N_BLOCKS, 0]
    assert sched.cmd("match", req_id="doc2", n_blocks=N_BLOCKS)["tokens"] == 0
    # The recomputed blocks are offered for saving and committed on both ranks (rank 0 already holds
    # them: its copy stays); a later request then loads the prompt from B's own stores, bit-exact.
    _recompute_and_store(sched, b, **recompute)
    tokens = sched.cmd("match", req_id="doc3", n_blocks=N_BLOCKS)["tokens"]
    assert tokens == PROMPT_TOKENS
    ids = [b_ + 8 for b_ in BLOCK_IDS]
    sched.cmd("alloc", req_id="doc3", n_blocks=N_BLOCKS, block_ids=ids, tokens=tokens)
    built, outs, invalid = _step(sched, b, new=[["doc3", ids, PROMPT_TOKENS, 1]])
    assert built["loads"] == [["doc3", N_BLOCKS, ids[:N_BLOCKS], 0]] and invalid == set()
    _check_exact(outs, invalid, ids)
