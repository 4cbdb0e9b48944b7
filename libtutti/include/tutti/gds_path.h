/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tutti/gds_path.h - the "gds" data path: store files <-> GPU memory
 * through cuFile (GPUDirect Storage)
 *
 * Same pipeline as the staged path (staged_path.h): runs of objects
 * adjacent on disk, several per I/O thread in flight, a scatter (read) or
 * gather (write) kernel between a device chunk and the paged blocks, GPU
 * hashing. Only the move between file and device chunk differs: one
 * cuFileRead/cuFileWrite into the device chunk, which the driver does by
 * DMA with nvidia-fs, or in its compatibility mode through its own bounce
 * buffers. libcufile.so.0 is loaded at run time: nothing links against it,
 * and a machine without it gets -ENOSYS from tt_file_path_open_gds().
 *
 * Example (compiled by make ctest):
 *
 *	int with_gds_path(struct tt_store *s)
 *	{
 *		struct tt_file_path *fp;
 *		int ret = tt_file_path_open_gds(NULL, &fp);
 *
 *		if (ret)	// -ENOSYS: no cuFile here, use the staged path
 *			return ret;
 *		ret = tt_store_set_devpath(s, &tt_devpath_gds, fp);
 *		if (!ret) {
 *			// transactions as in devpath.h
 *			tt_store_set_devpath(s, NULL, NULL);
 *		}
 *		tt_file_path_close(fp);
 *		return ret;
 *	}
 */
#ifndef TUTTI_GDS_PATH_H
#define TUTTI_GDS_PATH_H

#include "staged_path.h"

#ifdef __cplusplus
extern "C" {
#endif
#pragma GCC visibility push(default)	/* the exported API: libtutti.map */
/* cffi: begin */

/**
 * tt_file_path_open_gds() - start a GDS data path
 * @p: tuning (as the staged path), or NULL
 * @out: the path, the context for tt_devpath_gds; close with tt_file_path_close()
 *
 * Return: 0, -ENOSYS (libcufile.so.0 missing or incomplete), -EIO (the
 * cuFile driver did not open; reason in tt_errmsg()), -ENOMEM, -EINVAL.
 */
int tt_file_path_open_gds(const struct tt_file_path_params *p, struct tt_file_path **out);

extern const struct tt_devpath_ops tt_devpath_gds;

/* cffi: end */
#pragma GCC visibility pop
#ifdef __cplusplus
}
#endif
#endif /* TUTTI_GDS_PATH_H */
