"""SSD endurance (tutti.endurance) and `tutti-admin health`'s endurance rows, on a constructed SMART page, and
from the store's own bytes-written counter (health --store: next to the drive's count, or alone on files)."""
import json
import os

import pytest
from click.testing import CliRunner

from helpers import fake_sysfs
from test_admin_devices import make_page
from tutti import Store, devices
from tutti.cli import EXIT_OK, EXIT_USAGE, main
from tutti.endurance import projection, rated_bytes, store_projection, store_rate

TB = 10**12


def test_rated_bytes():
    assert rated_bytes(rated_tbw=600) == 600 * TB
    assert rated_bytes(dwpd=1, capacity_bytes=TB, warranty_years=5) == 5 * 365 * TB
    assert rated_bytes() is None
    for kw, why in (({"rated_tbw": 1, "dwpd": 1}, "not both"), ({"dwpd": 1}, "capacity"),
                    ({"rated_tbw": 0}, "above zero")):
        with pytest.raises(ValueError, match=why):
            rated_bytes(**kw)


def test_projection():
    p = projection(written_bytes=100 * TB, power_on_hours=24 * 100, percent_used=10, rated=600 * TB)
    assert p["write_bytes_per_day"] == TB
    assert p["days_to_rated"] == 500
    assert p["rated_used_fraction"] == pytest.approx(1 / 6)
    assert p["days_to_percent_used_100"] == 900
    assert p["why"] == []
    fresh = projection(0, 0, 0, None)
    assert fresh["write_bytes_per_day"] is None and fresh["days_to_rated"] is None and len(fresh["why"]) == 3
    assert projection(700 * TB, 24, 120, 600 * TB)["days_to_rated"] == 0  # past its rating
    assert projection(700 * TB, 24, 120, 600 * TB)["days_to_percent_used_100"] == 0


@pytest.fixture
def smart_cli(tmp_path, monkeypatch):
    fake = fake_sysfs.build(tmp_path)
    monkeypatch.setattr(devices, "SYS", fake)
    ctl = devices.describe_controller("0000:00:04.0", fake, probe=False)
    # 2,000,000 data units = 1.024 TB written over 1000 hours, 2% used
    page = make_page(duw=2_000_000, poh=1000, used=2)
    monkeypatch.setattr(devices, "smart_log", lambda bdf, sysfs=None: (ctl, page))


def run(args, expect):
    res = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    assert res.exit_code == expect, res.output
    return res


def test_health_endurance_json_and_table(smart_cli):
    d = json.loads(run(["health", "0000:00:04.0", "--rated-tbw", "10", "--json"], EXIT_OK).stdout)
    e = d["endurance"]
    assert e["written_bytes"] == 2_000_000 * 512_000
    assert e["write_bytes_per_day"] == pytest.approx(1.024e12 / (1000 / 24))
    assert e["days_to_rated"] == pytest.approx((10e12 - 1.024e12) / (1.024e12 / (1000 / 24)))
    assert e["days_to_percent_used_100"] == pytest.approx(1000 / 24 * 98 / 2)
    text = run(["health", "0000:00:04.0", "--rated-tbw", "10"], EXIT_OK).stdout
    for line in ("write rate (lifetime average)", "24.58 GB/day", "rated endurance", "10.00 TB (10.24% written)",
                 "days to rated endurance", "365", "days to percentage used 100", "2,042"):
        assert line in text, line


def test_health_dwpd_uses_the_namespaces_capacity(smart_cli):
    d = json.loads(run(["health", "0000:00:04.0", "--dwpd", "1", "--warranty-years", "1", "--json"],
                       EXIT_OK).stdout)
    assert d["endurance"]["rated_bytes"] == 1048576 * 512 * 365  # the fake namespace is 512 MiB


def test_health_endurance_bad_options(smart_cli):
    assert "not both" in run(["health", "0000:00:04.0", "--dwpd", "1", "--rated-tbw", "5"], EXIT_USAGE).output
    assert "must be above 0" in run(["health", "0000:00:04.0", "--rated-tbw", "0"], EXIT_USAGE).output
    assert "not a finite" in run(["health", "0000:00:04.0", "--dwpd", "nan"], EXIT_USAGE).output
    text = run(["health", "0000:00:04.0"], EXIT_OK).stdout
    assert "no rated endurance given" in text


DAY_NS = 86400 * 10**9


def _written(counts, since, counter="kept"):
    members = [{"index": i, "path": f"m{i}", "bytes": b, "since_ns": t, "restarted": False}
               for i, (b, t) in enumerate(zip(counts, since))]
    return {"counter": counter, "bytes": sum(counts), "since_ns": min(since), "members": members}


def test_store_rate_and_projection():
    now = 100 * DAY_NS
    # member 0: 10 TB over 50 days; member 1 restarted 10 days ago: 1 TB over 10 days
    w = _written([10 * TB, TB], [50 * DAY_NS, 90 * DAY_NS])
    assert store_rate(w, now) == pytest.approx(10 * TB / 50 + TB / 10)
    p = store_projection(w, now, rated=600 * TB)
    assert p["source"] == "store" and p["written_bytes"] == 11 * TB
    assert p["days_to_rated"] == pytest.approx((600 - 11) * TB / (0.3 * TB))
    assert p["rated_used_fraction"] == pytest.approx(11 / 600)
    assert p["days_to_percent_used_100"] is None and any("own counter" in y for y in p["why"])
    assert store_rate(_written([5], [now]), now) is None  # began just now
    none = store_projection(_written([0], [now], counter="none"), now, None)
    assert none["write_bytes_per_day"] is None and "no bytes-written count" in none["why"][0]


@pytest.fixture
def store_files(tmp_path, tiny_fp):
    paths = [str(tmp_path / "a.img"), str(tmp_path / "b.img")]
    Store.format(paths, tiny_fp, n_slots=8, stripe_objs=2)
    with Store.open(paths) as s:
        for i in range(3):
            s.put(f"k{i}", os.urandom(s.block_bytes))
        w = s.written()
    return paths, w["bytes"] + 2 * 4096  # + the save at close, one per member


def test_health_of_a_store_on_files(store_files):
    paths, written = store_files
    args = ["health", "--store", paths[0], "--store", paths[1]]
    d = json.loads(run([*args, "--rated-tbw", "1", "--json"], EXIT_OK).stdout)
    assert d["store"]["bytes"] == written and d["store"]["counter"] == "kept"
    assert [m["path"] for m in d["store"]["members"]] == paths
    e = d["endurance"]
    assert e["source"] == "store" and e["written_bytes"] == written
    assert e["write_bytes_per_day"] > 0 and e["days_to_rated"] > 0  # the count began at format, just now
    assert d["store"]["write_bytes_per_day"] == pytest.approx(e["write_bytes_per_day"], rel=0.5)
    text = run(args, EXIT_OK).stdout
    for line in ("store bytes written", "2 members", "store member 1", "store write rate", "own counter"):
        assert line in text, line
    assert "not both" in run([*args, "--dwpd", "1", "--rated-tbw", "1"], EXIT_USAGE).output
    assert "give the drive as DEVICE" in run([*args, "--dwpd", "1"], EXIT_USAGE).output


def test_health_shows_the_store_next_to_the_drive(smart_cli, store_files):
    paths, written = store_files
    d = json.loads(run(["health", "0000:00:04.0", "--store", paths[0], "--store", paths[1], "--json"],
                       EXIT_OK).stdout)
    assert d["data_written_bytes"] == 2_000_000 * 512_000 and d["store"]["bytes"] == written
    assert d["endurance"]["source"] == "drive"
    lines = run(["health", "0000:00:04.0", "--store", paths[0], "--store", paths[1]], EXIT_OK).stdout.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith("data units written"))
    assert lines[at + 1].startswith("store bytes written")
    assert any(ln.startswith("write rate (lifetime average)") for ln in lines)


def test_health_needs_a_device_or_a_store():
    assert "give DEVICE, --store PATH..., or both" in run(["health"], EXIT_USAGE).output
