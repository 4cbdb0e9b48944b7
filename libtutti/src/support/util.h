/* SPDX-License-Identifier: Apache-2.0 */
/* Small helpers shared by the library's sources (not installed). */
#ifndef TT_SUPPORT_UTIL_H
#define TT_SUPPORT_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "libtutti's on-disk format is little-endian; big-endian hosts need byte swapping"
#endif

#define TT_ALIGN_UP(x, a)	((((x) + (a) - 1) / (a)) * (a))
#define TT_ARRAY_SIZE(a)	(sizeof(a) / sizeof((a)[0]))
#define TT_MIN(a, b)		((a) < (b) ? (a) : (b))
#define TT_MAX(a, b)		((a) > (b) ? (a) : (b))

/*
 * Checked arithmetic for sizes and offsets read from a disk or a user:
 * true when the result does not fit (then *r must not be used).  Every
 * place that combines such numbers goes through these, or through a bound
 * that one of them established (see format.h, "Limits").
 */
static inline bool tt_mul_overflows(uint64_t a, uint64_t b, uint64_t *r)
{
	return __builtin_mul_overflow(a, b, r);
}

static inline bool tt_add_overflows(uint64_t a, uint64_t b, uint64_t *r)
{
	return __builtin_add_overflow(a, b, r);
}

/* Round @x up to a multiple of @a (a > 0). */
static inline bool tt_align_up_overflows(uint64_t x, uint64_t a, uint64_t *r)
{
	uint64_t up;

	if (tt_add_overflows(x, a - 1, &up))
		return true;
	*r = up / a * a;
	return false;
}

/* Allocation aligned for O_DIRECT; free with free(). NULL on failure. */
void *tt_alloc_aligned(size_t len);

uint64_t tt_now_ns(void);

#endif
