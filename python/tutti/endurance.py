"""SSD endurance from a drive's SMART / health log: bytes written, write rate, and days left.

What the drive itself says (NVMe SMART log): data units written (thousands of 512-byte units), power-on
hours, and "percentage used" (the vendor's estimate of life used, may pass 100).  From those:

- the write rate is the lifetime average: bytes written / days powered on;
- days to the rated endurance (when given: ``--rated-tbw``, or ``--dwpd`` over ``--warranty-years`` of the
  drive's capacity): what is left of it at that rate;
- days to "percentage used" 100: the days so far scaled by what is left (the drive's own estimate, which
  also counts write amplification inside the drive, that bytes written do not).

These are projections at the average rate: a cache that started writing recently writes faster than
its drive's lifetime average says.  Two readings apart in time (a node exporter scraping
``data_written_bytes``) give the current rate.

Where the drive's counter cannot be read (a store on files, a drive without SMART), the store's own
bytes-written counter (``Store.written()``, kept in the store across restarts) gives the rate instead:
what the store wrote since its count began, over the days since.  It sees only this store's writes (not
other writers of the drive, nor the write amplification inside it).
"""
from __future__ import annotations

from typing import Any

DAY_H = 24
YEAR_D = 365


def rated_bytes(rated_tbw: float | None = None, dwpd: float | None = None, capacity_bytes: int | None = None,
                warranty_years: float = 5.0) -> int | None:
    """The drive's rated endurance in bytes: TBW (10^12 bytes), or DWPD x capacity x days of warranty."""
    if rated_tbw is not None and dwpd is not None:
        raise ValueError("give the rated endurance as TBW or as DWPD, not both")
    if rated_tbw is not None:
        if rated_tbw <= 0:
            raise ValueError("rated TBW must be above zero")
        return int(rated_tbw * 10**12)
    if dwpd is not None:
        if dwpd <= 0 or warranty_years <= 0:
            raise ValueError("DWPD and the warranty must be above zero")
        if not capacity_bytes:
            raise ValueError("DWPD needs the drive's capacity (its namespaces' size is unknown)")
        return int(dwpd * capacity_bytes * YEAR_D * warranty_years)
    return None


def projection(written_bytes: int, power_on_hours: int, percent_used: int, rated: int | None) -> dict:
    """Write rate and days left; a value that cannot be known is None (and ``why`` says so)."""
    days_on = power_on_hours / DAY_H
    out: dict[str, Any] = {"source": "drive", "written_bytes": written_bytes, "power_on_days": round(days_on, 2),
           "rated_bytes": rated, "write_bytes_per_day": None, "rated_used_fraction": None, "days_to_rated": None,
           "days_to_percent_used_100": None, "why": []}
    if days_on > 0:
        out["write_bytes_per_day"] = written_bytes / days_on
    else:
        out["why"].append("no power-on hours yet: no write rate")
    if rated:
        out["rated_used_fraction"] = written_bytes / rated
        rate = out["write_bytes_per_day"]
        if rate:
            out["days_to_rated"] = max(0.0, (rated - written_bytes) / rate)
        elif rate is not None:
            out["why"].append("nothing written yet: no end in sight")
    else:
        out["why"].append("no rated endurance given (--rated-tbw or --dwpd)")
    if 0 < percent_used < 100 and days_on > 0:
        out["days_to_percent_used_100"] = days_on * (100 - percent_used) / percent_used
    elif percent_used >= 100:
        out["days_to_percent_used_100"] = 0.0
    else:
        out["why"].append("percentage used is 0: too early for the drive's own estimate")
    return out


def store_rate(written: dict, now_ns: int) -> float | None:
    """Bytes per day the store wrote, from ``Store.written()``: each member's count over the days since its
    count began, summed (members may have begun at different times, after a restarted count); None when no
    member has counted for any time yet, or the store keeps no count."""
    if written.get("counter") in (None, "none"):
        return None
    rate, any_time = 0.0, False
    for m in written["members"]:
        days = (now_ns - m["since_ns"]) / 1e9 / 86400
        if days > 0:
            rate += m["bytes"] / days
            any_time = True
    return rate if any_time else None


def store_projection(written: dict, now_ns: int, rated: int | None) -> dict:
    """``projection()``'s keys from the store's own counter instead of a drive's SMART log (``source``: "store").

    ``written_bytes`` is what the store wrote since its count began; days to the rated endurance assume the
    store is the drive's only writer and the drive was new when the count began (said in ``why``)."""
    rate = store_rate(written, now_ns)
    kept = written.get("counter") not in (None, "none")
    since = written.get("since_ns") or 0
    out: dict[str, Any] = {"source": "store", "written_bytes": written.get("bytes", 0) if kept else None,
                           "counting_days": round((now_ns - since) / 1e9 / 86400, 4) if kept and since else None,
                           "rated_bytes": rated, "write_bytes_per_day": rate, "rated_used_fraction": None,
                           "days_to_rated": None, "days_to_percent_used_100": None, "why": []}
    if not kept:
        out["why"].append("the store keeps no bytes-written count (formatted before the counter): no write rate")
        return out
    out["why"].append("from the store's own counter: other writers of the drive, and its life before the "
                      "count began, are not counted")
    if rate is None:
        out["why"].append("the count began just now: no write rate")
    if rated:
        out["rated_used_fraction"] = out["written_bytes"] / rated
        if rate:
            out["days_to_rated"] = max(0.0, (rated - out["written_bytes"]) / rate)
    else:
        out["why"].append("no rated endurance given (--rated-tbw)")
    out["why"].append("percentage used needs the drive's SMART log (give DEVICE)")
    return out
