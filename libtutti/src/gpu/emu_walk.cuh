// SPDX-License-Identifier: Apache-2.0
//
// emu_walk.cuh - fetch-side checks of one SQE and its PRP / SGL data pointer (NVMe 1.4, 4.3-4.4)
// Included once, by emu_ctrl.cu (one translation unit, so everything stays
// static); split out to keep each part readable on its own.
#ifndef TT_EMU_WALK_CUH
#define TT_EMU_WALK_CUH

static void emu_add_ext(std::vector<emu_ext> &ext, uint32_t first, uint64_t addr,
			uint64_t len)
{
	if (ext.size() > first && ext.back().addr + ext.back().len == addr)
		ext.back().len += len;
	else
		ext.push_back({addr, len});
}

// Host pointer for list memory at bus address @bus, or NULL if outside it.
static const void *emu_list_ptr(const emu_q *q, uint64_t bus, uint64_t len)
{
	uint64_t base = (uint64_t)(uintptr_t)q->list;

	if (!q->list || bus < base || bus + len > base + q->list_bytes || bus + len < bus)
		return nullptr;
	return (const void *)(uintptr_t)bus;
}

// Resolve a PRP data pointer into extents (NVMe 1.4, 4.3).
static uint16_t emu_walk_prp(const emu_q *q, const struct tt_nvme_sqe *s,
			     uint64_t bytes, std::vector<emu_ext> &ext, uint32_t first)
{
	uint64_t prp1 = s->dptr.prp.prp1, prp2 = s->dptr.prp.prp2;
	uint64_t off = prp1 & (EMU_PAGE - 1), len, left;
	const uint64_t *list;
	unsigned epp, i;

	if (off & 3)
		return TT_NVME_SC_PRP_INVALID_OFFSET;
	len = EMU_PAGE - off < bytes ? EMU_PAGE - off : bytes;
	emu_add_ext(ext, first, prp1, len);
	left = bytes - len;
	if (left == 0)
		return TT_NVME_SC_SUCCESS;
	if (left <= EMU_PAGE) {
		if (prp2 & (EMU_PAGE - 1))
			return TT_NVME_SC_PRP_INVALID_OFFSET;
		emu_add_ext(ext, first, prp2, left);
		return TT_NVME_SC_SUCCESS;
	}
	// PRP2 is a list pointer: qword aligned, entries up to the page end.
	if (prp2 & 7)
		return TT_NVME_SC_PRP_INVALID_OFFSET;
	for (;;) {
		epp = (unsigned)((EMU_PAGE - (prp2 & (EMU_PAGE - 1))) / 8);
		list = (const uint64_t *)emu_list_ptr(q, prp2, (uint64_t)epp * 8);
		if (!list)
			return TT_NVME_SC_DATA_XFER_ERROR;
		for (i = 0; i < epp && left; i++) {
			uint64_t e = list[i];

			// Last entry of a full page with more than a page left: a link.
			if (i == epp - 1 && left > EMU_PAGE) {
				if (e & 7)
					return TT_NVME_SC_PRP_INVALID_OFFSET;
				prp2 = e;
				break;
			}
			if (e & (EMU_PAGE - 1))
				return TT_NVME_SC_PRP_INVALID_OFFSET;
			len = left < EMU_PAGE ? left : EMU_PAGE;
			emu_add_ext(ext, first, e, len);
			left -= len;
		}
		if (left == 0)
			return TT_NVME_SC_SUCCESS;
		if (i < epp - 1)
			return TT_NVME_SC_DATA_XFER_ERROR;
	}
}

// Resolve an SGL data pointer into extents (NVMe 1.4, 4.4).
static uint16_t emu_walk_sgl(const emu_q *q, const struct tt_nvme_sqe *s,
			     uint64_t bytes, std::vector<emu_ext> &ext, uint32_t first)
{
	struct tt_nvme_sgl_desc d = s->dptr.sgl;
	const struct tt_nvme_sgl_desc *seg;
	uint64_t total = 0;
	unsigned nsegs = 0, n, i;
	uint8_t type = tt_nvme_sgl_desc_type(&d);

	if ((d.type & 0xf) != TT_NVME_SGL_SUBTYPE_ADDRESS)
		return TT_NVME_SC_SGL_INVALID_TYPE;
	if (type == TT_NVME_SGL_TYPE_DATA_BLOCK) {
		if (d.len != bytes)
			return TT_NVME_SC_SGL_INVALID_DATA;
		emu_add_ext(ext, first, d.addr, d.len);
		return TT_NVME_SC_SUCCESS;
	}
	while (type == TT_NVME_SGL_TYPE_SEGMENT || type == TT_NVME_SGL_TYPE_LAST_SEGMENT) {
		bool last = type == TT_NVME_SGL_TYPE_LAST_SEGMENT;

		if (++nsegs > EMU_MAX_SGL_SEGS || d.len == 0 || (d.len & 15) || (d.addr & 7))
			return TT_NVME_SC_SGL_INVALID_SEG;
		seg = (const struct tt_nvme_sgl_desc *)emu_list_ptr(q, d.addr, d.len);
		if (!seg)
			return TT_NVME_SC_DATA_XFER_ERROR;
		n = d.len / 16;
		type = 0xff;
		for (i = 0; i < n; i++) {
			uint8_t t = tt_nvme_sgl_desc_type(&seg[i]);

			if ((seg[i].type & 0xf) != TT_NVME_SGL_SUBTYPE_ADDRESS)
				return TT_NVME_SC_SGL_INVALID_TYPE;
			if (t == TT_NVME_SGL_TYPE_DATA_BLOCK) {
				total += seg[i].len;
				if (total > bytes)
					return TT_NVME_SC_SGL_INVALID_DATA;
				if (seg[i].len)
					emu_add_ext(ext, first, seg[i].addr, seg[i].len);
			} else if ((t == TT_NVME_SGL_TYPE_SEGMENT ||
				    t == TT_NVME_SGL_TYPE_LAST_SEGMENT) &&
				   !last && i == n - 1) {
				d = seg[i];
				type = t;
			} else {
				return last ? TT_NVME_SC_SGL_INVALID_SEG :
					      TT_NVME_SC_SGL_INVALID_TYPE;
			}
		}
		if (last)
			break;
		if (type == 0xff)	// a Segment must end with a link
			return TT_NVME_SC_SGL_INVALID_SEG;
	}
	if (type != 0xff && type != TT_NVME_SGL_TYPE_LAST_SEGMENT &&
	    type != TT_NVME_SGL_TYPE_SEGMENT)
		return TT_NVME_SC_SGL_INVALID_TYPE;
	return total == bytes ? TT_NVME_SC_SUCCESS : TT_NVME_SC_SGL_INVALID_DATA;
}

// Validate @s and resolve its data; fills @c (status set on error).
static void emu_parse(const struct tt_emu *e, const emu_q *q,
		      const struct tt_nvme_sqe *s, emu_cmd &c,
		      std::vector<emu_ext> &ext)
{
	const struct tt_emu_params *p = &e->p;
	uint64_t slba, nlb;
	uint8_t psdt = s->flags & TT_NVME_FLAG_PSDT_MASK;

	c.cid = s->cid;
	c.opcode = s->opcode;
	c.nsid = s->nsid;
	c.bytes = 0;
	c.off = 0;
	c.ext_first = (uint32_t)ext.size();
	c.ext_n = 0;
	c.status = TT_NVME_SC_SUCCESS;
	if (s->opcode == TT_NVME_CMD_FLUSH)
		return;
	if (s->opcode != TT_NVME_CMD_READ && s->opcode != TT_NVME_CMD_WRITE) {
		c.status = TT_NVME_SC_INVALID_OPCODE;
		return;
	}
	if (s->nsid == 0 || s->nsid > p->n_ns) {
		c.status = TT_NVME_SC_INVALID_NS;
		return;
	}
	slba = s->cdw10 | ((uint64_t)s->cdw11 << 32);
	nlb = (s->cdw12 & 0xffff) + 1;
	if (slba + nlb > (p->ns_bytes >> p->lba_shift)) {
		c.status = TT_NVME_SC_LBA_RANGE;
		return;
	}
	c.off = slba << p->lba_shift;
	c.bytes = nlb << p->lba_shift;
	if (p->mdts_bytes && c.bytes > p->mdts_bytes) {
		c.status = TT_NVME_SC_INVALID_FIELD;
		return;
	}
	if (psdt == TT_NVME_FLAG_PSDT_PRP)
		c.status = emu_walk_prp(q, s, c.bytes, ext, c.ext_first);
	else if (psdt == TT_NVME_FLAG_PSDT_SGL && tt_nvme_sgl_supported(p->sgls))
		c.status = emu_walk_sgl(q, s, c.bytes, ext, c.ext_first);
	else
		c.status = TT_NVME_SC_INVALID_FIELD;
	if (c.status != TT_NVME_SC_SUCCESS)
		ext.resize(c.ext_first);
	c.ext_n = (uint32_t)ext.size() - c.ext_first;
}

#endif /* TT_EMU_WALK_CUH */
