// SPDX-License-Identifier: Apache-2.0
/*
 * The emulated controller's move ring (src/gpu/emu_dma_ring.h), run on the
 * CPU: threads stand in for the GPU warps of gio_dma_round() (claim by CAS,
 * move, then the done word), so the protocol the H200 runs is checked in CI.
 * Long copies cut into pieces, a ring too small for a batch (published as
 * entries come back), several batches in flight, out-of-order completion, and
 * "landed" never before every byte of the batch is where it belongs.
 */
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tap.h"
#include "testutil.h"
#include "../src/gpu/emu_dma_ring.h"

#define ENTRIES 16u
#define CHUNK 4096u
#define WORKERS 4
#define BATCHES 400
#define MAX_COPIES 12
#define MAX_LEN (48u << 10)
#define AREA (MAX_COPIES * (MAX_LEN + 64))

static struct tt_gio_dma_desc ring_mem[ENTRIES];
static volatile uint64_t posted;
static uint64_t claimed;		/* the warps' device counter */
static int stop_workers;
static unsigned wrong_flags, moves;
static char *host_area;			/* stands for host memory: TT_GIO_DMA_SRC_HOST sources */

static uint64_t rng = 0x9E3779B97F4A7C15ull;

static uint64_t next_rand(void)
{
	return xorshift64(&rng);
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int in_host(uint64_t a)
{
	return a >= (uint64_t)(uintptr_t)host_area && a < (uint64_t)(uintptr_t)host_area + 3 * AREA;
}

/* One "warp": what gio_dma_round() does, with a thread's own pace. */
static void *worker(void *arg)
{
	unsigned seed = (unsigned)(uintptr_t)arg;

	while (!__atomic_load_n(&stop_workers, __ATOMIC_ACQUIRE)) {
		uint64_t p = __atomic_load_n(&posted, __ATOMIC_ACQUIRE);
		uint64_t c = __atomic_load_n(&claimed, __ATOMIC_RELAXED);
		struct tt_gio_dma_desc d;

		if (c >= p || !__atomic_compare_exchange_n(&claimed, &c, c + 1, false, __ATOMIC_ACQ_REL,
							   __ATOMIC_RELAXED)) {
			sched_yield();
			continue;
		}
		d = ring_mem[c & (ENTRIES - 1)];
		if (!!(d.flags & TT_GIO_DMA_SRC_HOST) != in_host(d.src) || in_host(d.src) == in_host(d.dst))
			__atomic_add_fetch(&wrong_flags, 1, __ATOMIC_RELAXED);
		if ((seed = seed * 1103515245u + 12345u) >> 28 == 0)
			sched_yield();	/* finish out of order now and then */
		memcpy((void *)(uintptr_t)d.dst, (const void *)(uintptr_t)d.src, d.len);
		__atomic_add_fetch(&moves, 1, __ATOMIC_RELAXED);
		__atomic_store_n(&ring_mem[c & (ENTRIES - 1)].done, c + 1, __ATOMIC_RELEASE);
	}
	return NULL;
}

static struct emu_ring new_ring(void)
{
	struct emu_ring r;

	memset(ring_mem, 0, sizeof(ring_mem));
	posted = 0;
	claimed = 0;
	memset(&r, 0, sizeof(r));
	r.desc = ring_mem;
	r.posted = &posted;
	r.entries = ENTRIES;
	return r;
}

/* Pieces and their order, with nobody moving anything. */
static void pieces_and_order(void)
{
	struct emu_ring r = new_ring();
	struct emu_ring_cursor c;
	char a[10000], b[10000];
	void *dst[2] = {b, a}, *src[2] = {a, b};
	size_t len[2] = {10000, 16};
	bool all;

	emu_ring_begin(&r, &c);
	all = emu_ring_post(&r, &c, dst, src, len, 2, 1, CHUNK);
	tap_ok(all && r.head == 4 && posted == 4 && c.end == 4,
	       "a 10000-byte copy and a 16-byte one: 3 + 1 descriptors, all published");
	tap_ok(ring_mem[0].len == 4096 && ring_mem[1].len == 4096 && ring_mem[2].len == 1808 &&
	       ring_mem[1].src == (uint64_t)(uintptr_t)a + 4096 &&
	       ring_mem[2].dst == (uint64_t)(uintptr_t)b + 8192,
	       "pieces of at most the chunk, contiguous on both ends");
	tap_ok((ring_mem[0].flags & TT_GIO_DMA_SRC_HOST) && !(ring_mem[3].flags & TT_GIO_DMA_SRC_HOST),
	       "the first n_rd copies say their source is host memory, the others not");
	ring_mem[1].done = 2;	/* the second piece first: not landed, the first holds the tail */
	tap_ok(!emu_ring_landed(&r, &c, dst, src, len, 2, 1, CHUNK) && r.tail == 0,
	       "done out of order: the oldest not done holds the batch back");
	ring_mem[0].done = 1;
	ring_mem[2].done = 3;
	tap_ok(!emu_ring_landed(&r, &c, dst, src, len, 2, 1, CHUNK) && r.tail == 3,
	       "3 of 4 done: still not landed");
	ring_mem[3].done = 4;
	tap_ok(emu_ring_landed(&r, &c, dst, src, len, 2, 1, CHUNK) && r.tail == 4, "all done: landed");
}

/* A ring of 16 and batches of up to 12 copies of up to 48 KiB in 4 KiB pieces. */
struct batch {
	void *dst[MAX_COPIES], *src[MAX_COPIES];
	size_t len[MAX_COPIES];
	size_t n, n_rd;
	struct emu_ring_cursor cur;
};

static void make_batch(struct batch *b, char *gpu, char *host)
{
	size_t k, off = 0;

	b->n = 1 + next_rand() % MAX_COPIES;
	b->n_rd = next_rand() % (b->n + 1);
	for (k = 0; k < b->n; k++) {
		size_t len = 1 + next_rand() % MAX_LEN;

		if (next_rand() % 2)
			len = (len + 15) & ~(size_t)15;
		/* reads: host -> "GPU"; writes: "GPU" -> host */
		b->src[k] = k < b->n_rd ? host + off : gpu + off;
		b->dst[k] = k < b->n_rd ? gpu + off : host + off;
		b->len[k] = len;
		for (size_t i = 0; i < len; i++)
			((char *)b->src[k])[i] = (char)next_rand();
		memset(b->dst[k], 0, len);
		off += len + 64;
	}
}

static bool batch_exact(const struct batch *b)
{
	for (size_t k = 0; k < b->n; k++)
		if (memcmp(b->dst[k], b->src[k], b->len[k]))
			return false;
	return true;
}

static void concurrent(void)
{
	struct emu_ring r = new_ring();
	pthread_t th[WORKERS];
	char *gpu_area = malloc(3 * AREA);
	struct batch fifo[3];
	unsigned head = 0, n = 0, made = 0, landed = 0, inexact = 0;
	uint64_t pieces = 0;
	double t0 = now_s();
	int i;

	host_area = malloc(3 * AREA);	/* 3 batches in flight: an area each, both sides */
	for (i = 0; i < WORKERS; i++)
		pthread_create(&th[i], NULL, worker, (void *)(uintptr_t)(i + 1));
	while (landed < BATCHES && now_s() - t0 < 60) {
		if (n < 3 && made < BATCHES) {
			struct batch *b = &fifo[(head + n) % 3];
			unsigned slot = (head + n) % 3;

			make_batch(b, gpu_area + slot * AREA, host_area + slot * AREA);
			emu_ring_begin(&r, &b->cur);
			emu_ring_post(&r, &b->cur, b->dst, b->src, b->len, b->n, b->n_rd, CHUNK);
			n++;
			made++;
			for (size_t k = 0; k < b->n; k++)
				pieces += (b->len[k] + CHUNK - 1) / CHUNK;
		}
		if (n) {
			struct batch *b = &fifo[head];

			/* CQEs in fetch order: only the oldest may land */
			if (emu_ring_landed(&r, &b->cur, b->dst, b->src, b->len, b->n, b->n_rd, CHUNK)) {
				if (!batch_exact(b))
					inexact++;
				head = (head + 1) % 3;
				n--;
				landed++;
			}
		}
	}
	__atomic_store_n(&stop_workers, 1, __ATOMIC_RELEASE);
	for (i = 0; i < WORKERS; i++)
		pthread_join(th[i], NULL);
	tap_ok(landed == BATCHES, "%u of %u batches landed within 60 s, 3 in flight, %d movers",
	       landed, BATCHES, WORKERS);
	tap_ok(inexact == 0, "every batch exact the moment it landed (%u inexact)", inexact);
	tap_ok(moves == pieces && posted == pieces && claimed == pieces && r.tail == r.head,
	       "each of %llu pieces moved exactly once (%u moves, %llu claimed)",
	       (unsigned long long)pieces, moves, (unsigned long long)claimed);
	tap_ok(wrong_flags == 0, "every piece's direction flag right (%u wrong)", wrong_flags);
	tap_ok(r.head > 4 * ENTRIES, "the ring wrapped %llu times",
	       (unsigned long long)(r.head / ENTRIES));
	free(gpu_area);
	free(host_area);
}

int main(void)
{
	pieces_and_order();
	concurrent();
	return tap_done();
}
