"""Which CPUs tutti's own threads run on (the connector's ``service_cpus``).

vLLM's CPU backend binds each OpenMP thread of a worker, the worker's main thread among them, to a core
of that rank's list, and a new thread inherits the mask of the thread that made it.  Where that thread is
already bound when the connector starts (always with engines forked from a process that had imported
torch and vLLM, as the test suite starts them; in some runs with a fresh interpreter), everything the
connector starts — the store's copy and checksum threads, the cluster tier's threads and Mooncake's, the
fetch thread, each bounded Mooncake call — would share one core with the rank's compute thread, which
also spins while it waits for work.  On 2 CPUs with tensor_parallel_size 2 a node's fetches took seconds
at times, but that was measured while the tests' engines, each in a session of its own, starved their
peers (docs/cluster.md#first-fetch).

The default is ``inherit`` (leave them there): measured again once the tests' engines no longer starved
their peers, moving them onto every allowed CPU was no faster on a 2-CPU machine whose every CPU computes
for a rank (forked engines 1.4-1.8x slower, fresh ones the same): they then took the *other* rank's core.
So ``auto`` moves them only onto CPUs no rank computes on — the allowed CPUs minus this thread's mask and
minus every rank's list in ``VLLM_CPU_OMP_THREADS_BIND`` (``0-3|4-7``: vLLM's ranks, in rank order) — and
leaves them where they are when none is left.  With vLLM's own binding (``auto``, no lists) the other
ranks' CPUs are not known here: a CPU list is then the way to name the free ones
(``VLLM_CPU_NUM_OF_RESERVED_CPU``).

A worker picks the set once (``choose``, ``use``); threads tutti starts enter it (``service_thread``),
and C or Mooncake objects that start threads of their own are made inside ``service_cpus()``.  Outside a
worker nothing changes: ``service_thread`` does nothing until ``use`` was called.
"""
from __future__ import annotations

import contextlib
import os
import threading

from .errors import ConfigError

_service: frozenset | None = None
_lock = threading.Lock()


def parse_cpu_list(text: str) -> frozenset:
    """CPU numbers of a list like ``0-3,8`` (the kernel's cpulist format); ValueError if malformed."""
    cpus: set[int] = set()
    for part in str(text).replace(" ", "").split(","):
        if not part:
            raise ValueError(f"empty item in CPU list {text!r}")
        lo, dash, hi = part.partition("-")
        a, b = int(lo), int(hi) if dash else int(lo)
        if a < 0 or b < a or b > 1 << 16:
            raise ValueError(f"bad range {part!r} in CPU list {text!r}")
        cpus.update(range(a, b + 1))
    return frozenset(cpus)


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip() or None
    except OSError:
        return None


def allowed_cpus() -> frozenset:
    """The CPUs this process may run on: the online ones, within its cgroup's cpuset when known (a
    thread's own mask is no guide here: vLLM narrowed it)."""
    online = _read("/sys/devices/system/cpu/online")
    try:
        cpus = parse_cpu_list(online) if online else frozenset(range(os.cpu_count() or 1))
    except ValueError:
        cpus = frozenset(range(os.cpu_count() or 1))
    rel = None
    for line in (_read("/proc/self/cgroup") or "").splitlines():
        if line.startswith("0::"):  # cgroup v2
            rel = line[3:].lstrip("/")
    for path in ([f"/sys/fs/cgroup/{rel}/cpuset.cpus.effective"] if rel else []) + \
            ["/sys/fs/cgroup/cpuset.cpus.effective"]:
        text = _read(path)
        if text:
            try:
                limited = cpus & parse_cpu_list(text)
            except ValueError:
                continue
            if limited:
                return limited
            break
    return cpus


def ranks_bound_cpus(env=None) -> frozenset:
    """CPUs vLLM's CPU backend binds its ranks' compute threads to, where ``VLLM_CPU_OMP_THREADS_BIND``
    names them as lists (``0-3|4-7``); empty when it does not (unset, ``auto``, ``all``, ``nobind``,
    or not a list this can read: then nothing is known of the other ranks)."""
    text = (os.environ if env is None else env).get("VLLM_CPU_OMP_THREADS_BIND", "").strip()
    if not text or text in ("auto", "all", "nobind"):
        return frozenset()
    try:
        return frozenset().union(*(parse_cpu_list(p) for p in text.split("|") if p.strip()))
    except ValueError:
        return frozenset()


def choose(spec: str = "auto", env=None) -> frozenset | None:
    """The set the calling (worker's main) thread's helpers should run on, or None to leave them as
    they are.  ``auto``: when this thread is bound to fewer CPUs than allowed (vLLM's CPU backend), the
    allowed CPUs no rank computes on (ranks_bound_cpus and this thread's own); None when there are none,
    or when it is not bound.  ``inherit``: None.  A CPU list: those (ConfigError if none is allowed)."""
    if spec == "inherit" or not hasattr(os, "sched_getaffinity"):
        return None
    allowed = allowed_cpus()
    if spec == "auto":
        try:
            mine = frozenset(os.sched_getaffinity(0))
        except OSError:
            return None
        if allowed <= mine:
            return None
        return (allowed - mine - ranks_bound_cpus(env)) or None
    try:
        want = parse_cpu_list(spec)
    except ValueError as e:
        raise ConfigError(f"service_cpus: {e} (expected auto, inherit or a CPU list like 0-3,8)") from None
    if not want & allowed:
        raise ConfigError(f"service_cpus: none of CPUs {spec} is online and allowed to this process "
                          f"({describe(allowed)})")
    return want & allowed


def use(cpus: frozenset | None) -> None:
    """From now on tutti's threads in this process run on ``cpus`` (None: as they were made)."""
    global _service
    with _lock:
        _service = frozenset(cpus) if cpus else None


def current() -> frozenset | None:
    return _service


def service_thread() -> None:
    """Called first thing in a thread tutti starts: move it onto the service CPUs, if any were chosen."""
    cpus = _service
    if cpus:
        try:
            os.sched_setaffinity(0, cpus)
        except OSError:  # a CPU went offline, or a cpuset changed: stay where it is
            pass


@contextlib.contextmanager
def service_cpus():
    """Run the block with the calling thread on the service CPUs, so that threads made inside it (the
    store's, Mooncake's) start there; the thread's own mask comes back after it."""
    cpus = _service
    before = None
    if cpus:
        try:
            before = os.sched_getaffinity(0)
            os.sched_setaffinity(0, cpus)
        except OSError:
            before = None
    try:
        yield
    finally:
        if before is not None:
            try:
                os.sched_setaffinity(0, before)
            except OSError:
                pass


def describe(cpus) -> str:
    """``0-3,8`` for {0, 1, 2, 3, 8}."""
    s = sorted(cpus)
    out, i = [], 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[j] + 1:
            j += 1
        out.append(str(s[i]) if i == j else f"{s[i]}-{s[j]}")
        i = j + 1
    return ",".join(out)
