/* SPDX-License-Identifier: Apache-2.0 */
/* A store member: one backing file or block device (not installed). */
#ifndef TT_SUPPORT_MEMBER_H
#define TT_SUPPORT_MEMBER_H

#include <stdint.h>

#define TT_PATH_MAX 4096

struct tt_member {
	int fd;
	int is_blk;
	int is_chr;		/* tutti.ko namespace node (kqueue engine) */
	int direct;		/* opened with O_DIRECT */
	int created;		/* format created the file */
	uint32_t mem_align;	/* O_DIRECT buffer alignment */
	uint64_t size;
	char path[TT_PATH_MAX];
};

/* tt_member_open() flags */
#define TT_MEMBER_WRITE		(1u << 0)
#define TT_MEMBER_CREATE	(1u << 1)	/* regular file may be created */
#define TT_MEMBER_NOLOCK	(1u << 2)	/* other processes may open it */

int tt_member_open(const char *path, unsigned flags, struct tt_member *m);
void tt_member_close(struct tt_member *m);
int tt_member_resize(struct tt_member *m, uint64_t size);
/* A file's first @size bytes given disk (or RAM) space now; devices: no-op. */
int tt_member_preallocate(struct tt_member *m, uint64_t size);

/* Synchronous whole-buffer I/O for metadata (buffer aligned to mem_align). */
int tt_member_pread(struct tt_member *m, void *buf, uint64_t len, uint64_t off);
/*
 * The first bytes of a member, up to @len (a multiple of 4096; buffer as
 * above): a shorter member yields what it holds.  *got: bytes read.
 */
int tt_member_read_head(struct tt_member *m, void *buf, uint64_t len, uint64_t *got);
int tt_member_pwrite(struct tt_member *m, const void *buf, uint64_t len, uint64_t off);

#endif
