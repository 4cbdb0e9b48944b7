/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tutti/gpu_domains.h - split a GPU's SMs into an I/O domain and a compute
 * domain with CUDA green contexts
 *
 * The I/O domain runs gio_uring's submit/poll kernels on a few SMs; the
 * compute domain (attention, MLPs) gets the rest, so I/O polling never
 * competes with compute for SMs. Where green contexts are unavailable
 * (driver or GPU too old, MIG, ...) both streams are ordinary streams over
 * the whole GPU and @reason says why.
 */
#ifndef TUTTI_GPU_DOMAINS_H
#define TUTTI_GPU_DOMAINS_H

#ifdef __cplusplus
extern "C" {
#endif
#pragma GCC visibility push(default)	/* the exported API: libtutti.map */
/* cffi: begin */

struct CUstream_st;

/**
 * struct tt_gpu_domains - two streams bound to disjoint SM sets
 * @io: stream for I/O kernels (launch gio_uring kernels here)
 * @compute: stream for everything else
 * @io_sms: SMs of the I/O domain (the whole GPU on fallback)
 * @compute_sms: SMs of the compute domain (the whole GPU on fallback)
 * @green: 1 when the domains are green contexts, 0 on fallback
 * @reason: on fallback, the call that failed and its error
 * @priv: implementation data
 */
struct tt_gpu_domains {
	struct CUstream_st *io;
	struct CUstream_st *compute;
	unsigned io_sms;
	unsigned compute_sms;
	int green;
	char reason[128];
	void *priv;
};

/**
 * tt_gpu_domains_create() - partition the current CUDA device
 * @io_sms: SMs wanted for I/O (rounded up to the GPU's partition granule)
 * @d: out
 *
 * Return: 0 (green contexts or fallback), or a negative errno when not
 * even plain streams could be made.
 */
int tt_gpu_domains_create(unsigned io_sms, struct tt_gpu_domains *d);

/** tt_gpu_domains_destroy() - destroy the streams and green contexts. */
void tt_gpu_domains_destroy(struct tt_gpu_domains *d);

/* cffi: end */
#pragma GCC visibility pop
#ifdef __cplusplus
}
#endif
#endif /* TUTTI_GPU_DOMAINS_H */
