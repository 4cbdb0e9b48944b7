/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tutti/hd.h - host/device portability helpers
 *
 * Everything in libtutti's protocol headers is static inline and marked
 * TT_HD, so one definition compiles for the CPU (gcc, C11) and for CUDA
 * device code (nvcc). This file holds the few primitives whose body differs
 * between the two sides: memory barriers and MMIO/DMA-memory accesses.
 *
 * All NVMe structures are little-endian; libtutti assumes a little-endian
 * host (x86-64, arm64) and GPU.
 */
#ifndef TUTTI_HD_H
#define TUTTI_HD_H

#include <stdint.h>
#include <stddef.h>
#include <stdbool.h>

#if defined(__CUDACC__)
#define TT_HD __host__ __device__
#else
#define TT_HD
#endif

#define TT_INLINE static inline TT_HD

#if defined(__cplusplus)
#define TT_STATIC_ASSERT(cond, msg) static_assert(cond, msg)
#else
#define TT_STATIC_ASSERT(cond, msg) _Static_assert(cond, msg)
#endif

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "libtutti assumes a little-endian host"
#endif

/*
 * Error numbers returned (negated) by libtutti. They are plain constants so
 * device code needs no <errno.h>; they equal Linux's E2BIG, EINVAL and
 * ENOSPC (tests/test_nvme_structs.c checks that against <errno.h>).
 */
#define TT_E2BIG  7
#define TT_EINVAL 22
#define TT_ENOSPC 28

/**
 * tt_wmb() - order earlier memory accesses before later stores
 *
 * Used before a doorbell write so the controller sees the queue entries the
 * doorbell publishes. On the GPU this is a system-scope fence, which also
 * orders the stores as seen by the PCIe peer.
 */
TT_INLINE void tt_wmb(void)
{
#if defined(__CUDA_ARCH__)
	__threadfence_system();
#else
	__atomic_thread_fence(__ATOMIC_RELEASE);
#endif
}

/**
 * tt_rmb() - order an earlier load before later loads
 *
 * Used after a completion entry's phase bit was seen flipped, so the rest
 * of the entry is read after the phase bit.
 */
TT_INLINE void tt_rmb(void)
{
#if defined(__CUDA_ARCH__)
	__threadfence_system();
#else
	__atomic_thread_fence(__ATOMIC_ACQUIRE);
#endif
}

/**
 * tt_mmio_write32() - store a 32-bit value to a device register
 * @reg: mapped register (for instance a doorbell in BAR0)
 * @v: value to store
 *
 * A single 32-bit volatile store; callers order it with tt_wmb().
 */
TT_INLINE void tt_mmio_write32(volatile uint32_t *reg, uint32_t v)
{
	*reg = v;
}

/**
 * tt_read_once_u16() - load a 16-bit value that another agent may change
 * @p: location written by the device or another thread
 *
 * Return: the value, read exactly once.
 */
TT_INLINE uint16_t tt_read_once_u16(const volatile uint16_t *p)
{
	return *p;
}

/**
 * tt_read_once_u32() - load a 32-bit value that another agent may change
 * @p: location written by the device or another thread
 *
 * Return: the value, read exactly once.
 */
TT_INLINE uint32_t tt_read_once_u32(const volatile uint32_t *p)
{
	return *p;
}

#endif /* TUTTI_HD_H */
