"""Controller commands: list, attach, detach, health (tutti.ko and the kernel nvme driver)."""
from __future__ import annotations

import sys

import click

from .app import main
from .common import (
    EXIT_CODES,
    EXIT_PROBLEMS,
    EXIT_STORE,
    EXIT_USAGE,
    CliError,
    _emit_json,
    _json_opt,
    _open,
    check_members,
    format_size,
    make_console,
)
from .params import Finite, InputFile, MemberPath

_DEVICE_METAVAR = "PCI_ADDR|/dev/nvmeX|/dev/nvmeXnY|/dev/tuttiN"


def _device_error(e, what: str) -> CliError:
    """A devices.DeviceError as a CLI error: bad input exit 2, unusable device exit 3."""
    return CliError(f"{what}: {e}", EXIT_USAGE if e.usage else EXIT_STORE)


def _resolve_device(arg: str, what: str) -> str:
    from ..devices import DeviceError, resolve_controller

    try:
        return resolve_controller(arg)
    except DeviceError as e:
        raise _device_error(e, what) from None


def _store_text(v) -> str:
    return "?" if v is None else ("yes" if v else "no")


def _decimal_bytes(n: int) -> str:
    for unit, mult in (("PB", 10**15), ("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= mult:
            return f"{n / mult:.2f} {unit}"
    return f"{n} B"


def device_rows(ctls: list) -> list:
    """Rows of the list table: one per namespace (a controller without any: one row)."""
    rows = []
    for c in ctls:
        ident = [c["pci_address"], c["driver"], c["device"] or "-", c["model"] or "-", c["serial"] or "-",
                 c["firmware"] or "-"]
        if not c["namespaces"]:
            rows.append(ident + ["-", "-", "-"])
        for ns in c["namespaces"]:
            name = ns["device"]
            if ns.get("partitions"):
                name += f" ({len(ns['partitions'])} partition{'s' if len(ns['partitions']) > 1 else ''})"
            size = format_size(ns["size_bytes"]) if ns.get("size_bytes") is not None else "?"
            rows.append(ident + [name, size, _store_text(ns.get("tutti_store"))])
    return rows


@main.command("list", epilog=EXIT_CODES)
@_json_opt
def list_cmd(as_json):
    """List NVMe controllers and their namespaces.

    For each controller (PCI class 010802): PCI address, the driver bound to it
    (nvme, tutti or none), its node, model, serial and firmware; for each
    namespace: its block device (nvme) or tutti.ko node, size, and whether a
    Tutti store is on it (superblock magic; '?' when it cannot be read: run as
    root).  Like `nvme list`.
    """
    from rich.table import Table

    from ..devices import list_controllers

    ctls = list_controllers()
    if as_json:
        _emit_json(ctls)
        return
    t = Table(title="NVMe controllers", title_justify="left")
    for col in ("PCI address", "driver", "controller", "model", "serial", "firmware", "namespace", "size",
                "tutti store"):
        t.add_column(col, no_wrap=True)
    for row in device_rows(ctls):
        t.add_row(*row)
    con = make_console()
    if not con.is_terminal:  # pipes and logs: never cut a device name or serial short
        from rich.measure import Measurement

        con.width = max(con.width, Measurement.get(con, con.options.update_width(1 << 16), t).maximum)
    con.print(t)
    if not ctls:
        click.echo("no NVMe controller found", err=True)


def _device_summary(ctl: dict) -> str:
    nodes = [ctl["device"]] if ctl["device"] else []
    nodes += [ns["device"] for ns in ctl["namespaces"]]
    return ", ".join(nodes) if nodes else "no device nodes yet"


@main.command("attach", epilog=EXIT_CODES)
@click.argument("device", metavar=_DEVICE_METAVAR)
@_json_opt
def attach_cmd(device, as_json):
    """Hand an NVMe controller to tutti.ko (from the nvme driver, or from no driver).

    DEVICE is the controller's PCI address or any of its device nodes.  Refused
    (exit 3, nothing changed) while any of its namespaces, or a partition on one,
    is mounted, used as swap, held by another block device (dm, md, ...) or
    opened exclusively; also when tutti.ko is not loaded.  Needs root.
    """
    from ..devices import DeviceError, attach

    bdf = _resolve_device(device, "attach")
    try:
        ctl, changed = attach(bdf)
    except DeviceError as e:
        raise _device_error(e, "attach") from None
    if as_json:
        _emit_json({**ctl, "changed": changed})
        return
    click.echo(f"{bdf}: {'attached to' if changed else 'already bound to'} tutti.ko: {_device_summary(ctl)}")


@main.command("detach", epilog=EXIT_CODES)
@click.argument("device", metavar=_DEVICE_METAVAR)
@_json_opt
def detach_cmd(device, as_json):
    """Give an NVMe controller back to the kernel's nvme driver.

    Waits until the nvme driver has brought the controller up and its namespaces'
    block devices exist.  Exit 3 when the nvme driver is not loaded (the controller
    is then left without a driver: modprobe nvme and run detach again).  Processes
    using the controller's tutti.ko nodes lose them (-ENODEV).  Needs root.
    """
    from ..devices import DeviceError, detach

    bdf = _resolve_device(device, "detach")
    try:
        ctl, changed = detach(bdf)
    except DeviceError as e:
        raise _device_error(e, "detach") from None
    if as_json:
        _emit_json({**ctl, "changed": changed})
        return
    click.echo(f"{bdf}: {'handed back to' if changed else 'already bound to'} nvme: {_device_summary(ctl)}")


def health_rows(d: dict) -> list:
    """(label, text) rows of the health table, in nvme smart-log's order."""
    cw = d["critical_warning"]
    rows = [
        ("critical warning", f"{cw:#04x}" + (f" ({'; '.join(d['critical_warnings'])})" if cw else " (none)")),
        ("temperature", f"{d['temperature_c']} °C ({d['temperature_k']} K)"),
        ("available spare", f"{d['avail_spare']}%"),
        ("available spare threshold", f"{d['spare_thresh']}%"),
        ("percentage used", f"{d['percent_used']}%"),
        ("endurance group critical warning summary", f"{d['endurance_grp_critical_warning_summary']:#04x}"),
        ("data units read", f"{d['data_units_read']:,} ({_decimal_bytes(d['data_read_bytes'])})"),
        ("data units written", f"{d['data_units_written']:,} ({_decimal_bytes(d['data_written_bytes'])})"),
        ("host read commands", f"{d['host_read_commands']:,}"),
        ("host write commands", f"{d['host_write_commands']:,}"),
        ("controller busy time", f"{d['controller_busy_time']:,} min"),
        ("power cycles", f"{d['power_cycles']:,}"),
        ("power on hours", f"{d['power_on_hours']:,}"),
        ("unsafe shutdowns", f"{d['unsafe_shutdowns']:,}"),
        ("media and data integrity errors", f"{d['media_errors']:,}"),
        ("error information log entries", f"{d['num_err_log_entries']:,}"),
        ("warning temperature time", f"{d['warning_temp_time']:,} min"),
        ("critical composite temperature time", f"{d['critical_comp_time']:,} min"),
    ]
    for i, k in enumerate(d["temperature_sensors_k"]):
        if k:
            rows.append((f"temperature sensor {i + 1}", f"{k - 273} °C ({k} K)"))
    for i in (1, 2):
        if d[f"thm_temp{i}_trans_count"] or d[f"thm_temp{i}_total_time"]:
            rows.append((f"thermal management T{i} transitions", f"{d[f'thm_temp{i}_trans_count']:,}"))
            rows.append((f"thermal management T{i} total time", f"{d[f'thm_temp{i}_total_time']:,} s"))
    return rows


@main.command("health", epilog=EXIT_CODES)
@click.argument("device", metavar=f"[{_DEVICE_METAVAR}]", required=False)
@click.option("--store", "store_paths", multiple=True, metavar="PATH", type=MemberPath(), callback=check_members,
              help="a member of a store (repeat for each member): the store's own bytes-written counter, next to "
                   "the drive's; without DEVICE (a store on files) the write rate comes from it")
@click.option("--rated-tbw", type=Finite(0.0, max=1e9), help="the drive's rated endurance in TB written")
@click.option("--dwpd", type=Finite(0.0, max=1000.0), help="the drive's rated drive writes per day (with "
              "--warranty-years and its capacity)")
@click.option("--warranty-years", type=Finite(0.0, max=100.0), default=5.0, show_default=True,
              help="warranty period the DWPD rating holds for")
@_json_opt
def health_cmd(device, store_paths, rated_tbw, dwpd, warranty_years, as_json):
    """Show a controller's SMART / health log, like `nvme smart-log`, and its endurance.

    Read through the driver the controller is bound to: the kernel's nvme driver
    (NVME_IOCTL_ADMIN_CMD on /dev/nvmeX) or tutti.ko (its read-only admin
    passthrough on /dev/tuttiN).  Exit 1 when the critical warning is not zero.
    With --rated-tbw or --dwpd: the write rate and the days left to the rated
    endurance.  Needs root.

    With --store PATH...: the store's own bytes-written counter (kept in the
    store across restarts), next to the drive's data units written.  Without
    DEVICE (a store on files, or no SMART log to read): only the store's
    counter, and the write rate and days to --rated-tbw from it.  The store is
    opened read-only without a lock, so it may be in use: its counts are as
    last saved (at close and every GiB per member).
    """
    from rich.table import Table

    if not device and not store_paths:
        raise click.UsageError("give DEVICE, --store PATH..., or both")
    store = _store_written(store_paths) if store_paths else None
    if not device:
        _health_of_store(store, rated_tbw, dwpd, warranty_years, as_json)
        return

    from ..devices import DeviceError, smart_log
    from ..smart import parse_smart_log

    bdf = _resolve_device(device, "health")
    try:
        ctl, page = smart_log(bdf)
    except DeviceError as e:
        raise _device_error(e, "health") from None
    d = {"pci_address": bdf, "device": ctl["device"], "driver": ctl["driver"], **parse_smart_log(page).to_dict()}
    d["endurance"] = _endurance(d, ctl, rated_tbw, dwpd, warranty_years)
    if store is not None:
        d["store"] = store
    if as_json:
        _emit_json(d)
    else:
        t = Table(title=f"SMART / health log of {bdf} ({ctl['device']}, driver {ctl['driver']})",
                  title_justify="left", show_header=False, box=None, pad_edge=False)
        t.add_column(style="bold")
        t.add_column()
        rows = health_rows(d)
        if store is not None:  # right after the drive's data units written
            at = next(i for i, (label, _) in enumerate(rows) if label == "data units written") + 1
            rows[at:at] = store_rows(store)
        for label, text in rows + endurance_rows(d["endurance"]):
            t.add_row(label, text, style="red" if label == "critical warning" and d["critical_warning"] else None)
        make_console().print(t)
    if d["critical_warning"]:
        sys.exit(EXIT_PROBLEMS)


def _store_written(paths) -> dict:
    """The store's identity and bytes-written counts (Store.written()), with its write rate."""
    import time

    from ..endurance import store_rate

    with _open(paths, "health", readonly=True, shared=True) as s:
        w = s.written()
        out = {"uuid": s.uuid, "paths": list(s.paths), **w}
    out["write_bytes_per_day"] = store_rate(w, time.time_ns())
    return out


def _health_of_store(store: dict, rated_tbw, dwpd, warranty_years, as_json) -> None:
    """health --store without DEVICE: the store's counter and the endurance projected from it."""
    import time

    from rich.table import Table

    from ..endurance import rated_bytes, store_projection

    try:
        rated = rated_bytes(rated_tbw, dwpd, None, warranty_years)
    except ValueError as e:
        raise CliError(f"health: {e} (give the drive as DEVICE)", EXIT_USAGE) from None
    d = {"store": store, "endurance": store_projection(store, time.time_ns(), rated)}
    if as_json:
        _emit_json(d)
        return
    t = Table(title=f"Bytes written by store {store['uuid']} (its own counter)", title_justify="left",
              show_header=False, box=None, pad_edge=False)
    t.add_column(style="bold")
    t.add_column()
    for label, text in store_rows(store) + endurance_rows(d["endurance"]):
        t.add_row(label, text)
    make_console().print(t)


def _when(ns: int) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(ns / 1e9, dt.timezone.utc).isoformat(timespec="seconds")


def store_rows(store: dict) -> list:
    """(label, text) rows of the store's own bytes-written counter."""
    if store["counter"] == "none":
        return [("store bytes written", "not kept: the store was formatted before its bytes-written counter "
                                        "(reformat it to get one)")]
    members = store["members"]
    rows = [("store bytes written", f"{_decimal_bytes(store['bytes'])} ({len(members)} member"
                                    f"{'s' if len(members) > 1 else ''}, counting since {_when(store['since_ns'])})")]
    if len(members) > 1:
        for m in members:
            rows.append((f"store member {m['index']}", f"{_decimal_bytes(m['bytes'])} ({m['path'] or '?'}, since "
                                                       f"{_when(m['since_ns'])})"))
    restarted = [str(m["index"]) for m in members if m["restarted"]]
    if restarted:
        rows.append(("store counter", f"member(s) {', '.join(restarted)} restarted at 0 at this open (superblock "
                                      "copy B unreadable: a torn save); the rest kept"))
    if store.get("write_bytes_per_day") is not None:
        rows.append(("store write rate (average since its count began)",
                     f"{_decimal_bytes(int(store['write_bytes_per_day']))}/day"))
    return rows


def _endurance(d: dict, ctl: dict, rated_tbw, dwpd, warranty_years) -> dict:
    from ..endurance import projection, rated_bytes

    capacity = sum(ns["size_bytes"] or 0 for ns in ctl["namespaces"]) or None
    try:
        rated = rated_bytes(rated_tbw, dwpd, capacity, warranty_years)
    except ValueError as e:
        raise CliError(f"health: {e}", EXIT_USAGE) from None
    return projection(d["data_written_bytes"], d["power_on_hours"], d["percent_used"], rated)


def endurance_rows(e: dict) -> list:
    """(label, text) rows of the endurance projection."""
    rows = []
    if e["write_bytes_per_day"] is not None and e.get("source") != "store":  # the store's is in store_rows
        rows.append(("write rate (lifetime average)", f"{_decimal_bytes(int(e['write_bytes_per_day']))}/day"))
    if e["rated_bytes"]:
        rows.append(("rated endurance", f"{_decimal_bytes(e['rated_bytes'])} "
                                        f"({100 * e['rated_used_fraction']:.2f}% written)"))
    if e["days_to_rated"] is not None:
        rows.append(("days to rated endurance", f"{e['days_to_rated']:,.0f}"))
    if e["days_to_percent_used_100"] is not None:
        rows.append(("days to percentage used 100", f"{e['days_to_percent_used_100']:,.0f}"))
    for why in e["why"]:
        rows.append(("endurance", why))
    return rows


@main.command("hotplug", epilog=EXIT_CODES)
@click.argument("device", metavar=_DEVICE_METAVAR)
@click.option("--config", default=None, type=InputFile(missing_ok=True),
              help="controllers to attach, one PCI address or serial a line [default: /etc/tutti/attach.conf]")
def hotplug_cmd(device, config):
    """Attach a controller that just appeared if the config lists it (run by udev).

    udev/99-tutti.rules runs this for every NVMe controller added; a controller
    not listed, or a config that does not exist, is left alone (exit 0).  The
    same refusals as attach apply: a listed controller whose namespaces are in
    use stays with nvme (exit 3).
    """
    from ..devices import DEFAULT_ATTACH_CONFIG, DeviceError, attach, hotplug_wanted, read_attach_config

    path = config or DEFAULT_ATTACH_CONFIG
    try:
        entries, problems = read_attach_config(path)
    except DeviceError as e:
        raise _device_error(e, "hotplug") from None
    con = make_console(stderr=True)
    for p in problems:
        con.print(f"tutti-admin: hotplug: {p}", markup=False, soft_wrap=True)  # a log line: never wrapped
    bdf = _resolve_device(device, "hotplug")
    try:
        if not hotplug_wanted(bdf, entries):
            return
        _, changed = attach(bdf)
    except DeviceError as e:
        raise _device_error(e, "hotplug") from None
    con.print(f"tutti-admin: hotplug: {bdf} " + ("attached to tutti.ko" if changed else "already on tutti.ko"),
              markup=False, soft_wrap=True)
