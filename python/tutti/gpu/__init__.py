"""Python binding of build/libtutti_gpu.so (cffi ABI mode: no compiler, no tutti._tutti needed).

  EmulatedController   emulated NVMe controller on host threads (emu_ctrl.h)
  Gio, GioBatch        GPU-built NVMe commands, one descriptor per layer (gio_uring.h)
  Domains              I/O and compute SM domains with green contexts (gpu_domains.h)
  plan_geometry        a store's geometry from libtutti's planner (objects where tt_locate() puts them)
  GpuStore, DeviceKV   the store itself, with layer-wise transactions into GPU memory through a data
                       path (gio over an emulated controller, staged, gds) and GPU checksums (store.py)

The library is found through $TUTTI_GPU_LIB or build/libtutti_gpu.so in the
checkout (``make gpu-lib``); it is loaded on first use, so importing this
package never fails for want of it.  Import torch first (one CUDA runtime).
"""
from ._ffi import GpuLibraryMissing, lib, library_path
from .domains import Domains
from .emu import EmulatedController
from .gio import Gio, GioBatch, device_ptr
from .layout import plan_geometry
from .store import CorruptBlockError, DeviceKV, DeviceTxn, GdsUnavailable, GpuStore, StoreBusyError, StoreError
from .streams import stream_ptr

__all__ = ["EmulatedController", "Gio", "GioBatch", "Domains", "plan_geometry", "GpuLibraryMissing",
           "library_path", "lib", "device_ptr", "stream_ptr",
           "GpuStore", "DeviceKV", "DeviceTxn", "StoreError", "StoreBusyError", "CorruptBlockError", "GdsUnavailable"]
