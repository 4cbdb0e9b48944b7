/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Description: PRP mapping of tutti/nvme_prp.h. Every mapping is read back
 * by a small model of a controller's PRP walker and must describe exactly
 * the buffer's bytes; the NVMe 1.4 rules (PRP2 use, list chaining,
 * alignment, MDTS, list capacity) are checked case by case.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <tutti/nvme_prp.h>

#include "tap.h"
#include "testutil.h"

#define PS 4096u
#define EPP (PS / 8)
#define SENTINEL 0xdeaddeaddeaddeadull
#define MAX_CHUNKS 4

/* List memory with scattered, page aligned bus addresses. */
struct listmem {
	struct tt_nvme_list list;
	uint64_t bus[MAX_CHUNKS];
	uint64_t *mem;
	uint32_t page_size;
};

static void listmem_init(struct listmem *lm, uint32_t page_size, unsigned nchunks)
{
	lm->page_size = page_size;
	lm->mem = aligned_alloc(page_size, (size_t)page_size * MAX_CHUNKS);
	for (unsigned c = 0; c < MAX_CHUNKS; c++)
		lm->bus[c] = 0xa00000000000ull + (uint64_t)(5 * c + 3) * page_size;
	lm->list.vaddr = lm->mem;
	lm->list.bus = lm->bus;
	lm->list.nchunks = nchunks;
	lm->list.chunk_bytes = page_size;
}

static void listmem_poison(struct listmem *lm)
{
	for (size_t i = 0; i < (size_t)lm->page_size / 8 * MAX_CHUNKS; i++)
		lm->mem[i] = SENTINEL;
}

static uint64_t *listmem_translate(const struct listmem *lm, uint64_t bus)
{
	for (unsigned c = 0; c < lm->list.nchunks; c++)
		if (lm->bus[c] == bus)
			return lm->mem + (size_t)c * (lm->page_size / 8);
	return NULL;
}

/*
 * Model of the controller: follow PRP1, PRP2 and the PRP list for a transfer
 * of @len bytes and return the byte ranges, merged when contiguous, or -1
 * on anything the spec forbids. *@list_pages counts list pages read.
 */
static int walk_prp(const struct tt_nvme_sqe *sqe, uint64_t len,
		    const struct listmem *lm, struct range *out, int max,
		    unsigned *list_pages)
{
	const uint64_t ps = lm->page_size, epp = ps / 8;
	uint64_t prp1 = sqe->dptr.prp.prp1, prp2 = sqe->dptr.prp.prp2;
	uint64_t off = prp1 & (ps - 1), rem, chunk, e;
	uint64_t *list;
	unsigned idx = 0;
	int n = 0;

	*list_pages = 0;
	if ((sqe->flags & TT_NVME_FLAG_PSDT_MASK) != TT_NVME_FLAG_PSDT_PRP || (off & 3))
		return -1;
#define EMIT(a, l) do {                                                     \
		if (n && out[n - 1].addr + out[n - 1].len == (a)) {         \
			out[n - 1].len += (l);                              \
		} else {                                                    \
			if (n == max)                                       \
				return -1;                                  \
			out[n].addr = (a);                                  \
			out[n++].len = (l);                                 \
		}                                                           \
	} while (0)
	chunk = len < ps - off ? len : ps - off;
	EMIT(prp1, chunk);
	rem = len - chunk;
	if (rem == 0)
		return prp2 == 0 ? n : -1;
	if (rem <= ps) {
		if (prp2 & (ps - 1))
			return -1;
		EMIT(prp2, rem);
		return n;
	}
	list = listmem_translate(lm, prp2);
	if (!list)
		return -1;
	*list_pages = 1;
	while (rem) {
		if (idx == epp - 1 && rem > ps) {
			list = listmem_translate(lm, list[idx]);
			if (!list)
				return -1;
			++*list_pages;
			idx = 0;
			continue;
		}
		e = list[idx++];
		if (e & (ps - 1))
			return -1;
		chunk = rem < ps ? rem : ps;
		EMIT(e, chunk);
		rem -= chunk;
	}
#undef EMIT
	return n;
}

/* Expected ranges for pages[] + first_off, merged when contiguous. */
static int expect_pages(const uint64_t *pages, uint32_t off, uint64_t len,
			uint32_t ps, struct range *out)
{
	uint64_t rem = len, chunk;
	int n = 0;

	for (unsigned i = 0; rem; i++) {
		uint64_t a = pages[i] + (i ? 0 : off);

		chunk = (i ? ps : ps - off);
		if (chunk > rem)
			chunk = rem;
		if (n && out[n - 1].addr + out[n - 1].len == a) {
			out[n - 1].len += chunk;
		} else {
			out[n].addr = a;
			out[n++].len = chunk;
		}
		rem -= chunk;
	}
	return n;
}

static uint64_t *make_pages(unsigned n, uint32_t ps)
{
	uint64_t *p = malloc(sizeof(*p) * n);

	/* Descending and spaced: no two pages are neighbours on the bus. */
	for (unsigned i = 0; i < n; i++)
		p[i] = 0x100000000000ull + (uint64_t)(n - i) * 2 * ps;
	return p;
}

static long ret_of(int r)
{
	return r;
}

#define NPAGES (3 * EPP + 8)

static void test_cases(void)
{
	uint64_t *pages = make_pages(NPAGES, PS);
	struct tt_nvme_sqe sqe, before;
	struct listmem lm;
	uint64_t *l;

	listmem_init(&lm, PS, MAX_CHUNKS);
	l = lm.mem;

	listmem_poison(&lm);
	tt_nvme_cmd_read(&sqe, 1, 0, 1);
	sqe.flags = TT_NVME_FLAG_PSDT_SGL;
	tap_eq(ret_of(tt_nvme_map_prp(&sqe, pages, NPAGES, 512, 1024, PS, 0, &lm.list)), 0,
	       "offset inside one page: mapped");
	tap_eq(sqe.dptr.prp.prp1, pages[0] + 512, "offset inside one page: PRP1 = page + offset");
	tap_eq(sqe.dptr.prp.prp2, 0, "offset inside one page: PRP2 = 0");
	tap_eq(sqe.flags & TT_NVME_FLAG_PSDT_MASK, 0, "PSDT reset to PRP");
	tap_eq(l[0], SENTINEL, "no PRP list written for one page");

	tap_eq(ret_of(tt_nvme_map_prp(&sqe, pages, NPAGES, 0, PS, PS, 0, &lm.list)), 0,
	       "exactly one page: mapped");
	tap_ok(sqe.dptr.prp.prp1 == pages[0] && sqe.dptr.prp.prp2 == 0,
	       "exactly one page: PRP1 = page, PRP2 = 0");
	tap_eq(ret_of(tt_nvme_map_prp(&sqe, pages, NPAGES, PS - 4, 4, PS, 0, &lm.list)), 0,
	       "last dword of a page: mapped");
	tap_ok(sqe.dptr.prp.prp1 == pages[0] + PS - 4 && sqe.dptr.prp.prp2 == 0,
	       "last dword of a page: one page, PRP2 = 0");

	tap_eq(ret_of(tt_nvme_map_prp(&sqe, pages, NPAGES, 0, 2 * PS, PS, 0, NULL)), 0,
	       "exactly two pages: mapped without list memory");
	tap_ok(sqe.dptr.prp.prp1 == pages[0] && sqe.dptr.prp.prp2 == pages[1],
	       "exactly two pages: PRP2 = second page");
	tap_eq(ret_of(tt_nvme_map_prp(&sqe, pages, NPAGES, 512, PS, PS, 0, NULL)), 0,
	       "two pages with offset: mapped");
	tap_ok(sqe.dptr.prp.prp1 == pages[0] + 512 && sqe.dptr.prp.prp2 == pages[1],
	       "two pages with offset: PRP1 = page + 512, PRP2 = second page");
	tap_eq(ret_of(tt_nvme_map_prp(&sqe, pages, NPAGES, 512, 2 * PS - 512, PS, 0, NULL)), 0,
	       "two pages with offset, up to the end of the second page");
	tap_eq(sqe.dptr.prp.prp2, pages[1], "still PRP2 = second page");
	tap_eq(l[0], SENTINEL, "no PRP list written for two pages");
	tap_eq((uint64_t)ret_of(tt_nvme_map_prp(&sqe, pages, NPAGES, 512, 2 * PS - 511, PS, 0, NULL)),
	       (uint64_t)-TT_ENOSPC, "one byte into a third page needs a list: -ENOSPC without one");

	tap_eq(ret_of(tt_nvme_map_prp(&sqe, pages, NPAGES, 512, 2 * PS, PS, 0, &lm.list)), 0,
	       "three pages with offset: mapped");
	tap_eq(sqe.dptr.prp.prp2, lm.bus[0], "PRP2 points to the PRP list");
	tap_ok(l[0] == pages[1] && l[1] == pages[2] && l[2] == SENTINEL,
	       "list holds pages 2 and 3 and nothing more");

	listmem_poison(&lm);
	tap_eq(ret_of(tt_nvme_map_prp(&sqe, pages, NPAGES, 0, (EPP + 1) * PS, PS, 0, &lm.list)), 0,
	       "513 pages: list of 512 entries fills one list page");
	tap_eq(l[EPP - 1], pages[EPP], "last entry of a full single list page is data, not a link");
	tap_eq(l[EPP], SENTINEL, "second list page untouched");

	listmem_poison(&lm);
	tap_eq(ret_of(tt_nvme_map_prp(&sqe, pages, NPAGES, 0, (EPP + 2) * PS, PS, 0, &lm.list)), 0,
	       "514 pages: list needs chaining");
	tap_eq(sqe.dptr.prp.prp2, lm.bus[0], "chained: PRP2 = first list page");
	tap_eq(l[EPP - 2], pages[EPP - 1], "chained: 511th data entry in first list page");
	tap_eq(l[EPP - 1], lm.bus[1], "chained: last entry of list page 0 points to list page 1");
	tap_ok(l[EPP] == pages[EPP] && l[EPP + 1] == pages[EPP + 1] && l[EPP + 2] == SENTINEL,
	       "chained: list page 1 holds the remaining 2 entries");

	listmem_poison(&lm);
	tap_eq(ret_of(tt_nvme_map_prp(&sqe, pages, NPAGES, 8, 2 * EPP * PS, PS, 0, &lm.list)), 0,
	       "offset 8, 2*512 pages + 8 bytes: three list pages");
	tap_ok(l[EPP - 1] == lm.bus[1] && l[2 * EPP - 1] == lm.bus[2] &&
	       l[2 * EPP] == pages[2 * EPP - 1] && l[2 * EPP + 1] == pages[2 * EPP] &&
	       l[2 * EPP + 2] == SENTINEL,
	       "three list pages: two links, the tail on page 2");

	/* Rejections: the entry must stay untouched. */
	tt_nvme_cmd_read(&sqe, 1, 0, 1);
	sqe.dptr.prp.prp1 = 0x1111;
	sqe.dptr.prp.prp2 = 0x2222;
	before = sqe;
	tap_eq(ret_of(tt_nvme_map_prp(&sqe, pages, NPAGES, 0, 128 * 1024, PS, 128 * 1024, &lm.list)), 0,
	       "transfer of exactly MDTS accepted");
	sqe = before;
	tap_eq((uint64_t)ret_of(tt_nvme_map_prp(&sqe, pages, NPAGES, 0, 128 * 1024 + 1, PS, 128 * 1024,
						&lm.list)),
	       (uint64_t)-TT_E2BIG, "transfer one byte above MDTS: -E2BIG");
	tap_ok(!memcmp(&sqe, &before, sizeof(sqe)), "rejected mapping leaves the command alone");
	tap_eq((uint64_t)ret_of(tt_nvme_map_prp(&sqe, pages, NPAGES, 2, 100, PS, 0, &lm.list)),
	       (uint64_t)-TT_EINVAL, "first offset not dword aligned: -EINVAL");
	tap_eq((uint64_t)ret_of(tt_nvme_map_prp(&sqe, pages, NPAGES, PS, 100, PS, 0, &lm.list)),
	       (uint64_t)-TT_EINVAL, "first offset of a whole page: -EINVAL");
	tap_eq((uint64_t)ret_of(tt_nvme_map_prp(&sqe, pages, NPAGES, 0, 0, PS, 0, &lm.list)),
	       (uint64_t)-TT_EINVAL, "zero length: -EINVAL");
	tap_eq((uint64_t)ret_of(tt_nvme_map_prp(&sqe, pages, NPAGES, 0, 100, 2048, 0, &lm.list)),
	       (uint64_t)-TT_EINVAL, "page size below 4 KiB: -EINVAL");
	tap_eq((uint64_t)ret_of(tt_nvme_map_prp(&sqe, pages, NPAGES, 0, 100, 6144, 0, &lm.list)),
	       (uint64_t)-TT_EINVAL, "page size not a power of two: -EINVAL");
	tap_eq((uint64_t)ret_of(tt_nvme_map_prp(&sqe, pages, 2, 4, 2 * PS, PS, 0, &lm.list)),
	       (uint64_t)-TT_EINVAL, "fewer pages given than the transfer touches: -EINVAL");
	tap_ok(!memcmp(&sqe, &before, sizeof(sqe)), "still untouched after the rejections");

	{
		uint64_t bad[4] = { pages[0], pages[1] + 8, pages[2], pages[3] };

		tap_eq((uint64_t)ret_of(tt_nvme_map_prp(&sqe, bad, 4, 0, 2 * PS, PS, 0, &lm.list)),
		       (uint64_t)-TT_EINVAL, "second PRP entry not page aligned: -EINVAL");
		tap_eq((uint64_t)ret_of(tt_nvme_map_prp(&sqe, bad, 4, 0, PS, PS, 0, &lm.list)), 0,
		       "unaligned page beyond the transfer is not looked at");
		bad[1] = pages[1];
		bad[3] = pages[3] + PS / 2;
		tap_eq((uint64_t)ret_of(tt_nvme_map_prp(&sqe, bad, 4, 0, 4 * PS, PS, 0, &lm.list)),
		       (uint64_t)-TT_EINVAL, "list entry not page aligned: -EINVAL");
		bad[0] = pages[0] + 4;
		tap_eq((uint64_t)ret_of(tt_nvme_map_prp(&sqe, bad, 1, 0, 100, PS, 0, &lm.list)),
		       (uint64_t)-TT_EINVAL, "first page not page aligned: -EINVAL");
	}

	lm.list.nchunks = 1;
	tap_eq((uint64_t)ret_of(tt_nvme_map_prp(&sqe, pages, NPAGES, 0, (EPP + 1) * PS, PS, 0, &lm.list)),
	       0, "one list page is enough for 513 pages");
	tap_eq((uint64_t)ret_of(tt_nvme_map_prp(&sqe, pages, NPAGES, 0, (EPP + 2) * PS, PS, 0, &lm.list)),
	       (uint64_t)-TT_ENOSPC, "514 pages with one list page: -ENOSPC");
	lm.list.nchunks = MAX_CHUNKS;
	tap_eq((uint64_t)ret_of(tt_nvme_map_prp(&sqe, pages, NPAGES, 0, 3 * PS, PS, 0, NULL)),
	       (uint64_t)-TT_ENOSPC, "list needed but none given: -ENOSPC");
	lm.list.chunk_bytes = 2 * PS;
	tap_eq((uint64_t)ret_of(tt_nvme_map_prp(&sqe, pages, NPAGES, 0, 3 * PS, PS, 0, &lm.list)),
	       (uint64_t)-TT_EINVAL, "list chunk size other than the page size: -EINVAL");
	lm.list.chunk_bytes = PS;
	lm.bus[0] += 64;
	tap_eq((uint64_t)ret_of(tt_nvme_map_prp(&sqe, pages, NPAGES, 0, 3 * PS, PS, 0, &lm.list)),
	       (uint64_t)-TT_EINVAL, "list page bus address not page aligned: -EINVAL");
	lm.bus[0] -= 64;
	free(lm.mem);
	free(pages);
}

/* Every combination of page size, offset and page count near the edges. */
static void test_exhaustive(uint32_t ps)
{
	const unsigned epp = ps / 8;
	const unsigned counts[] = { 0, 1, 2, 3, 4, epp - 2, epp - 1, epp, epp + 1, epp + 2,
				    2 * epp - 3, 2 * epp - 2, 2 * epp - 1, 2 * epp, 2 * epp + 1,
				    3 * epp - 4, 3 * epp - 3 };
	const uint32_t offs[] = { 0, 4, 8, 512, ps / 2, ps - 8, ps - 4 };
	const unsigned npages = 3 * epp + 2;
	uint64_t *pages = make_pages(npages, ps);
	struct range *got = malloc(sizeof(*got) * (npages + 1));
	struct listmem lm;
	unsigned cases = 0, bad = 0, list_pages;
	struct tt_nvme_sqe sqe;

	listmem_init(&lm, ps, MAX_CHUNKS);
	for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++) {
		for (size_t oi = 0; oi < sizeof(offs) / sizeof(offs[0]); oi++) {
			/* n list entries: touch n + 1 pages, shortest and longest */
			unsigned n = counts[ci];
			uint32_t off = offs[oi];
			uint64_t lens[3], maxlen = (uint64_t)(n + 1) * ps - off;

			lens[0] = n ? (uint64_t)n * ps - off + 1 : 1;
			lens[1] = maxlen;
			lens[2] = (lens[0] + maxlen) / 2 & ~3ull;
			if (lens[2] < lens[0])
				lens[2] = lens[0];
			for (int li = 0; li < 3; li++) {
				struct range *exp = malloc(sizeof(*exp) * (npages + 1));
				int ne, ng, r;

				cases++;
				listmem_poison(&lm);
				tt_nvme_cmd_write(&sqe, 1, 0, 1);
				r = tt_nvme_map_prp(&sqe, pages, npages, off, (uint32_t)lens[li], ps, 0,
						    &lm.list);
				ne = expect_pages(pages, off, lens[li], ps, exp);
				ng = r ? -1 : walk_prp(&sqe, lens[li], &lm, got, (int)npages + 1,
						       &list_pages);
				if (r || !ranges_equal(got, ng, exp, ne) ||
				    list_pages != tt_nvme_prp_list_pages(n, ps) ||
				    (list_pages < MAX_CHUNKS &&
				     lm.mem[(size_t)list_pages * epp] != SENTINEL)) {
					if (bad++ < 5)
						tap_diag("ps %u off %u len %llu: ret %d ranges %d/%d lists %u",
							 ps, off, (unsigned long long)lens[li], r, ng, ne,
							 list_pages);
				}
				free(exp);
			}
		}
	}
	tap_ok(bad == 0, "page size %u: %u offset/length combinations walk back to the buffer",
	       ps, cases);
	free(got);
	free(pages);
	free(lm.mem);
}

/* Segment input: expand to the byte ranges the controller must see. */
static int expect_segs(const struct tt_dma_seg *segs, unsigned nsegs, struct range *out)
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

static void test_prpv(void)
{
	struct tt_nvme_sqe sqe, before;
	struct range got[2048], exp[64];
	struct listmem lm;
	unsigned list_pages, bad = 0, cases = 0;
	uint64_t seed = 0x9e3779b97f4a7c15ull;
	const uint64_t A = 0x200000000ull, B = 0x300000000ull, C = 0x400000000ull;
	struct tt_dma_seg segs[3] = {
		{ A + 0x200, PS - 0x200 }, { B, 3 * PS }, { C, 100 },
	};
	int n;

	listmem_init(&lm, PS, MAX_CHUNKS);
	listmem_poison(&lm);
	tt_nvme_cmd_read(&sqe, 1, 0, 1);
	tap_eq(ret_of(tt_nvme_map_prpv(&sqe, segs, 3, PS, 0, &lm.list)), 0,
	       "segments: tail of a page, 3 whole pages, head of a page");
	tap_ok(sqe.dptr.prp.prp1 == A + 0x200 && sqe.dptr.prp.prp2 == lm.bus[0] &&
	       lm.mem[0] == B && lm.mem[1] == B + PS && lm.mem[2] == B + 2 * PS &&
	       lm.mem[3] == C && lm.mem[4] == SENTINEL, "segments: PRP1 and 4 list entries");
	n = walk_prp(&sqe, PS - 0x200 + 3 * PS + 100, &lm, got, 2048, &list_pages);
	tap_ok(ranges_equal(got, n, exp, expect_segs(segs, 3, exp)), "segments: walk matches");

	segs[0].len = 100;
	tap_eq(ret_of(tt_nvme_map_prpv(&sqe, segs, 1, PS, 0, &lm.list)), 0, "one short segment");
	tap_ok(sqe.dptr.prp.prp1 == A + 0x200 && sqe.dptr.prp.prp2 == 0, "one short segment: PRP2 0");
	before = sqe;
	tap_eq((uint64_t)ret_of(tt_nvme_map_prpv(&sqe, segs, 3, PS, 0, &lm.list)),
	       (uint64_t)-TT_EINVAL, "first segment not ending on a page boundary: -EINVAL");
	segs[0].len = PS - 0x200;
	segs[1].addr = B + 0x10;
	tap_eq((uint64_t)ret_of(tt_nvme_map_prpv(&sqe, segs, 3, PS, 0, &lm.list)),
	       (uint64_t)-TT_EINVAL, "middle segment not starting on a page boundary: -EINVAL");
	segs[1].addr = B;
	segs[1].len = 3 * PS - 4;
	tap_eq((uint64_t)ret_of(tt_nvme_map_prpv(&sqe, segs, 3, PS, 0, &lm.list)),
	       (uint64_t)-TT_EINVAL, "middle segment not ending on a page boundary: -EINVAL");
	segs[1].len = 3 * PS;
	segs[2].addr = C + 4;
	tap_eq((uint64_t)ret_of(tt_nvme_map_prpv(&sqe, segs, 3, PS, 0, &lm.list)),
	       (uint64_t)-TT_EINVAL, "last segment not starting on a page boundary: -EINVAL");
	segs[2].addr = C;
	segs[0].addr = A + 0x202;
	segs[0].len = PS - 0x202;
	tap_eq((uint64_t)ret_of(tt_nvme_map_prpv(&sqe, segs, 3, PS, 0, &lm.list)),
	       (uint64_t)-TT_EINVAL, "first segment not dword aligned: -EINVAL");
	segs[0].addr = A + 0x200;
	segs[0].len = PS - 0x200;
	segs[2].len = 0;
	tap_eq((uint64_t)ret_of(tt_nvme_map_prpv(&sqe, segs, 3, PS, 0, &lm.list)),
	       (uint64_t)-TT_EINVAL, "empty segment: -EINVAL");
	segs[2].len = 100;
	tap_eq((uint64_t)ret_of(tt_nvme_map_prpv(&sqe, segs, 3, PS, 3 * PS, &lm.list)),
	       (uint64_t)-TT_E2BIG, "segments above MDTS: -E2BIG");
	tap_ok(!memcmp(&sqe, &before, sizeof(sqe)), "rejected segment mappings leave the command alone");
	tap_eq((uint64_t)ret_of(tt_nvme_map_prpv(&sqe, segs, 0, PS, 0, &lm.list)),
	       (uint64_t)-TT_EINVAL, "no segments: -EINVAL");

	/* Random page-shaped segment lists, up to 1440 pages (chained lists). */
	for (int iter = 0; iter < 2000; iter++) {
		struct tt_dma_seg rs[40];
		unsigned ns = 1 + (unsigned)(seed >> 59) % 8, maxp = iter % 4 ? 6 : 180;
		uint64_t total = 0, base = 0x1000000000ull;
		int r, ne, ng;

		for (unsigned i = 0; i < ns; i++) {
			seed = seed * 6364136223846793005ull + 1442695040888963407ull;
			unsigned pg = 1 + (unsigned)(seed >> 40) % maxp;
			uint32_t head = i == 0 ? (uint32_t)((seed >> 20) % PS) & ~3u : 0;
			uint32_t tail = i + 1 == ns ? (uint32_t)((seed >> 8) % PS) : 0;

			if (pg == 1 && tail && tail <= head)
				tail = 0; /* keep a one-page segment non-empty */

			/* contiguous with the previous one every third time */
			if (i == 0 || (seed >> 33) % 3)
				base += (uint64_t)(1 + (seed >> 50) % 7) * PS;
			rs[i].addr = base + head;
			rs[i].len = pg * PS - head - (tail ? PS - tail : 0);
			base += (uint64_t)pg * PS;
			total += rs[i].len;
		}
		cases++;
		listmem_poison(&lm);
		tt_nvme_cmd_read(&sqe, 1, 0, 1);
		r = tt_nvme_map_prpv(&sqe, rs, ns, PS, 0, &lm.list);
		ne = expect_segs(rs, ns, exp);
		ng = r ? -1 : walk_prp(&sqe, total, &lm, got, 2048, &list_pages);
		if (r || !ranges_equal(got, ng, exp, ne)) {
			if (bad++ < 5)
				tap_diag("iter %d: ret %d ranges %d/%d", iter, r, ng, ne);
		}
	}
	tap_ok(bad == 0, "%u random page-shaped segment lists walk back to the buffer", cases);
	free(lm.mem);
}

int main(void)
{
	test_cases();
	test_exhaustive(4096);
	test_exhaustive(8192);
	test_exhaustive(65536);
	test_prpv();
	return tap_done();
}
