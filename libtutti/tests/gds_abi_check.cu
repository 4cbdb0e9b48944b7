// SPDX-License-Identifier: Apache-2.0
//
// gds_abi_check.cu - compile-time check of src/gpu/cufile_min.h against
// the real cufile.h, where one is installed (CUDA toolkit, or the pip
// package nvidia-cufile: nvcc -I.../site-packages/nvidia/cufile/include).
// Without cufile.h this file compiles to nothing.
#if __has_include(<cufile.h>)
#include <cstddef>
#include <type_traits>
#include <cufile.h>

#include "../src/gpu/cufile_min.h"

static_assert(sizeof(CUfileError_t) == sizeof(struct tt_cufile_error), "CUfileError_t");
static_assert(offsetof(CUfileError_t, err) == offsetof(struct tt_cufile_error, err), "err");
static_assert(offsetof(CUfileError_t, cu_err) == offsetof(struct tt_cufile_error, cu_err), "cu_err");
static_assert(sizeof(CUfileDescr_t) == sizeof(struct tt_cufile_descr), "CUfileDescr_t");
static_assert(offsetof(CUfileDescr_t, type) == offsetof(struct tt_cufile_descr, type), "type");
static_assert(offsetof(CUfileDescr_t, handle) == offsetof(struct tt_cufile_descr, handle), "handle");
static_assert(offsetof(CUfileDescr_t, fs_ops) == offsetof(struct tt_cufile_descr, fs_ops), "fs_ops");
static_assert(CU_FILE_SUCCESS == TT_CU_FILE_SUCCESS, "CU_FILE_SUCCESS");
static_assert(CU_FILE_HANDLE_TYPE_OPAQUE_FD == TT_CU_FILE_HANDLE_TYPE_OPAQUE_FD, "OPAQUE_FD");

// The functions dlsym'd have the prototypes the real header gives them.
static_assert(std::is_same<decltype(&cuFileRead), decltype(tt_cufile_api::read)>::value, "cuFileRead");
static_assert(std::is_same<decltype(&cuFileWrite), decltype(tt_cufile_api::write)>::value, "cuFileWrite");
static_assert(std::is_same<decltype(&cuFileHandleDeregister),
			   decltype(tt_cufile_api::handle_deregister)>::value, "cuFileHandleDeregister");

#ifdef cuFileDriverClose	// newer headers map it to the reference-counted _v2
static_assert(sizeof(cuFileDriverClose_v2()) == sizeof(struct tt_cufile_error), "cuFileDriverClose_v2");
#endif

int tt_gds_abi_checked(void)
{
	return 1;
}
#endif
