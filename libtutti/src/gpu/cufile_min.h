/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cufile_min.h - the few cuFile declarations the GDS path uses, after the
 * public cuFile API reference (cufile.h is not installed everywhere we
 * build). Functions are looked up with dlsym in libcufile.so.0; the names
 * here carry a tt_ prefix so this header can sit next to the real one
 * (tests/gds_abi_check.cu compares the layouts where cufile.h exists).
 */
#ifndef TT_CUFILE_MIN_H
#define TT_CUFILE_MIN_H

#include <stddef.h>
#include <sys/types.h>

/* CUfileOpError: 0 is success; others are CU_FILE_* codes (5000 and up). */
#define TT_CU_FILE_SUCCESS		0
#define TT_CU_FILE_HANDLE_TYPE_OPAQUE_FD 1

/* CUfileError_t: the cuFile status and, for CUDA failures, the CUresult. */
struct tt_cufile_error {
	int err;
	int cu_err;
};

/* CUfileDescr_t */
struct tt_cufile_descr {
	int type;
	union {
		int fd;
		void *handle;
	} handle;
	const void *fs_ops;
};

typedef void *tt_cufile_handle;

struct tt_cufile_api {
	struct tt_cufile_error (*driver_open)(void);
	/* cuFileDriverClose_v2: reference counted (cufile.h maps the name) */
	struct tt_cufile_error (*driver_close)(void);
	struct tt_cufile_error (*handle_register)(tt_cufile_handle *fh,
						   struct tt_cufile_descr *descr);
	void (*handle_deregister)(tt_cufile_handle fh);
	struct tt_cufile_error (*buf_register)(const void *dev, size_t len, int flags);
	struct tt_cufile_error (*buf_deregister)(const void *dev);
	/* bytes moved, -1 with errno set, or a negated CU_FILE_* code */
	ssize_t (*read)(tt_cufile_handle fh, void *dev, size_t size, off_t file_off,
			off_t dev_off);
	ssize_t (*write)(tt_cufile_handle fh, const void *dev, size_t size,
			 off_t file_off, off_t dev_off);
};

#endif /* TT_CUFILE_MIN_H */
