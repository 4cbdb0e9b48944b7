"""One cluster node as its own process, driven by JSON lines on stdin (tests/cluster).

argv: store path, model id, endpoint port, master, metadata URL.  Each command line is answered by one
JSON line on stdout: {"ok": ...} or {"error": "..."}.  Blocks are made from (seed) so every process
knows what a block must hold.
"""
import json
import os
import random
import sys

from tutti import Fingerprint, Store
from tutti.cluster import ClusterConfig, ClusterNode


def block(seed: int, n: int) -> bytes:
    return random.Random(seed).randbytes(n)


def key(seed: int, model: str) -> bytes:
    return f"tutti-vllm-v1|{model}|prefix|{seed}".encode()


def main():
    path, model, port, master, metadata = sys.argv[1:6]
    tp_rank, tp_size = map(int, os.environ.get("NODE_TP", "0/1").split("/"))  # a rank of a TP engine
    fp = Fingerprint(model_id=model, dtype="float16", n_layers=4, kv_heads=2, head_dim=64, block_size=16,
                     tp_rank=tp_rank, tp_size=tp_size)
    if not os.path.exists(path):
        Store.format(path, fp, n_slots=int(os.environ.get("NODE_SLOTS", "64")))
    store = Store.open(path, expect=fp)
    cfg = ClusterConfig(master=master, metadata=metadata, port=int(port),
                        call_timeout_s=float(os.environ.get("NODE_CALL_TIMEOUT", "2")),
                        fetch_timeout_s=float(os.environ.get("NODE_FETCH_TIMEOUT", "5")),
                        keeper_interval_s=0.5, index_bytes=16 << 20,
                        batch_blocks=int(os.environ.get("NODE_BATCH", "8")),
                        inflight_batches=int(os.environ.get("NODE_INFLIGHT", "4")),
                        send_threads=int(os.environ.get("NODE_SENDS", "0")),
                        peer_quarantine_s=float(os.environ.get("NODE_QUARANTINE", "30")),
                        replicas=int(os.environ.get("NODE_REPLICAS", "0")))
    node = ClusterNode(store, cfg, group=os.environ.get("NODE_GROUP", ""))
    bb = store.block_bytes
    print(json.dumps({"ok": "ready", "block_bytes": bb}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        try:
            if op == "put":
                keys = [key(s, cmd.get("model", model)) for s in cmd["seeds"]]
                with node.store_lock:
                    for k, s in zip(keys, cmd["seeds"]):
                        store.put(k, block(s, bb))
                out = node.publish(keys) if cmd.get("publish", True) else 0
            elif op == "fetch":
                keys = [key(s, cmd.get("model", model)) for s in cmd["seeds"]]
                bufs = [bytearray(bb) for _ in keys]
                ok = node.fetch(keys, bufs)
                out = {"ok": ok, "exact": [good and bytes(b) == block(s, bb)
                                           for good, b, s in zip(ok, bufs, cmd["seeds"])]}
            elif op == "replicate":  # fetch_into_store: kept here, read back from this store
                if "chunk_bytes" in cmd:
                    node.REPLICA_CHUNK_BYTES = cmd["chunk_bytes"]
                keys = [key(s, cmd.get("model", model)) for s in cmd["seeds"]]
                transient: list = []
                ok = node.fetch_into_store(keys, transient)
                with node.store_lock:
                    out = {"ok": ok, "exact": [good and key_ in store and store.get(key_) == block(s, bb)
                                               for good, key_, s in zip(ok, keys, cmd["seeds"])],
                           "flushes": store.stats()["engine"]["flushes"],
                           "transient": [s for s, k in zip(cmd["seeds"], keys) if k in transient]}
            elif op == "drop":  # transient copies used: out of the store, claims released
                out = len(node.drop([key(s, model) for s in cmd["seeds"]]))
            elif op == "holds":  # which of these blocks this node's own store holds
                with node.store_lock:
                    out = [x is not None for x in store.lookup([key(s, model) for s in cmd["seeds"]])]
            elif op == "prefix":
                out = node.lookup_prefix([key(s, cmd.get("model", model)) for s in cmd["seeds"]])
            elif op == "withdraw":
                out = node.withdraw([key(s, model) for s in cmd["seeds"]])
            elif op == "evict":  # drop from the store without telling the cluster (a stale descriptor)
                with node.store_lock:
                    slots = [x for x in store.lookup([key(s, model) for s in cmd["seeds"]]) if x is not None]
                    out = store.invalidate(slots)
            elif op == "overwrite":  # slot reused: same key re-stored with other bytes, not re-published
                with node.store_lock:
                    ks = [key(s, model) for s in cmd["seeds"]]
                    store.invalidate([x for x in store.lookup(ks) if x is not None])
                    for k, s in zip(ks, cmd["seeds"]):
                        store.put(k, block(s + 1_000_000, bb))
                out = len(ks)
            elif op == "raw_put":  # write a raw value under a block's index name (a hostile/stale value)
                name = node.index.name_of(node.index.store_key(key(cmd["seed"], model)))
                out = node.link.store.upsert(name, bytes.fromhex(cmd["value"]))
            elif op == "raw_get":
                name = node.index.name_of(node.index.store_key(key(cmd["seed"], model)))
                out = node.link.store.get(name).hex()
            elif op == "info":
                out = node.info()
            elif op == "record":  # refresh this node's record now (the keeper does every 10 s)
                node.index.publish_record()
                out = True
            elif op == "close":
                node.close()
                print(json.dumps({"ok": True}), flush=True)
                return
            else:
                raise ValueError(f"unknown op {op}")
            print(json.dumps({"ok": out}), flush=True)
        except Exception as e:  # noqa: BLE001 - reported to the test
            print(json.dumps({"error": f"{type(e).__name__}: {e}"}), flush=True)


if __name__ == "__main__":
    main()
