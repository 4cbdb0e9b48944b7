/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tutti/gpu_sum.h - the store's object checksums, computed on the GPU
 *
 * Bit-identical to the CPU's tt_sum_object(): XXH3-64 of the object's
 * span_bytes, seeded with its object index m = tt_obj_index(layer, span).
 * One warp per object. XXH3's accumulation inside a 1 KiB block is a plain
 * sum, so the 32 lanes split each block: lane (g, i) adds accumulator i's
 * terms of stripes g, g + 4, g + 8, g + 12 (one coalesced 256-byte load
 * per pass), the four lanes of an accumulator add up with shuffles, and
 * every lane folds blocks in order through XXH3's scramble step.
 */
#ifndef TUTTI_GPU_SUM_H
#define TUTTI_GPU_SUM_H

#include <stdint.h>

#include "layout.h"

#ifdef __cplusplus
extern "C" {
#endif
#pragma GCC visibility push(default)	/* the exported API: libtutti.map */
/* cffi: begin */

struct CUstream_st;

#define TT_GPU_SUM_MAX_SPANS 8u

/**
 * struct tt_gpu_sum_layer - one layer's objects to hash
 * @geo: store geometry (n_spans <= TT_GPU_SUM_MAX_SPANS)
 * @layer: layer
 * @n_blocks: blocks
 * @block_ids: device array: memory block of block i
 * @skip: device array of @n_blocks bytes, non-zero = leave block i alone;
 *        may be NULL
 * @base: device address of memory block 0 for each span of this layer
 * @stride: bytes between memory blocks, per span
 * @sums: device array, n_blocks * tt_objs_per_slot(geo); the hash of
 *        block i's object m goes to sums[i * R + m]
 */
struct tt_gpu_sum_layer {
	struct tt_geometry geo;
	uint32_t layer;
	uint32_t n_blocks;
	const uint32_t *block_ids;
	const uint8_t *skip;
	uint64_t base[TT_GPU_SUM_MAX_SPANS];
	uint64_t stride[TT_GPU_SUM_MAX_SPANS];
	uint64_t *sums;
};

/**
 * tt_gpu_sum_layer() - hash one layer's objects on @stream
 * @d: what to hash (copied)
 * @stream: CUDA stream
 *
 * Return: 0, -EINVAL (too many spans) or -EIO (launch failure).
 */
int tt_gpu_sum_layer(const struct tt_gpu_sum_layer *d, struct CUstream_st *stream);

/* cffi: end */
#pragma GCC visibility pop
#ifdef __cplusplus
}
#endif
#endif /* TUTTI_GPU_SUM_H */
