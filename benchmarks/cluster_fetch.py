"""Fetch rate of the cluster tier vs Mooncake's own get of the same bytes, on loopback (docs/cluster.md).

Starts a mooncake_master and an owner process (its own store holding N blocks, published; and the same
bytes as raw Mooncake objects in its segment), then in this process: ClusterNode.fetch of all N blocks
(owner reads its store, transfer engine write, checksum of the copy), and MooncakeDistributedStore
.batch_get_into of the raw objects into registered memory (no store read, no checksum).

    .venv/bin/python benchmarks/cluster_fetch.py [--blocks 64] [--runs 5]
"""
import argparse
import ctypes
import json
import mmap
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from tutti import Fingerprint, Store
from tutti.cluster import ClusterConfig, ClusterNode

# Llama-3-8B's KV block shape: 32 layers x K/V x 16 tokens x 8 heads x 128 dims, bf16 = 2 MiB.
FP = Fingerprint(model_id="bench/llama3-8b-shape", dtype="bfloat16", n_layers=32, kv_heads=8, head_dim=128,
                 block_size=16)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def key(i):
    return f"bench|{i}".encode()


def owner(path, port, master, metadata, n):
    Store.format(path, FP, n_slots=n + 4)
    store = Store.open(path, expect=FP)
    bb = store.block_bytes
    for i in range(n):
        store.put(key(i), os.urandom(bb))
    node = ClusterNode(store, ClusterConfig(master=master, metadata=metadata, port=port,
                                            index_bytes=(n + 8) * bb, batch_blocks=16))
    cfg = node.link.replicate_here()
    for i in range(n):
        node.link.store.put(f"bench/raw/{i}", store.get(key(i)), cfg)
    print("ready", flush=True)
    sys.stdin.readline()
    node.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=64)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--owner", nargs=5, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.owner:
        path, port, master, metadata, n = a.owner
        return owner(path, int(port), master, metadata, int(n))
    tmp = tempfile.mkdtemp(prefix="tutti-cluster-bench-")
    rpc, http, metrics = free_port(), free_port(), free_port()
    exe = shutil.which("mooncake_master", path=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    m = subprocess.Popen([exe, f"--rpc_port={rpc}", "--rpc_address=127.0.0.1", "--enable_http_metadata_server=true",
                          "--http_metadata_server_host=127.0.0.1", f"--http_metadata_server_port={http}",
                          "--metrics_host=127.0.0.1", f"--metrics_port={metrics}"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.5)
    master, metadata = f"127.0.0.1:{rpc}", f"http://127.0.0.1:{http}/metadata"
    o = subprocess.Popen([sys.executable, __file__, "--owner", f"{tmp}/owner.img", str(free_port()), master,
                          metadata, str(a.blocks)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                         stderr=subprocess.DEVNULL)
    try:
        assert o.stdout.readline().strip() == "ready", "owner did not start"
        Store.format(f"{tmp}/me.img", FP, n_slots=4)
        store = Store.open(f"{tmp}/me.img", expect=FP)
        bb, n = store.block_bytes, a.blocks
        node = ClusterNode(store, ClusterConfig(master=master, metadata=metadata, port=free_port(),
                                                index_bytes=16 << 20, batch_blocks=16, fetch_timeout_s=60))
        keys = [key(i) for i in range(n)]
        buf = mmap.mmap(-1, n * bb)
        views = [memoryview(buf)[i * bb:(i + 1) * bb] for i in range(n)]
        tutti_s, raw_s = [], []
        for _ in range(a.runs):
            t = time.perf_counter()
            ok = node.fetch(keys, views)
            tutti_s.append(time.perf_counter() - t)
            assert all(ok), f"{ok.count(False)} blocks missed"
        addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
        assert node.link.store.register_buffer(addr, n * bb) == 0
        names = [f"bench/raw/{i}" for i in range(n)]
        for _ in range(a.runs):
            t = time.perf_counter()
            got = node.link.store.batch_get_into(names, [addr + i * bb for i in range(n)], [bb] * n)
            raw_s.append(time.perf_counter() - t)
            assert all(g == bb for g in got), got
        mib = n * bb / (1 << 20)
        out = {"blocks": n, "block_bytes": bb, "runs": a.runs,
               "tutti_fetch_MiB_s": round(mib / statistics.median(tutti_s), 1),
               "mooncake_get_MiB_s": round(mib / statistics.median(raw_s), 1)}
        out["ratio"] = round(out["tutti_fetch_MiB_s"] / out["mooncake_get_MiB_s"], 3)
        print(json.dumps(out))
        node.close()
    finally:
        if o.poll() is None:
            o.stdin.write("\n")
            o.stdin.flush()
            o.wait(30)
        m.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
