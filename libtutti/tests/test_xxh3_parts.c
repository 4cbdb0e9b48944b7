// SPDX-License-Identifier: Apache-2.0
/*
 * The GPU checksum's algorithm pieces (src/gpu/xxh3_parts.h), run on the
 * CPU, against libxxhash's XXH3_64bits_withSeed(): every length up to a
 * few blocks, the lengths around every path and block boundary up to
 * 70 KiB, odd input alignment and many seeds.  Also the store's own object
 * sum, tt_sum_object(), which calls libxxhash's run-time dispatched variant
 * where the library has one: the same hash as the default entry point.
 */
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "tap.h"
#include "testutil.h"
#include "../src/gpu/xxh3_parts.h"
#include "../src/store/store_impl.h"

static const uint8_t ks[TT_XXH3_SECRET_SIZE] = TT_XXH3_KSECRET;

#define MAX_LEN (70u << 10)

static uint64_t rng = 0x243F6A8885A308D3ull;

static uint64_t next_rand(void)
{
	return xorshift64(&rng);
}

/* Lengths and seeds that disagree, counted instead of one check each. */
static unsigned bad;

static void one(const uint8_t *p, uint64_t len, uint64_t seed)
{
	uint64_t want = XXH3_64bits_withSeed(p, len, seed);
	uint64_t got = tt_xxh3_64(p, len, seed, ks);

	if (got != want && bad++ < 10)
		tap_diag("len %llu seed 0x%llx: got 0x%llx want 0x%llx",
			 (unsigned long long)len, (unsigned long long)seed,
			 (unsigned long long)got, (unsigned long long)want);
}

static void lens_near(const uint8_t *p, uint64_t centre, uint64_t seed)
{
	for (int d = -17; d <= 17; d++)
		if ((int64_t)centre + d >= 0 && centre + d <= MAX_LEN)
			one(p, centre + d, seed);
}

int main(void)
{
	static const uint64_t seeds[] = { 0, 1, 2, 63, 64, 1000, 0xffffffffull,
					  0x100000000ull, 0x8000000000000005ull,
					  0xffffffffffffffffull };
	uint8_t *buf = malloc(MAX_LEN + 8);
	unsigned ns = sizeof(seeds) / sizeof(seeds[0]);

	if (!buf)
		return 1;
	for (unsigned i = 0; i < MAX_LEN + 8; i++)
		buf[i] = (uint8_t)next_rand();

	tap_eq(tt_xxh3_64(buf, 0, 0, ks), XXH3_64bits_withSeed(buf, 0, 0), "empty input");

	bad = 0;
	for (unsigned s = 0; s < ns; s++)
		for (uint64_t len = 0; len <= 16; len++)
			one(buf, len, seeds[s]);
	tap_eq(bad, 0, "0..16 bytes (1-3, 4-8, 9-16 paths), %u seeds", ns);

	bad = 0;
	for (unsigned s = 0; s < ns; s++)
		for (uint64_t len = 17; len <= TT_XXH3_SHORT_MAX; len++)
			one(buf, len, seeds[s]);
	tap_eq(bad, 0, "17..240 bytes (mid paths), %u seeds", ns);

	bad = 0;
	for (unsigned s = 0; s < ns; s++)
		for (uint64_t len = TT_XXH3_SHORT_MAX + 1; len <= 4 * TT_XXH3_BLOCK + 100; len++)
			one(buf, len, seeds[s]);
	tap_eq(bad, 0, "241..4196 bytes: every stripe and block boundary, %u seeds", ns);

	bad = 0;
	for (unsigned s = 0; s < ns; s++) {
		for (uint64_t c = TT_XXH3_BLOCK; c <= MAX_LEN; c += TT_XXH3_BLOCK)
			lens_near(buf, c, seeds[s]);
		for (uint64_t c = 4096; c <= MAX_LEN; c += 4096)
			lens_near(buf, c + 16 * (c / 4096 % 64), seeds[s]);
	}
	tap_eq(bad, 0, "around every 1 KiB multiple up to 70 KiB, %u seeds", ns);

	bad = 0;
	for (unsigned i = 0; i < 3000; i++) {
		uint64_t len = next_rand() % (MAX_LEN + 1);
		unsigned off = (unsigned)(next_rand() % 8);

		one(buf + off, len, next_rand() >> (next_rand() % 64));
	}
	tap_eq(bad, 0, "3000 random lengths, offsets and seeds");

	bad = 0;
	for (uint64_t len = 0; len <= 8 * TT_XXH3_BLOCK; len += 61)
		for (unsigned off = 1; off < 8; off += 3)
			one(buf + off, len, len * 7 + off);
	tap_eq(bad, 0, "unaligned inputs");

	/* Store-shaped objects: seed = object index, 4 KiB multiples. */
	bad = 0;
	for (uint64_t len = 4096; len <= 65536; len *= 2)
		for (uint64_t m = 0; m < 80; m++)
			one(buf, len, m);
	tap_eq(bad, 0, "4..64 KiB objects seeded with object indices 0..79");

	/* The decomposition: block sums in any stripe order give the same. */
	{
		uint64_t sw[24], a[8], b[8], c[8];

		for (unsigned w = 0; w < 24; w++)
			sw[w] = tt_xxh3_seeded_word(ks, w, 12345);
		tt_xxh3_block_sum(buf, 0, 16, sw, a);
		tt_xxh3_block_sum(buf, 0, 7, sw, b);
		tt_xxh3_block_sum(buf, 7, 9, sw, c);
		bad = 0;
		for (unsigned i = 0; i < 8; i++)
			bad += a[i] != b[i] + c[i];
		tap_eq(bad, 0, "a block's sum splits over stripe ranges");
	}

	/* tt_sum_object (the dispatched variant where libxxhash exports one). */
	{
		Dl_info info;
		void *lib = NULL;

		if (dladdr((void *)XXH3_64bits_withSeed, &info) && info.dli_fname)
			lib = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
		tap_diag("libxxhash %s XXH3_64bits_withSeed_dispatch",
			 lib && dlsym(lib, "XXH3_64bits_withSeed_dispatch") ? "exports" : "lacks");
		if (lib)
			dlclose(lib);
		bad = 0;
		for (uint64_t len = 4096; len <= 65536; len *= 2)
			for (unsigned off = 0; off < 8; off += 7)
				for (uint32_t m = 0; m < 80; m++)
					bad += tt_sum_object(buf + off, (uint32_t)len, m) !=
					       XXH3_64bits_withSeed(buf + off, len, m);
		for (unsigned i = 0; i < 2000; i++) {
			uint32_t len = (uint32_t)(next_rand() % (MAX_LEN + 1));
			uint32_t m = (uint32_t)next_rand();

			bad += tt_sum_object(buf, len, m) != XXH3_64bits_withSeed(buf, len, m);
		}
		tap_eq(bad, 0, "the store's object sum equals XXH3_64bits_withSeed");
	}

	free(buf);
	return tap_done();
}
