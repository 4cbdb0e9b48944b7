"""Writer for crash trials: rewrites a small store forever until it is SIGKILLed.

Every block is derived from (key, version) and starts with both, so after a
crash a reader can tell exactly which write it sees and that no byte of it
is torn or misplaced.  With more keys than slots the writer keeps evicting,
and it overwrites keys (invalidate, then store a new version) and drops them.

    python tests/helpers/crash_writer.py STORE_PATH... [--seed N] [--trial T]
formats nothing: the store must exist (see FINGERPRINT / N_SLOTS).
"""
import argparse
import hashlib
import random
import struct

from tutti import Fingerprint, PagedBuffer, Store

# 2 layers x 2 spans of 4 KiB: 16 KiB blocks, so a trial writes hundreds of them.
FINGERPRINT = Fingerprint(model_id="tests/crash", dtype="float16", n_layers=2, kv_heads=1,
                          head_dim=128, block_size=16)
N_SLOTS = 8
N_KEYS = 20
VERSIONS_PER_TRIAL = 1 << 32
_HEADER = struct.Struct("<QQ")


def key_name(k: int) -> str:
    return f"crash-key-{k}"


def block_data(k: int, version: int, size: int) -> bytes:
    header = _HEADER.pack(k, version)
    return header + hashlib.shake_128(header).digest(size - len(header))


def parse_block(data: bytes):
    """(key index, version) a block claims to be; verify with block_data()."""
    return _HEADER.unpack_from(data)


def run(paths, seed: int, trial: int, on_ready=None, on_op=None) -> None:
    """Write forever.  ``on_ready()`` once the store is open, ``on_op()`` after each op."""
    rng = random.Random(seed)
    version = trial * VERSIONS_PER_TRIAL
    with Store.open(paths) as s, PagedBuffer.for_geometry(s.geometry, 4) as buf:
        size = s.block_bytes
        if on_ready:
            on_ready()
        while True:
            version += 1
            op = rng.random()
            k = rng.randrange(N_KEYS)
            if op < 0.45:  # one block; an existing key is overwritten half the time
                slot = s.lookup([key_name(k)])[0]
                if slot is not None and rng.random() < 0.5:
                    s.invalidate([slot])
                s.put(key_name(k), block_data(k, version, size))
            elif op < 0.9:  # a layer-wise batch from scattered memory blocks
                ks = rng.sample(range(N_KEYS), 3)
                ids = rng.sample(range(4), 3)
                for kk, b in zip(ks, ids):
                    buf.set_contiguous_block(b, block_data(kk, version, size))
                with s.write([key_name(kk) for kk in ks]) as txn:
                    for layer in range(s.geometry.n_layers):
                        txn.layer(layer, buf, ids)
                    for layer in range(s.geometry.n_layers):
                        txn.wait_layer(layer)
                    txn.finish()
            else:  # drop a key
                slot = s.lookup([key_name(k)])[0]
                if slot is not None:
                    s.invalidate([slot])
            if on_op:
                on_op()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--trial", type=int, default=0)
    args = ap.parse_args()
    run(args.paths, args.seed, args.trial)


if __name__ == "__main__":
    main()
