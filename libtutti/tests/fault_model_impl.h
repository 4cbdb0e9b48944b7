/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The fault-model driver's state and the model's checks, shared by
 * fault_model.c (operations, schedules) and fault_model_check.c (helpers,
 * fault hits, the model and the crash view).  Not part of libtutti.
 */
#ifndef TUTTI_TESTS_FAULT_MODEL_IMPL_H
#define TUTTI_TESTS_FAULT_MODEL_IMPL_H

#include <stdint.h>

#include "tutti/tutti.h"
#include "fault_model.h"

#define FM_KEYS		256u	/* at most; a schedule uses 5/3 of its slots */
#define FM_SLOTS	256u
#define FM_L		4u
#define FM_S		2u
#define FM_SPAN		4096u
#define FM_BLOCK	(FM_L * FM_S * FM_SPAN)
#define FM_MEMB		8u	/* memory blocks a transaction can use */
#define FM_TXN_MAX	6u
#define FM_HITS		4096u

struct fm {
	const struct fm_config *c;
	struct fm_stats *st;
	char *why;
	size_t why_len;
	int broken;
	uint64_t rng;
	unsigned step;
	const char *op;
	char eng[40];
	uint32_t flags;			/* the live handle's open flags */
	int files;			/* the members are regular files (FULL can bite) */
	struct tt_store *s;
	const struct tt_geometry *g;
	uint8_t keys[FM_KEYS][TT_KEY_BYTES];
	uint8_t in[FM_KEYS];		/* in the live index after the last step */
	int64_t slot[FM_KEYS];
	uint8_t durable[FM_KEYS];	/* committed with its record on disk */
	uint8_t gone[FM_KEYS];		/* removed with its EMPTY record on disk */
	uint8_t ever[FM_KEYS];		/* committed at some point */
	unsigned n_keys;
	struct tt_store_stats stats;	/* the live handle's, after the last step */
	struct tt_fault_hit hits[FM_HITS];
	int n_hits;
	uint8_t *mem;
	uint64_t base[FM_L * FM_S], stride[FM_L * FM_S];
	uint8_t val[FM_BLOCK], buf[FM_BLOCK];
};

uint64_t rnd(struct fm *m, uint64_t n);
__attribute__((format(printf, 2, 3)))
int broke(struct fm *m, const char *fmt, ...);
void value_of(unsigned k, uint8_t *out);
struct tt_memmap mem_map(struct fm *m, unsigned shift);
uint8_t *mem_obj(struct fm *m, unsigned id, unsigned o);
void mem_put(struct fm *m, unsigned id, unsigned k);
int mem_is(struct fm *m, unsigned id, unsigned k);
void pick_ids(struct fm *m, uint32_t *ids, unsigned n);
void arm_random(struct fm *m);
void drain(struct fm *m);
void disarm(struct fm *m);
int hit_failed(const struct tt_fault_hit *h, unsigned op, unsigned kind);
int slot_hit_err(struct fm *m, int64_t slot, unsigned op, int err);
int slot_hit(struct fm *m, int64_t slot, unsigned op);
int err_explained(struct fm *m, int64_t slot, unsigned op, int err);
int data_hit(struct fm *m, unsigned op, unsigned kind);
int flush_hit(struct fm *m);
int index_of(struct fm *m, struct tt_store *s, uint8_t *in, int64_t *slot);
void after_step(struct fm *m, const uint8_t *dropped, const uint8_t *may_add, int durable_ok);
void table_synced(struct fm *m);
void table_unsure(struct fm *m);
void check_disk(struct fm *m);

#endif
