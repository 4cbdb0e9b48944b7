/* SPDX-License-Identifier: Apache-2.0 */
/* The store's private state, shared by its source files (not installed). */
#ifndef TT_STORE_IMPL_H
#define TT_STORE_IMPL_H

#include <stdint.h>

#include "tutti/devpath.h"
#include "tutti/store.h"
#include "../support/member.h"
#include "../support/workers.h"

/* In-memory slot states; the disk only knows EMPTY and COMMITTED. */
enum tt_slot_state {
	TT_MS_FREE = 0,		/* empty on disk, on the free stack */
	TT_MS_COMMITTED,	/* indexed, on the LRU list */
	TT_MS_WRITING,		/* owned by a write transaction */
	TT_MS_BAD,		/* damaged record: never served, kept for check */
	TT_MS_DROPPED,		/* emptied while pinned: freed at last unpin */
	TT_MS_CLEARING,		/* emptied, EMPTY record not on disk yet: not reusable */
};

#define TT_NIL UINT32_MAX

struct tt_slots {
	uint64_t n;
	struct tt_slot_record *rec;	/* the on-disk table, 4 KiB aligned */
	uint8_t *state;
	uint32_t *pins;			/* open transactions using the slot */
	uint32_t *prev, *next;		/* LRU list of committed slots */
	uint32_t lru_head, lru_tail;	/* head = least recently used */
	uint32_t *free;			/* stack of free slots (EMPTY on disk) */
	uint64_t n_free;
	uint32_t *clearing;		/* slots waiting for their EMPTY record */
	uint64_t n_clearing;
	uint32_t nospace;		/* a write met a full filesystem: evict first */
	uint32_t nospace_allocs;
	uint32_t *ht;			/* key index: slot + 1, 0 = empty */
	uint64_t ht_mask;
	uint64_t n_committed;
	uint64_t n_bad;
	uint64_t next_seq;
	uint8_t *dirty;			/* one flag per table page */
};

struct tt_store {
	struct tt_member members[TT_MAX_MEMBERS];
	unsigned n_members;
	uint32_t flags;			/* TT_OPEN_* */
	struct tt_superblock sb;
	struct tt_geometry geo;
	struct tt_engine *eng;
	struct tt_slots slots;
	uint32_t mem_align;		/* O_DIRECT memory alignment */
	struct tt_txn *txns;		/* open transactions */
	const struct tt_devpath_ops *dp_ops;	/* data path for device memory */
	void *dp_ctx;
	struct tt_store_stats st;
	unsigned cpu_threads;		/* checksum threads wanted (>= 1) */
	struct tt_workers *cpu;		/* started at the first large layer */
	cpu_set_t cpus;			/* ... on the CPUs the opening thread could use */
	struct tt_written wr;		/* bytes written (written.c) */
	uint8_t wr_unsaved[TT_MAX_MEMBERS];	/* restarted: since_ns not in copy B yet */
};

/* checksum.c */
uint64_t tt_sum_object(const void *p, uint32_t len, uint32_t obj_index);
uint64_t tt_sum_combine(const uint64_t *sums, uint32_t n);
uint64_t tt_sum_record(const struct tt_slot_record *r, uint64_t slot);
uint64_t tt_sum_superblock(const struct tt_superblock *sb);
uint64_t tt_sum_fingerprint(const struct tt_fingerprint *fp);

/* plan.c */
/*
 * tt_geometry_check() - @g inside format.h's limits, and the sizes it needs
 * (header table, data offset, bytes per member), computed without overflow.
 * The one rule for format and open.  Return: 0, -EINVAL or -EFBIG.
 */
int tt_geometry_check(const struct tt_geometry *g, uint64_t *table_bytes,
		      uint64_t *data_off, uint64_t *need);

/* superblock.c */
void tt_sb_fill(struct tt_superblock *sb, const struct tt_format_params *p,
		const struct tt_geometry *g, uint64_t need, const uint8_t uuid[16]);
/* What a member's superblock area holds besides its superblock. */
struct tt_sb_extra {
	int copy_a_ok;		/* copy A is a valid superblock: copy B may be rewritten */
	int written_ok;		/* copy B holds this member's count (TT_FEAT_COMPAT_WRITTEN) */
	struct tt_sb_written written;	/* that count, if written_ok */
};
/* tt_sb_read() flags */
#define TT_SB_WRITABLE	(1u << 0)	/* the store will be written: refuse unknown ro_compat */
/* tt_sb_parse() and, if @x, tt_sb_parse_extra() of what member @m holds. */
int tt_sb_read(struct tt_member *m, struct tt_superblock *sb, unsigned flags,
	       struct tt_sb_extra *x);
/*
 * tt_sb_parse() - tt_sb_read() without the I/O: the superblock a member of
 * @size bytes whose first @len bytes are @buf describes, every check made
 * (version, features, limits, sizes, truncation).  Fuzzable.
 */
int tt_sb_parse(const char *path, const void *buf, size_t len, uint64_t size,
		unsigned flags, struct tt_superblock *sb);
/*
 * tt_sb_parse_extra() - for @sb, which tt_sb_parse() accepted from @buf (a
 * member's first @len bytes): is copy A valid, and does copy B hold the
 * member's count (the feature set, copy B valid and, but for the count and
 * the feature bits, the same superblock as @sb)?  No I/O: fuzzable.
 */
void tt_sb_parse_extra(const void *buf, size_t len, const struct tt_superblock *sb,
		       struct tt_sb_extra *x);
/* What the copies in @buf (a member's first @len bytes) hold; for STORE,
 * @sb (may be NULL) receives the first valid copy.  No I/O: fuzzable. */
void tt_sb_probe(const void *buf, size_t len, struct tt_probe *out,
		 struct tt_superblock *sb);
/* tt_sb_probe() of what member @m holds (a short member: what is there). */
int tt_sb_probe_member(struct tt_member *m, struct tt_probe *out);
/* "format version 2" (and the magic when it is not TT_SB_MAGIC), in @buf. */
const char *tt_probe_describe(const struct tt_probe *pr, char *buf, size_t len);
/*
 * tt_sb_seal_copy() - copy @copy (0: A, 1: B) of @sb as it goes to disk: the
 * count @w in copy B only (with the feature; else zeros), checksum set.
 */
void tt_sb_seal_copy(struct tt_superblock *out, const struct tt_superblock *sb,
		     unsigned copy, const struct tt_sb_written *w);
/* Both copies of @sb (tt_sb_seal_copy()) to member @m (format). */
int tt_sb_write(struct tt_member *m, const struct tt_superblock *sb,
		const struct tt_sb_written *w);
void tt_sb_geometry(const struct tt_superblock *sb, struct tt_geometry *g);
int tt_fp_compare(const struct tt_fingerprint *have, const struct tt_fingerprint *want);

/* slots.c */
int tt_slots_load(struct tt_store *s);
void tt_slots_free(struct tt_slots *t);
int64_t tt_slots_find(struct tt_slots *t, const uint8_t *key);
void tt_slots_touch(struct tt_slots *t, uint64_t slot);
int64_t tt_slots_alloc(struct tt_store *s, int *evicted, struct tt_slot_record *old);
uint64_t tt_slots_can_take(struct tt_store *s, uint64_t need);
void tt_slots_unevict(struct tt_store *s, uint64_t slot, const struct tt_slot_record *old);
void tt_slots_note_nospace(struct tt_slots *t);
void tt_slots_note_space(struct tt_slots *t);
void tt_slots_release(struct tt_slots *t, uint64_t slot);
/* Slots emptied whose EMPTY record is not on disk yet (tt_store_info.n_clearing). */
uint64_t tt_slots_clearing(const struct tt_slots *t);
void tt_slots_unpin(struct tt_slots *t, uint64_t slot);
void tt_slots_set_empty(struct tt_store *s, uint64_t slot, enum tt_slot_state st);
void tt_slots_commit(struct tt_store *s, uint64_t slot, const uint8_t *key,
		     uint64_t data_sum);
int tt_slots_sync(struct tt_store *s, int flush);
int tt_slot_record_ok(const struct tt_store *s, uint64_t slot);

/* written.c: bytes written per member (struct tt_written) */
/*
 * At open: the counts found in the members' copies B (@x, by member index).
 * Return: 0, or -EINVAL (TUTTI_WRITTEN_SAVE_BYTES is not a byte count).
 */
int tt_written_init(struct tt_store *s, const struct tt_sb_extra *x);
/* @bytes handed to member @member for writing. */
void tt_written_add(struct tt_store *s, unsigned member, uint64_t bytes);
/* The write ios of @ios (with @moved_only: only those whose res is 0). */
void tt_written_add_ios(struct tt_store *s, const struct tt_io *ios, uint32_t n,
			int moved_only);
/*
 * tt_written_save() - write copy B of the members whose count changed by at
 * least save_every (@all: by anything, or restarted), then flush.  Never
 * fails the caller: a failure is counted (save_errors) and retried later.
 */
void tt_written_save(struct tt_store *s, int all);

/* txn.c */
void tt_txn_abort_all(struct tt_store *s);
void tt_txn_keep_bad(struct tt_txn *t);

#endif
