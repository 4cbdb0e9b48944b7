"""libtutti's CUDA code never queues work on the legacy default stream, nor makes blocking streams.

Why: libtutti runs beside a framework (PyTorch) whose compute sits on stream 0.  Work the library put there
would wait for that compute, unordered against the library's own non-blocking streams: a completion counter
zeroed there (tt_gio_batch_create did, with cudaMemset) could reset under a running gio batch, which then
spins forever.  A blocking stream (cudaStreamCreate without flags) implicitly waits for stream 0 too, and the
emulated controller's copies waiting for compute that waits for those copies is a deadlock.  These rules are
checked on the sources, so CI (no GPU) catches a regression the GPU tests would only show as a rare hang.

Nor does it wait for the whole device: cudaDeviceSynchronize() (cudaThreadSynchronize, cuCtxSynchronize)
also waits for the caller's compute, which may itself wait (an event, a flag) for what the caller does after
the library returns.  tt_gio_batch_result did, and hung on the H200 while compute streams held the GPU.
"""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GPU_SRC = ROOT / "libtutti" / "src" / "gpu"

# Runtime calls that always use the legacy default stream (their *Async forms take a stream).
LEGACY_CALLS = ("cudaMemset", "cudaMemcpy", "cudaMemcpy2D", "cudaMemcpy3D", "cudaMemcpyToSymbol",
                "cudaMemcpyFromSymbol", "cudaMemcpyPeer", "cudaStreamCreate")
LEGACY_STREAM_NAMES = {"0", "nullptr", "NULL", "cudaStreamLegacy"}
# Waits for every stream of the context, the caller's compute included.
DEVICE_WAITS = ("cudaDeviceSynchronize", "cudaThreadSynchronize", "cuCtxSynchronize")


def strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def split_args(s: str) -> list:
    out, depth, cur = [], 0, ""
    for ch in s:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    out.append(cur.strip())
    return out


def violations(text: str) -> list:
    code = strip_comments(text)
    found = []
    for name in LEGACY_CALLS:
        for m in re.finditer(r"\b%s\s*\(" % re.escape(name), code):
            found.append((code.count("\n", 0, m.start()) + 1, f"{name}() runs on the legacy default stream"
                          if name != "cudaStreamCreate" else "cudaStreamCreate() makes a blocking stream"))
    for name in DEVICE_WAITS:
        for m in re.finditer(r"\b%s\s*\(" % re.escape(name), code):
            found.append((code.count("\n", 0, m.start()) + 1, f"{name}() waits for the caller's compute too"))
    for m in re.finditer(r"<<<(.*?)>>>", code, flags=re.S):
        args = split_args(m.group(1))
        line = code.count("\n", 0, m.start()) + 1
        if len(args) < 4 or args[3] in LEGACY_STREAM_NAMES:
            found.append((line, f"kernel launch <<<{m.group(1).strip()}>>> on the legacy default stream"))
    return found


def gpu_sources() -> list:
    return sorted(p for p in GPU_SRC.iterdir() if p.suffix in (".cu", ".cuh"))


def test_the_rules_catch_what_they_are_for():
    bad = """
        cudaMemset(b->done, 0, 4);          // the gio_uring bug
        k<<<1, 32>>>(a);
        k<<<g, b, 0, 0>>>(a);
        cudaStreamCreate(&s);
        /* cudaMemcpy(d, s, n, k) in a comment is fine */
        cudaMemsetAsync(p, 0, n, s);
        k<<<g, b, 0, s>>>(a);
        k<<<g, dim3(32, w), smem(a, b), io>>>(a);
        if (cudaDeviceSynchronize() != cudaSuccess)   // tt_gio_batch_result's hang
        cudaStreamSynchronize(g->ctl);
    """
    lines = sorted(line for line, _ in violations(bad))
    assert lines == [2, 3, 4, 5, 10]


@pytest.mark.parametrize("src", gpu_sources(), ids=lambda p: p.name)
def test_no_legacy_stream_work_in_libtutti(src):
    found = violations(src.read_text())
    assert not found, "\n".join(f"{src.relative_to(ROOT)}:{line}: {why}" for line, why in found)


def test_sources_were_scanned():
    names = {p.name for p in gpu_sources()}
    assert {"gio_uring.cu", "gio_path.cu", "emu_ctrl.cu", "file_pipe.cu"} <= names
