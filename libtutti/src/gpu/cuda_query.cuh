// SPDX-License-Identifier: Apache-2.0
//
// cuda_query.cuh - reading a cudaEventQuery() / cudaStreamQuery() result:
// whether the work was reached (the data paths' polls) and its name (the hang
// diagnostics, emu_dump.cuh and gio_path_hang.cuh).
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

// Has the queried work ended? "Not ready" is an answer, not an error: it
// leaves the runtime's last error alone, so an error somebody else has yet to
// read is kept. A real error counts as ended (the caller's wait judges it) and
// is cleared, as it was reported here.
static inline bool tt_cuda_reached(cudaError_t r)
{
	if (r == cudaErrorNotReady)
		return false;
	if (r != cudaSuccess)
		cudaGetLastError();
	return true;
}

#endif /* TT_CUDA_QUERY_CUH */
