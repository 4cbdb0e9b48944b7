"""Fetch rate of the cluster tier vs Mooncake's own get of the same bytes, on loopback (docs/cluster.md).

Starts a mooncake_master and an owner process (its own store holding N blocks, published; and the same
bytes as raw Mooncake objects in its segment), then in this process, alternating, after one warm-up each:
ClusterNode.fetch of all N blocks (owner reads its store, transfer-engine write, checksum of the copy) and
MooncakeDistributedStore.batch_get_into of the raw objects into registered memory (no store read, no
checksum).  Prints medians and their ratio as one JSON line, and the CPU seconds per GiB each took (this
process, the owner and the master together, and each: on a small machine, what bounds the rate).  ``--owner-dir``
puts the owner's store there (e.g. /dev/shm: tmpfs, the same DRAM the raw get reads; default: a temporary
directory on disk).

``--breakdown`` also times a fetch with one batch in flight (the serial path before the pipeline;
alternating with the other two) and the parts of the fetch path on their own: the owner's verified store
read of the N blocks (in the owner, batch by batch) and the requester's copy + checksum of N blocks, with
their CPU seconds per GiB.

    .venv/bin/python benchmarks/cluster_fetch.py [--blocks 64] [--runs 5] [--owner-dir /dev/shm]
"""
import argparse
import ctypes
import json
import mmap
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from tutti import Fingerprint, Store
from tutti.cluster import ClusterConfig, ClusterError, ClusterNode
from tutti.cluster.local_master import LocalMaster, free_port

# Llama-3-8B's KV block shape: 32 layers x K/V x 16 tokens x 8 heads x 128 dims, bf16 = 2 MiB.
FP = Fingerprint(model_id="bench/llama3-8b-shape", dtype="bfloat16", n_layers=32, kv_heads=8, head_dim=128,
                 block_size=16)


def key(i):
    return f"bench|{i}".encode()


def cpu_s(*pids):
    """CPU seconds (user + system) used so far by this process and each of ``pids``."""
    r = os.times()
    out = [r.user + r.system]
    tick = os.sysconf("SC_CLK_TCK")
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        out.append((int(fields[11]) + int(fields[12])) / tick)
    return out


def cpu_since(before, *pids):
    return [b - a for a, b in zip(before, cpu_s(*pids))]


def config(a, **kw):
    return ClusterConfig(batch_blocks=a.batch, inflight_batches=a.inflight, send_threads=a.send_threads, **kw)


def owner(a):
    path, port, master, metadata, n = a.owner[0], int(a.owner[1]), a.owner[2], a.owner[3], int(a.owner[4])
    Store.format(path, FP, n_slots=n + 4)
    store = Store.open(path, expect=FP)
    bb = store.block_bytes
    for i in range(n):
        store.put(key(i), os.urandom(bb))
    # Headroom: Mooncake evicts from a segment near full, and the descriptors live in it too.
    segment = n * bb * 5 // 4 + (32 << 20)
    node = ClusterNode(store, config(a, master=master, metadata=metadata, port=port, index_bytes=segment))
    cfg = node.link.replicate_here()
    for i in range(n):
        node.link.store.put(f"bench/raw/{i}", store.get(key(i)), cfg)
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() != "read":
            break
        # The serve path's store read alone: every block, batch by batch, into the serve slot.
        slots = store.lookup([key(i) for i in range(n)])
        recs = [store.slot_record(s) for s in slots]
        blocks = [(r["key"], s, r["gen"], r["data_sum"]) for r, s in zip(recs, slots)]
        c0, t = cpu_s()[0], time.perf_counter()
        for c in range(0, n, a.batch):
            assert all(node.transfers._read_for_peer(blocks[c:c + a.batch], 0))
        print(json.dumps({"read_s": time.perf_counter() - t, "cpu_s": cpu_s()[0] - c0}), flush=True)
    node.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=64)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--batch", type=int, default=16, help="cluster_batch_blocks")
    ap.add_argument("--inflight", type=int, default=ClusterConfig.inflight_batches, help="cluster_inflight_batches")
    ap.add_argument("--send-threads", type=int, default=0, help="cluster_send_threads (0: auto)")
    ap.add_argument("--owner-dir", help="directory of the owner's store (default: a temporary one on disk)")
    ap.add_argument("--breakdown", action="store_true", help="also time the parts of the fetch path")
    ap.add_argument("--owner", nargs=5, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.owner:
        return owner(a)
    tmp = tempfile.mkdtemp(prefix="tutti-cluster-bench-")
    odir = tempfile.mkdtemp(prefix="tutti-cluster-bench-owner-", dir=a.owner_dir) if a.owner_dir else tmp
    try:
        m = LocalMaster(tmp, client_ttl=10).start()
    except ClusterError as e:
        sys.exit(f"cluster_fetch: {e}")
    master, metadata = m.address, m.metadata
    o = subprocess.Popen([sys.executable, __file__, "--batch", str(a.batch), "--inflight", str(a.inflight),
                          "--send-threads", str(a.send_threads),
                          "--owner", f"{odir}/owner.img", str(free_port()), master, metadata, str(a.blocks)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, stderr=subprocess.DEVNULL)
    try:
        assert o.stdout.readline().strip() == "ready", "owner did not start"
        Store.format(f"{tmp}/me.img", FP, n_slots=4)
        store = Store.open(f"{tmp}/me.img", expect=FP)
        bb, n = store.block_bytes, a.blocks
        node = ClusterNode(store, config(a, master=master, metadata=metadata, port=free_port(),
                                         index_bytes=16 << 20, fetch_timeout_s=60))
        keys = [key(i) for i in range(n)]
        buf = mmap.mmap(-1, n * bb)
        views = [memoryview(buf)[i * bb:(i + 1) * bb] for i in range(n)]
        addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
        assert node.link.store.register_buffer(addr, n * bb) == 0
        names = [f"bench/raw/{i}" for i in range(n)]
        if node.lookup_prefix(keys) != n:
            sys.exit(f"cluster_fetch: the owner published {node.lookup_prefix(keys)} of {n} blocks")

        cpu = {"tutti": [], "raw": []}  # CPU seconds of requester + owner + master per run

        def tutti_fetch():
            c, t = cpu_s(o.pid, m.proc.pid), time.perf_counter()
            ok = node.fetch(keys, views)
            dt = time.perf_counter() - t
            cpu["tutti"].append(cpu_since(c, o.pid, m.proc.pid))
            assert all(ok), f"{ok.count(False)} blocks missed: {node.info()['stats']}"
            return dt

        def raw_get():
            c, t = cpu_s(o.pid, m.proc.pid), time.perf_counter()
            got = node.link.store.batch_get_into(names, [addr + i * bb for i in range(n)], [bb] * n)
            dt = time.perf_counter() - t
            cpu["raw"].append(cpu_since(c, o.pid, m.proc.pid))
            assert all(g == bb for g in got), got
            return dt

        def serial_fetch():  # one batch in flight: the path before the pipeline, same nodes
            node.transfers.inflight = 1
            try:
                return tutti_fetch()
            finally:
                node.transfers.inflight = a.inflight

        tutti_fetch(), raw_get()  # warm-up: connections, segment descriptors
        tutti_s, raw_s, serial_s = [], [], []
        for _ in range(a.runs):  # alternating, so that all three see the same machine
            tutti_s.append(tutti_fetch())
            raw_s.append(raw_get())
            if a.breakdown:
                serial_s.append(serial_fetch())
        mib = n * bb / (1 << 20)
        out = {"blocks": n, "block_bytes": bb, "batch_blocks": a.batch, "inflight_batches": a.inflight,
               "send_threads": node.cfg.sends, "cpus": len(os.sched_getaffinity(0)),
               "owner_dir": a.owner_dir or "disk (temporary directory)", "runs": a.runs,
               "tutti_fetch_MiB_s": round(mib / statistics.median(tutti_s), 1),
               "mooncake_get_MiB_s": round(mib / statistics.median(raw_s), 1)}
        out["ratio"] = round(out["tutti_fetch_MiB_s"] / out["mooncake_get_MiB_s"], 3)
        gib = n * bb / (1 << 30)
        for name, what in (("tutti", "tutti"), ("mooncake", "raw")):  # the warm-up left out
            per = list(zip(*cpu[what][1:]))  # requester, owner, master
            out[f"{name}_cpu_s_per_GiB"] = round(statistics.median(map(sum, zip(*per))) / gib, 2)
            out[f"{name}_cpu_split"] = {k: round(statistics.median(v) / gib, 2)
                                        for k, v in zip(("requester", "owner", "master"), per)}
        if a.breakdown:
            reads, read_cpu = [], []
            for _ in range(a.runs):
                o.stdin.write("read\n")
                o.stdin.flush()
                r = json.loads(o.stdout.readline())
                reads.append(r["read_s"])
                read_cpu.append(r["cpu_s"])
            sums, sum_cpu = [], []
            src = bytearray(os.urandom(bb))
            for _ in range(a.runs):
                c, t = cpu_s()[0], time.perf_counter()
                for v in views:
                    v[:] = src
                    store.block_sum(v)
                sums.append(time.perf_counter() - t)
                sum_cpu.append(cpu_s()[0] - c)
            out["owner_store_read_MiB_s"] = round(mib / statistics.median(reads), 1)
            out["owner_store_read_cpu_s_per_GiB"] = round(statistics.median(read_cpu) / gib, 2)
            out["requester_copy_and_sum_MiB_s"] = round(mib / statistics.median(sums), 1)
            out["requester_copy_and_sum_cpu_s_per_GiB"] = round(statistics.median(sum_cpu) / gib, 2)
            out["one_batch_in_flight_MiB_s"] = round(mib / statistics.median(serial_s), 1)
        print(json.dumps(out))
        node.close()
    finally:
        if o.poll() is None:
            o.stdin.write("\n")
            o.stdin.flush()
            o.wait(30)
        m.kill()
        shutil.rmtree(tmp, ignore_errors=True)
        if odir != tmp:
            shutil.rmtree(odir, ignore_errors=True)


if __name__ == "__main__":
    main()
