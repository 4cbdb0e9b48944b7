/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tutti/nvme_prp.h - map a data buffer with Physical Region Page entries
 *
 * Rules enforced (NVMe 1.4, 4.3):
 *  - PRP1 is the first page plus an offset that must be dword aligned;
 *  - every later entry is a page aligned page address (offset 0);
 *  - 1 page touched: PRP2 = 0; 2 pages: PRP2 = the second page;
 *    more: PRP2 points to a PRP list;
 *  - a PRP list fills whole list pages; when more entries remain than fit,
 *    the last entry of a list page points to the next list page;
 *  - the transfer must not exceed the controller's MDTS.
 * Errors leave the command untouched.
 */
#ifndef TUTTI_NVME_PRP_H
#define TUTTI_NVME_PRP_H

#include "nvme.h"

/**
 * tt_nvme_prp_list_pages() - PRP list pages needed for a transfer
 * @nentries: PRP entries after PRP1 (pages touched minus one)
 * @page_size: controller memory page size in bytes
 *
 * Return: 0 when PRP2 alone suffices, else the number of list pages.
 */
TT_INLINE unsigned tt_nvme_prp_list_pages(unsigned nentries, uint32_t page_size)
{
	if (nentries <= 1)
		return 0;
	return tt_nvme_list_chunks(nentries, page_size / 8);
}

/* Writes PRP entries 2..n of one command into PRP2 or the list. */
struct tt__prp_writer {
	struct tt_nvme_sqe *sqe;
	uint64_t *list;
	const uint64_t *bus;
	unsigned n;
	unsigned epp;
	unsigned npages;
};

TT_INLINE bool tt__prp_page_size_ok(uint32_t page_size)
{
	return page_size >= 4096 && (page_size & (page_size - 1)) == 0;
}

/* Validate the list memory for @n entries; touches nothing on error. */
TT_INLINE int tt__prp_begin(struct tt__prp_writer *w, struct tt_nvme_sqe *sqe,
			    unsigned n, uint32_t page_size,
			    const struct tt_nvme_list *list)
{
	unsigned i;

	w->sqe = sqe;
	w->n = n;
	w->epp = page_size / 8;
	w->npages = tt_nvme_prp_list_pages(n, page_size);
	w->list = NULL;
	w->bus = NULL;
	if (w->npages == 0)
		return 0;
	if (!list || !list->vaddr || !list->bus || w->npages > list->nchunks)
		return -TT_ENOSPC;
	if (list->chunk_bytes != page_size || ((uintptr_t)list->vaddr & 7))
		return -TT_EINVAL;
	for (i = 0; i < w->npages; i++)
		if (list->bus[i] & (page_size - 1))
			return -TT_EINVAL;
	w->list = (uint64_t *)list->vaddr;
	w->bus = list->bus;
	return 0;
}

/* Store data entry @k (0 is the entry after PRP1). */
TT_INLINE void tt__prp_put(struct tt__prp_writer *w, unsigned k, uint64_t entry)
{
	if (w->n == 1)
		w->sqe->dptr.prp.prp2 = entry;
	else
		w->list[tt__list_slot(k, w->epp, w->npages)] = entry;
}

/* Set PRP1, PRP2, the list chain pointers and PSDT. */
TT_INLINE void tt__prp_end(struct tt__prp_writer *w, uint64_t prp1)
{
	unsigned c;

	w->sqe->dptr.prp.prp1 = prp1;
	if (w->n == 0)
		w->sqe->dptr.prp.prp2 = 0;
	if (w->npages) {
		w->sqe->dptr.prp.prp2 = w->bus[0];
		for (c = 0; c + 1 < w->npages; c++)
			w->list[c * w->epp + w->epp - 1] = w->bus[c + 1];
	}
	tt_nvme_sqe_set_psdt(w->sqe, TT_NVME_FLAG_PSDT_PRP);
}

/**
 * tt_nvme_map_prp() - map a buffer given as pages plus a first offset
 * @sqe: command whose data pointer is set
 * @pages: bus addresses of the buffer's pages, each page aligned
 * @npages: entries in @pages (at least the pages the transfer touches)
 * @first_off: byte offset of the data in @pages[0], dword aligned
 * @len: transfer length in bytes, at least 1
 * @page_size: controller memory page size (CC.MPS), a power of two >= 4096
 * @mdts_bytes: maximum transfer size in bytes, 0 for no limit
 * @list: PRP list memory; may be NULL when the transfer touches <= 2 pages
 *
 * Return: 0; -TT_EINVAL for a misaligned page, offset or list page, a bad
 * page size or too few @pages; -TT_E2BIG above @mdts_bytes; -TT_ENOSPC when
 * @list has too few pages.
 */
TT_INLINE int tt_nvme_map_prp(struct tt_nvme_sqe *sqe, const uint64_t *pages,
			      unsigned npages, uint32_t first_off, uint32_t len,
			      uint32_t page_size, uint32_t mdts_bytes,
			      const struct tt_nvme_list *list)
{
	struct tt__prp_writer w;
	uint64_t touched;
	unsigned i;
	int ret;

	if (!tt__prp_page_size_ok(page_size) || len == 0 || !pages)
		return -TT_EINVAL;
	if (mdts_bytes && len > mdts_bytes)
		return -TT_E2BIG;
	if (first_off >= page_size || (first_off & 3))
		return -TT_EINVAL;
	touched = ((uint64_t)first_off + len + page_size - 1) / page_size;
	if (touched > npages)
		return -TT_EINVAL;
	for (i = 0; i < touched; i++)
		if (pages[i] & (page_size - 1))
			return -TT_EINVAL;

	ret = tt__prp_begin(&w, sqe, (unsigned)touched - 1, page_size, list);
	if (ret)
		return ret;
	for (i = 1; i < touched; i++)
		tt__prp_put(&w, i - 1, pages[i]);
	tt__prp_end(&w, pages[0] + first_off);
	return 0;
}

/**
 * tt_nvme_map_prpv() - map a buffer given as contiguous segments
 * @sqe: command whose data pointer is set
 * @segs: segments in transfer order
 * @nsegs: number of segments, at least 1
 * @page_size: controller memory page size (CC.MPS), a power of two >= 4096
 * @mdts_bytes: maximum transfer size in bytes, 0 for no limit
 * @list: PRP list memory; may be NULL when the transfer touches <= 2 pages
 *
 * PRPs can describe segments only when the first one starts dword aligned,
 * every other one starts on a page boundary and every one but the last
 * ends on a page boundary.
 *
 * Return: 0; -TT_EINVAL for an empty or misaligned segment or a bad page
 * size; -TT_E2BIG above @mdts_bytes; -TT_ENOSPC when @list is too small.
 */
TT_INLINE int tt_nvme_map_prpv(struct tt_nvme_sqe *sqe,
			       const struct tt_dma_seg *segs, unsigned nsegs,
			       uint32_t page_size, uint32_t mdts_bytes,
			       const struct tt_nvme_list *list)
{
	const uint64_t mask = page_size - 1;
	struct tt__prp_writer w;
	uint64_t total = 0, n = 0, p, end;
	unsigned i, k = 0;
	int ret;

	if (!tt__prp_page_size_ok(page_size) || nsegs == 0 || !segs)
		return -TT_EINVAL;
	for (i = 0; i < nsegs; i++) {
		end = segs[i].addr + segs[i].len;
		if (segs[i].len == 0)
			return -TT_EINVAL;
		if (segs[i].addr & (i == 0 ? 3 : mask))
			return -TT_EINVAL;
		if (i + 1 < nsegs && (end & mask))
			return -TT_EINVAL;
		total += segs[i].len;
		n += (end - (segs[i].addr & ~mask) + mask) / page_size;
	}
	if (total > 0xffffffffu || (mdts_bytes && total > mdts_bytes))
		return -TT_E2BIG;

	ret = tt__prp_begin(&w, sqe, (unsigned)(n - 1), page_size, list);
	if (ret)
		return ret;
	for (i = 0; i < nsegs; i++) {
		p = segs[i].addr & ~mask;
		if (i == 0)
			p += page_size;
		for (end = segs[i].addr + segs[i].len; p < end; p += page_size)
			tt__prp_put(&w, k++, p);
	}
	tt__prp_end(&w, segs[0].addr);
	return 0;
}

#endif /* TUTTI_NVME_PRP_H */
