// SPDX-License-Identifier: Apache-2.0
/*
 * Copies whose destination is not read again soon (a KV block landed in its
 * buffer, a run written into a tmpfs member): streaming stores write the
 * lines without reading them first, one pass over memory in three less.
 */
#include <string.h>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include "stream_copy.h"

void tt_copy_stream(void *dst, const void *src, size_t n)
{
#if defined(__x86_64__)
	if (!((uintptr_t)dst & 15) && !(n & 63)) {
		__m128i *d = dst;
		const __m128i *s = src;

		for (size_t i = 0; i < n / 16; i += 4) {
			__m128i a = _mm_loadu_si128(s + i), b = _mm_loadu_si128(s + i + 1);
			__m128i c = _mm_loadu_si128(s + i + 2), e = _mm_loadu_si128(s + i + 3);

			_mm_stream_si128(d + i, a);
			_mm_stream_si128(d + i + 1, b);
			_mm_stream_si128(d + i + 2, c);
			_mm_stream_si128(d + i + 3, e);
		}
		return;
	}
#endif
	memcpy(dst, src, n);
}

void tt_copy_stream_end(void)
{
#if defined(__x86_64__)
	_mm_sfence();	/* streaming stores are weakly ordered: visible before any later store */
#endif
}
