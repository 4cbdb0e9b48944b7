/* SPDX-License-Identifier: Apache-2.0 */
/*
 * On-disk format v1 (docs/format.md is the prose version).
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

/* cffi: begin */
#define TT_SB_MAGIC		"TUTTIKV1"
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
	uint32_t reserved[2];
};

struct tt_superblock {
	char magic[8];
	uint32_t version;
	uint32_t sb_size;
	uint8_t uuid[16];
	uint32_t member_index;
	uint32_t n_members;
	uint32_t flags;
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
	uint8_t pad[3792];
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
_Static_assert(sizeof(struct tt_slot_record) == TT_RECORD_SIZE, "record size");
#endif

#ifdef __cplusplus
}
#endif
#endif
