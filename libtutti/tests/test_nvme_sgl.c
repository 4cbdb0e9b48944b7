/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Description: SGL mapping and the PRP-or-SGL policy of tutti/nvme_sgl.h.
 * Every mapping is read back by a model of a controller's SGL walker that
 * enforces the NVMe 1.4 segment rules and must yield the merged buffer.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <tutti/nvme_sgl.h>

#include "tap.h"
#include "testutil.h"

#define MAX_CHUNKS 8
#define CHUNK_MAX_BYTES 4096u

struct listmem {
	struct tt_nvme_list list;
	uint64_t bus[MAX_CHUNKS];
	struct tt_nvme_sgl_desc *mem;
};

static void listmem_init(struct listmem *lm, unsigned cap, unsigned nchunks)
{
	lm->mem = aligned_alloc(4096, CHUNK_MAX_BYTES * MAX_CHUNKS);
	memset(lm->mem, 0xee, CHUNK_MAX_BYTES * MAX_CHUNKS);
	for (unsigned c = 0; c < MAX_CHUNKS; c++)
		lm->bus[c] = 0xb0000000ull + (uint64_t)(7 * c + 2) * 0x1000 + 0x40 * c;
	lm->list.vaddr = lm->mem;
	lm->list.bus = lm->bus;
	lm->list.nchunks = nchunks;
	lm->list.chunk_bytes = cap * 16;
}

static void listmem_set_cap(struct listmem *lm, unsigned cap)
{
	memset(lm->mem, 0xee, CHUNK_MAX_BYTES * MAX_CHUNKS);
	lm->list.chunk_bytes = cap * 16;
}

/* Map a segment's bus address back to memory; the segment must fit its chunk. */
static struct tt_nvme_sgl_desc *translate(const struct listmem *lm, uint64_t bus, uint32_t len)
{
	for (unsigned c = 0; c < lm->list.nchunks; c++)
		if (lm->bus[c] == bus && len <= lm->list.chunk_bytes)
			return (struct tt_nvme_sgl_desc *)((char *)lm->mem +
							   (size_t)c * lm->list.chunk_bytes);
	return NULL;
}

static bool desc_clean(const struct tt_nvme_sgl_desc *d)
{
	return d->rsvd[0] == 0 && d->rsvd[1] == 0 && d->rsvd[2] == 0 && (d->type & 0xf) == 0;
}

/*
 * Model of the controller: follow the SGL and return its data blocks, or -1
 * on a rule violation. *@nseg counts SGL segments read from list memory.
 */
static int walk_sgl(const struct tt_nvme_sqe *sqe, const struct listmem *lm,
		    struct range *out, int max, unsigned *nseg)
{
	struct tt_nvme_sgl_desc d = sqe->dptr.sgl;
	int n = 0;

	*nseg = 0;
	if ((sqe->flags & TT_NVME_FLAG_PSDT_MASK) != TT_NVME_FLAG_PSDT_SGL || !desc_clean(&d))
		return -1;
	if (tt_nvme_sgl_desc_type(&d) == TT_NVME_SGL_TYPE_DATA_BLOCK) {
		out[0].addr = d.addr;
		out[0].len = d.len;
		return 1;
	}
	for (;;) {
		uint8_t t = tt_nvme_sgl_desc_type(&d);
		const struct tt_nvme_sgl_desc *seg;
		unsigned cnt;
		bool chained = false;

		if (t != TT_NVME_SGL_TYPE_SEGMENT && t != TT_NVME_SGL_TYPE_LAST_SEGMENT)
			return -1;
		if (d.len == 0 || d.len % 16 || (d.addr & 7))
			return -1; /* qword aligned array of whole descriptors */
		seg = translate(lm, d.addr, d.len);
		if (!seg)
			return -1;
		++*nseg;
		cnt = d.len / 16;
		for (unsigned j = 0; j < cnt; j++) {
			uint8_t et = tt_nvme_sgl_desc_type(&seg[j]);

			if (!desc_clean(&seg[j]))
				return -1;
			if (et == TT_NVME_SGL_TYPE_SEGMENT || et == TT_NVME_SGL_TYPE_LAST_SEGMENT) {
				/* only last in a segment, never in the last segment */
				if (j != cnt - 1 || t == TT_NVME_SGL_TYPE_LAST_SEGMENT)
					return -1;
				d = seg[j];
				chained = true;
				break;
			}
			if (et != TT_NVME_SGL_TYPE_DATA_BLOCK || n == max)
				return -1;
			out[n].addr = seg[j].addr;
			out[n++].len = seg[j].len;
		}
		if (t == TT_NVME_SGL_TYPE_LAST_SEGMENT)
			return n;
		if (!chained)
			return -1; /* a Segment descriptor promised more */
	}
}

/* Reference merge of contiguous neighbours. */
static int merge(const struct tt_dma_seg *segs, unsigned nsegs, struct range *out)
{
	int n = 0;

	for (unsigned i = 0; i < nsegs; i++) {
		if (n && out[n - 1].addr + out[n - 1].len == segs[i].addr) {
			out[n - 1].len += segs[i].len;
		} else {
			out[n].addr = segs[i].addr;
			out[n++].len = segs[i].len;
		}
	}
	return n;
}

static long ret_of(int r)
{
	return r;
}

static const struct tt_nvme_sgl_desc *chunk(const struct listmem *lm, unsigned c)
{
	return (const struct tt_nvme_sgl_desc *)((const char *)lm->mem +
						 (size_t)c * lm->list.chunk_bytes);
}

static bool desc_is(const struct tt_nvme_sgl_desc *d, uint64_t addr, uint32_t len, uint8_t type)
{
	return d->addr == addr && d->len == len && d->type == (uint8_t)(type << 4) && desc_clean(d);
}

/* n non-contiguous 512-byte data blocks */
static void scattered(struct tt_dma_seg *segs, unsigned n)
{
	for (unsigned i = 0; i < n; i++) {
		segs[i].addr = 0x70000000ull + (uint64_t)i * 0x10000;
		segs[i].len = 512;
	}
}

static void test_cases(void)
{
	const uint64_t A = 0x10000000, B = 0x20000000, C = 0x30000000;
	struct tt_dma_seg segs[16];
	struct tt_nvme_sqe sqe, before;
	struct listmem lm;
	const struct tt_nvme_sgl_desc *c0, *c1, *c2;

	listmem_init(&lm, 4, MAX_CHUNKS);

	tt_nvme_cmd_read(&sqe, 1, 0, 8);
	segs[0].addr = A + 3;
	segs[0].len = 4093;
	tap_eq(ret_of(tt_nvme_map_sgl(&sqe, segs, 1, 0, NULL)), 0, "single segment, no list memory");
	tap_eq(sqe.flags & TT_NVME_FLAG_PSDT_MASK, TT_NVME_FLAG_PSDT_SGL, "PSDT = 01b");
	tap_ok(desc_is(&sqe.dptr.sgl, A + 3, 4093, TT_NVME_SGL_TYPE_DATA_BLOCK),
	       "single segment: data block descriptor in DPTR (byte address, odd length)");

	for (unsigned i = 0; i < 4; i++) {
		segs[i].addr = A + i * 4096;
		segs[i].len = 4096;
	}
	tap_eq(tt_nvme_sgl_count(segs, 4), 1, "4 contiguous pages count as 1 descriptor");
	tap_eq(ret_of(tt_nvme_map_sgl(&sqe, segs, 4, 0, NULL)), 0, "4 contiguous pages mapped");
	tap_ok(desc_is(&sqe.dptr.sgl, A, 16384, TT_NVME_SGL_TYPE_DATA_BLOCK),
	       "contiguous pages coalesce into one 16 KiB data block in DPTR");

	segs[0] = (struct tt_dma_seg){ A, 4096 };
	segs[1] = (struct tt_dma_seg){ B, 100 };
	segs[2] = (struct tt_dma_seg){ C, 64 };
	tap_eq(tt_nvme_sgl_count(segs, 3), 3, "3 scattered segments count as 3");
	tap_eq(ret_of(tt_nvme_map_sgl(&sqe, segs, 3, 0, &lm.list)), 0, "3 scattered segments mapped");
	c0 = chunk(&lm, 0);
	tap_ok(desc_is(&sqe.dptr.sgl, lm.bus[0], 48, TT_NVME_SGL_TYPE_LAST_SEGMENT),
	       "scattered: DPTR is a Last Segment descriptor of 3 x 16 bytes");
	tap_ok(desc_is(&c0[0], A, 4096, 0) && desc_is(&c0[1], B, 100, 0) && desc_is(&c0[2], C, 64, 0),
	       "scattered: list holds the 3 data blocks in order");
	tap_eq(c0[3].type, 0xee, "scattered: nothing written past the 3 descriptors");

	segs[0] = (struct tt_dma_seg){ A, 4096 };
	segs[1] = (struct tt_dma_seg){ A + 4096, 4096 };
	segs[2] = (struct tt_dma_seg){ B, 100 };
	segs[3] = (struct tt_dma_seg){ C, 8 };
	segs[4] = (struct tt_dma_seg){ C + 8, 8 };
	segs[5] = (struct tt_dma_seg){ C + 32, 8 };
	listmem_set_cap(&lm, 4);
	tap_eq(ret_of(tt_nvme_map_sgl(&sqe, segs, 6, 0, &lm.list)), 0, "mixed segments mapped");
	tap_ok(desc_is(&sqe.dptr.sgl, lm.bus[0], 64, TT_NVME_SGL_TYPE_LAST_SEGMENT) &&
	       desc_is(&c0[0], A, 8192, 0) && desc_is(&c0[1], B, 100, 0) &&
	       desc_is(&c0[2], C, 16, 0) && desc_is(&c0[3], C + 32, 8, 0),
	       "mixed: merges only contiguous runs; 4 blocks exactly fill a 4-entry chunk");

	/* Chaining, 4 descriptors a chunk. */
	scattered(segs, 5);
	listmem_set_cap(&lm, 4);
	tap_eq(ret_of(tt_nvme_map_sgl(&sqe, segs, 5, 0, &lm.list)), 0, "5 blocks, 4 per chunk");
	c0 = chunk(&lm, 0);
	c1 = chunk(&lm, 1);
	tap_ok(desc_is(&sqe.dptr.sgl, lm.bus[0], 64, TT_NVME_SGL_TYPE_SEGMENT),
	       "5/4: DPTR is a Segment descriptor covering the whole first segment (64 bytes)");
	tap_ok(desc_is(&c0[0], segs[0].addr, 512, 0) && desc_is(&c0[2], segs[2].addr, 512, 0),
	       "5/4: first segment holds blocks 0-2");
	tap_ok(desc_is(&c0[3], lm.bus[1], 32, TT_NVME_SGL_TYPE_LAST_SEGMENT),
	       "5/4: its last entry is a Last Segment descriptor of 2 x 16 bytes");
	tap_ok(desc_is(&c1[0], segs[3].addr, 512, 0) && desc_is(&c1[1], segs[4].addr, 512, 0),
	       "5/4: last segment holds blocks 3-4");

	scattered(segs, 7);
	listmem_set_cap(&lm, 4);
	tap_eq(ret_of(tt_nvme_map_sgl(&sqe, segs, 7, 0, &lm.list)), 0, "7 blocks, 4 per chunk");
	tap_ok(desc_is(&c0[3], lm.bus[1], 64, TT_NVME_SGL_TYPE_LAST_SEGMENT) &&
	       desc_is(&c1[3], segs[6].addr, 512, 0),
	       "7/4: last segment is full with 4 data blocks, no further link");

	scattered(segs, 8);
	listmem_set_cap(&lm, 4);
	tap_eq(ret_of(tt_nvme_map_sgl(&sqe, segs, 8, 0, &lm.list)), 0, "8 blocks, 4 per chunk");
	c2 = chunk(&lm, 2);
	tap_ok(desc_is(&sqe.dptr.sgl, lm.bus[0], 64, TT_NVME_SGL_TYPE_SEGMENT) &&
	       desc_is(&c0[3], lm.bus[1], 64, TT_NVME_SGL_TYPE_SEGMENT) &&
	       desc_is(&c1[3], lm.bus[2], 32, TT_NVME_SGL_TYPE_LAST_SEGMENT),
	       "8/4: Segment -> Segment(64) -> Last Segment(32)");
	tap_ok(desc_is(&c1[0], segs[3].addr, 512, 0) && desc_is(&c2[0], segs[6].addr, 512, 0) &&
	       desc_is(&c2[1], segs[7].addr, 512, 0) && c2[2].type == 0xee,
	       "8/4: blocks 3-5 in segment 1, 6-7 in segment 2");

	/* Rejections leave the command untouched. */
	tt_nvme_cmd_read(&sqe, 1, 0, 8);
	before = sqe;
	scattered(segs, 8);
	lm.list.nchunks = 2;
	tap_eq((uint64_t)ret_of(tt_nvme_map_sgl(&sqe, segs, 8, 0, &lm.list)), (uint64_t)-TT_ENOSPC,
	       "8 blocks in 2 chunks of 4: -ENOSPC");
	lm.list.nchunks = MAX_CHUNKS;
	tap_eq((uint64_t)ret_of(tt_nvme_map_sgl(&sqe, segs, 2, 0, NULL)), (uint64_t)-TT_ENOSPC,
	       "2 blocks without list memory: -ENOSPC");
	listmem_set_cap(&lm, 1);
	tap_eq((uint64_t)ret_of(tt_nvme_map_sgl(&sqe, segs, 2, 0, &lm.list)), (uint64_t)-TT_ENOSPC,
	       "1-descriptor chunks cannot hold a list: -ENOSPC");
	listmem_set_cap(&lm, 4);
	tap_eq((uint64_t)ret_of(tt_nvme_map_sgl(&sqe, segs, 8, 4095, &lm.list)), (uint64_t)-TT_E2BIG,
	       "above MDTS: -E2BIG");
	tap_eq(ret_of(tt_nvme_map_sgl(&sqe, segs, 8, 4096, &lm.list)), 0, "exactly MDTS accepted");
	sqe = before;
	segs[3].len = 0;
	tap_eq((uint64_t)ret_of(tt_nvme_map_sgl(&sqe, segs, 8, 0, &lm.list)), (uint64_t)-TT_EINVAL,
	       "empty segment: -EINVAL");
	segs[3].len = 512;
	lm.bus[1] += 4;
	tap_eq((uint64_t)ret_of(tt_nvme_map_sgl(&sqe, segs, 8, 0, &lm.list)), (uint64_t)-TT_EINVAL,
	       "list chunk not qword aligned: -EINVAL");
	lm.bus[1] -= 4;
	lm.list.chunk_bytes = 40;
	tap_eq((uint64_t)ret_of(tt_nvme_map_sgl(&sqe, segs, 8, 0, &lm.list)), (uint64_t)-TT_EINVAL,
	       "chunk size not a whole number of descriptors: -EINVAL");
	tap_ok(!memcmp(&sqe, &before, sizeof(sqe)), "rejected mappings leave the command alone");
	tap_eq((uint64_t)ret_of(tt_nvme_map_sgl(&sqe, segs, 0, 0, &lm.list)), (uint64_t)-TT_EINVAL,
	       "no segments: -EINVAL");
	free(lm.mem);
}

/* Random buffers of 1-60 pieces, chunk capacities 2..256, walked back. */
static void test_random(void)
{
	const unsigned caps[] = { 2, 3, 4, 5, 8, 16, 256 };
	uint64_t seed = 0x2545f4914f6cdd1dull;
	struct tt_dma_seg segs[64];
	struct range got[64], want[64];
	unsigned cases = 0, bad = 0, chained = 0, nseg;
	struct listmem lm;
	struct tt_nvme_sqe sqe;

	listmem_init(&lm, 4, MAX_CHUNKS);
	for (int iter = 0; iter < 20000; iter++) {
		unsigned cap = caps[iter % 7];
		unsigned ns, n, need;
		uint64_t addr = 0x5000000000ull;
		int r, ng, nw;

		seed = seed * 6364136223846793005ull + 1442695040888963407ull;
		ns = 1 + (unsigned)(seed >> 58);
		for (unsigned i = 0; i < ns; i++) {
			seed = seed * 6364136223846793005ull + 1442695040888963407ull;
			if ((seed >> 30) % 4) /* gap three times in four */
				addr += 1 + (seed >> 40) % 100000;
			segs[i].addr = addr;
			segs[i].len = 1 + (uint32_t)((seed >> 12) % 70000);
			addr += segs[i].len;
		}
		listmem_set_cap(&lm, cap);
		tt_nvme_cmd_write(&sqe, 1, 0, 1);
		r = tt_nvme_map_sgl(&sqe, segs, ns, 0, &lm.list);
		nw = merge(segs, ns, want);
		n = (unsigned)nw;
		need = n == 1 ? 0 : tt_nvme_list_chunks(n, cap);
		cases++;
		if (need > MAX_CHUNKS) {
			if (r != -TT_ENOSPC && bad++ < 5)
				tap_diag("iter %d: %u blocks cap %u: ret %d, want -ENOSPC", iter, n, cap, r);
			continue;
		}
		nseg = 0;
		ng = r ? -1 : walk_sgl(&sqe, &lm, got, 64, &nseg);
		if (nseg > 1)
			chained++;
		if (r || tt_nvme_sgl_count(segs, ns) != n || !ranges_equal(got, ng, want, nw) ||
		    nseg != need) {
			if (bad++ < 5)
				tap_diag("iter %d: %u segs -> %u blocks, cap %u: ret %d, got %d, %u segments",
					 iter, ns, n, cap, r, ng, nseg);
		}
	}
	tap_ok(bad == 0 && chained > 1000,
	       "%u random buffers (%u with chained segments) walk back to the merged buffer",
	       cases, chained);
	free(lm.mem);
}

static void test_policy(void)
{
	struct tt_nvme_xfer_caps caps = { .page_size = 4096, .mdts_bytes = 0,
					  .sgls = TT_NVME_SGLS_BYTE_ALIGNED, .sgl_threshold = 8192 };
	struct tt_dma_seg segs[3] = { { 0x10000, 4096 }, { 0x30000, 4096 }, { 0x50000, 4096 } };
	struct tt_nvme_sqe sqe;
	struct listmem lm;

	listmem_init(&lm, 256, 2);
	lm.list.chunk_bytes = 4096;
	for (unsigned c = 0; c < MAX_CHUNKS; c++)
		lm.bus[c] &= ~0xfffull; /* page aligned, valid as PRP list pages too */

	tap_ok(!tt_nvme_sgl_supported(0), "SGLS 0: no SGL support");
	tap_ok(tt_nvme_sgl_supported(1), "SGLS 1: byte aligned SGLs");
	tap_ok(tt_nvme_sgl_supported(2), "SGLS 2: dword aligned SGLs");
	tap_ok(!tt_nvme_sgl_supported(3), "SGLS 3 is reserved: no SGL");
	tap_ok(tt_nvme_sgl_supported(0x00100001u), "other SGLS bits are ignored");
	tap_ok(tt_nvme_sgl_dword_only(2) && !tt_nvme_sgl_dword_only(1), "dword-only mode detected");

	tap_eq(ret_of(tt_nvme_map(&sqe, 1, segs, 3, &caps, &lm.list)), 0, "I/O queue, 12 KiB");
	tap_eq(sqe.flags & TT_NVME_FLAG_PSDT_MASK, TT_NVME_FLAG_PSDT_SGL,
	       "SGL when supported, I/O queue, above the threshold");
	tap_eq(ret_of(tt_nvme_map(&sqe, 0, segs, 3, &caps, &lm.list)), 0, "admin queue, 12 KiB");
	tap_eq(sqe.flags & TT_NVME_FLAG_PSDT_MASK, TT_NVME_FLAG_PSDT_PRP, "admin queue takes PRPs");
	tap_eq(sqe.dptr.prp.prp2, lm.bus[0], "admin queue: PRP2 points to a PRP list");
	tap_ok(((const uint64_t *)lm.mem)[0] == 0x30000 && ((const uint64_t *)lm.mem)[1] == 0x50000,
	       "admin queue: PRP entries 2 and 3 in list memory");
	tap_eq(ret_of(tt_nvme_map(&sqe, 1, segs, 1, &caps, &lm.list)), 0, "I/O queue, 4 KiB");
	tap_eq(sqe.flags & TT_NVME_FLAG_PSDT_MASK, TT_NVME_FLAG_PSDT_PRP, "below the threshold: PRP");
	caps.sgls = 0;
	tt_nvme_map(&sqe, 1, segs, 3, &caps, &lm.list);
	tap_eq(sqe.flags & TT_NVME_FLAG_PSDT_MASK, TT_NVME_FLAG_PSDT_PRP, "no SGL support: PRP");
	caps.sgls = TT_NVME_SGLS_DWORD_ALIGNED;
	tt_nvme_map(&sqe, 1, segs, 3, &caps, &lm.list);
	tap_eq(sqe.flags & TT_NVME_FLAG_PSDT_MASK, TT_NVME_FLAG_PSDT_SGL, "dword-only, aligned: SGL");
	segs[2].len = 4094;
	tt_nvme_map(&sqe, 1, segs, 3, &caps, &lm.list);
	tap_eq(sqe.flags & TT_NVME_FLAG_PSDT_MASK, TT_NVME_FLAG_PSDT_PRP,
	       "dword-only, odd length: falls back to PRP");
	caps.sgls = TT_NVME_SGLS_BYTE_ALIGNED;
	tt_nvme_map(&sqe, 1, segs, 3, &caps, &lm.list);
	tap_eq(sqe.flags & TT_NVME_FLAG_PSDT_MASK, TT_NVME_FLAG_PSDT_SGL, "byte aligned, odd length: SGL");
	segs[1].addr += 8;
	tap_eq(ret_of(tt_nvme_map(&sqe, 1, segs, 3, &caps, &lm.list)), 0,
	       "SGL takes a segment PRPs could not describe");
	tap_eq((uint64_t)ret_of(tt_nvme_map(&sqe, 0, segs, 3, &caps, &lm.list)), (uint64_t)-TT_EINVAL,
	       "the same buffer on the admin queue: PRP rules reject it");
	caps.mdts_bytes = 8192;
	tap_eq((uint64_t)ret_of(tt_nvme_map(&sqe, 1, segs, 3, &caps, &lm.list)), (uint64_t)-TT_E2BIG,
	       "policy passes MDTS to the SGL mapper");
	segs[1].addr -= 8;
	tap_eq((uint64_t)ret_of(tt_nvme_map(&sqe, 0, segs, 3, &caps, &lm.list)), (uint64_t)-TT_E2BIG,
	       "policy passes MDTS to the PRP mapper");
	free(lm.mem);
}

int main(void)
{
	test_cases();
	test_random();
	test_policy();
	return tap_done();
}
