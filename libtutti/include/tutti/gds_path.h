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
 * and a machine without it gets -ENOSYS from tt_gds_open().
 *
 *   tt_gds_open(NULL, &fp);
 *   tt_store_set_devpath(store, &tt_gds_ops, fp);
 *   ... tt_file_path_close(fp);
 */
#ifndef TUTTI_GDS_PATH_H
#define TUTTI_GDS_PATH_H

#include "staged_path.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * tt_gds_open() - start a GDS data path
 * @p: tuning (as the staged path), or NULL
 * @out: the path, the context for tt_gds_ops; close with tt_file_path_close()
 *
 * Return: 0, -ENOSYS (libcufile.so.0 missing or incomplete), -EIO (the
 * cuFile driver did not open; reason in tt_errmsg()), -ENOMEM, -EINVAL.
 */
int tt_gds_open(const struct tt_file_path_params *p, struct tt_file_path **out);

extern const struct tt_devpath_ops tt_gds_ops;

#ifdef __cplusplus
}
#endif
#endif /* TUTTI_GDS_PATH_H */
