"""The NVMe SMART / Health Information log (Get Log Page, log id 02h), read two ways.

- From a controller bound to the kernel's nvme driver: NVME_IOCTL_ADMIN_CMD on
  its character device (/dev/nvmeX), the same ioctl nvme-cli's ``smart-log`` uses.
- From a controller bound to tutti.ko: the module's read-only admin passthrough
  (TUTTI_IOC_ADMIN, ``tt_kdev_admin()`` in libtutti/src/kmod/ctl.c) on /dev/tuttiN.

Page layout (NVM Express Base Specification, "SMART / Health Information Log"),
all integers little-endian:

=======  =====  ==========================================================
offset   bytes  field
=======  =====  ==========================================================
0        1      critical warning (bit field, see CRITICAL_WARNING_BITS)
1        2      composite temperature, kelvin
3        1      available spare, percent
4        1      available spare threshold, percent
5        1      percentage used (may exceed 100)
6        1      endurance group critical warning summary
32       16     data units read (thousands of 512-byte units)
48       16     data units written
64       16     host read commands
80       16     host write commands
96       16     controller busy time, minutes
112      16     power cycles
128      16     power on hours
144      16     unsafe shutdowns
160      16     media and data integrity errors
176      16     number of error information log entries
192      4      warning composite temperature time, minutes
196      4      critical composite temperature time, minutes
200      2 x 8  temperature sensors 1..8, kelvin (0: not reported)
216      4      thermal management temperature 1 transition count
220      4      thermal management temperature 2 transition count
224      4      total time for thermal management temperature 1, seconds
228      4      total time for thermal management temperature 2, seconds
=======  =====  ==========================================================
"""
from __future__ import annotations

import ctypes
import dataclasses
import errno
import fcntl
import os
import struct

from .errors import SmartError

SMART_LOG_ID = 0x02
SMART_LOG_BYTES = 512
NSID_ALL = 0xFFFFFFFF
ADMIN_GET_LOG_PAGE = 0x02
DATA_UNIT_BYTES = 512 * 1000
KELVIN_0C = 273

# Bits of the critical warning byte.
CRITICAL_WARNING_BITS = {
    0: "available spare below threshold",
    1: "temperature outside its thresholds",
    2: "NVM subsystem reliability degraded",
    3: "media placed in read-only mode",
    4: "volatile memory backup device failed",
    5: "persistent memory region read-only or unreliable",
}

# struct nvme_passthru_cmd (linux/nvme_ioctl.h): 72 bytes.
#   u8 opcode, u8 flags, u16 rsvd1, u32 nsid, u32 cdw2, u32 cdw3, u64 metadata, u64 addr,
#   u32 metadata_len, u32 data_len, u32 cdw10..cdw15, u32 timeout_ms, u32 result
PASSTHRU_FMT = "=BBHIIIQQII6III"
PASSTHRU_BYTES = struct.calcsize(PASSTHRU_FMT)
assert PASSTHRU_BYTES == 72
# _IOWR('N', 0x41, struct nvme_passthru_cmd)
NVME_IOCTL_ADMIN_CMD = (3 << 30) | (PASSTHRU_BYTES << 16) | (ord("N") << 8) | 0x41


@dataclasses.dataclass(frozen=True)
class SmartLog:
    """One SMART / Health Information log page, decoded (names follow nvme-cli's JSON)."""

    critical_warning: int
    temperature_k: int
    avail_spare: int
    spare_thresh: int
    percent_used: int
    endurance_grp_critical_warning_summary: int
    data_units_read: int
    data_units_written: int
    host_read_commands: int
    host_write_commands: int
    controller_busy_time: int
    power_cycles: int
    power_on_hours: int
    unsafe_shutdowns: int
    media_errors: int
    num_err_log_entries: int
    warning_temp_time: int
    critical_comp_time: int
    temperature_sensors_k: tuple
    thm_temp1_trans_count: int
    thm_temp2_trans_count: int
    thm_temp1_total_time: int
    thm_temp2_total_time: int

    @property
    def temperature_c(self) -> int:
        return self.temperature_k - KELVIN_0C

    @property
    def warnings(self) -> list[str]:
        """The critical warning bits that are set, in words (unknown bits by number)."""
        out = [text for bit, text in CRITICAL_WARNING_BITS.items() if self.critical_warning & (1 << bit)]
        out += [f"bit {b}" for b in range(6, 8) if self.critical_warning & (1 << b)]
        return out

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["temperature_sensors_k"] = list(self.temperature_sensors_k)
        d["temperature_c"] = self.temperature_c
        d["critical_warnings"] = self.warnings
        d["data_read_bytes"] = self.data_units_read * DATA_UNIT_BYTES
        d["data_written_bytes"] = self.data_units_written * DATA_UNIT_BYTES
        return d


def _u128(page: bytes, off: int) -> int:
    return int.from_bytes(page[off:off + 16], "little")


def parse_smart_log(page: bytes) -> SmartLog:
    """Decode a SMART / Health log page (at least its first 512 bytes)."""
    page = bytes(page)
    if len(page) < SMART_LOG_BYTES:
        raise ValueError(f"a SMART / health log page is {SMART_LOG_BYTES} bytes, got {len(page)}")
    u32s = struct.unpack_from("<2I", page, 192)
    sensors = struct.unpack_from("<8H", page, 200)
    thm = struct.unpack_from("<4I", page, 216)
    return SmartLog(
        critical_warning=page[0],
        temperature_k=struct.unpack_from("<H", page, 1)[0],
        avail_spare=page[3],
        spare_thresh=page[4],
        percent_used=page[5],
        endurance_grp_critical_warning_summary=page[6],
        data_units_read=_u128(page, 32),
        data_units_written=_u128(page, 48),
        host_read_commands=_u128(page, 64),
        host_write_commands=_u128(page, 80),
        controller_busy_time=_u128(page, 96),
        power_cycles=_u128(page, 112),
        power_on_hours=_u128(page, 128),
        unsafe_shutdowns=_u128(page, 144),
        media_errors=_u128(page, 160),
        num_err_log_entries=_u128(page, 176),
        warning_temp_time=u32s[0],
        critical_comp_time=u32s[1],
        temperature_sensors_k=tuple(sensors),
        thm_temp1_trans_count=thm[0],
        thm_temp2_trans_count=thm[1],
        thm_temp1_total_time=thm[2],
        thm_temp2_total_time=thm[3],
    )


def get_log_cdw10(log_id: int, nbytes: int) -> int:
    """Get Log Page CDW10: log id in bits 7:0, NUMDL (dwords - 1) in bits 31:16."""
    if nbytes <= 0 or nbytes % 4 or nbytes > 4 * 0x10000:
        raise ValueError(f"log length {nbytes} is not a positive multiple of 4 up to 256 KiB")
    return (log_id & 0xFF) | (((nbytes // 4 - 1) & 0xFFFF) << 16)


def pack_admin_cmd(opcode: int, nsid: int, addr: int, data_len: int, cdw10: int) -> bytearray:
    """A struct nvme_passthru_cmd for NVME_IOCTL_ADMIN_CMD."""
    return bytearray(struct.pack(PASSTHRU_FMT, opcode, 0, 0, nsid, 0, 0, 0, addr, 0, data_len,
                                 cdw10, 0, 0, 0, 0, 0, 0, 0))


def read_smart_nvme(path: str) -> bytes:
    """The SMART log of a controller bound to the nvme driver, through /dev/nvmeX (or a namespace)."""
    buf = ctypes.create_string_buffer(SMART_LOG_BYTES)
    cmd = pack_admin_cmd(ADMIN_GET_LOG_PAGE, NSID_ALL, ctypes.addressof(buf), SMART_LOG_BYTES,
                         get_log_cdw10(SMART_LOG_ID, SMART_LOG_BYTES))
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise SmartError(e.errno or errno.EIO, f"{path}: {e.strerror}") from None
    try:
        rc = fcntl.ioctl(fd, NVME_IOCTL_ADMIN_CMD, cmd, True)
    except OSError as e:
        raise SmartError(e.errno or errno.EIO,
                         f"{path}: NVME_IOCTL_ADMIN_CMD (Get Log Page 02h): {e.strerror}") from None
    finally:
        os.close(fd)
    if rc:
        raise SmartError(errno.EIO, f"{path}: Get Log Page 02h failed with NVMe status {rc:#x}", rc)
    return buf.raw


def read_smart_tutti(path: str) -> bytes:
    """The SMART log of a controller bound to tutti.ko, through /dev/tuttiN (or a namespace node)."""
    from ._tutti import ffi, lib

    buf = ffi.new("uint8_t[]", SMART_LOG_BYTES)
    status = ffi.new("uint16_t *")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise SmartError(e.errno or errno.EIO, f"{path}: {e.strerror}") from None
    try:
        # the module fills in NUMDL from the length: cdw10 is the log id alone
        rc = lib.tt_kdev_admin(fd, ADMIN_GET_LOG_PAGE, NSID_ALL, SMART_LOG_ID, buf, SMART_LOG_BYTES, status)
    finally:
        os.close(fd)
    if rc < 0:
        reason = ffi.string(lib.tt_errmsg()).decode(errors="replace") or os.strerror(-rc)
        lib.tt_clearerr()
        hint = " (needs CAP_SYS_RAWIO)" if -rc == errno.EPERM else ""
        raise SmartError(-rc, f"{path}: {reason}{hint}")
    if status[0]:
        raise SmartError(errno.EIO, f"{path}: Get Log Page 02h failed with NVMe status {status[0]:#x}", status[0])
    return bytes(ffi.buffer(buf, SMART_LOG_BYTES))
