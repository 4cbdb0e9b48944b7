"""SSD endurance (tutti.endurance) and `tutti-admin health`'s endurance rows, on a constructed SMART page."""
import json

import pytest
from click.testing import CliRunner

from helpers import fake_sysfs
from test_admin_devices import make_page
from tutti import devices
from tutti.cli import EXIT_OK, EXIT_USAGE, main
from tutti.endurance import projection, rated_bytes

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
