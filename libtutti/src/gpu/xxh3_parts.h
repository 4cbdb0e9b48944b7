/* SPDX-License-Identifier: Apache-2.0 */
/*
 * xxh3_parts.h - XXH3-64 (seeded) taken apart so a GPU warp can run it
 * (not installed; host and device, C11 and CUDA)
 *
 * Bit-identical to libxxhash's XXH3_64bits_withSeed(), which the store uses
 * for its object checksums (tt_sum_object(): seed = object index).
 *
 * Inputs above 240 bytes take the long path: the input is cut into 1 KiB
 * blocks of 16 stripes of 64 bytes, and 8 64-bit accumulators take one
 * term per stripe. Inside a block the terms are only added, so a block's
 * contribution to accumulator i is a plain sum over its stripes and can be
 * computed by many lanes in any order; between blocks every accumulator is
 * scrambled, which is the only step that must follow block order. The
 * last, partial block and the last 64 bytes of the input (read with a
 * shifted key) are again plain sums, then the accumulators are merged.
 * The long path keys with a secret derived from the seed; inputs up to 240
 * bytes are hashed directly with the default secret and the seed.
 */
#ifndef TT_XXH3_PARTS_H
#define TT_XXH3_PARTS_H

#include <stddef.h>
#include <stdint.h>

#include "tutti/hd.h"

#define TT_XXH3_SECRET_SIZE	192u
#define TT_XXH3_STRIPE		64u
#define TT_XXH3_BLOCK_STRIPES	16u	/* (secret size - stripe) / 8 */
#define TT_XXH3_BLOCK		(TT_XXH3_STRIPE * TT_XXH3_BLOCK_STRIPES)
#define TT_XXH3_SHORT_MAX	240u	/* longer inputs take the long path */
#define TT_XXH3_SCRAMBLE_OFF	128u	/* secret offset of the scramble keys */
#define TT_XXH3_LASTACC_OFF	121u	/* ... of the last stripe's keys */
#define TT_XXH3_MERGE_OFF	11u	/* ... of the merge keys */

#define TT_XXH_P32_1 0x9E3779B1u
#define TT_XXH_P32_2 0x85EBCA77u
#define TT_XXH_P32_3 0xC2B2AE3Du
#define TT_XXH_P64_1 0x9E3779B185EBCA87ull
#define TT_XXH_P64_2 0xC2B2AE3D27D4EB4Full
#define TT_XXH_P64_3 0x165667B19E3779F9ull
#define TT_XXH_P64_4 0x85EBCA77C2B2AE63ull
#define TT_XXH_P64_5 0x27D4EB2F165667C5ull
#define TT_XXH_MX1   0x165667919E3779F9ull
#define TT_XXH_MX2   0x9FB21C651E98DF25ull

/* XXH3's default secret (the spec's kSecret), as an array initialiser. */
#define TT_XXH3_KSECRET { \
	0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c, \
	0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f, \
	0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21, \
	0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c, \
	0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3, \
	0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8, \
	0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d, \
	0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64, \
	0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb, \
	0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e, \
	0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce, \
	0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e }

/* Little-endian loads from any alignment (input and secret offsets are odd). */
TT_INLINE uint64_t tt_xxh3_rd64(const uint8_t *p)
{
	uint64_t v = 0;

	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

TT_INLINE uint32_t tt_xxh3_rd32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
	       (uint32_t)p[3] << 24;
}

TT_INLINE uint64_t tt_xxh3_rotl(uint64_t v, unsigned r)
{
	return v << r | v >> (64 - r);
}

TT_INLINE uint64_t tt_xxh3_bswap64(uint64_t v)
{
	uint64_t r = 0;

	for (int i = 0; i < 8; i++, v >>= 8)
		r = r << 8 | (v & 0xff);
	return r;
}

TT_INLINE uint32_t tt_xxh3_bswap32(uint32_t v)
{
	return v >> 24 | (v >> 8 & 0xff00u) | (v << 8 & 0xff0000u) | v << 24;
}

/* Low half xor high half of the 128-bit product. */
TT_INLINE uint64_t tt_xxh3_mul_fold(uint64_t a, uint64_t b)
{
#if defined(__CUDA_ARCH__)
	return (a * b) ^ __umul64hi(a, b);
#else
	unsigned __int128 m = (unsigned __int128)a * b;

	return (uint64_t)m ^ (uint64_t)(m >> 64);
#endif
}

TT_INLINE uint64_t tt_xxh3_avalanche(uint64_t h)
{
	h ^= h >> 37;
	h *= TT_XXH_MX1;
	return h ^ h >> 32;
}

TT_INLINE uint64_t tt_xxh64_avalanche(uint64_t h)
{
	h ^= h >> 33;
	h *= TT_XXH_P64_2;
	h ^= h >> 29;
	h *= TT_XXH_P64_3;
	return h ^ h >> 32;
}

TT_INLINE uint64_t tt_xxh3_rrmxmx(uint64_t h, uint64_t len)
{
	h ^= tt_xxh3_rotl(h, 49) ^ tt_xxh3_rotl(h, 24);
	h *= TT_XXH_MX2;
	h ^= (h >> 35) + len;
	h *= TT_XXH_MX2;
	return h ^ h >> 28;
}

/* 16 input bytes keyed by 16 secret bytes and the seed, folded to 64 bits. */
TT_INLINE uint64_t tt_xxh3_mix16(const uint8_t *p, const uint8_t *s, uint64_t seed)
{
	return tt_xxh3_mul_fold(tt_xxh3_rd64(p) ^ (tt_xxh3_rd64(s) + seed),
				tt_xxh3_rd64(p + 8) ^ (tt_xxh3_rd64(s + 8) - seed));
}

TT_INLINE uint64_t tt_xxh3_0to16(const uint8_t *p, uint64_t len, const uint8_t *ks,
				 uint64_t seed)
{
	if (len > 8) {
		uint64_t lo = tt_xxh3_rd64(p) ^ ((tt_xxh3_rd64(ks + 24) ^ tt_xxh3_rd64(ks + 32)) + seed);
		uint64_t hi = tt_xxh3_rd64(p + len - 8) ^
			      ((tt_xxh3_rd64(ks + 40) ^ tt_xxh3_rd64(ks + 48)) - seed);

		return tt_xxh3_avalanche(len + tt_xxh3_bswap64(lo) + hi + tt_xxh3_mul_fold(lo, hi));
	}
	if (len >= 4) {
		uint64_t s = seed ^ (uint64_t)tt_xxh3_bswap32((uint32_t)seed) << 32;
		uint64_t in = tt_xxh3_rd32(p + len - 4) + ((uint64_t)tt_xxh3_rd32(p) << 32);

		return tt_xxh3_rrmxmx(in ^ ((tt_xxh3_rd64(ks + 8) ^ tt_xxh3_rd64(ks + 16)) - s), len);
	}
	if (len > 0) {
		uint32_t c = (uint32_t)p[0] << 16 | (uint32_t)p[len >> 1] << 24 |
			     (uint32_t)p[len - 1] | (uint32_t)len << 8;

		return tt_xxh64_avalanche(c ^ ((uint64_t)(tt_xxh3_rd32(ks) ^ tt_xxh3_rd32(ks + 4)) + seed));
	}
	return tt_xxh64_avalanche(seed ^ tt_xxh3_rd64(ks + 56) ^ tt_xxh3_rd64(ks + 64));
}

TT_INLINE uint64_t tt_xxh3_17to128(const uint8_t *p, uint64_t len, const uint8_t *ks,
				   uint64_t seed)
{
	uint64_t acc = len * TT_XXH_P64_1;

	/* Pairs from both ends, outermost pair on the first 32 secret bytes. */
	for (unsigned k = (unsigned)((len - 1) / 32) + 1; k-- > 0;) {
		acc += tt_xxh3_mix16(p + 16 * k, ks + 32 * k, seed);
		acc += tt_xxh3_mix16(p + len - 16 * (k + 1), ks + 32 * k + 16, seed);
	}
	return tt_xxh3_avalanche(acc);
}

TT_INLINE uint64_t tt_xxh3_129to240(const uint8_t *p, uint64_t len, const uint8_t *ks,
				    uint64_t seed)
{
	uint64_t acc = len * TT_XXH_P64_1, tail;
	unsigned rounds = (unsigned)(len / 16), i;

	for (i = 0; i < 8; i++)
		acc += tt_xxh3_mix16(p + 16 * i, ks + 16 * i, seed);
	acc = tt_xxh3_avalanche(acc);
	/* Rounds past the eighth reuse the secret from offset 3. */
	for (; i < rounds; i++)
		acc += tt_xxh3_mix16(p + 16 * i, ks + 16 * (i - 8) + 3, seed);
	tail = tt_xxh3_mix16(p + len - 16, ks + 136 - 17, seed);
	return tt_xxh3_avalanche(acc + tail);
}

/**
 * tt_xxh3_short() - XXH3-64 of an input of at most TT_XXH3_SHORT_MAX bytes
 * @ks: the default secret (TT_XXH3_KSECRET), not a seeded one
 */
TT_INLINE uint64_t tt_xxh3_short(const uint8_t *p, uint64_t len, const uint8_t *ks,
				 uint64_t seed)
{
	if (len <= 16)
		return tt_xxh3_0to16(p, len, ks, seed);
	if (len <= 128)
		return tt_xxh3_17to128(p, len, ks, seed);
	return tt_xxh3_129to240(p, len, ks, seed);
}

/* 64-bit word @w of the long path's secret for @seed (words are aligned). */
TT_INLINE uint64_t tt_xxh3_seeded_word(const uint8_t *ks, unsigned w, uint64_t seed)
{
	uint64_t v = tt_xxh3_rd64(ks + 8 * w);

	return w & 1 ? v - seed : v + seed;
}

/* 64 bits of a secret held as aligned words, from any byte offset. */
TT_INLINE uint64_t tt_xxh3_word_at(const uint64_t *w, unsigned off)
{
	unsigned r = off & 7;

	if (!r)
		return w[off / 8];
	return w[off / 8] >> (8 * r) | w[off / 8 + 1] << (64 - 8 * r);
}

TT_INLINE uint64_t tt_xxh3_acc_init(unsigned i)
{
	switch (i) {
	case 0: return TT_XXH_P32_3;
	case 1: return TT_XXH_P64_1;
	case 2: return TT_XXH_P64_2;
	case 3: return TT_XXH_P64_3;
	case 4: return TT_XXH_P64_4;
	case 5: return TT_XXH_P32_2;
	case 6: return TT_XXH_P64_5;
	default: return TT_XXH_P32_1;
	}
}

/*
 * One stripe's term for accumulator i: the neighbouring data word plus the
 * 32x32-bit product of the keyed word's halves. @d is data word i, @pair
 * data word i ^ 1, @key secret word i at this stripe's offset.
 */
TT_INLINE uint64_t tt_xxh3_term(uint64_t d, uint64_t pair, uint64_t key)
{
	uint64_t k = d ^ key;

	return pair + (k & 0xffffffffu) * (k >> 32);
}

/* Between blocks: mix each accumulator with its scramble key. */
TT_INLINE uint64_t tt_xxh3_scramble(uint64_t acc, uint64_t key)
{
	acc ^= acc >> 47;
	acc ^= key;
	return acc * TT_XXH_P32_1;
}

/* Full blocks before the last (partial or full) one, and its stripes. */
TT_INLINE uint64_t tt_xxh3_full_blocks(uint64_t len)
{
	return (len - 1) / TT_XXH3_BLOCK;
}

TT_INLINE unsigned tt_xxh3_last_stripes(uint64_t len)
{
	return (unsigned)(((len - 1) % TT_XXH3_BLOCK) / TT_XXH3_STRIPE);
}

/* Accumulators pairwise keyed and folded, plus the length, avalanched. */
TT_INLINE uint64_t tt_xxh3_merge(const uint64_t acc[8], const uint64_t *sw, uint64_t len)
{
	uint64_t r = len * TT_XXH_P64_1;

	for (unsigned i = 0; i < 8; i += 2)
		r += tt_xxh3_mul_fold(acc[i] ^ tt_xxh3_word_at(sw, TT_XXH3_MERGE_OFF + 8 * i),
				      acc[i + 1] ^ tt_xxh3_word_at(sw, TT_XXH3_MERGE_OFF + 8 * i + 8));
	return tt_xxh3_avalanche(r);
}

/*
 * Sum of the terms of stripes [first, first + n) of a block for every
 * accumulator, stripe s keyed from secret word s. The order of the
 * additions does not matter: this is what a GPU warp splits over lanes.
 */
TT_INLINE void tt_xxh3_block_sum(const uint8_t *blk, unsigned first, unsigned n,
				 const uint64_t *sw, uint64_t sum[8])
{
	for (unsigned i = 0; i < 8; i++)
		sum[i] = 0;
	for (unsigned s = first; s < first + n; s++)
		for (unsigned i = 0; i < 8; i++)
			sum[i] += tt_xxh3_term(tt_xxh3_rd64(blk + TT_XXH3_STRIPE * s + 8 * i),
					       tt_xxh3_rd64(blk + TT_XXH3_STRIPE * s + 8 * (i ^ 1)),
					       sw[s + i]);
}

/**
 * tt_xxh3_long() - XXH3-64 of an input above TT_XXH3_SHORT_MAX bytes,
 * block sums folded in order (the decomposition the GPU runs)
 * @sw: the seeded secret as 24 words (tt_xxh3_seeded_word())
 */
TT_INLINE uint64_t tt_xxh3_long(const uint8_t *p, uint64_t len, const uint64_t *sw)
{
	uint64_t nb = tt_xxh3_full_blocks(len), acc[8], sum[8];
	const uint8_t *last = p + len - TT_XXH3_STRIPE;
	unsigned i;

	for (i = 0; i < 8; i++)
		acc[i] = tt_xxh3_acc_init(i);
	for (uint64_t b = 0; b < nb; b++) {
		tt_xxh3_block_sum(p + b * TT_XXH3_BLOCK, 0, TT_XXH3_BLOCK_STRIPES, sw, sum);
		for (i = 0; i < 8; i++)
			acc[i] = tt_xxh3_scramble(acc[i] + sum[i], sw[TT_XXH3_SCRAMBLE_OFF / 8 + i]);
	}
	tt_xxh3_block_sum(p + nb * TT_XXH3_BLOCK, 0, tt_xxh3_last_stripes(len), sw, sum);
	for (i = 0; i < 8; i++)
		acc[i] += sum[i] + tt_xxh3_term(tt_xxh3_rd64(last + 8 * i),
						tt_xxh3_rd64(last + 8 * (i ^ 1)),
						tt_xxh3_word_at(sw, TT_XXH3_LASTACC_OFF + 8 * i));
	return tt_xxh3_merge(acc, sw, len);
}

/** tt_xxh3_64() - XXH3_64bits_withSeed(), @ks the default secret. */
TT_INLINE uint64_t tt_xxh3_64(const void *data, uint64_t len, uint64_t seed,
			      const uint8_t *ks)
{
	uint64_t sw[TT_XXH3_SECRET_SIZE / 8];

	if (len <= TT_XXH3_SHORT_MAX)
		return tt_xxh3_short((const uint8_t *)data, len, ks, seed);
	for (unsigned w = 0; w < TT_XXH3_SECRET_SIZE / 8; w++)
		sw[w] = tt_xxh3_seeded_word(ks, w, seed);
	return tt_xxh3_long((const uint8_t *)data, len, sw);
}

#endif /* TT_XXH3_PARTS_H */
