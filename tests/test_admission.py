"""Write admission under an SSD write budget (tutti.admission): budget parsing, the token bucket, and the
expected-value and second-hit policies, on a fake clock."""
import pytest

from tutti.admission import DAY_S, Admission, Save, parse_budget

GB = 10**9


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


@pytest.mark.parametrize("text,capacity,want", [
    ("200GB/day", None, 200 * GB),
    ("200GB", None, 200 * GB),
    ("1TiB/d", None, 1 << 40),
    ("10GB/h", None, 240 * GB),
    ("0.5dwpd", 4 * 10**12, 2 * 10**12),
    ("1DWPD", 10**12, 10**12),
    (5e9, None, 5e9),
])
def test_parse_budget(text, capacity, want):
    assert parse_budget(text, capacity) == want


@pytest.mark.parametrize("text,why", [
    ("fast", "not a write budget"), ("0.3dwpd", "need the store's capacity"), ("1dwpd/h", "already per day"),
    ("0GB/day", "above zero"), (-1, "above zero"), ("5XB/day", "unknown unit"), ("1.5B/day", "whole number"),
])
def test_parse_budget_refuses(text, why):
    with pytest.raises(ValueError, match=why):
        parse_budget(text, None)


def test_no_budget_admits_everything():
    a = Admission(None)
    saves = [Save("p", 100, GB) for _ in range(50)]
    assert a.admit(saves) == saves
    assert a.stats()["skipped_saves"] == 0 and a.stats()["admitted_bytes"] == 50 * GB


def test_expected_value_ranks_seen_and_longer_prefixes_first():
    clock = Clock()
    a = Admission(24 * GB, burst_s=3600, clock=clock)  # 1 GB/h: a bucket of 1 GB
    assert a.admit([Save("cold", 10, int(0.9 * GB))])  # no pressure yet: admitted, bucket at 0.1 GB
    assert a.pressured()
    a.observe(["a", "a", "b", "b", "c"])  # a and b asked for twice, c once
    clock.t += 0.15 * 3600  # +0.15 GB
    got = a.admit([Save("c", 4000, int(0.1 * GB)), Save("b", 100, int(0.1 * GB)), Save("a", 2000, int(0.1 * GB))])
    assert [s.prefix for s in got] == ["a", "b"]  # seen before, longest first; the 0.25 GB left fits two
    st = a.stats()
    assert st["skipped_saves"] == 1 and st["skipped_unseen"] == 1 and st["pressure_steps"] == 1


def test_expected_value_lets_unseen_prefixes_use_what_is_left():
    clock = Clock()
    a = Admission(24 * GB, clock=clock)
    a.admit([Save("cold", 1, int(0.9 * GB))])
    clock.t += 0.3 * 3600  # 0.4 GB in the bucket: below half
    a.observe(["a", "a"])
    got = a.admit([Save("new", 10, int(0.1 * GB)), Save("a", 10, int(0.1 * GB))])
    assert [s.prefix for s in got] == ["a", "new"]


def test_second_hit_never_writes_a_first_sighting_under_pressure():
    clock = Clock()
    a = Admission(24 * GB, policy="second_hit", clock=clock)
    a.admit([Save("cold", 1, int(0.9 * GB))])
    clock.t += 0.3 * 3600
    a.observe(["new", "a", "a"])
    got = a.admit([Save("new", 10_000, 1), Save("a", 10, 1)])
    assert [s.prefix for s in got] == ["a"]
    a.observe(["new"])  # asked for again: now its save is admitted
    assert [s.prefix for s in a.admit([Save("new", 10_000, 1)])] == ["new"]


def test_budget_holds_over_a_day_of_saves():
    """However many saves arrive, the bytes written in any window stay within budget + one bucket."""
    clock = Clock()
    budget = 100 * GB
    a = Admission(budget, burst_s=3600, clock=clock)
    written = 0
    for step in range(24 * 60):  # one step a minute, 10 GB of saves each (14.4 TB/day offered)
        a.observe([step % 7, step % 7])
        written += sum(s.nbytes for s in a.admit([Save(step % 7, 100, 5 * GB), Save(("u", step), 100, 5 * GB)]))
        clock.t += 60
    assert written <= budget + budget / 24 + 10 * GB
    assert written >= budget * 0.5  # and the budget is used, not starved
    assert a.stats()["skipped_bytes"] > 0


def test_all_policy_only_counts():
    clock = Clock()
    a = Admission(GB, policy="all", clock=clock)
    saves = [Save(i, 1, GB) for i in range(5)]
    assert a.admit(saves) == saves
    assert a.stats()["budget_tokens"] < 0  # overdrawn: what a budget would have cut


def test_seen_set_is_bounded():
    a = Admission(None, seen_capacity=3)
    a.observe(["a", "b", "c", "d"])
    assert a.times_seen("a") == 0 and a.times_seen("d") == 1


def test_bad_arguments():
    with pytest.raises(ValueError, match="one of expected_value, second_hit, all"):
        Admission(GB, policy="lru")
    with pytest.raises(ValueError):
        Admission(0)
    assert DAY_S == 86400
