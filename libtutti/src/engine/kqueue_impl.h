/* SPDX-License-Identifier: Apache-2.0 */
/* The kqueue engine's state, shared by kqueue.c (setup) and kqueue_io.c (I/O). */
#ifndef TT_KQUEUE_IMPL_H
#define TT_KQUEUE_IMPL_H

#include <stdint.h>
#include <sys/uio.h>
#include <time.h>

#include "tutti/kqueue.h"
#include "tutti/nvme_sgl.h"
#include "engine_impl.h"

#define KQ_PAGE			4096u
#define KQ_MAX_CMD		(1u << 20)	/* per command, below MDTS */
#define KQ_MAX_DEPTH		1024u
#define KQ_BOUNCE_SLOTS		16u
#define KQ_MAX_AREAS		256u
#define KQ_TIMEOUT_MS		30000u	/* TUTTI_KQ_TIMEOUT_MS overrides */
#define KQ_SGL_PER_CHUNK	(KQ_PAGE / 16)

struct kq_req;

struct kq_cmd {
	struct kq_req *req;
	uint64_t req_off;	/* where in the request this command starts */
	uint32_t len;
	int bounce;		/* bounce slot, -1 for direct */
	struct kq_cmd *next_free;
};

struct kq_member {
	int fd;
	struct tt_kinfo info;
	struct tt_kqp *qp;
	struct kq_cmd *cmds;
	unsigned ncmds;
	struct kq_cmd *free;
	char *lists;		/* ncmds * list_pages pages */
	uint64_t *lists_bus;
	uint32_t lists_handle;
	int lists_mapped;
	struct tt_nvme_xfer_caps caps;
	uint64_t bytes;
	uint64_t write_floor;	/* the engine never writes below (superblocks) */
	uint64_t *bounce_bus;
	uint32_t bounce_handle;
	int bounce_mapped;
	unsigned unrung;
	unsigned inflight;
	uint64_t progress_ms;	/* last completion, or first command after idle */
	int lost;		/* no queue (-errno): deleted after a stall, not remade */
	int quarantined;	/* its queue was not proven stopped: keep its memory */
	uint32_t depth;
};

struct kq_req {
	struct tt_req r;
	struct iovec iov[TT_ENGINE_MAX_IOV];
	unsigned niov;
	uint64_t issued;
	unsigned pending;
	int all_issued;
	int res;
	struct kq_req *next_free;
};

struct kq_area {
	char *base;		/* page aligned */
	size_t len;
	uint64_t *bus[TT_MAX_ENGINE_MEMBERS];
	uint32_t handle[TT_MAX_ENGINE_MEMBERS];
};

struct kq {
	struct kq_member m[TT_MAX_ENGINE_MEMBERS];
	struct kq_req *reqs;
	struct kq_req *free_reqs;
	struct kq_req *cur;
	struct kq_area areas[KQ_MAX_AREAS];
	unsigned n_areas;
	char *bounce;
	size_t bounce_bytes;
	int bounce_free[KQ_BOUNCE_SLOTS];
	unsigned n_bounce_free;
	struct tt_dma_seg *segs;
	unsigned max_segs;
	uint32_t max_cmd;
	unsigned list_pages;
	int peer_fd;
	char *peer_cmb;
	size_t peer_len;
	size_t peer_sq_bytes;
	uint64_t timeout_ms;
	int bounce_quarantined;	/* a slot is held by a command not proven stopped */
};

static inline uint64_t kq_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* kqueue.c: (re)create member @i's queue pair. */
int tt_kq_member_queue(struct kq *k, unsigned i);
/* kqueue_io.c: the engine's submit and reap. */
int tt_kq_submit(struct tt_engine *e, struct tt_batch *b);
int tt_kq_reap(struct tt_engine *e, int wait);

#endif
