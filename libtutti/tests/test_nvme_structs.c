/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Description: NVMe queue entry layouts, command builders and status
 * helpers of tutti/nvme.h, checked byte by byte against NVMe 1.4.
 */
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include <tutti/nvme.h>

#include "tap.h"

/* Dword @i of a submission entry as the controller reads it (little endian). */
static uint32_t sqe_dw(const struct tt_nvme_sqe *sqe, unsigned i)
{
	const uint8_t *b = (const uint8_t *)sqe;

	return (uint32_t)b[4 * i] | (uint32_t)b[4 * i + 1] << 8 |
	       (uint32_t)b[4 * i + 2] << 16 | (uint32_t)b[4 * i + 3] << 24;
}

/* True if every dword not in @mask (bit i = dword i) is zero. */
static bool sqe_rest_zero(const struct tt_nvme_sqe *sqe, uint32_t mask)
{
	for (unsigned i = 0; i < 16; i++)
		if (!(mask & (1u << i)) && sqe_dw(sqe, i))
			return false;
	return true;
}

static void dirty(struct tt_nvme_sqe *sqe)
{
	memset(sqe, 0xa5, sizeof(*sqe));
}

static void test_layout(void)
{
	tap_eq(sizeof(struct tt_nvme_sqe), 64, "SQE is 64 bytes");
	tap_eq(sizeof(struct tt_nvme_cqe), 16, "CQE is 16 bytes");
	tap_eq(sizeof(struct tt_nvme_sgl_desc), 16, "SGL descriptor is 16 bytes");
	tap_eq(offsetof(struct tt_nvme_sqe, opcode), 0, "SQE opcode at byte 0");
	tap_eq(offsetof(struct tt_nvme_sqe, flags), 1, "SQE flags at byte 1");
	tap_eq(offsetof(struct tt_nvme_sqe, cid), 2, "SQE cid at byte 2");
	tap_eq(offsetof(struct tt_nvme_sqe, nsid), 4, "SQE nsid at byte 4 (DW1)");
	tap_eq(offsetof(struct tt_nvme_sqe, cdw2), 8, "SQE cdw2 at byte 8");
	tap_eq(offsetof(struct tt_nvme_sqe, cdw3), 12, "SQE cdw3 at byte 12");
	tap_eq(offsetof(struct tt_nvme_sqe, mptr), 16, "SQE mptr at byte 16 (DW4-5)");
	tap_eq(offsetof(struct tt_nvme_sqe, dptr.prp.prp1), 24, "SQE prp1 at byte 24 (DW6-7)");
	tap_eq(offsetof(struct tt_nvme_sqe, dptr.prp.prp2), 32, "SQE prp2 at byte 32 (DW8-9)");
	tap_eq(offsetof(struct tt_nvme_sqe, dptr.sgl), 24, "SQE SGL1 at byte 24");
	tap_eq(offsetof(struct tt_nvme_sqe, cdw10), 40, "SQE cdw10 at byte 40");
	tap_eq(offsetof(struct tt_nvme_sqe, cdw15), 60, "SQE cdw15 at byte 60");
	tap_eq(offsetof(struct tt_nvme_cqe, result), 0, "CQE DW0 at byte 0");
	tap_eq(offsetof(struct tt_nvme_cqe, dw1), 4, "CQE DW1 at byte 4");
	tap_eq(offsetof(struct tt_nvme_cqe, sq_head), 8, "CQE SQHD at byte 8");
	tap_eq(offsetof(struct tt_nvme_cqe, sq_id), 10, "CQE SQID at byte 10");
	tap_eq(offsetof(struct tt_nvme_cqe, cid), 12, "CQE CID at byte 12");
	tap_eq(offsetof(struct tt_nvme_cqe, status), 14, "CQE status at byte 14");
	tap_eq(offsetof(struct tt_nvme_sgl_desc, len), 8, "SGL length at byte 8");
	tap_eq(offsetof(struct tt_nvme_sgl_desc, type), 15, "SGL identifier at byte 15");
}

static void test_sgl_desc(void)
{
	struct tt_nvme_sgl_desc d;
	const uint8_t *b = (const uint8_t *)&d;

	memset(&d, 0xff, sizeof(d));
	tt_nvme_sgl_desc_set(&d, 0x1122334455667788ull, 0xaabbccdd,
			     TT_NVME_SGL_TYPE_LAST_SEGMENT);
	tap_eq(b[0] | (uint64_t)b[7] << 56, 0x1100000000000088ull,
	       "SGL address little endian in bytes 0-7");
	tap_eq(b[8] | (uint32_t)b[11] << 24, 0xaa0000ddu,
	       "SGL length little endian in bytes 8-11");
	tap_ok(b[12] == 0 && b[13] == 0 && b[14] == 0, "SGL reserved bytes 12-14 cleared");
	tap_eq(b[15], 0x30, "Last Segment descriptor id byte is 3h << 4 | subtype 0");
	tap_eq(tt_nvme_sgl_desc_type(&d), TT_NVME_SGL_TYPE_LAST_SEGMENT, "descriptor type read back");
	tt_nvme_sgl_desc_set(&d, 0, 1, TT_NVME_SGL_TYPE_SEGMENT);
	tap_eq(b[15], 0x20, "Segment descriptor id byte is 20h");
	tt_nvme_sgl_desc_set(&d, 0, 1, TT_NVME_SGL_TYPE_DATA_BLOCK);
	tap_eq(b[15], 0x00, "Data Block descriptor id byte is 00h");
}

static void test_rw(void)
{
	struct tt_nvme_sqe sqe;

	dirty(&sqe);
	tap_eq(tt_nvme_cmd_read(&sqe, 1, 0x123456789aull, 8), 0, "read with 8 blocks accepted");
	sqe.cid = 0xbeef;
	tap_eq(sqe_dw(&sqe, 0), 0xbeef0002u, "read DW0 = cid << 16 | opcode 02h, flags 0");
	tap_eq(sqe_dw(&sqe, 1), 1, "read DW1 = nsid");
	tap_eq(sqe_dw(&sqe, 10), 0x3456789au, "read CDW10 = SLBA low");
	tap_eq(sqe_dw(&sqe, 11), 0x12, "read CDW11 = SLBA high");
	tap_eq(sqe_dw(&sqe, 12), 7, "read CDW12 NLB is 0's based (8 blocks -> 7)");
	tap_ok(sqe_rest_zero(&sqe, 1u << 0 | 1u << 1 | 1u << 10 | 1u << 11 | 1u << 12),
	       "read clears every other dword of a dirty entry");

	dirty(&sqe);
	tap_eq(tt_nvme_cmd_write(&sqe, 7, 0, 1), 0, "write with 1 block accepted");
	tap_eq(sqe.opcode, TT_NVME_CMD_WRITE, "write opcode 01h");
	tap_eq(sqe.cdw12, 0, "1 block -> NLB 0");
	tap_eq(sqe.nsid, 7, "write nsid");

	tap_eq(tt_nvme_cmd_read(&sqe, 1, 0, 65536), 0, "65536 blocks accepted");
	tap_eq(sqe.cdw12, 0xffff, "65536 blocks -> NLB ffffh");
	sqe.cdw12 = 0x1234;
	tap_eq((uint64_t)tt_nvme_cmd_read(&sqe, 1, 0, 0), (uint64_t)-TT_EINVAL, "0 blocks rejected");
	tap_eq((uint64_t)tt_nvme_cmd_write(&sqe, 1, 0, 65537), (uint64_t)-TT_EINVAL,
	       "65537 blocks rejected");
	tap_eq(sqe.cdw12, 0x1234, "rejected builder leaves the entry alone");

	dirty(&sqe);
	tt_nvme_cmd_flush(&sqe, 0xffffffffu);
	tap_eq(sqe.opcode, TT_NVME_CMD_FLUSH, "flush opcode 00h");
	tap_eq(sqe_dw(&sqe, 1), 0xffffffffu, "flush nsid");
	tap_ok(sqe_rest_zero(&sqe, 1u << 1), "flush clears everything else");
}

static void test_admin(void)
{
	struct tt_nvme_sqe sqe;

	dirty(&sqe);
	tt_nvme_cmd_identify(&sqe, TT_NVME_IDENTIFY_CNS_CTRL, 0, 0x0102);
	tap_eq(sqe_dw(&sqe, 0), 0x06, "identify opcode 06h");
	tap_eq(sqe.cdw10, 0x01020001u, "identify CDW10 = CNTID << 16 | CNS");
	tap_ok(sqe_rest_zero(&sqe, 1u << 0 | 1u << 10), "identify clears the rest");

	dirty(&sqe);
	tap_eq(tt_nvme_cmd_get_log_page(&sqe, TT_NVME_LOG_SMART, 0xffffffffu, 512, 0), 0,
	       "get log page 512 bytes accepted");
	tap_eq(sqe.opcode, TT_NVME_ADMIN_GET_LOG_PAGE, "get log page opcode 02h");
	tap_eq(sqe.cdw10, 127u << 16 | 0x02, "CDW10 = NUMDL (0's based dwords) << 16 | LID");
	tap_eq(sqe.cdw11, 0, "CDW11 NUMDU 0 for a small log");
	tap_eq(tt_nvme_cmd_get_log_page(&sqe, 0xc0, 1, 0x40000u * 4, 0x100000004ull), 0,
	       "get log page of 1 MiB at a 64-bit offset accepted");
	tap_eq(sqe.cdw10, 0xffff00c0u, "NUMD 3ffffh: NUMDL ffffh");
	tap_eq(sqe.cdw11, 0x3, "NUMD 3ffffh: NUMDU 3h");
	tap_eq(sqe.cdw12, 4, "LPOL");
	tap_eq(sqe.cdw13, 1, "LPOU");
	tap_eq((uint64_t)tt_nvme_cmd_get_log_page(&sqe, 2, 0, 6, 0), (uint64_t)-TT_EINVAL,
	       "log length not a dword multiple rejected");
	tap_eq((uint64_t)tt_nvme_cmd_get_log_page(&sqe, 2, 0, 0, 0), (uint64_t)-TT_EINVAL,
	       "zero log length rejected");
	tap_eq((uint64_t)tt_nvme_cmd_get_log_page(&sqe, 2, 0, 4, 2), (uint64_t)-TT_EINVAL,
	       "log offset not a dword multiple rejected");

	dirty(&sqe);
	tap_eq(tt_nvme_cmd_create_cq(&sqe, 3, 1024, 0xabc000, 5, true), 0, "create CQ accepted");
	tap_eq(sqe.opcode, TT_NVME_ADMIN_CREATE_CQ, "create CQ opcode 05h");
	tap_eq(sqe.dptr.prp.prp1, 0xabc000, "create CQ PRP1 = ring");
	tap_eq(sqe.cdw10, 1023u << 16 | 3, "create CQ CDW10 = QSIZE-1 << 16 | QID");
	tap_eq(sqe.cdw11, 5u << 16 | 1u << 1 | 1u, "create CQ CDW11 = IV << 16 | IEN | PC");
	tap_ok(sqe_rest_zero(&sqe, 1u << 0 | 1u << 6 | 1u << 10 | 1u << 11),
	       "create CQ clears the rest");
	tt_nvme_cmd_create_cq(&sqe, 1, 2, 0x1000, 0, false);
	tap_eq(sqe.cdw11, 1, "polled CQ: only PC set");
	tap_eq(tt_nvme_cmd_create_cq(&sqe, 1, 65536, 0x1000, 0, false), 0, "CQ of 65536 accepted");
	tap_eq(sqe.cdw10, 0xffff0001u, "65536 entries -> QSIZE ffffh");
	tap_eq((uint64_t)tt_nvme_cmd_create_cq(&sqe, 0, 16, 0x1000, 0, false),
	       (uint64_t)-TT_EINVAL, "create CQ for admin qid rejected");
	tap_eq((uint64_t)tt_nvme_cmd_create_cq(&sqe, 1, 1, 0x1000, 0, false),
	       (uint64_t)-TT_EINVAL, "CQ of 1 entry rejected");
	tap_eq((uint64_t)tt_nvme_cmd_create_cq(&sqe, 1, 65537, 0x1000, 0, false),
	       (uint64_t)-TT_EINVAL, "CQ of 65537 entries rejected");

	dirty(&sqe);
	tap_eq(tt_nvme_cmd_create_sq(&sqe, 2, 256, 0xdef000, 3, 2), 0, "create SQ accepted");
	tap_eq(sqe.opcode, TT_NVME_ADMIN_CREATE_SQ, "create SQ opcode 01h");
	tap_eq(sqe.dptr.prp.prp1, 0xdef000, "create SQ PRP1 = ring");
	tap_eq(sqe.cdw10, 255u << 16 | 2, "create SQ CDW10");
	tap_eq(sqe.cdw11, 3u << 16 | 2u << 1 | 1u, "create SQ CDW11 = CQID << 16 | QPRIO << 1 | PC");
	tap_eq((uint64_t)tt_nvme_cmd_create_sq(&sqe, 2, 256, 0, 0, 0), (uint64_t)-TT_EINVAL,
	       "create SQ bound to the admin CQ rejected");

	dirty(&sqe);
	tt_nvme_cmd_delete_sq(&sqe, 9);
	tap_ok(sqe.opcode == TT_NVME_ADMIN_DELETE_SQ && sqe.cdw10 == 9 &&
	       sqe_rest_zero(&sqe, 1u << 10), "delete SQ: opcode 00h, CDW10 = QID");
	dirty(&sqe);
	tt_nvme_cmd_delete_cq(&sqe, 9);
	tap_ok(sqe.opcode == TT_NVME_ADMIN_DELETE_CQ && sqe.cdw10 == 9 &&
	       sqe_rest_zero(&sqe, 1u << 0 | 1u << 10), "delete CQ: opcode 04h, CDW10 = QID");

	dirty(&sqe);
	tt_nvme_cmd_set_features(&sqe, TT_NVME_FEAT_NUM_QUEUES, 0x001f001f, false);
	tap_eq(sqe.opcode, TT_NVME_ADMIN_SET_FEATURES, "set features opcode 09h");
	tap_eq(sqe.cdw10, 0x07, "set features CDW10 = FID");
	tap_eq(sqe.cdw11, 0x001f001f, "set features CDW11 value");
	tt_nvme_cmd_set_features(&sqe, 0x06, 1, true);
	tap_eq(sqe.cdw10, 0x80000006u, "set features SV is CDW10 bit 31");
}

static void test_flags(void)
{
	struct tt_nvme_sqe sqe;

	tt_nvme_cmd_flush(&sqe, 1);
	sqe.flags = 0x01; /* fused, first command */
	tt_nvme_sqe_set_psdt(&sqe, TT_NVME_FLAG_PSDT_SGL);
	tap_eq(sqe.flags, 0x41, "PSDT 01b in flag bits 7:6, FUSE kept");
	tap_eq(sqe_dw(&sqe, 0) & 0xc300u, 0x4100u, "PSDT lands in CDW0 bits 15:14");
	tt_nvme_sqe_set_psdt(&sqe, TT_NVME_FLAG_PSDT_PRP);
	tap_eq(sqe.flags, 0x01, "PSDT back to PRP, FUSE kept");
}

static void test_cqe(void)
{
	/* DW0, DW1, DW2 = SQID << 16 | SQHD, DW3 = status << 16 | CID */
	const uint32_t raw_ok[4] = { 0xcafe, 0, 3u << 16 | 17, (0x0001u << 16) | 0x42 };
	uint16_t st = (uint16_t)((TT_NVME_SC_READ_ERROR << 1) | TT_NVME_STATUS_DNR);
	const uint32_t raw_err[4] = { 0, 0, 0, (uint32_t)st << 16 | 7 };
	struct tt_nvme_cqe cqe;

	memcpy(&cqe, raw_ok, sizeof(cqe));
	tap_eq(cqe.result, 0xcafe, "CQE result from DW0");
	tap_eq(cqe.sq_head, 17, "CQE SQHD from DW2 bits 15:0");
	tap_eq(cqe.sq_id, 3, "CQE SQID from DW2 bits 31:16");
	tap_eq(cqe.cid, 0x42, "CQE CID from DW3 bits 15:0");
	tap_eq(tt_nvme_cqe_phase(&cqe), 1, "phase tag is DW3 bit 16");
	tap_eq(tt_nvme_cqe_status(&cqe), TT_NVME_SC_SUCCESS, "phase does not count as status");
	tap_ok(!tt_nvme_cqe_dnr(&cqe), "DNR clear");

	memcpy(&cqe, raw_err, sizeof(cqe));
	tap_eq(tt_nvme_cqe_phase(&cqe), 0, "phase 0");
	tap_eq(tt_nvme_cqe_status(&cqe), 0x281, "status = SCT 2h << 8 | SC 81h");
	tap_ok(tt_nvme_cqe_dnr(&cqe), "DNR is DW3 bit 31");
	tap_ok(!strcmp(tt_nvme_status_str(tt_nvme_cqe_status(&cqe)), "Unrecovered Read Error"),
	       "media error string");
	tap_ok(!strcmp(tt_nvme_status_str(0), "Successful Completion"), "success string");
	tap_ok(!strcmp(tt_nvme_status_str(0x002), "Invalid Field in Command"), "generic 02h string");
	tap_ok(!strcmp(tt_nvme_status_str(0x013), "PRP Offset Invalid"), "generic 13h string");
	tap_ok(!strcmp(tt_nvme_status_str(0x080), "LBA Out of Range"), "generic 80h string");
	tap_ok(!strcmp(tt_nvme_status_str(0x101), "Invalid Queue Identifier"),
	       "command specific 01h string");
	tap_ok(!strcmp(tt_nvme_status_str(0x7ff), "Unknown status"), "unknown code string");
}

static void test_helpers(void)
{
	tap_ok(TT_EINVAL == EINVAL && TT_ENOSPC == ENOSPC && TT_E2BIG == E2BIG,
	       "TT_E* constants equal the host errno values");
	tap_eq(tt_nvme_mdts_bytes(5, 4096), 128 * 1024, "MDTS 5 with 4 KiB MPSMIN = 128 KiB");
	tap_eq(tt_nvme_mdts_bytes(0, 4096), 0, "MDTS 0 = no limit");
	tap_eq(tt_nvme_mdts_bytes(20, 4096), 0, "MDTS beyond 4 GiB reported as no limit");
	tap_eq(tt_nvme_list_chunks(1, 512), 1, "1 entry: 1 chunk");
	tap_eq(tt_nvme_list_chunks(512, 512), 1, "512 entries fill one 512-entry chunk");
	tap_eq(tt_nvme_list_chunks(513, 512), 2, "513 entries: 2 chunks (511 + link, 2)");
	tap_eq(tt_nvme_list_chunks(1023, 512), 2, "1023 entries: 2 chunks (511 + 512)");
	tap_eq(tt_nvme_list_chunks(1024, 512), 3, "1024 entries: 3 chunks");
	tap_eq(tt_nvme_list_chunks(5, 2), 4, "5 entries in 2-entry chunks: 1+1+1+2");
	tap_eq(tt_nvme_list_chunks(3, 1), 0, "1-entry chunks cannot chain");
}

int main(void)
{
	test_layout();
	test_sgl_desc();
	test_rw();
	test_admin();
	test_flags();
	test_cqe();
	test_helpers();
	return tap_done();
}
