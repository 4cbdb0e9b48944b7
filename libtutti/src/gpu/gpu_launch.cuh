// SPDX-License-Identifier: Apache-2.0
//
// gpu_launch.cuh - launch a kernel and get that launch's own result.
// After <<<...>>>, cudaGetLastError() returns the oldest error nobody read,
// whoever made it: a good launch could be reported failed because of an
// earlier, already handled failure, and a bad one blamed elsewhere.
// cudaLaunchKernelEx returns the result of this launch alone.
#ifndef TT_GPU_LAUNCH_CUH
#define TT_GPU_LAUNCH_CUH

#include <utility>

#include <cuda_runtime.h>

template <typename... E, typename... A>
static inline cudaError_t tt_launch(void (*kernel)(E...), dim3 grid, dim3 block,
				    cudaStream_t stream, A &&...args)
{
	cudaLaunchConfig_t cfg = {};

	cfg.gridDim = grid;
	cfg.blockDim = block;
	cfg.dynamicSmemBytes = 0;
	cfg.stream = stream;
	return cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...);
}

#endif /* TT_GPU_LAUNCH_CUH */
