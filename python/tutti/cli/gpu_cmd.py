"""tutti-admin gpu: what the GPU data paths need, and whether this machine has it.

Read-only and quick: nothing is opened for I/O.  The vLLM connector picks ``data_path: staged`` for a KV
cache on a GPU when the library and a CUDA device are here; this command says which paths would run and,
for the others, what is missing (``--require PATH`` turns that into an exit code for health checks).
"""
from __future__ import annotations

import ctypes
import os

import click

from .app import main
from .common import EXIT_CODES, EXIT_OK, EXIT_PROBLEMS, _emit_json, make_console
from .params import Choice

PATHS = ("staged", "gds", "gio")


def _library() -> dict:
    from ..gpu._ffi import lib, library_path
    path = library_path()
    try:
        lib()
        return {"ok": True, "path": str(path), "detail": "loaded"}
    except (ImportError, OSError) as e:  # GpuLibraryMissing is an ImportError; dlopen errors are OSError
        return {"ok": False, "path": str(path), "detail": str(e)}


def _cuda() -> dict:
    try:
        import torch
    except ImportError:
        return {"ok": False, "devices": [], "detail": "PyTorch is not installed"}
    if not torch.cuda.is_available():
        why = "PyTorch has no CUDA" if torch.version.cuda is None else "no CUDA device or driver"
        return {"ok": False, "devices": [], "detail": f"{why} (torch {torch.__version__})"}
    devs = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        devs.append({"index": i, "name": p.name, "memory_gib": round(p.total_memory / 2**30, 1),
                     "sms": p.multi_processor_count})
    return {"ok": True, "devices": devs, "detail": f"{len(devs)} device(s), CUDA {torch.version.cuda}"}


def _cufile() -> dict:
    from ..libfile import library_problem

    env = os.environ.get("TUTTI_CUFILE")
    if env and library_problem(env):  # a FIFO would block dlopen for good
        return {"ok": False, "detail": f"TUTTI_CUFILE: {library_problem(env)}"}
    for name in ([env] if env else ["libcufile.so.0", "/usr/local/cuda/lib64/libcufile.so.0"]):
        try:
            ctypes.CDLL(name)
            return {"ok": True, "detail": f"{name} loads (its driver opens at attach; without nvidia-fs "
                                          "it runs in compatibility mode)"}
        except OSError:
            continue
    return {"ok": False, "detail": "libcufile.so.0 not found (TUTTI_CUFILE names it)"}


def _green() -> dict:
    try:
        from cuda.bindings import driver  # noqa: F401 - only: is it installed?
    except ImportError:
        return {"ok": False, "detail": "cuda-bindings is not installed: I/O and compute share all SMs "
                                       "(plain streams)"}
    return {"ok": True, "detail": "cuda-bindings present (green contexts need a driver that has them)"}


def survey() -> dict:
    """Every check, and per data path whether it would run here and why not."""
    lib, cuda, cufile, green = _library(), _cuda(), _cufile(), _green()
    base = [] if lib["ok"] else ["libtutti_gpu.so"]
    base += [] if cuda["ok"] else ["a CUDA device"]
    paths = {
        "staged": {"ready": not base, "missing": base,
                   "what": "members -> pinned host chunks -> HBM, checksums on the GPU"},
        "gds": {"ready": not base and cufile["ok"], "missing": base + ([] if cufile["ok"] else ["cuFile"]),
                "what": "cuFile (GPUDirect Storage)"},
        "gio": {"ready": not base, "missing": base,
                "what": "GPU-built NVMe commands, emulated controller (its own CUDA context)"},
    }
    return {"library": lib, "cuda": cuda, "cufile": cufile, "green_contexts": green, "paths": paths,
            "vllm_gpu_kv_ready": paths["staged"]["ready"]}


@main.command("gpu", epilog=EXIT_CODES)
@click.option("--require", "require", type=Choice(PATHS), multiple=True,
              help="Exit 1 unless this data path would run here (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def gpu_cmd(require, as_json):
    """Show what the GPU data paths need and whether this machine has it.

    Checks libtutti_gpu.so (TUTTI_GPU_LIB, the package, or the checkout's build/), CUDA devices through
    PyTorch, cuFile for the gds path and cuda-bindings for green contexts; then which data path the vLLM
    connector's "auto" (staged) would run for a KV cache on a GPU.
    """
    s = survey()
    missing = [p for p in require if not s["paths"][p]["ready"]]
    if as_json:
        _emit_json(dict(s, required=list(require), required_missing=missing))
    else:
        con = make_console()
        mark = {True: "[green]ok[/green]", False: "[red]missing[/red]"}
        con.print(f"libtutti_gpu.so   {mark[s['library']['ok']]}  {s['library']['path']}")
        if not s["library"]["ok"]:
            con.print(f"                  {s['library']['detail']}", markup=False)
        con.print(f"CUDA              {mark[s['cuda']['ok']]}  {s['cuda']['detail']}")
        for d in s["cuda"]["devices"]:
            con.print(f"  cuda:{d['index']}  {d['name']}, {d['memory_gib']} GiB, {d['sms']} SMs", markup=False)
        con.print(f"cuFile            {mark[s['cufile']['ok']]}  {s['cufile']['detail']}")
        con.print(f"green contexts    {mark[s['green_contexts']['ok']]}  {s['green_contexts']['detail']}")
        for name, p in s["paths"].items():
            state = "[green]ready[/green]" if p["ready"] else "[red]not ready[/red]: needs " + ", ".join(p["missing"])
            con.print(f"data path {name:<7} {state}  ({p['what']})")
        if s["vllm_gpu_kv_ready"]:
            con.print("vLLM with its KV cache on a GPU: data_path auto = staged, [green]ready[/green]")
        else:
            con.print("vLLM with its KV cache on a GPU: data_path auto = staged, [red]the connector would "
                      "refuse to start[/red] (needs " + ", ".join(s["paths"]["staged"]["missing"]) + ")")
    if missing:
        if not as_json:
            make_console(stderr=True).print(f"required data path(s) not ready: {', '.join(missing)}", soft_wrap=True)
        raise SystemExit(EXIT_PROBLEMS)
    raise SystemExit(EXIT_OK)
