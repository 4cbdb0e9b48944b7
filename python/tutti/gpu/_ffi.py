"""libtutti_gpu.so through cffi's ABI mode: declarations and loading.

ABI mode needs no compiler where it runs (the GPU machine has none for
Python), so the structs below must match the C headers field for field; they
are checked against the compiler's layout by tests/test_gpu_binding.py
wherever gcc is available.  Pointers the Python side never follows are
declared ``void *`` (same size and alignment as the typed pointers).
"""
from __future__ import annotations

import os
from pathlib import Path

from cffi import FFI

CDEF = """
struct tt_nvme_xfer_caps {
    uint32_t page_size;
    uint32_t mdts_bytes;
    uint32_t sgls;
    uint32_t sgl_threshold;
};

struct tt_geometry {
    uint32_t n_layers;
    uint32_t n_spans;
    uint32_t span_bytes;
    uint32_t obj_stride;
    uint32_t n_members;
    uint32_t stripe_objs;
    uint64_t n_slots;
    uint64_t data_off;
};

struct tt_fingerprint {
    char model_id[128];
    char dtype[16];
    uint32_t n_layers;
    uint32_t kv_heads;
    uint32_t head_dim;
    uint32_t block_size;
    uint32_t tp_rank;
    uint32_t tp_size;
    uint32_t reserved[2];
};

struct tt_format_params {
    struct tt_fingerprint fp;
    uint32_t n_spans;
    uint32_t span_bytes;
    uint64_t n_slots;
    uint32_t stripe_objs;
    uint32_t flags;
};

struct tt_gio_qmem {
    uint16_t qid;
    uint32_t depth;
    void *sq;
    void *cq;
    void *sq_db;
    void *cq_db;
    void *list;
    uint64_t list_bus;
    uint32_t list_chunks;
    uint32_t chunk_bytes;
};

struct tt_gio_params {
    unsigned n_queues;
    const struct tt_gio_qmem *qmem;
    struct tt_nvme_xfer_caps caps;
    uint32_t lba_shift;
    unsigned warps_per_queue;
};

struct tt_gio_layer {
    struct tt_geometry geo;
    uint32_t layer;
    uint32_t n_blocks;
    const uint64_t *slots;
    const uint32_t *block_ids;
    uint64_t base;
    uint64_t block_stride;
    uint64_t span_stride;
    uint32_t nsid_base;
    uint8_t op;
};

struct tt_emu_params {
    unsigned n_queues;
    uint32_t depth;
    unsigned n_threads;
    int backing;
    unsigned n_ns;
    uint64_t ns_bytes;
    uint32_t lba_shift;
    const int *fds;
    uint32_t sgls;
    uint32_t mdts_bytes;
    uint32_t list_chunks;
    double rate_gbps;
};

struct tt_emu_stats {
    uint64_t cmds;
    uint64_t errors;
    uint64_t bytes;
    uint64_t sq_wraps;
    uint64_t cq_wraps;
    uint64_t doorbells;
};

struct tt_gpu_domains {
    void *io;
    void *compute;
    unsigned io_sms;
    unsigned compute_sms;
    int green;
    char reason[128];
    void *priv;
};

struct tt_emu;
struct tt_gio;
struct tt_gio_batch;

const char *tt_errmsg(void);
int tt_store_plan(struct tt_format_params *p, unsigned n_members, uint64_t member_bytes,
                  struct tt_geometry *geo, uint64_t *need_bytes);

int tt_emu_open(const struct tt_emu_params *p, struct tt_emu **out);
void tt_emu_close(struct tt_emu *c);
const struct tt_gio_qmem *tt_emu_qmem(const struct tt_emu *c);
void tt_emu_caps(const struct tt_emu *c, struct tt_nvme_xfer_caps *caps);
void *tt_emu_ns_data(const struct tt_emu *c, uint32_t nsid);
void tt_emu_get_stats(const struct tt_emu *c, struct tt_emu_stats *st);
uint64_t tt_emu_queue_cmds(const struct tt_emu *c, unsigned q);

int tt_gio_open(const struct tt_gio_params *p, struct tt_gio **out);
void tt_gio_close(struct tt_gio *g);
int tt_gio_batch_create(struct tt_gio *g, uint32_t max_cmds, struct tt_gio_batch **out);
void tt_gio_batch_destroy(struct tt_gio_batch *b);
int tt_gio_prep_layer(struct tt_gio_batch *b, const struct tt_gio_layer *l);
int tt_gio_submit_wait(struct tt_gio *g, struct tt_gio_batch *b, void *stream);
int tt_gio_issue(struct tt_gio *g, struct tt_gio_batch *b, void *stream);
int tt_gio_wait_cqe(struct tt_gio *g, struct tt_gio_batch *b, void *stream);
int tt_gio_batch_result(struct tt_gio_batch *b, uint32_t *n_err, uint16_t *status);
uint32_t tt_gio_batch_size(const struct tt_gio_batch *b);

int tt_gpu_domains_create(unsigned io_sms, struct tt_gpu_domains *d);
void tt_gpu_domains_destroy(struct tt_gpu_domains *d);
"""

# Values of the C headers' macros and enums that the binding passes on.
TT_NVME_CMD_WRITE = 0x01
TT_NVME_CMD_READ = 0x02
TT_NVME_SGLS_BYTE_ALIGNED = 0x1
TT_EMU_NULL, TT_EMU_HOSTMEM, TT_EMU_FILE = 0, 1, 2
TT_EMU_MAX_NS = 16

ffi = FFI()
ffi.cdef(CDEF)

_lib = None


class GpuLibraryMissing(ImportError):
    """libtutti_gpu.so is not where tutti.gpu looks for it."""


def library_path() -> Path:
    """$TUTTI_GPU_LIB, else build/libtutti_gpu.so of the checkout this package lives in."""
    env = os.environ.get("TUTTI_GPU_LIB")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[3] / "build" / "libtutti_gpu.so"


def lib():
    """The loaded library (loaded once).

    Import torch before the first call: the library links the shared CUDA
    runtime, and one already in the process (PyTorch's) then serves both.
    """
    global _lib
    if _lib is None:
        path = library_path()
        if not path.is_file():
            raise GpuLibraryMissing(
                f"{path}: no such file; build it with `make gpu-lib` (needs nvcc) or point "
                "TUTTI_GPU_LIB at a libtutti_gpu.so")
        _lib = ffi.dlopen(str(path))
    return _lib


def check(rc: int, what: str, errmsg: bool = False) -> int:
    """Raise OSError for a negative errno return.

    ``errmsg``: the function reports details through tt_seterr() (the store's
    functions do; the GPU ones only return the errno, so a message left by an
    earlier call would mislead).
    """
    if rc < 0:
        msg = ffi.string(lib().tt_errmsg()).decode(errors="replace") if errmsg else ""
        raise OSError(-rc, f"{what}: {os.strerror(-rc)}" + (f" ({msg})" if msg else ""))
    return rc
