/* SPDX-License-Identifier: Apache-2.0 */
/*
 * On-disk format v1 (docs/format.md is the prose version, including how
 * the format evolves and how a store is upgraded).
 *
 * Every member (backing file or device) of a store starts with the same
 * header area:
 *
 *   0        superblock copy A (4 KiB)
 *   4096     superblock copy B (4 KiB)
 *   8192     slot table (member 0 only; the area is reserved on all members)
 *   data_off data region (1 MiB aligned), objects laid out by layout.h
 *
 * All integers are little-endian.  Both superblock copies carry their own
 * checksum; either valid copy opens the store.  Slot records are 64 bytes,
 * so one never straddles a 512-byte sector and a torn table write can only
 * leave each record wholly old or wholly new; each record also carries a
 * checksum seeded with its slot index.
 */
#ifndef TUTTI_FORMAT_H
#define TUTTI_FORMAT_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * The magic is the same for every format version (the "1" is part of the
 * name, not the version); bytes 0..15 (magic, version, sb_size) and the
 * checksum rule (sb_sum, the last 8 bytes of the first 4 KiB, is XXH3-64 of
 * the 4088 bytes before it) never change, so any libtutti can tell a store
 * of another version from damage.  "TUTTIKV" followed by any byte, in
 * either copy, is treated as a Tutti superblock: format never overwrites it
 * without TT_FORMAT_FORCE.
 */
/* cffi: begin */
#define TT_SB_MAGIC		"TUTTIKV1"
#define TT_SB_MAGIC_STEM_LEN	7u	/* "TUTTIKV": a superblock of any version */
#define TT_FORMAT_VERSION	1u
#define TT_SB_SIZE		4096u
#define TT_SB_COPIES		2u
#define TT_TABLE_OFF		(TT_SB_SIZE * TT_SB_COPIES)
#define TT_DATA_ALIGN		(1u << 20)
#define TT_OBJ_ALIGN		4096u
#define TT_RECORD_SIZE		64u
#define TT_KEY_BYTES		16u
#define TT_MODEL_ID_LEN		128u
#define TT_DTYPE_LEN		16u
#define TT_MAX_MEMBERS		16u

/*
 * Limits on a geometry, enforced at format and re-checked at open.  Inside
 * them every product layout.h forms fits its type: objects per slot
 * <= 2^18, one slot's objects <= 2^46 bytes, objects of all slots < 2^50;
 * and open checks that the data region (member_bytes) is computed without
 * overflow and fits the member, so every tt_locate() offset lies inside it.
 */
#define TT_MAX_LAYERS		4096u
#define TT_MAX_SPANS		64u
#define TT_MAX_SPAN_BYTES	(256u << 20)
#define TT_MAX_SLOTS		(UINT32_MAX - 1u)	/* slot numbers fit a u32 */

/*
 * Feature masks (docs/format.md, "Format evolution").  A reader that meets
 * a bit it does not know:
 *   compat     ignores it: the store opens normally;
 *   ro_compat  opens the store read-only only (writable open: -EROFS);
 *   incompat   refuses the store (-EOPNOTSUPP, naming the bits).
 * Bytes this version defines as zero (flags, the fingerprint's reserved
 * words, the superblock's padding) must be zero unless some feature bit
 * unknown to the reader is set, which may give them a meaning.
 *
 * Compat features:
 *   TT_FEAT_COMPAT_WRITTEN  bytes written: copy B of each member holds the
 *       bytes the store wrote to that member (struct tt_sb_written), updated
 *       while the store is used; copy A holds zeros there and, once format
 *       wrote it, never changes.  Readers without the feature take copy A
 *       (and only the feature bits of copy B), so they open such a store; a
 *       torn copy-B write costs the count, never the store.  Set by format;
 *       a store formatted before it never gets it (docs/format.md).
 */
#define TT_FEAT_COMPAT_WRITTEN	(1ull << 0)
#define TT_FEAT_COMPAT_KNOWN	TT_FEAT_COMPAT_WRITTEN
#define TT_FEAT_RO_COMPAT_KNOWN	0ull
#define TT_FEAT_INCOMPAT_KNOWN	0ull

struct tt_features {
	uint64_t compat;
	uint64_t ro_compat;
	uint64_t incompat;
};

/*
 * Bytes written to a member (TT_FEAT_COMPAT_WRITTEN): meaningful in copy B
 * only, zero in copy A.  Counted: every byte the store hands to the member
 * for writing (data objects at their stride, slot-table pages, these
 * superblock writes, and format's own writes).
 */
struct tt_sb_written {
	uint64_t bytes;			/* written to this member since since_ns */
	uint64_t since_ns;		/* counting began (CLOCK_REALTIME): format, or an
					 * open that found this copy B unreadable */
	uint64_t saved_ns;		/* when this copy B was written */
};

/* What the KV bytes belong to: a store never serves another model's KV. */
struct tt_fingerprint {
	char model_id[TT_MODEL_ID_LEN];	/* NUL-padded, e.g. "meta-llama/Llama-3-8B" */
	char dtype[TT_DTYPE_LEN];	/* NUL-padded, e.g. "bfloat16" */
	uint32_t n_layers;
	uint32_t kv_heads;
	uint32_t head_dim;
	uint32_t block_size;		/* tokens per KV block */
	uint32_t tp_rank;
	uint32_t tp_size;
	uint32_t reserved[2];		/* 0 */
};

struct tt_superblock {
	char magic[8];
	uint32_t version;
	uint32_t sb_size;
	uint8_t uuid[16];
	uint32_t member_index;
	uint32_t n_members;
	uint32_t flags;			/* 0 (reserved) */
	/* geometry */
	uint32_t n_layers;
	uint32_t n_spans;		/* objects per layer per block */
	uint32_t span_bytes;		/* payload bytes of one object */
	uint32_t obj_stride;		/* span_bytes rounded up to TT_OBJ_ALIGN */
	uint32_t stripe_objs;		/* stripe unit, in objects */
	uint64_t n_slots;
	uint64_t table_off;
	uint64_t table_bytes;
	uint64_t data_off;
	uint64_t member_bytes;		/* bytes each member must hold */
	uint64_t created_ns;		/* CLOCK_REALTIME at format */
	struct tt_fingerprint fp;
	uint64_t fp_hash;		/* XXH3-64 of fp */
	struct tt_features feat;	/* feature masks (zero in stores made before them) */
	struct tt_sb_written written;	/* copy B only (TT_FEAT_COMPAT_WRITTEN); else zero */
	uint8_t pad[3744];		/* zero */
	uint64_t sb_sum;		/* XXH3-64 of the 4088 bytes before it */
};

#define TT_SLOT_EMPTY		0u
#define TT_SLOT_COMMITTED	1u

struct tt_slot_record {
	uint8_t key[TT_KEY_BYTES];
	uint64_t gen;			/* bumped at every state change */
	uint64_t data_sum;		/* combined checksum of all objects */
	uint64_t commit_seq;		/* store-wide commit order (LRU at open) */
	uint32_t state;			/* TT_SLOT_* */
	uint32_t span_bytes;		/* must equal the geometry's */
	uint64_t reserved;
	uint64_t rec_sum;		/* XXH3-64 of the 56 bytes above, seed slot */
};

/* cffi: end */
#ifndef __cplusplus
_Static_assert(sizeof(struct tt_fingerprint) == 176, "fingerprint size");
_Static_assert(sizeof(struct tt_superblock) == TT_SB_SIZE, "superblock size");
_Static_assert(__builtin_offsetof(struct tt_superblock, sb_sum) == TT_SB_SIZE - 8,
	       "sb_sum is the last 8 bytes of every version's first 4 KiB");
_Static_assert(__builtin_offsetof(struct tt_superblock, feat) == 296,
	       "feature masks where v1 stores before them held zero padding");
_Static_assert(__builtin_offsetof(struct tt_superblock, written) == 320,
	       "bytes written where v1 stores before the feature held zero padding");
_Static_assert(sizeof(struct tt_slot_record) == TT_RECORD_SIZE, "record size");
#endif

#ifdef __cplusplus
}
#endif
#endif
