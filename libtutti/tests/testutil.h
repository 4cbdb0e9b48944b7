/* SPDX-License-Identifier: Apache-2.0 */
/*
 * testutil.h - helpers the test programs share (libtutti/tests and, through hil.h, the HIL guest
 * programs), so each is written once: deterministic fill patterns, the keys of numbered blocks,
 * comparing lists of (address, length) ranges.
 */
#ifndef TUTTI_TESTS_TESTUTIL_H
#define TUTTI_TESTS_TESTUTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <tutti/store.h>

/* The next value of a xorshift64 sequence in *@x (never 0 if it starts non-zero). */
static inline uint64_t xorshift64(uint64_t *x)
{
	*x ^= *x << 13;
	*x ^= *x >> 7;
	*x ^= *x << 17;
	return *x;
}

/* Deterministic bytes from @seed (xorshift), to recognise data after a round trip. */
static inline void fill(void *buf, size_t len, uint64_t seed)
{
	uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
	uint8_t *p = (uint8_t *)buf;

	for (size_t i = 0; i < len; i++)
		p[i] = (uint8_t)xorshift64(&x);
}

/* The key of block number @i (a hash of its 4 bytes). */
static inline void key_of(unsigned i, uint8_t key[TT_KEY_BYTES])
{
	tt_key_from_bytes(&i, sizeof(i), key);
}

/* A bus range a mapping produced or a test expects. */
struct range {
	uint64_t addr;
	uint64_t len;
};

static inline bool ranges_equal(const struct range *a, int na, const struct range *b, int nb)
{
	if (na != nb)
		return false;
	for (int i = 0; i < na; i++)
		if (a[i].addr != b[i].addr || a[i].len != b[i].len)
			return false;
	return true;
}

#endif /* TUTTI_TESTS_TESTUTIL_H */
