/* SPDX-License-Identifier: Apache-2.0 */
#ifndef TT_SUPPORT_STREAM_COPY_H
#define TT_SUPPORT_STREAM_COPY_H

#include <stddef.h>
#include <stdint.h>

/*
 * memcpy whose stores bypass the cache where the CPU has them (x86-64, a
 * 16-byte aligned destination, a multiple of 64 bytes); memcpy otherwise.
 * Call tt_copy_stream_end() after a batch, before the bytes are published.
 */
void tt_copy_stream(void *dst, const void *src, size_t n);
void tt_copy_stream_end(void);

#endif
