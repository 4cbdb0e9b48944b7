/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libtutti: SSD-backed KV-cache object store.
 *
 * Layers (each its own header):
 *   nvme*.h   NVMe protocol: commands, SGL/PRP mapping, queue rings (CPU + GPU)
 *   format.h  on-disk format v1: superblock and slot records
 *   layout.h  geometry and the arithmetic address of every object
 *   engine.h  I/O engines: move batches of objects between store and memory
 *   fault.h   a fault-injecting engine wrapping any other (for tests)
 *   store.h   the object store: format/open, lookup, layer-wise put/get, check
 *
 * What the Python bindings see of each header is between its
 * "cffi: begin" and "cffi: end" comments (python/tutti/_cdefs.py);
 * what the libraries export is listed in libtutti.map.
 */
#ifndef TUTTI_TUTTI_H
#define TUTTI_TUTTI_H

/* cffi: begin */
#define TUTTI_VERSION_MAJOR 0
#define TUTTI_VERSION_MINOR 1
#define TUTTI_VERSION_PATCH 0
#define TUTTI_VERSION_STRING "0.1.0"
/* cffi: end */

#include "tutti/error.h"
#include "tutti/format.h"
#include "tutti/layout.h"
#include "tutti/engine.h"
#include "tutti/store.h"
#include "tutti/fault.h"

#endif
