"""A store's state as Prometheus metrics, in the text exposition format of node exporter's textfile collector.

``tutti-admin info PATH... --prometheus > /var/lib/node_exporter/textfile/tutti.prom.$$ && mv ...`` (run from
cron or a timer) exports what a read-only open of the store sees: its size, occupancy and damage, and for
members on NVMe whose SMART log can be read (root), the drive's bytes written and wear.  What happens
while vLLM serves (hits, loads, saves, errors, GB/s) is counted by the connector and exported through vLLM's
own Prometheus endpoint as ``tutti:<counter>_total`` (docs/vllm.md, "Statistics").  Names and meanings:
docs/operations.md.
"""
from __future__ import annotations

from collections.abc import Sequence

# name -> (type, help); every name a textfile can hold (the dashboard test checks its queries against these)
STORE_METRICS = {
    "tutti_store_info": ("gauge", "Always 1; the store's identity in labels"),
    "tutti_store_slots": ("gauge", "KV blocks the store can hold"),
    "tutti_store_committed_blocks": ("gauge", "KV blocks stored and committed"),
    "tutti_store_free_slots": ("gauge", "Slots holding no block"),
    "tutti_store_bad_records": ("gauge", "Damaged slot records found at open (never served; check --repair clears)"),
    "tutti_store_clearing_slots": ("gauge", "Slots whose empty record is not yet durable"),
    "tutti_store_occupancy_ratio": ("gauge", "Committed blocks / slots"),
    "tutti_store_block_bytes": ("gauge", "Payload bytes of one KV block (all layers and spans)"),
    "tutti_store_capacity_bytes": ("gauge", "Payload bytes the store can hold (slots x block bytes)"),
    "tutti_store_members": ("gauge", "Member files or devices the store is striped over"),
    "tutti_store_member_bytes": ("gauge", "Bytes each member must hold"),
    "tutti_store_created_timestamp_seconds": ("gauge", "When the store was formatted (Unix time)"),
    "tutti_store_bytes_written_total": ("counter", "Bytes the store wrote to a member since its count began, kept "
                                                   "in the store (as last saved: at close and every GiB)"),
    "tutti_store_bytes_written_since_timestamp_seconds": ("gauge", "When a member's bytes-written count began: "
                                                                   "format, or the open that restarted it"),
}
DRIVE_METRICS = {
    "tutti_drive_data_written_bytes_total": ("counter", "Bytes the drive reports written by hosts (SMART data units)"),
    "tutti_drive_data_read_bytes_total": ("counter", "Bytes the drive reports read by hosts (SMART data units)"),
    "tutti_drive_percentage_used": ("gauge", "Drive's estimate of its life used, percent (may pass 100)"),
    "tutti_drive_available_spare_ratio": ("gauge", "Available spare, as a fraction"),
    "tutti_drive_power_on_seconds_total": ("counter", "Power-on time (SMART power-on hours x 3600)"),
    "tutti_drive_media_errors_total": ("counter", "Media and data integrity errors"),
    "tutti_drive_critical_warning": ("gauge", "SMART critical warning bits (0: none)"),
    "tutti_drive_temperature_celsius": ("gauge", "Composite temperature"),
}
EXPORTED = {**STORE_METRICS, **DRIVE_METRICS}


def _label_value(v) -> str:
    return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: dict) -> str:
    return "{" + ",".join(f'{k}="{_label_value(v)}"' for k, v in labels.items()) + "}" if labels else ""


def _number(v) -> str:
    return repr(float(v)) if isinstance(v, float) else str(int(v))


def store_samples(info: dict) -> list[tuple[str, dict, float | int]]:
    """(metric, labels, value) of a store, from Store.info()."""
    g, fp = info["geometry"], info["fingerprint"]
    store = {"store": info["uuid"]}
    block = g["n_layers"] * g["n_spans"] * g["span_bytes"]
    slots = g["n_slots"]
    ident = {**store, "model": fp["model_id"], "dtype": fp["dtype"], "tp_rank": fp["tp_rank"],
             "tp_size": fp["tp_size"], "paths": ",".join(info["paths"])}
    return [
        ("tutti_store_info", ident, 1),
        ("tutti_store_slots", store, slots),
        ("tutti_store_committed_blocks", store, info["n_committed"]),
        ("tutti_store_free_slots", store, info["n_free"]),
        ("tutti_store_bad_records", store, info["n_bad_records"]),
        ("tutti_store_clearing_slots", store, info.get("n_clearing", 0)),
        ("tutti_store_occupancy_ratio", store, info["n_committed"] / slots if slots else 0.0),
        ("tutti_store_block_bytes", store, block),
        ("tutti_store_capacity_bytes", store, slots * block),
        ("tutti_store_members", store, g["n_members"]),
        ("tutti_store_member_bytes", store, info["member_bytes"]),
        ("tutti_store_created_timestamp_seconds", store, info["created_ns"] / 1e9),
        *written_samples(info),
    ]


def written_samples(info: dict) -> list[tuple[str, dict, float | int]]:
    """The store's own bytes-written counts, one sample per member (none for a store without the counter)."""
    w = info.get("written") or {}
    if w.get("counter") in (None, "none"):
        return []
    out: list[tuple[str, dict, float | int]] = []
    for m in w["members"]:
        lab = {"store": info["uuid"], "member": m["index"], "path": m["path"] or ""}
        out.append(("tutti_store_bytes_written_total", lab, m["bytes"]))
        out.append(("tutti_store_bytes_written_since_timestamp_seconds", lab, m["since_ns"] / 1e9))
    return out


def written_notes(info: dict) -> list[str]:
    """Comments the textfile carries about the bytes-written counts (why there are none, a restart)."""
    w = info.get("written") or {}
    if w.get("counter") == "none":
        return ["tutti: the store was formatted before its bytes-written counter: no tutti_store_bytes_written_total "
                "(reformat to get it)"]
    restarted = [str(m["index"]) for m in w.get("members", ()) if m["restarted"]]
    if restarted:
        return [f"tutti: the bytes-written count of member(s) {', '.join(restarted)} restarted at 0 at this open "
                "(superblock copy B unreadable: a torn save)"]
    return []


def drive_samples(store_uuid: str, bdf: str, smart: dict) -> list[tuple[str, dict, float | int]]:
    """(metric, labels, value) of one drive's SMART log (smart.SmartLog.to_dict())."""
    lab = {"store": store_uuid, "pci_address": bdf}
    return [
        ("tutti_drive_data_written_bytes_total", lab, smart["data_written_bytes"]),
        ("tutti_drive_data_read_bytes_total", lab, smart["data_read_bytes"]),
        ("tutti_drive_percentage_used", lab, smart["percent_used"]),
        ("tutti_drive_available_spare_ratio", lab, smart["avail_spare"] / 100),
        ("tutti_drive_power_on_seconds_total", lab, smart["power_on_hours"] * 3600),
        ("tutti_drive_media_errors_total", lab, smart["media_errors"]),
        ("tutti_drive_critical_warning", lab, smart["critical_warning"]),
        ("tutti_drive_temperature_celsius", lab, smart["temperature_c"]),
    ]


def render(samples: list[tuple[str, dict, float | int]], notes: Sequence[str] = ()) -> str:
    """The text exposition format: HELP and TYPE once per metric, then its samples; ``notes`` as comments."""
    out = ["# " + " ".join(n.split()) for n in notes]
    done = set()
    for name, _, _ in samples:
        if name in done:
            continue
        done.add(name)
        kind, text = EXPORTED[name]
        out.append(f"# HELP {name} {text}")
        out.append(f"# TYPE {name} {kind}")
        for n, labels, value in samples:
            if n == name:
                out.append(f"{name}{_labels(labels)} {_number(value)}")
    return "\n".join(out) + "\n"


def member_drives(paths: list[str]) -> dict[str, str]:
    """PCI address of the NVMe controller under each member that has one (file or device)."""
    from .doctor import Machine
    from .doctor.storage import _device_under

    m = Machine(uring_setup=lambda: 0)  # only its roots are used
    out = {}
    for p in paths:
        try:
            _, bdf, _ = _device_under(m, p)
        except OSError:
            continue
        if bdf:
            out[p] = bdf
    return out


def store_text(info: dict, smart: bool = True) -> str:
    """The whole textfile for one store: its state and, where readable, its drives' SMART."""
    samples, notes = store_samples(info), written_notes(info)
    if smart:
        from .devices import DeviceError, smart_log
        from .smart import parse_smart_log

        for bdf in sorted(set(member_drives(info["paths"]).values())):
            try:
                _, page = smart_log(bdf)
            except DeviceError as e:
                notes.append(f"tutti: no SMART log of {bdf}: {e}")
                continue
            samples += drive_samples(info["uuid"], bdf, parse_smart_log(page).to_dict())
    return render(samples, notes)
