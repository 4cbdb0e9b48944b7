// SPDX-License-Identifier: Apache-2.0
//
// hd_compile.cu - proves libtutti's NVMe protocol headers are device code.
//
// `make cuda-check` compiles this file (nvcc -c, no GPU needed); `make gpu-test`
// (scripts/gpu/h200_run.sh) also builds and runs it. The kernel runs the
// whole submit path a GPU submitter takes: build a read, map it with SGLs
// and PRPs, push it into an SQ ring in device memory, ring the doorbell,
// then peek and consume a completion. main() runs it when a GPU is present
// and checks the results (TAP); without one: "1..0 # SKIP no CUDA device".
#include <cstdio>

#include <cuda_runtime.h>

#include <tutti/hd.h>
#include <tutti/nvme.h>
#include <tutti/nvme_prp.h>
#include <tutti/nvme_queue.h>
#include <tutti/nvme_sgl.h>

#include "tap.h"

struct hd_result {
	int rc_read;
	int rc_sgl;
	int rc_prp;
	int rc_map;
	int slot;
	uint64_t sgl_addr;
	uint32_t sgl_len;
	uint8_t sgl_type;
	uint64_t prp2;
	uint8_t map_psdt;
	int peeked;
	uint16_t status;
	char status_first;
};

__global__ void tt_hd_kernel(struct tt_nvme_sqe *sq_ring, volatile uint32_t *sq_db,
			     volatile struct tt_nvme_cqe *cq_ring, volatile uint32_t *cq_db,
			     uint64_t *list_mem, const uint64_t *list_bus, struct hd_result *res)
{
	const struct tt_dma_seg segs[3] = {
		{ 0x100000, 4096 }, { 0x300000, 4096 }, { 0x500000, 4096 },
	};
	const uint64_t pages[3] = { 0x100000, 0x300000, 0x500000 };
	struct tt_nvme_list list;
	struct tt_nvme_xfer_caps caps;
	struct tt_nvme_sqe sqe;
	struct tt_nvme_sq sq;
	struct tt_nvme_cq cq;
	const struct tt_nvme_cqe *cqe;

	if (threadIdx.x != 0 || blockIdx.x != 0)
		return;
	list.vaddr = list_mem;
	list.bus = list_bus;
	list.nchunks = 2;
	list.chunk_bytes = 4096;
	caps.page_size = 4096;
	caps.mdts_bytes = tt_nvme_mdts_bytes(5, 4096);
	caps.sgls = TT_NVME_SGLS_BYTE_ALIGNED;
	caps.sgl_threshold = 8192;

	res->rc_read = tt_nvme_cmd_read(&sqe, 1, 0x1234, 24);
	res->rc_sgl = tt_nvme_map_sgl(&sqe, segs, 3, caps.mdts_bytes, &list);
	res->sgl_addr = sqe.dptr.sgl.addr;
	res->sgl_len = sqe.dptr.sgl.len;
	res->sgl_type = tt_nvme_sgl_desc_type(&sqe.dptr.sgl);
	res->rc_prp = tt_nvme_map_prp(&sqe, pages, 3, 0, 3 * 4096, caps.page_size,
				      caps.mdts_bytes, &list);
	res->prp2 = sqe.dptr.prp.prp2;

	tt_sq_init(&sq, sq_ring, sq_db, 16, 1);
	res->rc_map = tt_nvme_map(&sqe, sq.qid, segs, 3, &caps, &list);
	res->map_psdt = sqe.flags & TT_NVME_FLAG_PSDT_MASK;
	sqe.cid = 7;
	res->slot = tt_sq_push(&sq, &sqe);
	tt_sq_ring_doorbell(&sq);

	tt_cq_init(&cq, cq_ring, cq_db, 16);
	cqe = tt_cq_peek(&cq);
	res->peeked = cqe != NULL;
	if (cqe) {
		res->status = tt_nvme_cqe_status(cqe);
		tt_sq_update_head(&sq, cqe->sq_head);
		tt_cq_advance(&cq);
		tt_cq_ring_doorbell(&cq);
	}
	res->status_first = tt_nvme_status_str(res->status)[0];
}

#define CHECK(cond) tap_ok((cond), "device code: %s", #cond)

int main()
{
	struct tt_nvme_sqe *sq_ring;
	struct tt_nvme_cqe *cq_ring;
	uint32_t *dbs;
	uint64_t *list_mem, *list_bus;
	struct hd_result *res;
	int ndev = 0;

	if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0)
		tap_skip_all("no CUDA device");
	cudaMallocManaged(&sq_ring, 16 * sizeof(*sq_ring));
	cudaMallocManaged(&cq_ring, 16 * sizeof(*cq_ring));
	cudaMallocManaged(&dbs, 2 * sizeof(*dbs));
	cudaMallocManaged(&list_mem, 2 * 4096);
	cudaMallocManaged(&list_bus, 2 * sizeof(*list_bus));
	cudaMallocManaged(&res, sizeof(*res));
	cudaMemset(cq_ring, 0, 16 * sizeof(*cq_ring));
	cudaDeviceSynchronize();
	dbs[0] = dbs[1] = 0;
	list_bus[0] = 0xa000000;
	list_bus[1] = 0xa002000;
	cq_ring[0].cid = 7;
	cq_ring[0].sq_head = 1;
	cq_ring[0].status = (uint16_t)(TT_NVME_SC_LBA_RANGE << 1 | 1);

	tt_hd_kernel<<<1, 32>>>(sq_ring, &dbs[0], cq_ring, &dbs[1], list_mem, list_bus, res);
	if (!tap_ok(cudaDeviceSynchronize() == cudaSuccess, "the kernel ran"))
		return tap_done();
	CHECK(res->rc_read == 0 && res->rc_sgl == 0 && res->rc_prp == 0 && res->rc_map == 0);
	CHECK(res->sgl_type == TT_NVME_SGL_TYPE_LAST_SEGMENT && res->sgl_len == 48 &&
	      res->sgl_addr == 0xa000000);
	CHECK(res->prp2 == 0xa000000);
	CHECK(res->map_psdt == TT_NVME_FLAG_PSDT_SGL);
	CHECK(res->slot == 0 && dbs[0] == 1);
	CHECK(sq_ring[0].opcode == TT_NVME_CMD_READ && sq_ring[0].cid == 7 &&
	      sq_ring[0].cdw10 == 0x1234 && sq_ring[0].cdw12 == 23);
	CHECK(res->peeked && res->status == TT_NVME_SC_LBA_RANGE && dbs[1] == 1);
	CHECK(res->status_first == 'L');
	CHECK(tt_nvme_db_offset(1, true, 0) == 0x100c);
	return tap_done();
}
