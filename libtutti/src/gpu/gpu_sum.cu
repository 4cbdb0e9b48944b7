// SPDX-License-Identifier: Apache-2.0
//
// gpu_sum.cu - the store's object checksums (XXH3-64 seeded with the object
// index) computed on the GPU, one warp per object.
//
// Lane (g, i) = (lane / 8, lane % 8) owns accumulator i for stripes
// g, g + 4, g + 8, g + 12 of every 1 KiB block: one pass of the warp reads
// 4 stripes (256 contiguous bytes, coalesced). A stripe's term for
// accumulator i needs data word i ^ 1, which the neighbouring lane loaded
// (one shuffle). The four lanes of an accumulator add their block sums
// with two shuffles, then every lane scrambles its accumulator: blocks are
// folded in order, stripes inside a block in any order (xxh3_parts.h).
#include <cerrno>

#include <cuda_runtime.h>

#include "tutti/gpu_sum.h"
#include "gpu_launch.cuh"
#include "xxh3_parts.h"

#define GS_WARPS 8u	// objects per thread block
#define GS_FULL 0xffffffffu

static __constant__ uint8_t gs_ksecret[TT_XXH3_SECRET_SIZE] = TT_XXH3_KSECRET;

static __device__ __forceinline__ uint64_t gs_ld(const uint8_t *p, bool aligned)
{
	return aligned ? *(const uint64_t *)p : tt_xxh3_rd64(p);
}

// Sum over the warp's lanes of the same accumulator (lanes i, i+8, i+16, i+24).
static __device__ __forceinline__ uint64_t gs_lane_sum(uint64_t v)
{
	v += __shfl_xor_sync(GS_FULL, v, 8);
	return v + __shfl_xor_sync(GS_FULL, v, 16);
}

// XXH3-64 of @len > TT_XXH3_SHORT_MAX bytes at @p, by the whole warp;
// @sw: the seeded secret's 24 words (shared memory). Valid in lane 0.
static __device__ uint64_t gs_long(const uint8_t *p, uint64_t len, const uint64_t *sw,
				   unsigned lane)
{
	const unsigned i = lane & 7, g = lane >> 3;
	const bool al = ((uintptr_t)p & 7) == 0;
	const bool al_last = al && (len & 7) == 0;
	const uint64_t nb = tt_xxh3_full_blocks(len);
	const unsigned ls = tt_xxh3_last_stripes(len);
	const uint8_t *blk;
	uint64_t acc = tt_xxh3_acc_init(i), sum, d, pair, r = 0, next;

	for (uint64_t b = 0; b < nb; b++) {
		blk = p + b * TT_XXH3_BLOCK;
		sum = 0;
#pragma unroll
		for (unsigned j = 0; j < 4; j++) {
			unsigned s = g + 4 * j;

			d = gs_ld(blk + TT_XXH3_STRIPE * s + 8 * i, al);
			pair = __shfl_xor_sync(GS_FULL, d, 1);
			sum += tt_xxh3_term(d, pair, sw[s + i]);
		}
		acc = tt_xxh3_scramble(acc + gs_lane_sum(sum), sw[TT_XXH3_SCRAMBLE_OFF / 8 + i]);
	}
	// Last block: its whole stripes, then the input's last 64 bytes.
	blk = p + nb * TT_XXH3_BLOCK;
	sum = 0;
#pragma unroll
	for (unsigned j = 0; j < 4; j++) {
		unsigned s = g + 4 * j;

		d = s < ls ? gs_ld(blk + TT_XXH3_STRIPE * s + 8 * i, al) : 0;
		pair = __shfl_xor_sync(GS_FULL, d, 1);
		if (s < ls)
			sum += tt_xxh3_term(d, pair, sw[s + i]);
	}
	d = g == 0 ? gs_ld(p + len - TT_XXH3_STRIPE + 8 * i, al_last) : 0;
	pair = __shfl_xor_sync(GS_FULL, d, 1);
	if (g == 0)
		sum += tt_xxh3_term(d, pair, tt_xxh3_word_at(sw, TT_XXH3_LASTACC_OFF + 8 * i));
	acc += gs_lane_sum(sum);
	// Merge: lanes 0, 2, 4, 6 fold an accumulator pair each.
	next = __shfl_down_sync(GS_FULL, acc, 1);
	if (g == 0 && !(i & 1))
		r = tt_xxh3_mul_fold(acc ^ tt_xxh3_word_at(sw, TT_XXH3_MERGE_OFF + 8 * i),
				     next ^ tt_xxh3_word_at(sw, TT_XXH3_MERGE_OFF + 8 * i + 8));
	r += __shfl_xor_sync(GS_FULL, r, 2);
	r += __shfl_xor_sync(GS_FULL, r, 4);
	return tt_xxh3_avalanche(len * TT_XXH_P64_1 + r);
}

__global__ void gs_layer_kernel(struct tt_gpu_sum_layer d)
{
	__shared__ uint64_t sec[GS_WARPS][TT_XXH3_SECRET_SIZE / 8];
	const unsigned warp = threadIdx.x / 32, lane = threadIdx.x & 31;
	const uint64_t obj = (uint64_t)blockIdx.x * GS_WARPS + warp;
	const uint32_t S = d.geo.n_spans, R = tt_objs_per_slot(&d.geo);
	const uint64_t len = d.geo.span_bytes;
	uint64_t i, h;
	uint32_t k, m;
	const uint8_t *p;

	if (obj >= (uint64_t)d.n_blocks * S)
		return;
	i = obj / S;
	k = (uint32_t)(obj % S);
	if (d.skip && d.skip[i])
		return;
	m = tt_obj_index(&d.geo, d.layer, k);
	p = (const uint8_t *)(uintptr_t)(d.base[k] + (uint64_t)d.block_ids[i] * d.stride[k]);
	if (len <= TT_XXH3_SHORT_MAX) {
		if (lane == 0)
			d.sums[i * R + m] = tt_xxh3_short(p, len, gs_ksecret, m);
		return;
	}
	if (lane < TT_XXH3_SECRET_SIZE / 8)
		sec[warp][lane] = tt_xxh3_seeded_word(gs_ksecret, lane, m);
	__syncwarp();
	h = gs_long(p, len, sec[warp], lane);
	if (lane == 0)
		d.sums[i * R + m] = h;
}

extern "C" int tt_gpu_sum_layer(const struct tt_gpu_sum_layer *d, struct CUstream_st *stream)
{
	uint64_t n_objs, grid;

	if (!d || d->geo.n_spans == 0 || d->geo.n_spans > TT_GPU_SUM_MAX_SPANS ||
	    d->layer >= d->geo.n_layers || (d->n_blocks && (!d->block_ids || !d->sums)))
		return -EINVAL;
	n_objs = (uint64_t)d->n_blocks * d->geo.n_spans;
	if (n_objs == 0)
		return 0;
	grid = (n_objs + GS_WARPS - 1) / GS_WARPS;
	if (grid > 0x7fffffffu)
		return -EINVAL;
	return tt_launch(gs_layer_kernel, (unsigned)grid, 32 * GS_WARPS, (cudaStream_t)stream, *d) ==
			       cudaSuccess ? 0 : -EIO;
}
