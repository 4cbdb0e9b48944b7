// SPDX-License-Identifier: Apache-2.0
//
// cuda_query.cuh - the name of a cudaEventQuery() / cudaStreamQuery()
// result, for the hang diagnostics (emu_dump.cuh, gio_path_hang.cuh).
#ifndef TT_CUDA_QUERY_CUH
#define TT_CUDA_QUERY_CUH

#include <cuda_runtime.h>

// @done / @pending name the two expected answers; anything else is an error,
// cleared so that the next runtime call does not report it again.
static inline const char *tt_cuda_query_name(cudaError_t r, const char *done, const char *pending)
{
	if (r == cudaSuccess)
		return done;
	if (r == cudaErrorNotReady)
		return pending;
	cudaGetLastError();
	return cudaGetErrorName(r);
}

#endif /* TT_CUDA_QUERY_CUH */
