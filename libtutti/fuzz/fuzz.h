/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Shared pieces of the libFuzzer targets over everything that reads a
 * store member's bytes (docs/reliability.md, "On-disk format: fuzzing and
 * limits").
 *
 * An input is member bytes as they lie on disk, after a control byte.
 * Checksums stop blind mutation at the first check, so the control byte
 * says which of them to recompute after mutation (fingerprint hash, either
 * superblock copy, the slot records): the fuzzer then reaches the checks
 * behind them, and inputs that leave a checksum stale still exercise the
 * checksum tests.  Members are memfds, opened by path (/proc/self/fd/N)
 * through the same tt_store_open() a user calls.
 *
 * After a successful open the targets do what a user does next (info,
 * list, locate, lookup, get, check, put then get) and assert what must hold
 * for any store that opens: every object's extent lies inside the data
 * region of its member, listed keys look up to their slots, a block just
 * put reads back identical, the bytes-written counts add up and grow by at
 * least the block's bytes.  A broken assertion aborts (a crash to
 * libFuzzer), as does any ASan/UBSan report.
 */
#ifndef TT_FUZZ_H
#define TT_FUZZ_H

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tutti/tutti.h"
#include "../src/store/store_impl.h"
#include "../src/support/util.h"

/* Control byte (first byte of an input). */
#define CTL_SEAL_FP	0x01	/* recompute fp_hash in both copies */
#define CTL_SEAL_A	0x02	/* recompute sb_sum of copy A */
#define CTL_SEAL_B	0x04	/* recompute sb_sum of copy B */
#define CTL_SEAL_RECS	0x08	/* recompute rec_sum of every non-zero record */
#define CTL_SIZE(c)	(((c) >> 4) & 3)	/* member size, see fuzz_member_size() */
#define CTL_RDONLY	0x40	/* open read-only */
#define CTL_REPAIR	0x80	/* check --repair (writable opens) */
#define CTL_SEAL_ALL	(CTL_SEAL_FP | CTL_SEAL_A | CTL_SEAL_B | CTL_SEAL_RECS)

/*
 * Members are sparse memfds no larger than this; blocks larger than
 * FUZZ_MAX_BLOCK are not read or written whole (time, not safety).
 */
#define FUZZ_MAX_MEMBER	(16ull << 20)
#define FUZZ_MAX_BLOCK	(1u << 20)
#define FUZZ_MAX_MEMBERS 4u

/* fuzz_plan's input: format parameters as raw fields. */
struct plan_input {
	uint32_t n_layers, kv_heads, head_dim, block_size;
	uint32_t n_spans, span_bytes, stripe_objs;
	uint64_t n_slots, member_bytes;
	uint8_t dtype, n_members;
	uint64_t probe_slot;
	uint32_t probe_layer, probe_span;
};

#define FUZZ_ASSERT(cond)							\
	do {									\
		if (!(cond)) {							\
			fprintf(stderr, "%s:%d: broken: %s (%s)\n", __FILE__,	\
				__LINE__, #cond, tt_errmsg());			\
			abort();						\
		}								\
	} while (0)

static inline int fuzz_memfd(unsigned i)
{
	static int fds[FUZZ_MAX_MEMBERS] = { -1, -1, -1, -1 };

	if (fds[i] < 0) {
		fds[i] = memfd_create("tutti-fuzz", MFD_CLOEXEC);
		if (fds[i] < 0) {
			perror("memfd_create");
			abort();
		}
	}
	return fds[i];
}

static inline void fuzz_path(unsigned i, char *buf, size_t len)
{
	snprintf(buf, len, "/proc/self/fd/%d", fuzz_memfd(i));
}

/* Make member @i hold exactly @data, then @size bytes in all (sparse). */
static inline void fuzz_fill_member(unsigned i, const void *data, size_t len, uint64_t size)
{
	int fd = fuzz_memfd(i);

	if (ftruncate(fd, 0) || (len && pwrite(fd, data, len, 0) != (ssize_t)len) ||
	    ftruncate(fd, (off_t)(size > len ? size : len))) {
		perror("memfd");
		abort();
	}
}

/* The superblock copy the seals and sizes go by: A if it has the magic stem. */
static inline const struct tt_superblock *fuzz_main_copy(const uint8_t *buf, size_t len)
{
	if (len >= TT_SB_SIZE && !memcmp(buf, TT_SB_MAGIC, TT_SB_MAGIC_STEM_LEN))
		return (const struct tt_superblock *)buf;
	if (len >= TT_TABLE_OFF)
		return (const struct tt_superblock *)(buf + TT_SB_SIZE);
	return NULL;
}

/* Recompute the checksums @ctl names, in place (@buf is 8-byte aligned). */
static inline void fuzz_seal(uint8_t *buf, size_t len, unsigned ctl)
{
	const struct tt_superblock *main_sb;

	for (unsigned c = 0; c < TT_SB_COPIES; c++) {
		struct tt_superblock *sb = (struct tt_superblock *)(buf + c * TT_SB_SIZE);

		if (len < (c + 1) * TT_SB_SIZE)
			break;
		if (ctl & CTL_SEAL_FP)
			sb->fp_hash = tt_sum_fingerprint(&sb->fp);
	}
	main_sb = fuzz_main_copy(buf, len);
	if ((ctl & CTL_SEAL_RECS) && main_sb && main_sb->table_off < len) {
		uint64_t room = (len - main_sb->table_off) / TT_RECORD_SIZE;
		uint64_t n = main_sb->n_slots < room ? main_sb->n_slots : room;
		struct tt_slot_record *r = (struct tt_slot_record *)(buf + main_sb->table_off);

		if (main_sb->table_off % 8 == 0)
			for (uint64_t i = 0; i < n; i++) {
				static const struct tt_slot_record zero;

				if (memcmp(&r[i], &zero, sizeof(zero)))
					r[i].rec_sum = tt_sum_record(&r[i], i);
			}
	}
	for (unsigned c = 0; c < TT_SB_COPIES; c++) {
		struct tt_superblock *sb = (struct tt_superblock *)(buf + c * TT_SB_SIZE);

		if (len < (c + 1) * TT_SB_SIZE)
			break;
		if (ctl & (c ? CTL_SEAL_B : CTL_SEAL_A))
			sb->sb_sum = tt_sum_superblock(sb);
	}
}

/*
 * The member size an input asks for: 0 the store's member_bytes, 1 the
 * input's length, 2 one page short of member_bytes (truncated), 3 one page
 * more.  Capped at FUZZ_MAX_MEMBER: a store claiming more is truncated.
 */
static inline uint64_t fuzz_member_size(const uint8_t *buf, size_t len, unsigned ctl)
{
	const struct tt_superblock *sb = fuzz_main_copy(buf, len);
	uint64_t want;

	if (!sb || CTL_SIZE(ctl) == 1)
		return len;
	want = sb->member_bytes;
	if (CTL_SIZE(ctl) == 2)
		want = want > 4096 ? want - 4096 : 0;
	else if (CTL_SIZE(ctl) == 3 && want < FUZZ_MAX_MEMBER)
		want += 4096;
	return want < FUZZ_MAX_MEMBER ? want : FUZZ_MAX_MEMBER;
}

/* An aligned, writable copy of @data (seals write into it). */
static inline uint8_t *fuzz_copy(const uint8_t *data, size_t len)
{
	uint8_t *buf = aligned_alloc(64, (len + 63) / 64 * 64 + 64);

	if (!buf)
		abort();
	memcpy(buf, data, len);
	return buf;
}

static inline void fuzz_check_extent(const struct tt_store *s, const struct tt_store_info *info,
				     uint64_t slot, uint32_t layer, uint32_t span)
{
	const struct tt_geometry *g = tt_store_geometry(s);
	struct tt_extent e;

	FUZZ_ASSERT(!tt_store_locate(s, slot, layer, span, &e));
	FUZZ_ASSERT(e.member < g->n_members);
	FUZZ_ASSERT(e.len == g->obj_stride && e.off % TT_OBJ_ALIGN == 0);
	FUZZ_ASSERT(e.off >= g->data_off && e.off >= TT_TABLE_OFF + info->table_bytes);
	FUZZ_ASSERT(e.off <= info->member_bytes && info->member_bytes - e.off >= e.len);
}

/* Bytes of one block as tt_store_put() takes it; 0 if over FUZZ_MAX_BLOCK. */
static inline size_t fuzz_block_bytes(const struct tt_geometry *g)
{
	uint64_t b = (uint64_t)tt_objs_per_slot(g) * g->span_bytes;

	return b <= FUZZ_MAX_BLOCK ? (size_t)b : 0;
}

static inline void fuzz_fill_pattern(uint8_t *p, size_t len, uint32_t seed)
{
	for (size_t i = 0; i < len; i++)
		p[i] = (uint8_t)(seed + i * 131 + (i >> 9));
}

/* The bytes-written counts of an open store hold together (store.h). */
static inline void fuzz_check_written(const struct tt_store *s, unsigned ctl)
{
	const struct tt_geometry *g = tt_store_geometry(s);
	struct tt_written w;
	uint64_t sum = 0;

	FUZZ_ASSERT(!tt_store_get_written(s, &w));
	FUZZ_ASSERT(w.n_members == g->n_members && w.state <= TT_WRITTEN_RESTARTED);
	FUZZ_ASSERT(w.not_saving <= TT_WRITTEN_COPY_A_DAMAGED);
	FUZZ_ASSERT((w.state == TT_WRITTEN_NONE) == (w.not_saving == TT_WRITTEN_NO_COUNTER));
	if (ctl & CTL_RDONLY)
		FUZZ_ASSERT(w.not_saving != TT_WRITTEN_SAVING && !w.since_open && !w.saves);
	for (unsigned i = 0; i < w.n_members; i++) {
		const struct tt_member_written *m = &w.member[i];

		FUZZ_ASSERT(m->saved <= m->bytes);
		FUZZ_ASSERT(!m->saving || w.not_saving == TT_WRITTEN_SAVING ||
			    w.not_saving == TT_WRITTEN_COPY_A_DAMAGED);
		FUZZ_ASSERT(!m->restarted || w.state == TT_WRITTEN_RESTARTED);
		sum = sum + m->bytes < sum ? UINT64_MAX : sum + m->bytes;
	}
	FUZZ_ASSERT(sum == w.bytes);
}

/* What a user does with a store that opened; @sizes: each member's bytes. */
static inline void fuzz_exercise(struct tt_store *s, unsigned ctl, const uint64_t *sizes)
{
	const struct tt_geometry *g = tt_store_geometry(s);
	struct tt_store_info info;
	struct tt_check_result res = { 0 };
	uint8_t keys[16 * TT_KEY_BYTES], key[TT_KEY_BYTES];
	int64_t slots[16], found, bad[8];
	size_t bb = fuzz_block_bytes(g);
	int n, rc;

	FUZZ_ASSERT(!tt_store_get_info(s, &info));
	fuzz_check_written(s, ctl);
	for (unsigned i = 0; i < g->n_members; i++)
		FUZZ_ASSERT(info.member_bytes <= sizes[i]);
	FUZZ_ASSERT(info.n_committed + info.n_free + info.n_bad_records + info.n_clearing == g->n_slots);

	/* The object furthest from the start, and the first. */
	fuzz_check_extent(s, &info, g->n_slots - 1, g->n_layers - 1, g->n_spans - 1);
	fuzz_check_extent(s, &info, 0, 0, 0);

	n = tt_store_list(s, 0, g->n_slots, keys, slots, 16);
	FUZZ_ASSERT(n >= 0 && (uint64_t)n == info.n_committed);
	for (int i = 0; i < n && i < 16; i++) {
		FUZZ_ASSERT(slots[i] >= 0 && (uint64_t)slots[i] < g->n_slots);
		fuzz_check_extent(s, &info, (uint64_t)slots[i], g->n_layers - 1, g->n_spans - 1);
		FUZZ_ASSERT(tt_store_lookup(s, keys + i * TT_KEY_BYTES, 1, &found) == 1);
		FUZZ_ASSERT(found == slots[i]);
	}
	if (n > 0 && bb) {
		uint8_t *buf = malloc(bb);

		FUZZ_ASSERT(buf);
		rc = tt_store_get(s, keys, buf, bb);	/* data is zeros: corrupt */
		FUZZ_ASSERT(rc == 0 || rc == -EBADMSG);
		free(buf);
	}
	if (bb && bb <= FUZZ_MAX_BLOCK / 4) {
		int repair = (ctl & CTL_REPAIR) && !(ctl & CTL_RDONLY);

		rc = tt_store_check(s, 0, g->n_slots, repair, &res, bad, 8);
		FUZZ_ASSERT(rc >= 0);
		FUZZ_ASSERT(res.ok + res.bad == res.checked);
	}
	/* A writable store with a usable slot takes a block and gives it back. */
	FUZZ_ASSERT(!tt_store_get_info(s, &info));
	if (!(ctl & CTL_RDONLY) && bb && info.n_free + info.n_committed) {
		uint8_t *in = malloc(bb), *out = malloc(bb);
		struct tt_written w0, w1;

		FUZZ_ASSERT(in && out);
		fuzz_fill_pattern(in, bb, (uint32_t)g->n_slots);
		tt_key_from_bytes("fuzz-put", 8, key);
		if (tt_store_lookup(s, key, 1, &found) == 1)	/* planted by the input */
			FUZZ_ASSERT(tt_store_invalidate(s, &found, 1) == 1);
		tt_store_get_written(s, &w0);
		rc = tt_store_put(s, key, in, bb);
		FUZZ_ASSERT(rc == 0);
		/* The block's objects at their stride, at least, were counted. */
		tt_store_get_written(s, &w1);
		FUZZ_ASSERT(w1.since_open - w0.since_open >=
			    (uint64_t)tt_objs_per_slot(g) * g->obj_stride ||
			    w1.since_open == UINT64_MAX);
		fuzz_check_written(s, ctl);
		memset(out, 0, bb);
		rc = tt_store_get(s, key, out, bb);
		FUZZ_ASSERT(rc == 0);
		FUZZ_ASSERT(!memcmp(in, out, bb));
		free(in);
		free(out);
	}
}

/* Open @n memfd members in the order @order, exercise, close. */
static inline void fuzz_open_exercise(unsigned n, const unsigned *order, unsigned ctl)
{
	char names[FUZZ_MAX_MEMBERS][32];
	const char *paths[FUZZ_MAX_MEMBERS];
	struct tt_open_params op = { .engine = "psync" };
	uint64_t by_index[FUZZ_MAX_MEMBERS];
	struct tt_store *s;

	for (unsigned i = 0; i < n; i++) {
		fuzz_path(order[i], names[i], sizeof(names[i]));
		paths[i] = names[i];
	}
	if (ctl & CTL_RDONLY)
		op.flags |= TT_OPEN_RDONLY;
	if (tt_store_open(paths, n, &op, &s))
		return;
	/* Sizes in member-index order, as the store sees them. */
	for (unsigned i = 0; i < n; i++) {
		int fds[TT_MAX_MEMBERS];
		off_t end;

		tt_store_member_fds(s, fds, NULL);
		end = lseek(fds[i], 0, SEEK_END);
		FUZZ_ASSERT(end >= 0);
		by_index[i] = (uint64_t)end;
	}
	fuzz_exercise(s, ctl, by_index);
	tt_store_close(s);
}

#endif
