"""tutti.affinity: tutti's threads leave the one core vLLM's CPU backend binds a worker's thread to.

The set-up the tests copy: the calling thread bound to one CPU (as vLLM binds a rank's main thread),
then the choice the worker makes (``service_cpus`` auto), the store opened and threads started the way
the worker does; every thread tutti made may run on every allowed CPU, the bound thread stays bound.
"""
import os
import threading

import pytest

from tutti import Store, affinity
from tutti.errors import ConfigError
from tutti.vllm.config import TuttiConfig

ALLOWED = affinity.allowed_cpus()
many = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs a process allowed 2 CPUs or more")


@pytest.fixture(autouse=True)
def _reset():
    yield
    affinity.use(None)


def in_thread_bound_to(cpu, fn):
    """fn() in a fresh thread bound to ``cpu`` (as vLLM binds a worker's); its result or exception."""
    box = {}

    def run():
        os.sched_setaffinity(0, {cpu})
        try:
            box["v"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed back
            box["e"] = e
    t = threading.Thread(target=run)
    t.start()
    t.join(60)
    if "e" in box:
        raise box["e"]
    return box["v"]


def tids():
    return {int(t) for t in os.listdir("/proc/self/task")}


@pytest.mark.parametrize("text,want", [("0", {0}), ("0-3", {0, 1, 2, 3}), ("5,1-2", {1, 2, 5}), (" 7 ", {7})])
def test_cpu_lists_parse(text, want):
    assert affinity.parse_cpu_list(text) == want
    assert affinity.parse_cpu_list(affinity.describe(want)) == want


@pytest.mark.parametrize("bad", ["", "a", "3-1", "1,,2", "-1", "0-"])
def test_malformed_cpu_lists_are_refused(bad):
    with pytest.raises(ValueError):
        affinity.parse_cpu_list(bad)


def test_describe_folds_ranges():
    assert affinity.describe({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11"


def test_allowed_cpus_include_this_process_mask():
    assert ALLOWED and set(os.sched_getaffinity(0)) <= ALLOWED


def test_auto_leaves_an_unbound_thread_alone_and_inherit_always():
    assert affinity.choose("inherit") is None
    if set(os.sched_getaffinity(0)) >= ALLOWED:
        assert affinity.choose("auto") is None


@many
def test_auto_frees_a_thread_bound_to_one_cpu():
    """Onto the CPUs the bound thread does not compute on, never its own core."""
    cpu = min(os.sched_getaffinity(0))
    assert in_thread_bound_to(cpu, lambda: affinity.choose("auto", env={})) == ALLOWED - {cpu}


@pytest.mark.parametrize("text,want", [("0-3|4-7", set(range(8))), ("0|1", {0, 1}), ("2,5|", {2, 5}),
                                       ("auto", set()), ("all", set()), ("nobind", set()), ("", set()),
                                       ("0-x|1", set())])
def test_the_ranks_cpus_are_read_from_vllms_bind_lists(text, want):
    assert affinity.ranks_bound_cpus({"VLLM_CPU_OMP_THREADS_BIND": text}) == want


@many
def test_auto_keeps_off_every_ranks_cpus_and_stays_when_none_is_free():
    """With TP every CPU in VLLM_CPU_OMP_THREADS_BIND computes for some rank: auto leaves those alone
    (moving tutti's threads onto the other rank's core was slower, docs/cluster.md#first-fetch), and
    when no allowed CPU is left it changes nothing."""
    cpus = sorted(ALLOWED)
    me, other = cpus[0], cpus[1]
    bind = {"VLLM_CPU_OMP_THREADS_BIND": f"{me}|{other}"}
    assert in_thread_bound_to(me, lambda: affinity.choose("auto", env=bind)) == (ALLOWED - {me, other} or None)
    every = {"VLLM_CPU_OMP_THREADS_BIND": f"{me}|{affinity.describe(ALLOWED - {me})}"}
    assert in_thread_bound_to(me, lambda: affinity.choose("auto", env=every)) is None


def test_an_explicit_list_is_kept_within_the_allowed_cpus():
    cpu = min(ALLOWED)
    assert affinity.choose(str(cpu)) == {cpu}
    assert affinity.choose(f"{cpu},{max(ALLOWED) + 1000}") == {cpu}
    with pytest.raises(ConfigError, match="service_cpus"):
        affinity.choose(str(max(ALLOWED) + 1000))
    with pytest.raises(ConfigError, match="service_cpus"):
        affinity.choose("x")


def test_service_thread_does_nothing_until_a_set_is_chosen():
    cpu = min(os.sched_getaffinity(0))

    def run():
        affinity.service_thread()
        with affinity.service_cpus():
            return set(os.sched_getaffinity(0))
    assert in_thread_bound_to(cpu, run) == {cpu}


@many
def test_a_bound_workers_threads_run_on_the_service_cpus_and_it_keeps_its_own(tmp_path):
    """The worker's order: choose on the bound thread, open the store inside service_cpus(), then
    transfer from the bound thread (the store starts its threads at its first large layer, from
    there), start a thread that enters the set itself (the fetch thread)."""
    from tutti import LLAMA3_8B, PagedBuffer
    from tutti.bench.passes import store_pass
    from tutti.bench.run import bench_key

    cpu = min(os.sched_getaffinity(0))
    path = str(tmp_path / "kv.img")
    n = 64  # a layer of 64 blocks is over the store's 1 MiB threshold for its threads
    Store.format([path], LLAMA3_8B, n_slots=n)

    def worker():
        affinity.use(affinity.choose("auto", env={}))
        before = tids()
        with affinity.service_cpus():
            inside = set(os.sched_getaffinity(0))
            store = Store.open([path], cpu_threads=2)
        geo = store.geometry
        src = PagedBuffer.for_geometry(geo, n)
        src.fill_random(list(range(n)), seed=1)
        store_pass(store, src, geo, [bench_key(1, i) for i in range(n)], list(range(n)))
        made = tids() - before
        masks = {t: set(os.sched_getaffinity(t)) for t in made if os.path.exists(f"/proc/self/task/{t}")}
        got = {}

        def helper():
            affinity.service_thread()
            got["mask"] = set(os.sched_getaffinity(0))
        t = threading.Thread(target=helper)  # made by the bound thread: inherits its one CPU
        t.start()
        t.join()
        store.close()
        return inside, masks, got["mask"], set(os.sched_getaffinity(0))

    inside, masks, helper_mask, after = in_thread_bound_to(cpu, worker)
    free = ALLOWED - {cpu}
    assert inside == free
    assert masks, "the store started no threads"
    assert all(m == free for m in masks.values()), masks
    assert helper_mask == free
    assert after == {cpu}  # the compute thread stays where vLLM put it


@pytest.mark.parametrize("value,want", [("auto", "auto"), ("inherit", "inherit"), ("0-1", "0-1"), (3, "3")])
def test_service_cpus_option(value, want):
    assert TuttiConfig.from_extra({"service_cpus": value}).service_cpus == want


def test_service_cpus_default_leaves_threads_where_vllm_put_them():
    """inherit by default: measured best on a machine whose every CPU computes for a rank
    (docs/cluster.md#first-fetch); auto and lists are asked for."""
    assert TuttiConfig.from_extra({}).service_cpus == "inherit"
    assert affinity.choose(TuttiConfig.from_extra({}).service_cpus) is None


@pytest.mark.parametrize("value", ["some", "1-", True, 1.5, ["0"]])
def test_service_cpus_option_refuses_nonsense(value):
    with pytest.raises(ConfigError, match="service_cpus"):
        TuttiConfig.from_extra({"service_cpus": value})
