"""libtutti_gpu.so through cffi's ABI mode: declarations and loading.

ABI mode needs no compiler where it runs (the GPU machine has none for
Python), so the structs below must match the C headers field for field; they
are checked against the compiler's layout (and the macros against their values)
by tests/test_prefill_cpu.py::test_gpu_binding_layouts_match_the_headers
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

/* store.h, devpath.h, gio_path.h, staged_path.h, gds_path.h: the store and its data paths */
struct tt_engine_params {
    uint32_t queue_depth;
    uint32_t max_req_bytes;
    uint32_t min_reqs;
};

struct tt_engine_stats {
    uint64_t ios;
    uint64_t reqs;
    uint64_t bytes_read;
    uint64_t bytes_written;
    uint64_t syscalls;
    uint64_t flushes;
};

struct tt_open_params {
    uint32_t flags;
    const struct tt_fingerprint *expect;
    const char *engine;
    struct tt_engine_params engine_params;
};

struct tt_store_stats {
    uint64_t lookups, hits;
    uint64_t blocks_read, blocks_written;
    uint64_t commits, evictions;
    uint64_t corrupt_blocks;
    struct tt_engine_stats engine;
};

struct tt_store_info {
    uint8_t uuid[16];
    struct tt_geometry geo;
    struct tt_fingerprint fp;
    uint64_t member_bytes;
    uint64_t table_bytes;
    uint64_t created_ns;
    uint64_t n_committed;
    uint64_t n_free;
    uint64_t n_bad_records;
    char engine[16];
    struct tt_store_stats stats;
};

struct tt_extent {
    uint32_t member;
    uint32_t len;
    uint64_t off;
};

struct tt_memmap {
    uint32_t n_layers;
    uint32_t n_spans;
    const uint64_t *base;
    const uint64_t *stride;
};

struct tt_gio_path_params {
    unsigned n_queues;
    uint32_t depth;
    unsigned n_threads;
    int prp_only;
    unsigned warps_per_queue;
    double rate_gbps;
};

struct tt_file_path_params {
    unsigned n_threads;
    uint32_t chunk_bytes;
    unsigned depth;
    int device;
    unsigned map;
};

/* a data path's operations: only ever passed by address (function pointers as void *) */
struct tt_devpath_ops {
    const char *name;
    void *begin;
    void *layer;
    void *order;
    void *wait;
    void *collect;
    void *end;
    void *flush;
};

struct tt_emu;
struct tt_gio;
struct tt_gio_batch;
struct tt_store;
struct tt_txn;
struct tt_gio_path;
struct tt_file_path;

void tt_clearerr(void);
void tt_key_from_bytes(const void *data, size_t len, uint8_t key[16]);
int tt_store_format(const char *const *paths, unsigned n, const struct tt_format_params *p);
int tt_store_open(const char *const *paths, unsigned n, const struct tt_open_params *p,
                  struct tt_store **out);
void tt_store_close(struct tt_store *s);
int tt_store_get_info(struct tt_store *s, struct tt_store_info *info);
int tt_store_locate(const struct tt_store *s, uint64_t slot, uint32_t layer, uint32_t span, struct tt_extent *out);
int tt_store_lookup(struct tt_store *s, const uint8_t *keys, unsigned n, int64_t *slots);
int tt_store_invalidate(struct tt_store *s, const int64_t *slots, unsigned n);
int tt_store_list(struct tt_store *s, uint64_t first, uint64_t count, uint8_t *keys, int64_t *slots,
                  unsigned cap);
int tt_store_write_begin(struct tt_store *s, const uint8_t *keys, unsigned n, struct tt_txn **out);
int tt_store_read_begin(struct tt_store *s, const int64_t *slots, unsigned n, struct tt_txn **out);
int64_t tt_txn_slot(const struct tt_txn *t, unsigned i, int *present);
int tt_txn_layer(struct tt_txn *t, uint32_t layer, const struct tt_memmap *mem, const uint32_t *block_ids);
int tt_txn_wait_layer(struct tt_txn *t, uint32_t layer);
int tt_txn_finish(struct tt_txn *t, int32_t *status);
void tt_txn_abort(struct tt_txn *t);
int tt_txn_prepare(struct tt_txn *t, int32_t *status);
int tt_txn_veto(struct tt_txn *t, unsigned i);
int tt_store_put(struct tt_store *s, const uint8_t key[16], const void *buf, size_t len);
int tt_store_get(struct tt_store *s, const uint8_t key[16], void *buf, size_t len);
int tt_store_member_fds(const struct tt_store *s, int *fds, uint64_t *bytes);

int tt_store_set_devpath(struct tt_store *s, const struct tt_devpath_ops *ops, void *ctx);
int tt_txn_bind_device(struct tt_txn *t, const uint32_t *block_ids);
int tt_txn_layer_order(struct tt_txn *t, uint32_t layer, void *stream);

int tt_gio_path_open_emu(struct tt_store *s, const struct tt_gio_path_params *p, struct tt_gio_path **out);
void tt_gio_path_close(struct tt_gio_path *gp);
struct tt_emu *tt_gio_path_emu(const struct tt_gio_path *gp);
int tt_file_path_open_staged(const struct tt_file_path_params *p, struct tt_file_path **out);
int tt_file_path_open_gds(const struct tt_file_path_params *p, struct tt_file_path **out);
void tt_file_path_close(struct tt_file_path *fp);
extern struct tt_devpath_ops tt_devpath_staged;   /* const in C; cffi ABI mode reads only non-const globals */
extern struct tt_devpath_ops tt_devpath_gds;
extern struct tt_devpath_ops tt_devpath_host;

const char *tt_errmsg(void);
int tt_store_plan(struct tt_format_params *p, unsigned n_members, uint64_t member_bytes,
                  struct tt_geometry *geo, uint64_t *need_bytes);

int tt_emu_open(const struct tt_emu_params *p, struct tt_emu **out);
int tt_gpu_hw_queues(void);
int tt_emu_check_hw_queues(void);
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
TT_KEY_BYTES = 16
TT_MAX_MEMBERS = 16
TT_MODEL_ID_LEN, TT_DTYPE_LEN = 128, 16
TT_FORMAT_FORCE = 1 << 0
TT_OPEN_RDONLY, TT_OPEN_NO_VERIFY, TT_OPEN_SHARED = 1 << 0, 1 << 1, 1 << 2

ffi = FFI()
ffi.cdef(CDEF)

_lib = None


class GpuLibraryMissing(ImportError):
    """libtutti_gpu.so is not where tutti.gpu looks for it."""


def library_path() -> Path:
    """$TUTTI_GPU_LIB; else the copy installed in this package (``TUTTI_GPU=1 pip install``); else
    build/libtutti_gpu.so of the checkout this package lives in (``make gpu-lib``)."""
    env = os.environ.get("TUTTI_GPU_LIB")
    if env:
        return Path(env)
    here = Path(__file__).resolve().parent
    installed = here / "libtutti_gpu.so"
    if installed.is_file():
        return installed
    return here.parents[2] / "build" / "libtutti_gpu.so"


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
                f"{path}: no such file; install the package with `TUTTI_GPU=1 pip install .` or "
                "build it with `make gpu-lib` (both need nvcc), or point TUTTI_GPU_LIB at a "
                "libtutti_gpu.so")
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
