/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tutti/nvme_sgl.h - map a data buffer with Scatter Gather Lists, and the
 * PRP-or-SGL policy
 *
 * Rules followed (NVMe 1.4, 4.4):
 *  - physically contiguous neighbouring segments become one Data Block
 *    descriptor (as long as the 32-bit length allows);
 *  - one descriptor: it goes straight into DPTR, PSDT = 01b;
 *  - several: DPTR is a Last Segment descriptor for the one SGL segment
 *    holding all Data Block descriptors;
 *  - when they do not fit one list chunk, segments chain: DPTR and the last
 *    descriptor of every non-final segment are Segment descriptors, the one
 *    that points to the final segment is a Last Segment descriptor, and
 *    each one's length is the byte size of the whole segment it points to
 *    (its own trailing pointer descriptor included);
 *  - SGL segments are qword aligned.
 * Errors leave the command untouched.
 */
#ifndef TUTTI_NVME_SGL_H
#define TUTTI_NVME_SGL_H

#include "nvme.h"
#include "nvme_prp.h"

/**
 * tt_nvme_sgl_supported() - whether a controller takes SGLs for NVM I/O
 * @sgls: Identify Controller SGLS field
 *
 * Return: true for byte or dword aligned SGL support.
 */
TT_INLINE bool tt_nvme_sgl_supported(uint32_t sgls)
{
	uint32_t m = sgls & TT_NVME_SGLS_SUPPORT_MASK;

	return m == TT_NVME_SGLS_BYTE_ALIGNED || m == TT_NVME_SGLS_DWORD_ALIGNED;
}

/**
 * tt_nvme_sgl_dword_only() - whether SGL data blocks must be dword granular
 * @sgls: Identify Controller SGLS field
 *
 * Return: true if addresses and lengths of data blocks need bits 1:0 clear.
 */
TT_INLINE bool tt_nvme_sgl_dword_only(uint32_t sgls)
{
	return (sgls & TT_NVME_SGLS_SUPPORT_MASK) == TT_NVME_SGLS_DWORD_ALIGNED;
}

/*
 * Take the data block that starts at segment *@i, merging the contiguous
 * segments after it, and step *@i past them.
 */
TT_INLINE void tt__sgl_next(const struct tt_dma_seg *segs, unsigned nsegs,
			    unsigned *i, uint64_t *addr, uint32_t *len)
{
	uint64_t a = segs[*i].addr;
	uint32_t l = segs[*i].len;

	for ((*i)++; *i < nsegs; (*i)++) {
		if (segs[*i].addr != a + l || segs[*i].len > 0xffffffffu - l)
			break;
		l += segs[*i].len;
	}
	*addr = a;
	*len = l;
}

/**
 * tt_nvme_sgl_count() - data block descriptors a buffer needs
 * @segs: segments in transfer order, none empty
 * @nsegs: number of segments
 *
 * Return: the count after merging physically contiguous neighbours.
 */
TT_INLINE unsigned tt_nvme_sgl_count(const struct tt_dma_seg *segs,
				     unsigned nsegs)
{
	unsigned i = 0, n = 0;
	uint64_t addr;
	uint32_t len;

	while (i < nsegs) {
		tt__sgl_next(segs, nsegs, &i, &addr, &len);
		n++;
	}
	return n;
}

/* Byte size of SGL segment @c out of @nchunks holding @n data blocks. */
TT_INLINE uint32_t tt__sgl_seg_bytes(unsigned c, unsigned n, unsigned cap,
				     unsigned nchunks)
{
	if (c + 1 < nchunks)
		return cap * 16;
	return (n - (nchunks - 1) * (cap - 1)) * 16;
}

/**
 * tt_nvme_map_sgl() - map a buffer with SGL descriptors
 * @sqe: command whose data pointer is set
 * @segs: segments in transfer order
 * @nsegs: number of segments, at least 1
 * @mdts_bytes: maximum transfer size in bytes, 0 for no limit
 * @list: SGL segment memory, @list->chunk_bytes / 16 descriptors a chunk,
 *        chunk bus addresses qword aligned; may be NULL when the segments
 *        merge into one data block
 *
 * Return: 0; -TT_EINVAL for an empty segment or misaligned list memory;
 * -TT_E2BIG above @mdts_bytes; -TT_ENOSPC when @list is too small.
 */
TT_INLINE int tt_nvme_map_sgl(struct tt_nvme_sqe *sqe,
			      const struct tt_dma_seg *segs, unsigned nsegs,
			      uint32_t mdts_bytes,
			      const struct tt_nvme_list *list)
{
	struct tt_nvme_sgl_desc *descs;
	unsigned i, k, n, cap, nchunks, c;
	uint64_t total = 0, addr;
	uint32_t len;
	uint8_t type;

	if (nsegs == 0 || !segs)
		return -TT_EINVAL;
	for (i = 0; i < nsegs; i++) {
		if (segs[i].len == 0)
			return -TT_EINVAL;
		total += segs[i].len;
	}
	if (total > 0xffffffffu || (mdts_bytes && total > mdts_bytes))
		return -TT_E2BIG;

	n = tt_nvme_sgl_count(segs, nsegs);
	if (n == 1) {
		tt_nvme_sgl_desc_set(&sqe->dptr.sgl, segs[0].addr,
				     (uint32_t)total, TT_NVME_SGL_TYPE_DATA_BLOCK);
		tt_nvme_sqe_set_psdt(sqe, TT_NVME_FLAG_PSDT_SGL);
		return 0;
	}

	if (!list || !list->vaddr || !list->bus)
		return -TT_ENOSPC;
	if (((uintptr_t)list->vaddr & 7) || (list->chunk_bytes & 15))
		return -TT_EINVAL;
	cap = list->chunk_bytes / 16;
	nchunks = tt_nvme_list_chunks(n, cap);
	if (nchunks == 0 || nchunks > list->nchunks)
		return -TT_ENOSPC;
	for (c = 0; c < nchunks; c++)
		if (list->bus[c] & 7)
			return -TT_EINVAL;

	descs = (struct tt_nvme_sgl_desc *)list->vaddr;
	for (i = 0, k = 0; i < nsegs; k++) {
		tt__sgl_next(segs, nsegs, &i, &addr, &len);
		tt_nvme_sgl_desc_set(&descs[tt__list_slot(k, cap, nchunks)],
				     addr, len, TT_NVME_SGL_TYPE_DATA_BLOCK);
	}
	for (c = 0; c + 1 < nchunks; c++) {
		type = c + 2 == nchunks ? TT_NVME_SGL_TYPE_LAST_SEGMENT :
					  TT_NVME_SGL_TYPE_SEGMENT;
		tt_nvme_sgl_desc_set(&descs[c * cap + cap - 1], list->bus[c + 1],
				     tt__sgl_seg_bytes(c + 1, n, cap, nchunks),
				     type);
	}
	type = nchunks == 1 ? TT_NVME_SGL_TYPE_LAST_SEGMENT :
			      TT_NVME_SGL_TYPE_SEGMENT;
	tt_nvme_sgl_desc_set(&sqe->dptr.sgl, list->bus[0],
			     tt__sgl_seg_bytes(0, n, cap, nchunks), type);
	tt_nvme_sqe_set_psdt(sqe, TT_NVME_FLAG_PSDT_SGL);
	return 0;
}

/**
 * tt_nvme_map() - map a buffer with SGLs or PRPs, whichever fits
 * @sqe: command whose data pointer is set
 * @qid: queue the command goes to (0 is the admin queue)
 * @segs: segments in transfer order
 * @nsegs: number of segments, at least 1
 * @caps: controller limits and SGL support
 * @list: list memory, used as PRP list pages or SGL segments
 *
 * SGLs are used when the controller supports them for I/O, the queue is
 * not the admin queue (admin commands take PRPs), the transfer is at least
 * @caps->sgl_threshold bytes and, for dword-only controllers, every segment
 * is dword granular. Everything else takes PRPs. This is the one place
 * that policy lives.
 *
 * Return: as tt_nvme_map_sgl() or tt_nvme_map_prpv().
 */
TT_INLINE int tt_nvme_map(struct tt_nvme_sqe *sqe, uint16_t qid,
			  const struct tt_dma_seg *segs, unsigned nsegs,
			  const struct tt_nvme_xfer_caps *caps,
			  const struct tt_nvme_list *list)
{
	bool sgl = qid != 0 && tt_nvme_sgl_supported(caps->sgls);
	uint64_t total = 0;
	unsigned i;

	for (i = 0; i < nsegs; i++) {
		total += segs[i].len;
		if (tt_nvme_sgl_dword_only(caps->sgls) &&
		    ((segs[i].addr | segs[i].len) & 3))
			sgl = false;
	}
	if (sgl && total >= caps->sgl_threshold)
		return tt_nvme_map_sgl(sqe, segs, nsegs, caps->mdts_bytes, list);
	return tt_nvme_map_prpv(sqe, segs, nsegs, caps->page_size,
				caps->mdts_bytes, list);
}

#endif /* TUTTI_NVME_SGL_H */
