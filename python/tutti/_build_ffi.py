"""cffi (API mode) build of ``tutti._tutti``: libtutti compiled straight into the extension.

The cdef mirrors the public headers by hand; API mode makes the compiler check
it against the real declarations, so a drifting header fails the build rather
than corrupting memory at run time.
"""
import glob
import os

from cffi import FFI

# Paths relative to the project root (setuptools runs the build from there),
# so `pip install .` works from the temporary copy pip makes.
_ROOT = os.path.relpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
_INCLUDE = os.path.join(_ROOT, "libtutti", "include")
_SOURCES = sorted(glob.glob(os.path.join(_ROOT, "libtutti", "src", "**", "*.c"), recursive=True))
# Headers as dependencies: rebuilds notice header edits and an sdist carries them.
_HEADERS = sorted(glob.glob(os.path.join(_ROOT, "libtutti", "**", "*.h"), recursive=True))

# Every struct ends in "...;": cffi takes the real layout from the compiler, so a
# field added to a C struct cannot break the binding (it did twice before).
CDEF = """
/* tutti.h */
static const char *const TUTTI_VERSION_STRING;

/* error.h */
const char *tt_errmsg(void);
void tt_clearerr(void);

/* format.h */
#define TT_FORMAT_VERSION ...
#define TT_SB_SIZE ...
#define TT_SB_COPIES ...
#define TT_TABLE_OFF ...
#define TT_DATA_ALIGN ...
#define TT_OBJ_ALIGN ...
#define TT_RECORD_SIZE ...
#define TT_KEY_BYTES ...
#define TT_MODEL_ID_LEN ...
#define TT_DTYPE_LEN ...
#define TT_MAX_MEMBERS ...
#define TT_SLOT_EMPTY ...
#define TT_SLOT_COMMITTED ...

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
    ...;
};

struct tt_superblock {
    char magic[8];
    uint32_t version;
    uint32_t sb_size;
    uint8_t uuid[16];
    uint32_t member_index;
    uint32_t n_members;
    uint32_t flags;
    uint32_t n_layers;
    uint32_t n_spans;
    uint32_t span_bytes;
    uint32_t obj_stride;
    uint32_t stripe_objs;
    uint64_t n_slots;
    uint64_t table_off;
    uint64_t table_bytes;
    uint64_t data_off;
    uint64_t member_bytes;
    uint64_t created_ns;
    struct tt_fingerprint fp;
    uint64_t fp_hash;
    uint64_t sb_sum;
    ...;
};

struct tt_slot_record {
    uint8_t key[16];
    uint64_t gen;
    uint64_t data_sum;
    uint64_t commit_seq;
    uint32_t state;
    uint32_t span_bytes;
    uint64_t reserved;
    uint64_t rec_sum;
    ...;
};

/* layout.h */
struct tt_geometry {
    uint32_t n_layers;
    uint32_t n_spans;
    uint32_t span_bytes;
    uint32_t obj_stride;
    uint32_t n_members;
    uint32_t stripe_objs;
    uint64_t n_slots;
    uint64_t data_off;
    ...;
};

struct tt_extent {
    uint32_t member;
    uint32_t len;
    uint64_t off;
    ...;
};

uint32_t tt_objs_per_slot(const struct tt_geometry *g);
uint32_t tt_obj_index(const struct tt_geometry *g, uint32_t layer, uint32_t span);
uint64_t tt_member_objs(const struct tt_geometry *g);
struct tt_extent tt_locate(const struct tt_geometry *g, uint64_t slot, uint32_t layer,
                           uint32_t span);

/* engine.h */
#define TT_MAX_ENGINE_MEMBERS ...

enum tt_op { TT_OP_READ = 0, TT_OP_WRITE = 1 };

struct tt_io {
    void *buf;
    uint64_t off;
    uint32_t len;
    uint16_t member;
    uint8_t op;
    uint8_t flags;
    int32_t res;
    uint32_t tag;
    ...;
};

struct tt_batch {
    struct tt_io *ios;
    uint32_t n;
    uint32_t next;
    uint32_t inflight;
    int32_t err;
    uint32_t reqs;
    uint32_t req_cap;
    ...;
};

struct tt_engine_params {
    uint32_t queue_depth;
    uint32_t max_req_bytes;
    uint32_t min_reqs;
    ...;
};

struct tt_engine_stats {
    uint64_t ios;
    uint64_t reqs;
    uint64_t bytes_read;
    uint64_t bytes_written;
    uint64_t syscalls;
    uint64_t flushes;
    ...;
};

struct tt_engine;

int tt_engine_open(const char *name, const int *fds, unsigned n,
                   const struct tt_engine_params *params, struct tt_engine **out);
void tt_engine_close(struct tt_engine *e);
const char *tt_engine_name(const struct tt_engine *e);
int tt_engine_register(struct tt_engine *e, void *addr, size_t len);
int tt_engine_submit(struct tt_engine *e, struct tt_batch *b);
int tt_engine_wait(struct tt_engine *e, struct tt_batch *b);
int tt_engine_done(struct tt_engine *e, struct tt_batch *b);
int tt_engine_flush(struct tt_engine *e);
void tt_engine_get_stats(const struct tt_engine *e, struct tt_engine_stats *st);

/* store.h */
struct tt_store;
struct tt_txn;

#define TT_FORMAT_FORCE ...
#define TT_OPEN_RDONLY ...
#define TT_OPEN_NO_VERIFY ...
#define TT_OPEN_SHARED ...

struct tt_format_params {
    struct tt_fingerprint fp;
    uint32_t n_spans;
    uint32_t span_bytes;
    uint64_t n_slots;
    uint32_t stripe_objs;
    uint32_t flags;
    ...;
};

struct tt_open_params {
    uint32_t flags;
    const struct tt_fingerprint *expect;
    const char *engine;
    struct tt_engine_params engine_params;
    ...;
};

struct tt_store_stats {
    uint64_t lookups, hits;
    uint64_t blocks_read, blocks_written;
    uint64_t commits, evictions;
    uint64_t corrupt_blocks;
    struct tt_engine_stats engine;
    ...;
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
    ...;
};

struct tt_memmap {
    uint32_t n_layers;
    uint32_t n_spans;
    const uint64_t *base;
    const uint64_t *stride;
    ...;
};

struct tt_check_result {
    uint64_t checked;
    uint64_t ok;
    uint64_t bad;
    uint64_t bad_records;
    uint64_t repaired;
    uint64_t unreadable;
    ...;
};

unsigned tt_dtype_size(const char *dtype);
int tt_store_plan(struct tt_format_params *p, unsigned n_members, uint64_t member_bytes,
                  struct tt_geometry *geo, uint64_t *need_bytes);
int tt_store_format(const char *const *paths, unsigned n, const struct tt_format_params *p);
int tt_store_open(const char *const *paths, unsigned n, const struct tt_open_params *p,
                  struct tt_store **out);
void tt_store_close(struct tt_store *s);
int tt_store_get_info(struct tt_store *s, struct tt_store_info *info);
int tt_store_locate(const struct tt_store *s, uint64_t slot, uint32_t layer, uint32_t span,
                    struct tt_extent *out);
const struct tt_geometry *tt_store_geometry(const struct tt_store *s);
void tt_key_from_bytes(const void *data, size_t len, uint8_t key[16]);
int tt_store_lookup(struct tt_store *s, const uint8_t *keys, unsigned n, int64_t *slots);
int tt_store_invalidate(struct tt_store *s, const int64_t *slots, unsigned n);
int tt_store_write_begin(struct tt_store *s, const uint8_t *keys, unsigned n,
                         struct tt_txn **out);
int tt_store_read_begin(struct tt_store *s, const int64_t *slots, unsigned n,
                        struct tt_txn **out);
int64_t tt_txn_slot(const struct tt_txn *t, unsigned i, int *present);
int tt_txn_layer(struct tt_txn *t, uint32_t layer, const struct tt_memmap *mem,
                 const uint32_t *block_ids);
int tt_txn_wait_layer(struct tt_txn *t, uint32_t layer);
int tt_txn_finish(struct tt_txn *t, int32_t *status);
void tt_txn_abort(struct tt_txn *t);
int tt_txn_prepare(struct tt_txn *t, int32_t *status);
int tt_txn_veto(struct tt_txn *t, unsigned i);
int tt_store_list(struct tt_store *s, uint64_t first, uint64_t count, uint8_t *keys,
                  int64_t *slots, unsigned cap);
int tt_store_put(struct tt_store *s, const uint8_t key[16], const void *buf, size_t len);
int tt_store_get(struct tt_store *s, const uint8_t key[16], void *buf, size_t len);
int tt_store_check(struct tt_store *s, uint64_t first, uint64_t count, int repair,
                   struct tt_check_result *res, int64_t *bad, unsigned bad_cap);
int tt_store_register_memory(struct tt_store *s, void *addr, size_t len);

/* ---- added by the store helper (issue 12), by hand: drop this block when the cdef is
   generated from the headers (tt_check_result.unreadable above is in the header too) ---- */
/* fault.h */
int tt_store_set_faults(struct tt_store *s, const char *spec);
/* ---- end of the store helper's block ---- */

/* kqueue.h: tutti.ko nodes and handing controllers to the module (tutti-admin attach/detach/health) */
struct tt_kinfo {
    uint32_t flags;
    uint32_t instance;
    uint32_t nsid;
    uint32_t lba_shift;
    uint64_t nsze;
    uint32_t mdts_bytes;
    uint16_t vid;
    uint16_t ssvid;
    char sn[21];
    char mn[41];
    char fr[9];
    char bdf[16];
    ...;
};

int tt_kdev_info(int fd, struct tt_kinfo *info);
int tt_kdev_admin(int fd, uint8_t opcode, uint32_t nsid, uint32_t cdw10,
                  void *buf, uint32_t len, uint16_t *status);
int tt_kmod_attach(const char *bdf);
int tt_kmod_detach(const char *bdf);

/* ---- BEGIN block added by the `format` helper (format evolution, member probe).
 * From format.h and store.h; drop this block when the cdef is generated from the headers. */
#define TT_SB_MAGIC_STEM_LEN ...
#define TT_MAX_LAYERS ...
#define TT_MAX_SPANS ...
#define TT_MAX_SPAN_BYTES ...
#define TT_MAX_SLOTS ...
#define TT_FEAT_COMPAT_KNOWN ...
#define TT_FEAT_RO_COMPAT_KNOWN ...
#define TT_FEAT_INCOMPAT_KNOWN ...
#define TT_PROBE_NONE ...
#define TT_PROBE_STORE ...
#define TT_PROBE_OTHER_VERSION ...
#define TT_PROBE_DAMAGED ...

struct tt_features {
    uint64_t compat;
    uint64_t ro_compat;
    uint64_t incompat;
    ...;
};

struct tt_probe {
    uint32_t kind;
    uint32_t version;
    char magic[8];
    struct tt_features feat;
    uint8_t uuid[16];
    uint32_t member_index;
    uint32_t n_members;
    ...;
};

int tt_store_probe(const char *path, struct tt_probe *out);
void tt_store_get_features(const struct tt_store *s, struct tt_features *f);
/* ---- END block added by the `format` helper */
"""

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source(
    "tutti._tutti",
    '#include "tutti/tutti.h"\n#include "tutti/kqueue.h"',
    sources=_SOURCES,
    include_dirs=[_INCLUDE],
    depends=_HEADERS,
    libraries=["uring", "xxhash", "pthread"],
    extra_compile_args=["-std=gnu11", "-D_GNU_SOURCE", "-O2"],
)
