// SPDX-License-Identifier: Apache-2.0
//
// cuda_drv.cuh - CUDA driver API functions looked up at run time
// (cudaGetDriverEntryPointByVersion), so libtutti links only the runtime and
// an old driver means a clear refusal instead of a failed load.
#ifndef TT_CUDA_DRV_CUH
#define TT_CUDA_DRV_CUH

#include <cuda.h>
#include <cuda_runtime.h>

template <typename F>
static bool tt_drv_sym(const char *name, F *f)
{
	cudaDriverEntryPointQueryResult st;
	void *p = nullptr;

	if (cudaGetDriverEntryPointByVersion(name, &p, CUDA_VERSION, cudaEnableDefault, &st) !=
		    cudaSuccess ||
	    st != cudaDriverEntryPointSuccess || !p)
		return false;
	*f = (F)p;
	return true;
}

#endif /* TT_CUDA_DRV_CUH */
