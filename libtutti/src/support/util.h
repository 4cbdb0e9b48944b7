/* SPDX-License-Identifier: Apache-2.0 */
/* Small helpers shared by the library's sources (not installed). */
#ifndef TT_SUPPORT_UTIL_H
#define TT_SUPPORT_UTIL_H

#include <stddef.h>
#include <stdint.h>

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "libtutti's on-disk format is little-endian; big-endian hosts need byte swapping"
#endif

#define TT_ALIGN_UP(x, a)	((((x) + (a) - 1) / (a)) * (a))
#define TT_ARRAY_SIZE(a)	(sizeof(a) / sizeof((a)[0]))
#define TT_MIN(a, b)		((a) < (b) ? (a) : (b))
#define TT_MAX(a, b)		((a) > (b) ? (a) : (b))

/* Allocation aligned for O_DIRECT; free with free(). NULL on failure. */
void *tt_alloc_aligned(size_t len);

uint64_t tt_now_ns(void);

#endif
