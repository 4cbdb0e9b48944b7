"""tutti-admin doctor: every check against fake sysfs/procfs trees (ready, degraded and unusable cases), the
command line's exit codes, and the real run on this machine, whose lines are checked against what the
store then does.
"""
import json
import os

import pytest
from click.testing import CliRunner

from helpers import fake_machine
from helpers.fake_machine import GPU, SSD, SW_DOWN_GPU, SW_DOWN_SSD
from tutti import Fingerprint, Store, doctor
from tutti.cli import EXIT_OK, EXIT_PROBLEMS, EXIT_STORE, EXIT_USAGE, main
from tutti.doctor import DEGRADED, NA, OK, UNUSABLE, gpu, host, live, storage


def machine(tmp_path, live_over=None, **knobs):
    roots, calls = fake_machine.build(tmp_path, **knobs)
    calls.update(live_over or {})
    return doctor.Machine(**roots, environ={}, **calls)


def by_name(checks):
    return {c.name: c for c in checks}


def assert_fixes(checks):
    for c in checks:
        assert c.status in doctor.STATUSES
        if c.status in (DEGRADED, UNUSABLE):
            assert c.fix, f"{c.name}: {c.status} without a fix"


# ------------------------------------------------------------------ the three verdicts


def test_ready_machine(tmp_path):
    m = machine(tmp_path)
    checks = doctor.run(m, (fake_machine.file_on_ssd(tmp_path, {"sysfs": m.sysfs}),))
    bad = [(c.name, c.status, c.detail) for c in checks if c.status not in (OK, NA)]
    assert bad == []
    assert doctor.verdict(checks) == "ready"
    d = by_name(checks)
    assert "version 0.1.0" in d["tutti.ko"].detail and SSD in d["tutti.ko"].detail
    assert "driver tutti.ko" in d[f"nvme {SSD}"].detail and "MDTS 512 KiB" in d[f"nvme {SSD}"].detail
    assert "SGL yes" in d[f"nvme {SSD}"].detail and "tutti0n1" in d[f"nvme {SSD}"].detail
    dev = [c for c in checks if c.name.startswith("device ")][0]
    assert f"on tutti0n1: {SSD}" in dev.detail
    assert f"below {fake_machine.SW_UP}" in d["ACS"].detail
    assert "64 GiB" in d["BAR1"].detail


def test_degraded_machine_every_line_has_a_fix(tmp_path):
    m = machine(tmp_path, tutti_loaded=False, ssd_driver="nvme", acs_control=0x001D, p2p=False,
                live_over={"uring_setup": lambda: 1})
    checks = doctor.run(m)
    assert doctor.verdict(checks) == "degraded"
    assert_fixes(checks)
    d = by_name(checks)
    assert d["tutti.ko"].status == DEGRADED and "insmod" in d["tutti.ko"].fix
    assert d["io_uring"].status == DEGRADED and "psync" in d["io_uring"].detail
    assert d["ACS"].status == DEGRADED and SW_DOWN_GPU in d["ACS"].detail and SW_DOWN_SSD in d["ACS"].detail
    assert d["nvidia-p2p"].status == DEGRADED


def test_unusable_machine(tmp_path):
    m = machine(tmp_path, live_over={"libtutti": lambda: "No module named 'tutti._tutti'"})
    checks = doctor.run(m)
    assert doctor.verdict(checks) == "unusable"
    c = by_name(checks)["libtutti"]
    assert c.status == UNUSABLE and "pip install ." in c.fix
    assert_fixes(checks)


# ------------------------------------------------------------------ host


@pytest.mark.parametrize("disabled,rc,status,words", [
    ("0", 0, OK, "io_uring_setup works"),
    ("2", 1, DEGRADED, "io_uring_disabled=2"),
    ("1", 1, DEGRADED, "kernel.io_uring_group (gid 1234)"),
    ("0", 1, DEGRADED, "seccomp"),
    ("0", 38, DEGRADED, "no io_uring (ENOSYS)"),
    ("0", 12, DEGRADED, "RLIMIT_MEMLOCK"),
])
def test_io_uring(tmp_path, disabled, rc, status, words):
    c = host.check_io_uring(machine(tmp_path, io_uring_disabled=disabled, live_over={"uring_setup": lambda: rc}))
    assert c.status == status and words in c.detail, c


def test_memlock(tmp_path):
    low = 8 << 20
    c = host.check_memlock(machine(tmp_path / "a", memlock=str(low), cap_eff=0))
    assert c.status == DEGRADED and "8 MiB" in c.detail and "LimitMEMLOCK=infinity" in c.fix
    assert host.check_memlock(machine(tmp_path / "b", memlock=str(low))).status == OK  # CAP_IPC_LOCK
    assert host.check_memlock(machine(tmp_path / "c", memlock="unlimited", cap_eff=0)).status == OK
    # no NVMe, no tutti.ko, a 5.12+ kernel: nothing here counts against it
    c = host.check_memlock(machine(tmp_path / "d", memlock=str(low), cap_eff=0, tutti_loaded=False, ssd=False))
    assert c.status == OK
    old = machine(tmp_path / "e", memlock="65536", cap_eff=0, live_over={"uname": lambda: "5.10.0-20-amd64"})
    assert host.check_memlock(old).status == DEGRADED and "before Linux 5.12" in host.check_memlock(old).detail


def test_tutti_ko(tmp_path):
    assert host.check_tutti_ko(machine(tmp_path / "a")).status == OK
    c = host.check_tutti_ko(machine(tmp_path / "b", tutti_loaded=False, ssd_driver="nvme"))
    assert c.status == DEGRADED and "1 NVMe controller" in c.detail
    assert host.check_tutti_ko(machine(tmp_path / "c", tutti_loaded=False, ssd=False)).status == NA


def test_rights(tmp_path):
    assert host.check_rights(machine(tmp_path / "a")).status == OK
    c = host.check_rights(machine(tmp_path / "b", uid=1000, cap_eff=0, groups="1000"))
    assert c.status == DEGRADED and "CAP_SYS_RAWIO" in c.detail and "group tutti" in c.fix
    c = host.check_rights(machine(tmp_path / "c", uid=1000, cap_eff=1 << host.CAP_SYS_RAWIO, groups="990"))
    assert c.status == OK
    c = host.check_rights(machine(tmp_path / "d", uid=1000, cap_eff=0, tutti_group=False))
    assert "groupadd --system tutti" in c.fix


# ------------------------------------------------------------------ storage


def test_controller_without_driver_is_degraded(tmp_path):
    m = machine(tmp_path, ssd_driver=None)
    c = by_name(storage.checks(m, ()))[f"nvme {SSD}"]
    assert c.status == DEGRADED and f"tutti-admin attach {SSD}" in c.fix


def test_nvme_bound_controller_facts(tmp_path):
    m = machine(tmp_path, ssd_driver="nvme", live_over={"id_ctrl": lambda d, n: None})
    c = by_name(storage.checks(m, ()))[f"nvme {SSD}"]
    assert c.status == OK and "driver nvme" in c.detail and "nvme0n1 1 GiB" in c.detail
    assert "max I/O 512 KiB" in c.detail  # Identify not answered: the driver's limit from sysfs


@pytest.mark.skipif(os.geteuid() != 0, reason="making a block device node needs root")
def test_raw_member_that_is_mounted_is_unusable(tmp_path):
    m = machine(tmp_path, ssd_driver="nvme", store_on_ssd_mounted=True, block_node=True)
    dev = os.path.join(m.dev, "nvme0n1")
    c = by_name(storage.checks(m, (dev,)))[f"path {dev}"]
    assert c.status == UNUSABLE and "/data" in c.detail and "umount" in c.fix
    m = machine(tmp_path / "free", ssd_driver="nvme", block_node=True, live_over={"odirect": lambda p: None})
    dev = os.path.join(m.dev, "nvme0n1")
    d = by_name(storage.checks(m, (dev,)))
    assert d[f"path {dev}"].status == OK and d[f"path {dev}"].detail == "block device"
    assert d[f"device {dev}"].status == OK and f"on nvme0n1: {SSD}" in d[f"device {dev}"].detail


@pytest.mark.parametrize("answer,status", [(None, OK), (("unsupported", "refuses O_DIRECT"), DEGRADED),
                                           (("error", "permission denied"), UNUSABLE)])
def test_odirect(tmp_path, answer, status):
    m = machine(tmp_path, live_over={"odirect": lambda p: answer})
    c = by_name(storage.checks(m, (str(tmp_path),)))[f"O_DIRECT {tmp_path}"]
    assert c.status == status


def test_file_on_a_non_nvme_disk(tmp_path):
    m = machine(tmp_path)
    c = by_name(storage.checks(m, (str(tmp_path / "new.img"),)))
    assert c[f"path {tmp_path / 'new.img'}"].detail.startswith("does not exist yet")
    assert "not NVMe" in c[f"device {tmp_path / 'new.img'}"].detail or \
        "no block device" in c[f"device {tmp_path / 'new.img'}"].detail


def test_an_existing_member_is_looked_into(tmp_path, tiny_fp):
    """A server opens a member that exists as a store (only a missing one is created): doctor said "ready"
    for a file of random bytes.  Now libtutti's probe says what the member holds."""
    from tutti import Store
    from tutti.doctor import live

    m = machine(tmp_path / "m", live_over={"store_kind": live.store_kind})
    junk = tmp_path / "junk.img"
    junk.write_bytes(os.urandom(1 << 20))
    c = by_name(storage.checks(m, (str(junk),)))[f"store {junk}"]
    assert c.status == UNUSABLE and "holds no Tutti store" in c.detail and "tutti-admin format" in c.fix
    good = tmp_path / "kv.img"
    Store.format([str(good)], tiny_fp, n_slots=4)
    c = by_name(storage.checks(m, (str(good),)))[f"store {good}"]
    assert c.status == OK and "member 1 of 1" in c.detail
    kinds = {"damaged": "no valid superblock copy", "other_version": "format version 9"}
    for kind, words in kinds.items():
        m = machine(tmp_path / kind, live_over={"store_kind": lambda p, k=kind: {"kind": k, "version": 9}})
        c = by_name(storage.checks(m, (str(good),)))[f"store {good}"]
        assert c.status == UNUSABLE and words in c.detail and c.fix, (kind, c)
    # Nothing to look into: a directory, a member that does not exist yet.
    names = by_name(storage.checks(m, (str(tmp_path), str(tmp_path / "new.img"))))
    assert not [n for n in names if n.startswith("store ")]


# ------------------------------------------------------------------ GPU and vLLM


def test_acs(tmp_path):
    assert gpu.check_acs(machine(tmp_path / "a"), [GPU], [SSD]).status == OK
    c = gpu.check_acs(machine(tmp_path / "b", acs_control=0x0004), [GPU], [SSD])
    assert c.status == DEGRADED and "0x0004" in c.detail and "setpci" in c.fix
    c = gpu.check_acs(machine(tmp_path / "c", short_config=True), [GPU], [SSD])
    assert c.status == DEGRADED and "as root" in c.fix


def test_iommu(tmp_path):
    c = gpu.check_iommu(machine(tmp_path / "a"), [GPU], [SSD])
    assert c.status == OK and "no IOMMU" in c.detail
    assert gpu.check_iommu(machine(tmp_path / "b", iommu="identity"), [GPU], [SSD]).status == OK
    c = gpu.check_iommu(machine(tmp_path / "c", iommu="DMA-FQ"), [GPU], [SSD])
    assert c.status == DEGRADED and "iommu=pt" in c.fix and "intel_iommu=on" in c.detail


def test_bar1_p2p_green_queues(tmp_path):
    m = machine(tmp_path / "a", bar1=256 << 20, p2p=False)
    assert gpu.check_bar1(m, [GPU]).status == DEGRADED and "256 MiB" in gpu.check_bar1(m, [GPU]).detail
    assert gpu.check_p2p(m).status == DEGRADED
    m = machine(tmp_path / "b", live_over={"green": lambda: {"ok": False, "detail": "cuda-bindings is not installed"}})
    assert gpu.check_green(m).status == DEGRADED and "pip install cuda-bindings" in gpu.check_green(m).fix
    for value, status in ((None, OK), ("32", OK), ("1", DEGRADED), ("x", DEGRADED)):
        m.environ = {} if value is None else {"CUDA_DEVICE_MAX_CONNECTIONS": value}
        assert gpu.check_queues(m).status == status, value


def test_cufile(tmp_path):
    assert gpu.check_cufile(machine(tmp_path / "a")).status == OK
    c = gpu.check_cufile(machine(tmp_path / "b", nvidia_fs=False))
    assert c.status == DEGRADED and "compatibility mode" in c.detail
    m = machine(tmp_path / "c", nvidia_fs=False)
    (tmp_path / "c" / "etc" / "cufile.json").write_text('{"properties": {"allow_compat_mode": false}}')
    assert "refuses to open" in gpu.check_cufile(m).detail
    m = machine(tmp_path / "d", live_over={"cufile_lib": lambda: {"ok": False, "detail": "not found"}})
    assert gpu.check_cufile(m).status == DEGRADED and "nvidia-gds" in gpu.check_cufile(m).fix


def test_a_fifo_where_a_file_is_read_is_not_opened(tmp_path):
    """Opening a FIFO blocks until someone writes to it: CUFILE_ENV_PATH_JSON naming one hung doctor."""
    m = machine(tmp_path / "a")
    fifo = tmp_path / "cufile.fifo"
    os.mkfifo(fifo)
    m.environ["CUFILE_ENV_PATH_JSON"] = str(fifo)
    assert m.read(str(fifo)) is None
    assert gpu.check_cufile(m).status == OK  # as with no cufile.json: cuFile's defaults


def test_vllm_version(tmp_path):
    for version, status in (("0.32.0", OK), ("0.32.4", OK), ("0.33.0", DEGRADED), ("0.10.1", DEGRADED)):
        m = machine(tmp_path / version, live_over={"version_of": lambda d, v=version: v if d == "vllm" else None})
        assert gpu.check_vllm(m).status == status, version
    m = machine(tmp_path / "none", live_over={"version_of": lambda d: None})
    assert gpu.check_vllm(m).status == NA


def test_no_gpu_means_not_applicable_and_no_cuda_call(tmp_path):
    def boom():
        raise AssertionError("CUDA must not be asked without a GPU")

    m = machine(tmp_path, gpu=False, live_over={"cuda": boom, "green": boom, "cufile_lib": boom})
    checks = [c for c in gpu.checks(m) if c.area == "gpu"]
    assert len(checks) == 9 and all(c.status == NA for c in checks)


def test_ext_caps_loop_ends():
    import struct

    c = bytearray(4096)
    struct.pack_into("<I", c, 0x100, 0x0001 | (0x100 << 20))  # points at itself
    assert list(gpu.ext_caps(bytes(c))) == [(1, 0x100)]


# ------------------------------------------------------------------ the command


def run_cli(args, expect):
    res = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    assert res.exit_code == expect, f"exit {res.exit_code} != {expect}\n{res.output}"
    return res


def _patch_live(monkeypatch, calls):
    for name, fn in calls.items():
        monkeypatch.setattr(live, name, fn)


def _root_args(roots):
    return ["--sysfs-root", roots["sysfs"], "--procfs-root", roots["procfs"], "--dev-root", roots["dev"],
            "--etc-root", roots["etc"]]


@pytest.mark.parametrize("knobs,over,code,verdict", [
    ({}, {}, EXIT_OK, "ready"),
    ({"acs_control": 0x0004}, {}, EXIT_PROBLEMS, "degraded"),
    ({}, {"libtutti": lambda: "cannot load"}, EXIT_STORE, "unusable"),
])
def test_cli_exit_codes_on_fake_trees(tmp_path, monkeypatch, knobs, over, code, verdict):
    roots, calls = fake_machine.build(tmp_path, **knobs)
    _patch_live(monkeypatch, {**calls, **over})
    monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS", raising=False)
    rep = json.loads(run_cli(["doctor", "--json", *_root_args(roots)], code).stdout)
    assert rep["verdict"] == verdict
    text = run_cli(["doctor", *_root_args(roots)], code).stdout
    assert f"verdict: {verdict}" in text
    if code:
        assert "fix: " in text


def test_cli_refuses_bad_paths(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    res = run_cli(["doctor", fifo], EXIT_USAGE)
    assert "FIFO" in res.output
    run_cli(["doctor", "--sysfs-root", tmp_path / "nope"], EXIT_USAGE)


def test_real_run_on_this_machine(tmp_path):
    """The real probes here: a documented exit code, a fix on every line that is not ok, and each ok line
    true of what the store then does."""
    res = CliRunner().invoke(main, ["doctor", "--json", str(tmp_path)], catch_exceptions=False)
    rep = json.loads(res.stdout)
    assert res.exit_code == {"ready": EXIT_OK, "degraded": EXIT_PROBLEMS, "unusable": EXIT_STORE}[rep["verdict"]]
    for c in rep["checks"]:
        assert c["status"] in doctor.STATUSES
        assert c["status"] in (OK, NA) or c["fix"], c
    d = {c["name"]: c for c in rep["checks"]}
    paths = [str(tmp_path / "m.img")]
    # conftest's tiny model, restated: "from conftest import" can pick tests/hil's conftest in a full run.
    tiny = Fingerprint(model_id="tests/tiny", dtype="float16", n_layers=4, kv_heads=2, head_dim=64,
                       block_size=16)
    Store.format(paths, tiny, n_slots=4)
    with Store.open(paths) as s:
        assert (d["io_uring"]["status"] == OK) == (s.engine == "uring"), (d["io_uring"], s.engine)
    assert d["libtutti"]["status"] == OK
    assert d[f"O_DIRECT {tmp_path}"]["status"] == OK  # the test directory's disk file system takes O_DIRECT
    assert live.odirect(str(tmp_path)) is None
    assert not any(p.name.startswith(".tutti-doctor") for p in tmp_path.iterdir())  # the probe file is gone
