"""A dm-log-writes log (as QEMU's ``blklogwrites`` block driver writes it) and the crash states it implies.

Format (Linux Documentation/admin-guide/device-mapper/log-writes.rst; QEMU block/blklogwrites.c),
little-endian, in units of the log's sector size (512 here):

- sector 0: superblock ``magic u64, version u64, nr_entries u64, sectorsize u32``;
- from sector 1, one entry after another: a header sector ``sector u64, nr_sectors u64,
  flags u64, data_len u64`` followed, except for a discard, by the ``nr_sectors`` sectors written.

A flush is an entry with ``LOG_FLUSH`` and no data. QEMU logs a request after the drive completed
it, so every write the guest saw complete before it issued a flush lies before that flush's entry.

Crash states: the writes between two flushes (an *epoch*) were not promised durable, so a power
cut in an epoch leaves the disk at the previous flush point plus any subset of the epoch's writes,
landed in any order, and any write possibly torn at a sector boundary (NVMe promises atomicity of
one logical block, no more).  A write with ``LOG_FUA`` is durable once it completed, so it is
never dropped once a later write of its epoch landed.  ``epoch_states`` enumerates such states:
in-order prefixes, each write lost, each write alone, each write torn (first half, last half, a
random set of its sectors), and random subsets applied in random order with one write torn.
"""
from __future__ import annotations

import os
import random
import struct
from dataclasses import dataclass

LOG_FLUSH, LOG_FUA, LOG_DISCARD, LOG_MARK = 1, 2, 4, 8
LOG_MAGIC = 0x6A736677736872
LOG_VERSION = 1
SECTOR = 512
_SUPER = struct.Struct("<QQQI")
_ENTRY = struct.Struct("<QQQQ")


class LogError(ValueError):
    """The log is not a dm-log-writes log this replayer can use."""


@dataclass(frozen=True)
class Entry:
    idx: int        # position in the log
    sector: int     # first 512-byte sector written
    nr: int         # sectors
    flags: int
    data: int       # byte offset of the data in the log (-1: none)

    @property
    def is_flush(self) -> bool:
        return bool(self.flags & LOG_FLUSH)

    @property
    def is_write(self) -> bool:
        return self.nr > 0 and not self.flags & LOG_MARK

    @property
    def end(self) -> int:
        return self.sector + self.nr


class Log:
    """The entries of a log file, and the bytes each write carried."""

    def __init__(self, path: str):
        with open(path, "rb") as f:
            self.buf = f.read()
        if len(self.buf) < SECTOR:
            raise LogError(f"{path}: {len(self.buf)} bytes: no superblock")
        magic, version, self.nr_super, ssz = _SUPER.unpack_from(self.buf, 0)
        if magic != LOG_MAGIC or version != LOG_VERSION:
            raise LogError(f"{path}: not a dm-log-writes log (magic {magic:#x}, version {version})")
        if ssz != SECTOR:
            raise LogError(f"{path}: log sector size {ssz}; this replayer takes {SECTOR} (log-sector-size=512)")
        self.entries: list[Entry] = []
        pos = SECTOR
        # Read to the end of the file, not just nr_entries: QEMU updates the superblock's count
        # at flushes only, and a fresh log file ends exactly after its last entry.
        while pos + SECTOR <= len(self.buf):
            sector, nr, flags, _dlen = _ENTRY.unpack_from(self.buf, pos)
            if flags & ~0x1F:
                raise LogError(f"{path}: entry {len(self.entries)} at byte {pos}: bad flags {flags:#x}")
            pos += SECTOR
            data = -1
            if nr and not flags & (LOG_DISCARD | LOG_MARK):
                data = pos
                pos += nr * SECTOR
                if pos > len(self.buf):
                    raise LogError(f"{path}: entry {len(self.entries)} is cut short")
            self.entries.append(Entry(len(self.entries), sector, nr, flags, data))
        if len(self.entries) < self.nr_super:
            raise LogError(f"{path}: superblock counts {self.nr_super} entries, the file holds {len(self.entries)}")

    def data(self, e: Entry, first: int = 0, count: int | None = None) -> bytes:
        """Bytes of sectors [first, first + count) of write ``e`` (zeros for a discard)."""
        count = e.nr - first if count is None else count
        if e.data < 0:
            return bytes(count * SECTOR)
        a = e.data + first * SECTOR
        return self.buf[a:a + count * SECTOR]

    def epochs(self) -> list[tuple[list[Entry], int | None]]:
        """[(the writes before a flush since the previous one, that flush's entry index)]; writes
        after the last flush make a last epoch with index None."""
        out, cur = [], []
        for e in self.entries:
            if e.is_write:
                cur.append(e)
            if e.is_flush:
                out.append((cur, e.idx))
                cur = []
        if cur:
            out.append((cur, None))
        return out

    @property
    def n_flushes(self) -> int:
        return sum(1 for e in self.entries if e.is_flush)


# A crash state of an epoch: the writes that landed, in landing order, each whole (mask None)
# or torn (a frozenset of the sector indexes, within the write, that landed).
Piece = tuple  # (position in the epoch, frozenset | None)


def _overlap(a: Entry, b: Entry) -> bool:
    return a.sector < b.end and b.sector < a.end


def canonical(ws: list[Entry], state: tuple) -> tuple:
    """One name per distinct disk content: writes that overlap nothing keep no order."""
    idx = [p for p, _ in state]
    if all(not _overlap(ws[i], ws[j]) for k, i in enumerate(idx) for j in idx[k + 1:]):
        return tuple(sorted(state, key=lambda p: p[0]))
    return tuple(state)


def _torn_masks(nr: int, rng: random.Random) -> list[frozenset]:
    if nr < 2:
        return []
    half = nr // 2
    masks = [frozenset(range(half)), frozenset(range(half, nr))]
    k = rng.randrange(1, nr)
    masks.append(frozenset(rng.sample(range(nr), k)))
    return masks


def epoch_states(ws: list[Entry], rng: random.Random, n_random: int = 8) -> list[tuple]:
    """Crash states of one epoch other than its two flush points (nothing landed; all landed in
    order), deduplicated, FUA writes kept once anything after them landed."""
    n = len(ws)
    whole = [(i, None) for i in range(n)]
    cands: list[list] = []
    cands += [whole[:p] for p in range(1, n)]                               # in-order prefixes
    if n > 1:
        cands += [whole[:j] + whole[j + 1:] for j in range(n)]              # one write lost
        cands += [[whole[j]] for j in range(n)]                             # one write alone
    for j in range(n):                                                      # one write torn
        cands += [whole[:j] + [(j, m)] for m in _torn_masks(ws[j].nr, rng)]
    for _ in range(n_random if n > 1 else 0):                               # reordered subsets
        sub = [i for i in range(n) if rng.random() < 0.5]
        rng.shuffle(sub)
        st = [(i, None) for i in sub]
        if st and rng.random() < 0.5:
            t = rng.randrange(len(st))
            masks = _torn_masks(ws[st[t][0]].nr, rng)
            if masks:
                st[t] = (st[t][0], rng.choice(masks))
        cands.append(st)
    full = canonical(ws, tuple(whole))
    seen, out = set(), []
    for st in cands:
        st = _with_fua(ws, st)
        key = canonical(ws, tuple(st))
        if not key or key == full or key in seen:
            continue
        seen.add(key)
        out.append(key)
    return out


def _with_fua(ws: list[Entry], st: list) -> list:
    """A FUA write completed before any later write was issued: it landed, whole, if they did."""
    if not st:
        return st
    last = max(p for p, _ in st)
    have = {p for p, _ in st}
    fua = [(i, None) for i in range(last) if ws[i].flags & LOG_FUA and i not in have]
    st = [(p, None) if ws[p].flags & LOG_FUA else (p, m) for p, m in st]
    return fua + st


def describe(ws: list[Entry], state: tuple, where=None, limit: int = 6) -> str:
    """Which writes of the epoch landed (whole or torn) and which were lost, with what they hit:
    'landed 12 13 14(torn: sectors [0, 1]); lost 15 (sector 2048+16 [slot 3 layer 0 span 0])'."""
    def one(e: Entry) -> str:
        w = f" {where(e.sector * SECTOR, e.nr * SECTOR)}" if where else ""
        return f"{e.idx} (sector {e.sector}+{e.nr}{w})"

    def some(xs: list[str]) -> str:
        more = f" and {len(xs) - limit} more" if len(xs) > limit else ""
        return ", ".join(xs[:limit]) + more if xs else "none"
    landed = [f"{ws[p].idx}" + (f" torn (only sectors {sorted(m)})" if m is not None else "") for p, m in state]
    have = {p for p, _ in state}
    lost = [one(ws[i]) for i in range(len(ws)) if i not in have]
    torn = [one(ws[p]) for p, m in state if m is not None]
    # Writes that are not KV objects (slot records, superblocks, the marker) are usually the story.
    def is_meta(e: Entry) -> bool:
        w = where(e.sector * SECTOR, e.nr * SECTOR) if where else "[slot "
        return not w.startswith("[slot ") or "records" in w
    meta = [one(ws[p]) for p, _ in state if is_meta(ws[p])]
    return (f"log entries landed: {some(landed)}; lost: {some(lost)}"
            + (f"; torn: {some(torn)}" if torn else "") + (f"; metadata landed: {some(meta)}" if meta else ""))


class Image:
    """A replayed disk in a sparse file, with crash states applied and undone in place."""

    def __init__(self, path: str, size: int, log: Log):
        self.path, self.size, self.log = path, size, log
        with open(path, "wb") as f:
            f.truncate(size)
        self.fd = os.open(path, os.O_RDWR)
        self._undo: list[tuple[int, bytes]] = []

    def close(self) -> None:
        os.close(self.fd)

    def _put(self, off: int, data: bytes, undo: bool) -> None:
        if off + len(data) > self.size:
            raise LogError(f"a write at byte {off} (+{len(data)}) lies beyond the {self.size}-byte image")
        if undo:
            self._undo.append((off, os.pread(self.fd, len(data), off)))
        os.pwrite(self.fd, data, off)

    def apply(self, e: Entry, mask=None, undo: bool = False) -> None:
        if mask is None:
            self._put(e.sector * SECTOR, self.log.data(e), undo)
            return
        for s in sorted(mask):
            self._put((e.sector + s) * SECTOR, self.log.data(e, s, 1), undo)

    def apply_state(self, ws: list[Entry], state: tuple) -> None:
        for p, m in state:
            self.apply(ws[p], m, undo=True)

    def undo(self) -> None:
        while self._undo:
            off, old = self._undo.pop()
            os.pwrite(self.fd, old, off)

    def read(self, off: int, n: int) -> bytes:
        return os.pread(self.fd, n, off)
