"""Find out why tests/test_gpu_store_py.py::test_layer_order_compute_waits_on_the_gpu hangs sometimes.

    python3 scripts/gpu/hang_probe.py --variant pool|own --iters K [--timeout S]

Runs that test's body K times in this process (a fresh GpuStore each time).  ``pool``: the
compute stream comes from PyTorch's stream pool, as in the test (the first use of the pool
creates 32 streams per priority, more than the 32 CUDA hardware queues); ``own``: a stream
created with cudaStreamCreateWithFlags, no pool.  A watchdog dumps, after --timeout seconds
in one iteration, every Python thread's stack, the emulated controller's state and the gio
queues' state, then exits 3.  Prints one JSON line: iterations done, seconds each.
"""
import argparse
import ctypes
import faulthandler
import json
import os
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variant", choices=["pool", "own"], default="pool")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=25.0)
    args = ap.parse_args()

    import torch
    import test_gpu_store_py as t
    from tutti.gpu import GpuStore, lib
    from tutti.gpu._ffi import ffi
    from tutti.gpu.store import DeviceKV

    libc = ctypes.CDLL(None)
    libc.fdopen.restype = ctypes.c_void_p
    err = libc.fdopen(2, b"w")
    gpu = ctypes.CDLL(os.environ["TUTTI_GPU_LIB"])
    state = {"store": None, "t0": time.monotonic(), "i": -1}

    def watchdog():
        while True:
            time.sleep(0.5)
            if time.monotonic() - state["t0"] > args.timeout:
                print(f"HANG in iteration {state['i']} after {args.timeout} s", file=sys.stderr, flush=True)
                faulthandler.dump_traceback(all_threads=True)
                s = state["store"]
                if s is not None and s._path and s._path[0] == "gio":
                    h = int(ffi.cast("uintptr_t", s._path[1]))
                    emu = gpu.tt_gio_path_emu
                    emu.restype = ctypes.c_void_p
                    e = emu(ctypes.c_void_p(h))
                    gpu.tt_emu_dump(ctypes.c_void_p(e), ctypes.c_void_p(err))
                    libc.fflush(ctypes.c_void_p(err))
                os._exit(3)
    threading.Thread(target=watchdog, daemon=True).start()

    if args.variant == "own":
        cudart = ctypes.CDLL("libcudart.so.13")
        sp = ctypes.c_void_p()
        assert cudart.cudaStreamCreateWithFlags(ctypes.byref(sp), 1) == 0
        compute = torch.cuda.ExternalStream(sp.value)
    else:
        compute = torch.cuda.Stream()
    times = []
    L = t.L
    for i in range(args.iters):
        state["i"], state["t0"] = i, time.monotonic()
        with tempfile.TemporaryDirectory(dir="/dev/shm") as d:
            paths = [os.path.join(d, "m0"), os.path.join(d, "m1")]
            t._format(paths, n_slots=256)
            nb = 96
            cache = t._cache(torch, "cuda", nb=2 * nb, seed=4 + i)
            src, dst = list(range(nb)), list(range(nb, 2 * nb))
            got = torch.zeros((L, t.S, nb, t.BS, t.KVH, t.HD), dtype=torch.bfloat16, device="cuda")
            idx = torch.tensor(dst, device="cuda")
            with torch.cuda.stream(compute):
                got[0].copy_(cache[0].index_select(1, idx))
            torch.cuda.synchronize()
            with GpuStore.open(paths, expect=t._fp()) as s:
                state["store"] = s
                s.attach("gio", n_queues=4, depth=64, n_threads=2, rate_gbps=2.0)
                kv = DeviceKV.from_tensor(cache)
                keys = [f"o{k}" for k in range(nb)]
                assert s.write(keys, kv, src).transfer() == [0] * nb
                cache[:, :, nb:] = 0
                torch.cuda.synchronize()
                tx = s.read(s.lookup(keys), kv, dst)
                for layer in range(L):
                    tx.layer(layer)
                    tx.order(layer, compute)
                    with torch.cuda.stream(compute):
                        got[layer].copy_(cache[layer].index_select(1, idx))
                compute.synchronize()
                assert tx.finish() == [0] * nb
                state["store"] = None
            assert torch.equal(got, cache[:, :, :nb]), "compute ran before its layer landed"
        times.append(round(time.monotonic() - state["t0"], 2))
    print(json.dumps({"variant": args.variant, "iters": len(times), "s": times}))
    lib()  # keep the library referenced until the end


if __name__ == "__main__":
    main()
