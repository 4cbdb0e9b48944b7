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
    from tutti.gpu import lib
    from tutti.gpu._ffi import ffi

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
                if s is not None and s.path == "gio":
                    h = int(ffi.cast("uintptr_t", s._owned.path.ctx))
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
    for i in range(args.iters):
        state["i"], state["t0"] = i, time.monotonic()
        with tempfile.TemporaryDirectory(dir="/dev/shm") as d:
            rig = t.LayerOrderRig(torch, [os.path.join(d, "m0"), os.path.join(d, "m1")], compute, seed=4 + i)
            state["store"] = rig.store
            landed = rig.read_round()
            state["store"] = None
            rig.close()
            assert landed, "compute ran before its layer landed"
        times.append(round(time.monotonic() - state["t0"], 2))
    print(json.dumps({"variant": args.variant, "iters": len(times), "s": times}))
    lib()  # keep the library referenced until the end


if __name__ == "__main__":
    main()
