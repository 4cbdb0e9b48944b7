#!/usr/bin/env python3
"""Power-loss replay of a Tutti store: rebuild the disk at every flush point and at crash states
between flushes from QEMU's blklogwrites log, then open it, run ``tutti-admin check`` and read
every key, against the ground truth the guest's workload (pl_writer.c) printed.

    replay.py --log a.log --journal powerloss.results.log --engine kqueue [--disk a.img]
              [--crash-states 1000] [--seed 1] [--json out.json]

What must hold in every state, with ``m`` the last operation whose "acknowledged" marker the
state holds (pl_writer writes it after each operation returned, and flushes):
- before the format was acknowledged: no store, or an empty one;
- the store opens; ``tutti-admin check`` is clean (else ``--repair`` must leave it clean, and the
  state still counts as a failure: the commit protocol promises clean);
- every key is read with checksums off (so a record pointing at data that never landed shows as
  wrong bytes instead of being caught by a checksum): a key served must carry exactly the bytes
  of a version it had when op m returned or that op m+1 wrote (anything else is *wrong*, or
  *stale* if it is an older version);
- every (key, version) the store held when op m returned and still held after op m+1 (which may
  have evicted or dropped some) is served exactly (else *lost*).
Prints TAP lines ("ok - ..."), "# " details of the first failures (which flush point, which
writes landed, lost or were torn, and what they hit), and with --json the counts.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import struct
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dmlog import SECTOR, Image, Log, LogError, describe, epoch_states

PL_MAGIC = 0x4B424C50
MARK_MAGIC = b"TTPLMARK"
MAX_DETAILS = 12
FAILURES = ("wrong", "stale", "lost", "unclean", "open_failed", "unknown_keys", "recover_failed")


def parse_journal(lines, engine: str) -> dict:
    """The writer's journal for ``engine``: begin parameters, ops' writes, acknowledged sets."""
    j = {"begin": None, "w": {}, "ack": {}, "inv": {}, "abort": {}, "end": None}
    pre = f"PL {engine} "
    for line in lines:
        line = line.strip().replace("\r", "")
        if not line.startswith(pre):
            continue
        kind, _, rest = line[len(pre):].partition(" ")
        if kind in ("BEGIN", "END"):
            j[kind.lower()] = dict(kv.split("=", 1) for kv in rest.split())
            continue
        n_s, _, body = rest.partition(" ")
        n = int(n_s)
        items = [] if body in ("", "-") else body.split(",")
        if kind == "INV":
            j["inv"][n] = [int(k) for k in items]
        elif kind in ("W", "ACK", "ABORT"):
            d = {}
            for it in items:
                k, v = it.split(":")
                d[int(k)] = int(v)
            if kind == "ACK":
                j["ack"][n] = d
            else:               # two transactions of one op: two W lines
                j[kind.lower()].setdefault(n, {}).update(d)
    if j["begin"] is None:
        raise ValueError(f"no 'PL {engine} BEGIN' line: the guest's writer did not get past format")
    return j


def block_bytes(k: int, v: int, n_objs: int, span: int, _cache={}) -> bytes:  # noqa: B006 - a memo, on purpose
    """What pl_writer.c's gen_block() writes for (key k, version v)."""
    key = (k, v, n_objs, span)
    if key not in _cache:
        units = span // 16
        _cache[key] = b"".join(struct.pack("<4I", PL_MAGIC, k, v, m << 16 | u)
                               for m in range(n_objs) for u in range(units))
    return _cache[key]


def read_marker(img: Image, off: int, seed: int):
    raw = img.read(off, 32)
    if raw == bytes(32):
        return None
    magic, (n, s, chk) = raw[:8], struct.unpack_from("<QQQ", raw, 8)
    want = (n * 0x9E3779B97F4A7C15 ^ s ^ 0x5A5A5A5A5A5A5A5A) & (2**64 - 1)
    if magic != MARK_MAGIC or s != seed or chk != want:
        raise LogError(f"marker at byte {off} is damaged: {raw.hex()}")
    return n


def _brief(out: str) -> str:
    """tutti-admin check --json output in one line: what it found bad."""
    try:
        r = json.loads(out)
    except ValueError:
        return " ".join(out.split())[:300]
    return (f"{r.get('bad', 0)} bad slot(s) {r.get('bad_slots', [])}, {r.get('bad_records', 0)} damaged "
            f"record(s), {r.get('repaired', 0)} repaired, {r.get('remaining_problems', 0)} problem(s) left")


class Checker:
    """Checks one replayed state; counts outcomes and keeps the first failures' details."""

    def __init__(self, journal: dict, engine: str):
        self.j, self.engine = journal, engine
        b = journal["begin"]
        self.seed, self.n_keys = int(b["seed"]), int(b["keys"])
        self.mark_off = int(b["mark_off"])
        self.last_op = max(journal["ack"])
        self.counts = {"states": 0, "opened": 0, "no_store": 0, "served": 0, "wrong": 0, "stale": 0,
                       "lost": 0, "unclean": 0, "repaired": 0, "unrepaired": 0, "open_failed": 0,
                       "unknown_keys": 0, "keys_required": 0, "recovered": 0, "recover_failed": 0}
        self.recover_every = 4
        self.failures: list[str] = []
        self.geo = None
        from click.testing import CliRunner

        from tutti.cli import main
        self._runner, self._cli = CliRunner(), main

    def admin(self, *args) -> tuple[int, str]:
        """``tutti-admin ARGS`` in this process (the real command; no interpreter start per state)."""
        r = self._runner.invoke(self._cli, list(args), catch_exceptions=True)
        if r.exception and not isinstance(r.exception, SystemExit):
            return 99, f"{type(r.exception).__name__}: {r.exception}"
        return r.exit_code, r.output

    def expected(self, m):
        ack = self.j["ack"]
        now = ack.get(m, {})
        nxt = ack.get(m + 1)
        required = {k: v for k, v in now.items() if nxt is None or nxt.get(k) == v}
        allowed = {k: {v} for k, v in now.items()}
        for k, v in self.j["w"].get(m + 1, {}).items():
            allowed.setdefault(k, set()).add(v)
        return required, allowed

    def fail(self, what: str, where: str) -> None:
        if len(self.failures) < MAX_DETAILS:
            self.failures.append(f"{what} — {where}")

    def check(self, img: Image, where: str) -> bool:
        from tutti.errors import TuttiError
        from tutti.store import Store

        c = self.counts
        c["states"] += 1
        bad0 = sum(c[k] for k in FAILURES)
        m = read_marker(img, self.mark_off, self.seed)
        try:
            s = Store.open(img.path, readonly=True, verify=False, engine="psync")
        except TuttiError as e:
            if m is None:
                c["no_store"] += 1
                return True
            c["open_failed"] += 1
            self.fail(f"op {m} acknowledged but the store does not open: {e}", where)
            return False
        c["opened"] += 1
        with s:
            self.geo = s.geometry
            required, allowed = self.expected(m) if m is not None else ({}, {})
            c["keys_required"] += len(required)
            g = s.geometry
            n_objs = g.n_layers * g.n_spans
            found = 0
            for k in range(self.n_keys):
                try:
                    got = s.get(f"pl-{k}")
                except KeyError:
                    if k in required:
                        c["lost"] += 1
                        self.fail(f"key {k} version {required[k]} (held after op {m}) is missing", where)
                    continue
                found += 1
                c["served"] += 1
                magic, kk, v = struct.unpack_from("<3I", got, 0)
                if magic != PL_MAGIC or kk != k or got != block_bytes(k, v, n_objs, g.span_bytes):
                    c["wrong"] += 1
                    self.fail(f"key {k}: served bytes that are no version of it (first unit {got[:16].hex()})", where)
                elif self.j["abort"].get(v, {}).get(k) == v:
                    c["wrong"] += 1
                    self.fail(f"key {k}: served version {v}, written by a transaction that was aborted", where)
                elif v not in allowed.get(k, ()):
                    c["stale"] += 1
                    self.fail(f"key {k}: served version {v}; after op {m} only "
                              f"{sorted(allowed.get(k, ()))} may be", where)
                elif k in required and required[k] != v:
                    c["lost"] += 1
                    self.fail(f"key {k}: served version {v} instead of {required[k]}", where)
            extra = len(s.committed()) - found
            if extra:
                c["unknown_keys"] += 1
                self.fail(f"{extra} committed record(s) under keys the workload never wrote", where)
        rc, out = self.admin("check", img.path, "--json")
        if rc != 0:
            c["unclean"] += 1
            self.fail(f"tutti-admin check exit {rc}: {_brief(out)}", where)
            self._repair(img, where)
        elif self.recover_every and c["opened"] % self.recover_every == 0:
            self._recover(img, m, where)
        return bad0 == sum(c[k] for k in FAILURES)

    def _scratch_copy(self, img: Image, d: str) -> str:
        """The store's bytes (and the marker) in a sparse copy."""
        cp = os.path.join(d, "copy.img")
        member = int(self.j["begin"]["member_bytes"])
        with open(cp, "wb") as f:
            f.truncate(img.size)
            f.write(img.read(0, member))
            f.seek(self.mark_off)
            f.write(img.read(self.mark_off, 4096))
        return cp

    def _recover(self, img: Image, m, where: str) -> None:
        """A crashed store must stay usable: on a copy, store new blocks (the store is full, so they
        evict), reopen with checksums on, check clean, and every block served is still right."""
        from tutti.store import Store

        d = tempfile.mkdtemp(prefix="pl-recover-", dir=os.path.dirname(img.path))
        try:
            cp = self._scratch_copy(img, d)
            with Store.open(cp, engine="psync") as s:
                g = s.geometry
                n_objs = g.n_layers * g.n_spans
                new = {self.n_keys + i: 1 for i in range(3)}
                for k, v in new.items():
                    s.put(f"pl-{k}", block_bytes(k, v, n_objs, g.span_bytes))
            rc, out = self.admin("check", cp, "--json")
            _, allowed = self.expected(m) if m is not None else ({}, {})
            bad = [] if rc == 0 else [f"check exit {rc}: {_brief(out)}"]
            with Store.open(cp, readonly=True, engine="psync") as s:
                for k in range(self.n_keys + len(new)):
                    try:
                        got = s.get(f"pl-{k}")
                    except KeyError:
                        if k in new:
                            bad.append(f"new key {k} missing")
                        continue
                    v = struct.unpack_from("<3I", got, 0)[2]
                    ok_v = {new[k]} if k in new else allowed.get(k, set())
                    if v not in ok_v or got != block_bytes(k, v, n_objs, g.span_bytes):
                        bad.append(f"key {k} served wrong after new writes")
        except Exception as e:  # noqa: BLE001 - any failure to use the store is the finding
            bad = [f"{type(e).__name__}: {e}"]
        finally:
            shutil.rmtree(d, ignore_errors=True)
        if bad:
            self.counts["recover_failed"] += 1
            self.fail("writing to the crashed store: " + "; ".join(bad[:3]), where)
        else:
            self.counts["recovered"] += 1

    def _repair(self, img: Image, where: str) -> None:
        """check --repair on a copy (the replay goes on from the unrepaired image); clean after?"""
        d = tempfile.mkdtemp(prefix="pl-repair-", dir=os.path.dirname(img.path))
        try:
            cp = self._scratch_copy(img, d)
            rc1, out1 = self.admin("check", cp, "--repair", "--json")
            rc2, out2 = self.admin("check", cp, "--json")
            if rc1 == 0 and rc2 == 0:
                self.counts["repaired"] += 1
            else:
                self.counts["unrepaired"] += 1
                self.fail(f"check --repair exit {rc1} ({_brief(out1)}), then check exit {rc2} ({_brief(out2)})", where)
        finally:
            shutil.rmtree(d, ignore_errors=True)

    def where(self, off: int, n: int) -> str:
        """What a byte range of the member holds (superblock, slot table, objects, marker)."""
        g = self.geo
        if off >= self.mark_off:
            return "[ack marker]"
        if off < 8192:
            return "[superblock]"
        if g is None or off < g.data_off:
            if g is None:
                return "[header]"
            r0, r1 = (off - 8192) // 64, (off + n - 8192 - 1) // 64
            return f"[slot records {r0}..{min(r1, g.n_slots - 1)}]" if r0 < g.n_slots else "[table padding]"
        seq0, seq1 = (off - g.data_off) // g.obj_stride, (off + n - 1 - g.data_off) // g.obj_stride
        parts = []
        for seq in range(seq0, seq1 + 1):
            m, slot = divmod(seq, g.n_slots)
            parts.append(f"slot {slot} layer {m // g.n_spans} span {m % g.n_spans}")
        if len(parts) > 3:
            parts = parts[:2] + [f"... {len(parts) - 2} more objects"]
        return "[" + ", ".join(parts) + "]"


def pick_states(epochs, budget: int, rng: random.Random) -> list[list]:
    """Crash states to check per epoch: drawn per epoch (epoch_states), then taken round-robin
    over the epochs up to ``budget`` (a budget of at least their number takes them all)."""
    per_epoch = [epoch_states(ws, rng) for ws, _ in epochs]
    picks = [[] for _ in epochs]
    while budget > 0 and any(per_epoch):
        for i, cands in enumerate(per_epoch):
            if cands and budget > 0:
                picks[i].append(cands.pop(rng.randrange(len(cands))))
                budget -= 1
    return picks


def replay(log: Log, journal: dict, engine: str, *, crash_states: int, seed: int = 1, disk: str | None = None,
           tmpdir: str | None = None, recover_every: int = 4) -> tuple[list, dict, list]:
    """Check every flush point and ``crash_states`` states between flushes of ``log``.

    Returns (TAP results as (ok, text), counts, details of the first failures)."""
    ck = Checker(journal, engine)
    ck.recover_every = recover_every
    # Thousands of small images, each written then read with O_DIRECT: memory, not a disk.
    if tmpdir is None and os.path.isdir("/dev/shm"):
        tmpdir = "/dev/shm"
    tmp = tempfile.mkdtemp(prefix=f"pl-{engine}-", dir=tmpdir)
    t0 = time.monotonic()
    epochs = log.epochs()
    picks = pick_states(epochs, crash_states, random.Random(seed))
    flush_ok = flush_n = crash_ok = crash_n = 0
    disk_same = None
    try:
        img = Image(os.path.join(tmp, "member.img"), ck.mark_off + 4096, log)
        ck.check(img, "the blank drive")
        for i, (ws, fidx) in enumerate(epochs):
            at = f"flush at log entry {fidx}" if fidx is not None else "the end of the log"
            for st in picks[i]:
                img.apply_state(ws, st)
                crash_n += 1
                crash_ok += ck.check(img, f"crash before the {at}: " + describe(ws, st, ck.where))
                img.undo()
            for e in ws:
                img.apply(e)
            # A flush with no write since the last one leaves the state just checked.
            if fidx is not None:
                flush_n += 1
                flush_ok += ck.check(img, f"the {at}") if ws else 1
            else:
                crash_n += 1
                crash_ok += ck.check(img, "the end of the log: every unflushed write landed")
        if disk:
            member = int(journal["begin"]["member_bytes"])
            with open(disk, "rb") as f:
                real = f.read(member)
                f.seek(ck.mark_off)
                real_mark = f.read(4096)
            disk_same = real == img.read(0, member) and real_mark == img.read(ck.mark_off, 4096)
        img.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    c = ck.counts
    n_w = sum(len(ws) for ws, _ in epochs)
    ops = int(journal["end"]["ops"]) if journal["end"] else ck.last_op
    puts = int(journal["end"]["puts"]) if journal["end"] else None
    e = engine
    tap = [(journal["end"] is not None,
            f"[{e}] the guest's writer finished: {ops} operations ({puts} write sequences) acknowledged "
            f"(seed {journal['begin']['seed']})"),
           (True, f"[{e}] log: {len(log.entries)} entries, {log.n_flushes} flushes, {n_w} writes "
                  f"({sum(w.nr for ws, _ in epochs for w in ws) * SECTOR / 2**20:.1f} MiB)")]
    if disk_same is not None:
        tap.append((disk_same, f"[{e}] the log replayed in full equals the drive's final image"))
    tap += [
        (flush_ok == flush_n and flush_n > 0,
         f"[{e}] every flush point ({flush_ok} of {flush_n}): opens, check clean, every acknowledged key exact"),
        (crash_ok == crash_n and crash_n >= min(crash_states, 1),
         f"[{e}] between-flush crash states ({crash_ok} of {crash_n}; writes dropped, reordered, torn): "
         f"opens, check clean, every acknowledged key exact"),
        (c["wrong"] == 0 and c["stale"] == 0,
         f"[{e}] 0 wrong bytes served: {c['served']} reads, {c['wrong']} wrong, {c['stale']} stale"),
        (c["lost"] == 0, f"[{e}] 0 acknowledged keys lost ({c['keys_required']} required reads over all states)"),
        (c["unclean"] == 0 and c["open_failed"] == 0,
         f"[{e}] tutti-admin check clean in all {c['opened']} states with a store ({c['unclean']} unclean, "
         f"{c['repaired']} repaired, {c['open_failed']} failed to open; {c['no_store']} before the format landed)"),
        (c["recover_failed"] == 0 and c["recovered"] > 0,
         f"[{e}] the crashed store stays usable: {c['recovered']} states written to, reopened, checked clean "
         f"({c['recover_failed']} failed)"),
    ]
    summary = {"engine": e, "ops": ops, "write_sequences": puts, "log_entries": len(log.entries),
               "flushes": log.n_flushes, "writes": n_w, "flush_points": flush_n, "flush_points_ok": flush_ok,
               "crash_states": crash_n, "crash_states_ok": crash_ok,
               "seconds": round(time.monotonic() - t0, 1), "disk_matches": disk_same, **c}
    return tap, summary, ck.failures


def run(args) -> int:
    log = Log(args.log)
    with open(args.journal, errors="replace") as f:
        journal = parse_journal(f, args.engine)
    tap, summary, failures = replay(log, journal, args.engine, crash_states=args.crash_states, seed=args.seed,
                                    disk=args.disk, tmpdir=args.tmpdir)
    for good, text in tap:
        print(f"{'ok' if good else 'not ok'} - {text}")
    for d in failures:
        print(f"# FAIL {d}")
    print(f"# replay summary: {json.dumps(summary)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    return 0 if all(g for g, _ in tap) else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--log", required=True, help="blklogwrites log of the drive")
    ap.add_argument("--journal", required=True, help="the guest's output (results log) with the PL lines")
    ap.add_argument("--engine", required=True, help="which writer's journal (its ENGINE argument)")
    ap.add_argument("--disk", help="the drive's image after the run: must equal the full replay")
    ap.add_argument("--crash-states", type=int, default=1000, help="between-flush crash states to check")
    ap.add_argument("--seed", type=int, default=1, help="seed of the crash-state choice")
    ap.add_argument("--tmpdir", help="where the replayed images live (default: /dev/shm)")
    ap.add_argument("--json", help="write the counts here")
    args = ap.parse_args(argv)
    try:
        return run(args)
    except (LogError, ValueError, OSError) as e:
        print(f"not ok - [{args.engine}] replay: {e}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
