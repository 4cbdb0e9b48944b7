// SPDX-License-Identifier: Apache-2.0
/*
 * Description: the power-loss replay workload, run inside the HIL guest on a
 * drive whose every write and flush QEMU's blklogwrites driver records.
 *
 *   pl_writer ENGINE MEMBER SEED OPS
 *
 * Formats a small single-member store on MEMBER (a tutti.ko namespace node
 * for ENGINE kqueue, the kernel nvme driver's block device for uring/psync),
 * then runs OPS operations drawn from SEED: write transactions of 1-4 blocks
 * through the layer API (some prepared first, with a block vetoed; some two
 * transactions interleaved; some through tt_store_put; some aborted after a
 * few layers), and invalidations.
 * The store has fewer slots than the workload has keys, so most writes evict.
 *
 * After format and after every acknowledged operation n, a marker "op n
 * acknowledged" is written to a reserved sector of the same drive, outside
 * the store (PL_MARK_OFF), and flushed: a replayed image says by itself which
 * operations had returned.  The journal on stdout tells the host what each
 * operation wrote and which (key, version) pairs the store held once it
 * returned (from the store's own index); tests/hil/powerloss/replay.py
 * checks every replayed state against it.  Block bytes are a pure function
 * of (key, version): every 16-byte unit of object m holds
 * (PL_MAGIC, key, version, m << 16 | unit), so a stale, misplaced, torn or
 * never-written sector cannot pass for the expected bytes.
 *
 * Journal lines (prefixed "PL ENGINE "):
 *   BEGIN seed=S ops=N slots=N keys=N ...  the store is formatted (op 0)
 *   W n k:v,...                            op n is about to write these
 *   ABORT n k:v,...                        op n writes these, then aborts
 *   INV n k,...                            op n drops these keys
 *   ACK n k:v,...                          op n returned; the store holds this
 *   END ops=N puts=N aborts=N evictions=N
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "tutti/error.h"
#include "tutti/store.h"
#include "../hil.h"

#define PL_LAYERS	4
#define PL_SPANS	2
#define PL_SPAN		4096u
#define PL_BLOCK	(PL_LAYERS * PL_SPANS * PL_SPAN)
#define PL_SLOTS	24u
#define PL_KEYS		40u
#define PL_MAX_TXN	4u
#define PL_MAGIC	0x4b424c50u		/* "PLBK" */
#define PL_MARK_OFF	(64ull << 20)		/* outside the store (< 2 MiB) */

static const char *eng;
static uint64_t rng;
static uint32_t cur_ver[PL_KEYS];	/* version of each key the store holds */
static uint8_t keys[PL_KEYS][TT_KEY_BYTES];
static int mark_fd;
static uint64_t seed;

static uint64_t next_rand(void)
{
	uint64_t z = (rng += 0x9E3779B97F4A7C15ull);

	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

static unsigned rand_below(unsigned n)
{
	return (unsigned)(next_rand() % n);
}

/* The bytes of (key @k, version @v): see the header comment. */
static void gen_block(uint32_t k, uint32_t v, uint8_t *buf)
{
	uint32_t *w = (uint32_t *)buf;

	for (uint32_t m = 0; m < PL_LAYERS * PL_SPANS; m++)
		for (uint32_t u = 0; u < PL_SPAN / 16; u++, w += 4) {
			w[0] = PL_MAGIC;
			w[1] = k;
			w[2] = v;
			w[3] = m << 16 | u;
		}
}

/* "op @n acknowledged", durable before the next operation starts. */
static void write_marker(uint64_t n)
{
	static uint8_t *page;
	uint64_t *f;

	if (!page)
		page = hil_pages(4096);
	memset(page, 0, 4096);
	memcpy(page, "TTPLMARK", 8);
	f = (uint64_t *)page;
	f[1] = n;
	f[2] = seed;
	f[3] = n * 0x9E3779B97F4A7C15ull ^ seed ^ 0x5A5A5A5A5A5A5A5Aull;
	if (pwrite(mark_fd, page, 4096, PL_MARK_OFF) != 4096 || fdatasync(mark_fd))
		bail("%s: marker %llu: %s", eng, (unsigned long long)n, strerror(errno));
}

/* The store's committed (key, version) pairs, from its index. */
static void print_ack(struct tt_store *s, uint64_t n)
{
	uint8_t lk[PL_SLOTS * TT_KEY_BYTES];
	int found = tt_store_list(s, 0, PL_SLOTS, lk, NULL, PL_SLOTS);
	const char *sep = "";

	if (found < 0)
		bail("%s: list: %s", eng, tt_errmsg());
	printf("PL %s ACK %llu ", eng, (unsigned long long)n);
	for (int i = 0; i < found; i++) {
		uint32_t k;

		for (k = 0; k < PL_KEYS; k++)
			if (!memcmp(keys[k], lk + (size_t)i * TT_KEY_BYTES, TT_KEY_BYTES))
				break;
		if (k == PL_KEYS || !cur_ver[k])
			bail("%s: op %llu: the store holds a key the workload never wrote",
			     eng, (unsigned long long)n);
		printf("%s%u:%u", sep, k, cur_ver[k]);
		sep = ",";
	}
	printf("%s\n", *sep ? "" : "-");
	fflush(stdout);
}

/* Distinct random keys. */
static unsigned pick_keys(uint32_t *ks, unsigned max)
{
	unsigned n = 1 + rand_below(max);

	for (unsigned i = 0; i < n; i++) {
		uint32_t k;
		unsigned j;

		do {
			k = rand_below(PL_KEYS);
			for (j = 0; j < i && ks[j] != k; j++)
				;
		} while (j < i);
		ks[i] = k;
	}
	return n;
}

struct pl_txn {
	struct tt_txn *t;
	unsigned n;
	uint32_t k[PL_MAX_TXN];
	int written[PL_MAX_TXN];
	uint8_t *mem;
	uint64_t base[PL_LAYERS * PL_SPANS], stride[PL_LAYERS * PL_SPANS];
};

/*
 * Begin a write of @n keys; prints which (key, version) it will write, as
 * @what: "W" (to be committed) or "ABORT" (to be aborted: never to be served).
 */
static void txn_begin(struct tt_store *s, struct pl_txn *x, uint64_t op, const char *what)
{
	uint8_t kb[PL_MAX_TXN * TT_KEY_BYTES];
	const char *sep = "";

	for (unsigned i = 0; i < x->n; i++)
		memcpy(kb + i * TT_KEY_BYTES, keys[x->k[i]], TT_KEY_BYTES);
	if (tt_store_write_begin(s, kb, x->n, &x->t))
		bail("%s: op %llu: write_begin: %s", eng, (unsigned long long)op, tt_errmsg());
	printf("PL %s %s %llu ", eng, what, (unsigned long long)op);
	for (unsigned i = 0; i < x->n; i++) {
		int present;

		tt_txn_slot(x->t, i, &present);
		x->written[i] = !present;
		gen_block(x->k[i], (uint32_t)op, x->mem + (size_t)i * PL_BLOCK);
		if (!present) {
			printf("%s%u:%llu", sep, x->k[i], (unsigned long long)op);
			sep = ",";
		}
	}
	printf("%s\n", *sep ? "" : "-");
	fflush(stdout);
	for (uint32_t m = 0; m < PL_LAYERS * PL_SPANS; m++) {
		x->base[m] = (uint64_t)(uintptr_t)(x->mem + (size_t)m * PL_SPAN);
		x->stride[m] = PL_BLOCK;
	}
}

/* Submit layers [0, @n), then wait for them. */
static void txn_layers(struct pl_txn *x, uint64_t op, uint32_t n)
{
	struct tt_memmap mm = { PL_LAYERS, PL_SPANS, x->base, x->stride };
	uint32_t ids[PL_MAX_TXN] = { 0, 1, 2, 3 };

	for (uint32_t l = 0; l < n; l++)
		if (tt_txn_layer(x->t, l, &mm, ids))
			bail("%s: op %llu: layer %u: %s", eng, (unsigned long long)op, l, tt_errmsg());
	for (uint32_t l = 0; l < n; l++)
		if (tt_txn_wait_layer(x->t, l))
			bail("%s: op %llu: wait layer %u: %s", eng, (unsigned long long)op, l,
			     tt_errmsg());
}

/* Finish; @veto: block to veto after a prepare (-1: no prepare). */
static void txn_finish(struct pl_txn *x, uint64_t op, int veto)
{
	int32_t st[PL_MAX_TXN];
	int ret;

	if (veto >= 0) {
		if (tt_txn_prepare(x->t, NULL) < 0)
			bail("%s: op %llu: prepare: %s", eng, (unsigned long long)op, tt_errmsg());
		tt_txn_veto(x->t, (unsigned)veto);
	}
	ret = tt_txn_finish(x->t, st);
	if (ret < 0)
		bail("%s: op %llu: finish: %s", eng, (unsigned long long)op, tt_errmsg());
	for (unsigned i = 0; i < x->n; i++) {
		if (st[i] && !(st[i] == -ECANCELED && (int)i == veto))
			bail("%s: op %llu: block %u: status %d", eng, (unsigned long long)op, i,
			     st[i]);
		if (x->written[i] && !st[i])
			cur_ver[x->k[i]] = (uint32_t)op;
	}
}

/* A write operation; returns 1 if it commits (0: aborted). */
static int op_put(struct tt_store *s, uint64_t op, uint8_t *mem)
{
	struct pl_txn a = { .mem = mem }, b = { .mem = mem + PL_MAX_TXN * PL_BLOCK };
	unsigned kind = rand_below(100);

	a.n = pick_keys(a.k, PL_MAX_TXN);
	if (kind < 15) {		/* the one-call path (tt_store_put) */
		int64_t slot;
		int stored = tt_store_lookup(s, keys[a.k[0]], 1, &slot) == 1;

		gen_block(a.k[0], (uint32_t)op, mem);
		if (stored)	/* a put of a stored key writes nothing */
			printf("PL %s W %llu -\n", eng, (unsigned long long)op);
		else
			printf("PL %s W %llu %u:%llu\n", eng, (unsigned long long)op, a.k[0],
			       (unsigned long long)op);
		fflush(stdout);
		if (tt_store_put(s, keys[a.k[0]], mem, PL_BLOCK))
			bail("%s: op %llu: put: %s", eng, (unsigned long long)op, tt_errmsg());
		if (!stored)
			cur_ver[a.k[0]] = (uint32_t)op;
		return 1;
	}
	if (kind < 25) {		/* some layers written, then aborted: never to be served */
		txn_begin(s, &a, op, "ABORT");
		txn_layers(&a, op, 1 + rand_below(PL_LAYERS));
		tt_txn_abort(a.t);
		return 0;
	}
	txn_begin(s, &a, op, "W");
	if (kind < 35) {		/* two transactions open at once */
		b.n = pick_keys(b.k, 2);
		txn_begin(s, &b, op, "W");
		txn_layers(&b, op, PL_LAYERS);
		txn_layers(&a, op, PL_LAYERS);
		txn_finish(&b, op, -1);
		txn_finish(&a, op, -1);
		return 1;
	}
	txn_layers(&a, op, PL_LAYERS);
	txn_finish(&a, op, kind < 50 ? (int)rand_below(a.n) : -1);	/* prepare, veto */
	return 1;
}

static void op_invalidate(struct tt_store *s, uint64_t op)
{
	uint32_t ks[2];
	int64_t slots[2];
	unsigned n = pick_keys(ks, 2), m = 0;
	const char *sep = "";

	printf("PL %s INV %llu ", eng, (unsigned long long)op);
	for (unsigned i = 0; i < n; i++) {
		if (tt_store_lookup(s, keys[ks[i]], 1, &slots[m]) == 1) {
			printf("%s%u", sep, ks[i]);
			sep = ",";
			m++;
		}
	}
	printf("%s\n", *sep ? "" : "-");
	fflush(stdout);
	if (m && tt_store_invalidate(s, slots, m) != (int)m)
		bail("%s: op %llu: invalidate: %s", eng, (unsigned long long)op, tt_errmsg());
}

int main(int argc, char **argv)
{
	struct tt_format_params p;
	struct tt_open_params op = { 0 };
	struct tt_store_info info;
	struct tt_store *s;
	const char *member;
	uint64_t n_ops, puts = 0, aborts = 0;
	uint8_t *mem;
	int reg;

	if (argc != 5) {
		fprintf(stderr, "usage: pl_writer ENGINE MEMBER SEED OPS\n");
		return 2;
	}
	eng = argv[1];
	member = argv[2];
	seed = strtoull(argv[3], NULL, 0);
	n_ops = strtoull(argv[4], NULL, 0);
	rng = seed;
	for (uint32_t k = 0; k < PL_KEYS; k++) {
		char name[32];

		snprintf(name, sizeof(name), "pl-%u", k);
		tt_key_from_bytes(name, strlen(name), keys[k]);
	}
	mem = hil_pages(2 * PL_MAX_TXN * PL_BLOCK);
	mark_fd = open(member, O_RDWR | (strcmp(eng, "kqueue") ? O_DIRECT : 0));
	if (mark_fd < 0)
		bail("%s: open %s for the marker: %s", eng, member, strerror(errno));

	memset(&p, 0, sizeof(p));
	strcpy(p.fp.model_id, "hil/powerloss");
	strcpy(p.fp.dtype, "bfloat16");
	p.fp.n_layers = PL_LAYERS;
	p.fp.kv_heads = 2;
	p.fp.head_dim = 64;
	p.fp.block_size = 16;	/* span 4 KiB, block 32 KiB */
	p.n_slots = PL_SLOTS;
	p.flags = TT_FORMAT_FORCE;
	if (tt_store_format(&member, 1, &p))
		bail("%s: format %s: %s", eng, member, tt_errmsg());
	op.engine = eng;
	if (tt_store_open(&member, 1, &op, &s))
		bail("%s: open %s: %s", eng, member, tt_errmsg());
	tt_store_get_info(s, &info);
	if (strcmp(info.engine, eng) || info.geo.span_bytes != PL_SPAN ||
	    info.member_bytes >= PL_MARK_OFF)
		bail("%s: store opened with engine %s, span %u, %llu bytes", eng, info.engine,
		     info.geo.span_bytes, (unsigned long long)info.member_bytes);
	/* kqueue: the engine addresses registered memory directly (no bounce pool) */
	reg = !tt_store_register_memory(s, mem, 2 * PL_MAX_TXN * PL_BLOCK);
	write_marker(0);
	printf("PL %s BEGIN seed=%llu ops=%llu slots=%u keys=%u member_bytes=%llu mark_off=%llu "
	       "registered=%d\n", eng, (unsigned long long)seed, (unsigned long long)n_ops, PL_SLOTS,
	       PL_KEYS, (unsigned long long)info.member_bytes, PL_MARK_OFF, reg);
	print_ack(s, 0);
	for (uint64_t n = 1; n <= n_ops; n++) {
		if (rand_below(100) < 10) {
			op_invalidate(s, n);
		} else if (op_put(s, n, mem)) {
			puts++;
		} else {
			aborts++;
		}
		print_ack(s, n);
		write_marker(n);
	}
	tt_store_get_info(s, &info);
	tt_store_close(s);
	printf("PL %s END ops=%llu puts=%llu aborts=%llu evictions=%llu\n", eng,
	       (unsigned long long)n_ops, (unsigned long long)puts, (unsigned long long)aborts,
	       (unsigned long long)info.stats.evictions);
	check(1, "%s: %llu operations (%llu write sequences, %llu aborted, %llu evictions) "
	      "acknowledged on %s", eng, (unsigned long long)n_ops, (unsigned long long)puts,
	      (unsigned long long)aborts, (unsigned long long)info.stats.evictions, member);
	return tap_failed != 0;
}
