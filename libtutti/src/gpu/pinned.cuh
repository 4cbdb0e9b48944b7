// SPDX-License-Identifier: Apache-2.0
//
// pinned.cuh - page-aligned pinned host memory.
//
// cudaHostAlloc() packs small allocations: one made after an allocation of
// an odd size need not start on a page. Seen on the H200: the emulated
// controller's queue memory (rings, then PRP lists) after a few hundred
// bytes of batch status started mid-page, so the GPU refused to build every
// PRP-list command of those queues. PRP lists and O_DIRECT buffers must
// start on a page: ask for a page more and start at the first boundary.
#ifndef TT_PINNED_CUH
#define TT_PINNED_CUH

#include <cerrno>
#include <cstdint>

#include <cuda_runtime.h>

#define TT_PINNED_ALIGN 4096u

struct tt_pinned {
	void *raw;	// what cudaHostAlloc returned (to free)
	char *host;	// page aligned
	char *dev;	// @host as the GPU addresses it (cudaHostAllocMapped), or NULL
};

// @bytes of page-aligned pinned memory (not zeroed: a staging buffer needs
// no clearing at open). @flags: cudaHostAlloc's. Return: 0, -ENOMEM.
static inline int tt_pinned_alloc(struct tt_pinned *m, size_t bytes, unsigned flags)
{
	size_t off;
	void *d = nullptr;

	*m = {};
	if (cudaHostAlloc(&m->raw, bytes + TT_PINNED_ALIGN, flags) != cudaSuccess) {
		cudaGetLastError();
		m->raw = nullptr;
		return -ENOMEM;
	}
	off = (size_t)(-(uintptr_t)m->raw & (TT_PINNED_ALIGN - 1));
	m->host = (char *)m->raw + off;
	if ((flags & cudaHostAllocMapped) &&
	    cudaHostGetDevicePointer(&d, m->raw, 0) != cudaSuccess) {
		cudaGetLastError();
		cudaFreeHost(m->raw);
		*m = {};
		return -ENOMEM;
	}
	if (d)
		m->dev = (char *)d + off;
	return 0;
}

static inline void tt_pinned_free(struct tt_pinned *m)
{
	if (m->raw)
		cudaFreeHost(m->raw);
	*m = {};
}

#endif /* TT_PINNED_CUH */
