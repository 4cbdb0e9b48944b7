// SPDX-License-Identifier: Apache-2.0
/* Store lifecycle: format, open, close, info, lookup and single blocks. */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tutti/error.h"
#include "tutti/fault.h"
#include "store_impl.h"
#include "../support/util.h"

static void close_members(struct tt_member *m, unsigned n, int unlink_created)
{
	for (unsigned i = 0; i < n; i++) {
		tt_member_close(&m[i]);
		if (unlink_created && m[i].created)
			unlink(m[i].path);
	}
}

/* Is paths[i] one of the members already open (same name, link, "a//b")? */
static int same_file_as(const char *const *paths, unsigned i, const struct tt_member *m)
{
	struct stat a, b;

	if (stat(paths[i], &a))
		return 0;	/* does not exist yet: tt_member_open() decides */
	for (unsigned j = 0; j < i; j++)
		if (!fstat(m[j].fd, &b) && a.st_dev == b.st_dev && a.st_ino == b.st_ino)
			return tt_seterr(-EINVAL, "%s and %s are the same file", paths[j],
					 paths[i]);
	return 0;
}

static int open_members(const char *const *paths, unsigned n, unsigned mflags,
			struct tt_member *m)
{
	if (!n || n > TT_MAX_MEMBERS)
		return tt_seterr(-EINVAL, "%u paths given: a store has 1..%u members", n,
				 TT_MAX_MEMBERS);
	for (unsigned i = 0; i < n; i++) {
		int ret;

		ret = same_file_as(paths, i, m);
		if (!ret)
			ret = tt_member_open(paths[i], mflags, &m[i]);
		if (ret) {
			close_members(m, i, 1);
			return ret;
		}
	}
	return 0;
}

static int random_uuid(uint8_t uuid[16])
{
	int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
	ssize_t n;

	if (fd < 0)
		return tt_seterr(-errno, "/dev/urandom: %s", strerror(errno));
	n = read(fd, uuid, 16);
	close(fd);
	if (n != 16)
		return tt_seterr(-EIO, "/dev/urandom: short read");
	uuid[6] = (uuid[6] & 0x0f) | 0x40;	/* RFC 4122 version 4 */
	uuid[8] = (uuid[8] & 0x3f) | 0x80;
	return 0;
}

/* Zero [off, off+len) of a member in 1 MiB writes. */
static int zero_range(struct tt_member *m, uint64_t off, uint64_t len)
{
	const uint64_t chunk = TT_MIN(len, (uint64_t)1 << 20);
	void *z = tt_alloc_aligned(chunk);
	int ret = 0;

	if (!z)
		return tt_seterr(-ENOMEM, "out of memory");
	for (uint64_t done = 0; done < len && !ret; done += chunk)
		ret = tt_member_pwrite(m, z, TT_MIN(chunk, len - done), off + done);
	free(z);
	return ret;
}

/*
 * -EEXIST if @m holds a Tutti superblock of any version, valid or damaged,
 * in either copy: format overwrites nothing that may be a store unless
 * forced (a reader of another version would have called it "not a store").
 */
static int refuse_existing_store(struct tt_member *m)
{
	struct tt_probe pr;
	char what[64];
	int ret = tt_sb_probe_member(m, &pr);

	if (ret)
		return ret;
	switch (pr.kind) {
	case TT_PROBE_STORE:
		return tt_seterr(-EEXIST, "%s already holds a Tutti store "
				 "(format with force to overwrite it)", m->path);
	case TT_PROBE_OTHER_VERSION:
		return tt_seterr(-EEXIST, "%s already holds a Tutti store of %s "
				 "(format with force to overwrite it)", m->path,
				 tt_probe_describe(&pr, what, sizeof(what)));
	case TT_PROBE_DAMAGED:
		return tt_seterr(-EEXIST, "%s holds a damaged Tutti superblock "
				 "(format with force to overwrite it)", m->path);
	}
	return 0;
}

int tt_store_probe(const char *path, struct tt_probe *out)
{
	struct tt_member m;
	int ret;

	tt_clearerr();
	memset(out, 0, sizeof(*out));
	ret = tt_member_open(path, TT_MEMBER_NOLOCK, &m);
	if (ret)
		return ret;
	ret = tt_sb_probe_member(&m, out);
	tt_member_close(&m);
	return ret;
}

int tt_store_format(const char *const *paths, unsigned n,
		    const struct tt_format_params *params)
{
	struct tt_member m[TT_MAX_MEMBERS];
	struct tt_format_params p = *params;
	struct tt_superblock sb;
	struct tt_geometry g;
	uint64_t smallest = UINT64_MAX, need;
	uint8_t uuid[16];
	int ret;

	tt_clearerr();
	ret = open_members(paths, n, TT_MEMBER_WRITE | TT_MEMBER_CREATE, m);
	if (ret)
		return ret;
	for (unsigned i = 0; i < n; i++) {
		/* A regular file grows to fit; its current size is no limit. */
		if ((m[i].is_blk || m[i].is_chr) && m[i].size < smallest)
			smallest = m[i].size;
		if (!m[i].created && !(p.flags & TT_FORMAT_FORCE)) {
			ret = refuse_existing_store(&m[i]);
			if (ret)
				goto fail;
		}
	}
	if (smallest == UINT64_MAX) {
		smallest = 0;	/* only files: capacity must be given */
		if (!p.n_slots) {
			ret = tt_seterr(-EINVAL, "regular files need a capacity "
					"(a slot count or a size)");
			goto fail;
		}
	}
	tt_clearerr();
	ret = tt_store_plan(&p, n, smallest, &g, &need);
	if (ret)
		goto fail;
	for (unsigned i = 0; i < n; i++) {
		if ((m[i].is_blk || m[i].is_chr) && m[i].size < need) {
			ret = tt_seterr(-ENOSPC, "%s is too small: %llu bytes, %llu needed",
					m[i].path, (unsigned long long)m[i].size,
					(unsigned long long)need);
			goto fail;
		}
	}
	/* Reserving space changes no byte: an old store survives a failure here. */
	for (unsigned i = 0; i < n && (p.flags & TT_FORMAT_PREALLOC); i++) {
		ret = tt_member_preallocate(&m[i], need);
		if (ret)
			goto fail;
	}
	ret = random_uuid(uuid);
	if (ret)
		goto fail;
	tt_sb_fill(&sb, &p, &g, need, uuid);

	/*
	 * Nothing was written so far.  Old superblocks go first, so a crash
	 * mid-format leaves no store rather than a half-initialised one.
	 */
	for (unsigned i = 0; i < n && !ret; i++) {
		if (m[i].size < need)
			ret = tt_member_resize(&m[i], need);
		if (!ret)
			ret = zero_range(&m[i], 0, TT_TABLE_OFF);
	}
	if (!ret)
		ret = zero_range(&m[0], sb.table_off, sb.table_bytes);
	for (unsigned i = 0; i < n && !ret; i++)
		if (fdatasync(m[i].fd))
			ret = tt_seterr(-errno, "%s: flush: %s", m[i].path, strerror(errno));
	for (unsigned i = 0; i < n && !ret; i++) {
		/* The count starts with format's own writes to the member. */
		struct tt_sb_written w = {
			.bytes = 2 * TT_TABLE_OFF + (i ? 0 : sb.table_bytes),
			.since_ns = sb.created_ns, .saved_ns = sb.created_ns,
		};

		sb.member_index = i;
		ret = tt_sb_write(&m[i], &sb, &w);
		if (!ret && fdatasync(m[i].fd))
			ret = tt_seterr(-errno, "%s: flush: %s", m[i].path, strerror(errno));
	}
	if (ret)
		goto fail;
	close_members(m, n, 0);
	return 0;
fail:
	close_members(m, n, 1);
	return ret;
}

/* Do two members' superblocks describe the same store (all but their place)? */
static bool same_store(const struct tt_superblock *a, const struct tt_superblock *b)
{
	struct tt_superblock x = *a, y = *b;

	x.member_index = y.member_index = 0;
	x.sb_sum = y.sb_sum = 0;
	return !memcmp(&x, &y, sizeof(x));
}

/*
 * Read each member's superblock, check they form one store, order them;
 * @x: what each member's superblock area holds besides, by member index.
 */
static int assemble(struct tt_store *s, struct tt_member *m, unsigned n,
		    struct tt_sb_extra *x)
{
	struct tt_sb_extra xs[TT_MAX_MEMBERS];
	struct tt_superblock sbs[TT_MAX_MEMBERS];
	int seen[TT_MAX_MEMBERS] = { 0 };
	unsigned sbflags = (s->flags & TT_OPEN_RDONLY) ? 0 : TT_SB_WRITABLE;
	int ret;

	for (unsigned i = 0; i < n; i++) {
		ret = tt_sb_read(&m[i], &sbs[i], sbflags, &xs[i]);
		if (ret)
			return ret;
		if (memcmp(sbs[i].uuid, sbs[0].uuid, 16))
			return tt_seterr(-ENODEV, "%s belongs to another store than %s",
					 m[i].path, m[0].path);
		if (!same_store(&sbs[i], &sbs[0]))
			return tt_seterr(-EINVAL, "%s: superblock disagrees with %s",
					 m[i].path, m[0].path);
	}
	if (sbs[0].n_members != n)
		return tt_seterr(-ENODEV, "store has %u members, %u given",
				 sbs[0].n_members, n);
	for (unsigned i = 0; i < n; i++) {
		unsigned idx = sbs[i].member_index;	/* < n_members: tt_sb_read() */

		if (seen[idx])
			return tt_seterr(-ENODEV, "%s and another path are the same member %u",
					 m[i].path, idx);
		seen[idx] = 1;
		s->members[idx] = m[i];
		x[idx] = xs[i];
		if (m[i].mem_align > s->mem_align)
			s->mem_align = m[i].mem_align;
	}
	s->sb = sbs[0];
	s->sb.member_index = 0;
	s->n_members = n;
	tt_sb_geometry(&s->sb, &s->geo);
	return 0;
}

int tt_store_open(const char *const *paths, unsigned n,
		  const struct tt_open_params *params, struct tt_store **out)
{
	struct tt_open_params p = { 0 };
	struct tt_sb_extra x[TT_MAX_MEMBERS];
	struct tt_member m[TT_MAX_MEMBERS];
	struct tt_store *s;
	int fds[TT_MAX_MEMBERS];
	unsigned mflags = 0;
	int ret;

	tt_clearerr();
	if (params)
		p = *params;
	if (!(p.flags & TT_OPEN_RDONLY))
		mflags |= TT_MEMBER_WRITE;
	if (p.flags & TT_OPEN_SHARED)
		mflags |= TT_MEMBER_NOLOCK;
	s = calloc(1, sizeof(*s));
	if (!s)
		return tt_seterr(-ENOMEM, "out of memory");
	ret = open_members(paths, n, mflags, m);
	if (ret) {
		free(s);
		return ret;
	}
	s->flags = p.flags;
	s->mem_align = 1;
	s->cpu_threads = p.cpu_threads ? p.cpu_threads : tt_workers_auto();
	if (sched_getaffinity(0, sizeof(s->cpus), &s->cpus))
		CPU_ZERO(&s->cpus);
	ret = assemble(s, m, n, x);
	if (!ret)
		ret = tt_written_init(s, x);
	if (ret)
		goto fail_members;
	if (p.expect) {
		ret = tt_fp_compare(&s->sb.fp, p.expect);
		if (ret)
			goto fail_members;
	}
	for (unsigned i = 0; i < n; i++)
		fds[i] = s->members[i].fd;
	ret = tt_engine_open(p.engine, fds, n, &p.engine_params, &s->eng);
	if (ret)
		goto fail_members;
	ret = tt_slots_load(s);
	if (ret)
		goto fail_engine;
	/* A copy B found unreadable (a torn save): rewritten now, from copy A. */
	tt_written_save(s, 0);
	*out = s;
	return 0;
fail_engine:
	tt_engine_close(s->eng);
fail_members:
	close_members(m, n, 0);
	free(s);
	return ret;
}

void tt_store_close(struct tt_store *s)
{
	if (!s)
		return;
	tt_txn_abort_all(s);
	if (!(s->flags & TT_OPEN_RDONLY)) {
		tt_slots_sync(s, 1);
		tt_written_save(s, 1);
	}
	tt_slots_free(&s->slots);
	tt_engine_close(s->eng);
	tt_workers_stop(s->cpu);
	close_members(s->members, s->n_members, 0);
	free(s);
}

struct tt_engine *tt_store_engine(struct tt_store *s)
{
	return s->eng;
}

void tt_store_get_features(const struct tt_store *s, struct tt_features *f)
{
	*f = s->sb.feat;
}

const struct tt_geometry *tt_store_geometry(const struct tt_store *s)
{
	return &s->geo;
}

int tt_store_locate(const struct tt_store *s, uint64_t slot, uint32_t layer,
		    uint32_t span, struct tt_extent *out)
{
	const struct tt_geometry *g = &s->geo;

	if (slot >= g->n_slots || layer >= g->n_layers || span >= g->n_spans)
		return tt_seterr(-EINVAL,
				 "object (%llu, %u, %u) outside %llu slots x %u layers x %u spans",
				 (unsigned long long)slot, layer, span,
				 (unsigned long long)g->n_slots, g->n_layers, g->n_spans);
	*out = tt_locate(g, slot, layer, span);
	return 0;
}

int tt_store_get_info(struct tt_store *s, struct tt_store_info *info)
{
	memset(info, 0, sizeof(*info));
	memcpy(info->uuid, s->sb.uuid, sizeof(info->uuid));
	info->geo = s->geo;
	info->fp = s->sb.fp;
	info->member_bytes = s->sb.member_bytes;
	info->table_bytes = s->sb.table_bytes;
	info->created_ns = s->sb.created_ns;
	info->n_committed = s->slots.n_committed;
	info->n_free = s->slots.n_free;
	info->n_bad_records = s->slots.n_bad;
	info->n_clearing = tt_slots_clearing(&s->slots);
	strncpy(info->engine, tt_engine_name(s->eng), sizeof(info->engine) - 1);
	info->stats = s->st;
	tt_engine_get_stats(s->eng, &info->stats.engine);
	return 0;
}

int tt_store_lookup(struct tt_store *s, const uint8_t *keys, unsigned n,
		    int64_t *slots)
{
	int hits = 0;

	for (unsigned i = 0; i < n; i++) {
		slots[i] = tt_slots_find(&s->slots, keys + (size_t)i * TT_KEY_BYTES);
		if (slots[i] >= 0) {
			tt_slots_touch(&s->slots, (uint64_t)slots[i]);
			hits++;
		}
	}
	s->st.lookups += n;
	s->st.hits += (uint64_t)hits;
	return hits;
}

int tt_store_invalidate(struct tt_store *s, const int64_t *slots, unsigned n)
{
	struct tt_slots *sl = &s->slots;
	int dropped = 0;

	if (s->flags & TT_OPEN_RDONLY)
		return tt_seterr(-EROFS, "store is open read-only");
	for (unsigned i = 0; i < n; i++)
		if (slots[i] < 0 || (uint64_t)slots[i] >= sl->n)
			return tt_seterr(-ERANGE, "slot %lld out of range (store has %llu)",
					 (long long)slots[i], (unsigned long long)sl->n);
	for (unsigned i = 0; i < n; i++) {
		uint8_t st = sl->state[slots[i]];

		if (st == TT_MS_COMMITTED || st == TT_MS_BAD) {
			tt_slots_set_empty(s, (uint64_t)slots[i], TT_MS_DROPPED);
			dropped++;
		}
	}
	if (dropped) {
		int ret = tt_slots_sync(s, 1);

		if (ret)
			return ret;
	}
	return dropped;
}

int tt_store_register_memory(struct tt_store *s, void *addr, size_t len)
{
	return tt_engine_register(s->eng, addr, len);
}

int tt_store_member_fds(const struct tt_store *s, int *fds, uint64_t *bytes)
{
	for (unsigned i = 0; i < s->n_members; i++)
		fds[i] = s->members[i].fd;
	if (bytes)
		*bytes = s->sb.member_bytes;
	return (int)s->n_members;
}

int tt_store_set_devpath(struct tt_store *s, const struct tt_devpath_ops *ops,
			 void *ctx)
{
	if (s->txns)
		return tt_seterr(-EBUSY, "transactions are open");
	if (ops && (!ops->begin || !ops->layer || !ops->wait || !ops->collect || !ops->end))
		return tt_seterr(-EINVAL, "data path %s lacks an operation",
				 ops->name ? ops->name : "?");
	s->dp_ops = ops;
	s->dp_ctx = ops ? ctx : NULL;
	return 0;
}

/* A memory map of one block held contiguously at @buf, (layer, span) order. */
struct flat_map {
	struct tt_memmap map;
	uint64_t *base;
	uint64_t *stride;
};

static int flat_map_init(struct flat_map *f, const struct tt_geometry *g,
			 const void *buf)
{
	uint32_t R = tt_objs_per_slot(g);

	f->base = malloc(R * sizeof(*f->base));
	f->stride = calloc(R, sizeof(*f->stride));
	if (!f->base || !f->stride) {
		free(f->base);
		free(f->stride);
		return tt_seterr(-ENOMEM, "out of memory");
	}
	for (uint32_t i = 0; i < R; i++)
		f->base[i] = (uint64_t)(uintptr_t)buf + (uint64_t)i * g->span_bytes;
	f->map.n_layers = g->n_layers;
	f->map.n_spans = g->n_spans;
	f->map.base = f->base;
	f->map.stride = f->stride;
	return 0;
}

static void flat_map_free(struct flat_map *f)
{
	free(f->base);
	free(f->stride);
}

static int block_len_ok(const struct tt_geometry *g, size_t len)
{
	uint64_t want = (uint64_t)tt_objs_per_slot(g) * g->span_bytes;

	if (len != want)
		return tt_seterr(-EINVAL, "block is %llu bytes, this store's blocks are %llu",
				 (unsigned long long)len, (unsigned long long)want);
	return 0;
}

/* Move one block through a transaction, all layers. */
static int one_block(struct tt_store *s, struct tt_txn *t, const void *buf)
{
	struct flat_map f;
	uint32_t zero = 0;
	int32_t status = 0;
	int ret;

	ret = flat_map_init(&f, &s->geo, buf);
	if (ret) {
		tt_txn_abort(t);
		return ret;
	}
	for (uint32_t l = 0; l < s->geo.n_layers && !ret; l++)
		ret = tt_txn_layer(t, l, &f.map, &zero);
	if (ret) {
		tt_txn_abort(t);
		flat_map_free(&f);
		return ret;
	}
	ret = tt_txn_finish(t, &status);
	flat_map_free(&f);
	if (ret < 0)
		return ret;
	if (status == -EBADMSG)
		return tt_seterr(-EBADMSG, "stored block is corrupt (checksum mismatch); "
				 "it was dropped");
	if (status == -ENOSPC)
		return tt_seterr(-ENOSPC, "no space left on a member's filesystem: the block "
				 "was not stored (later writes evict old blocks to reuse their "
				 "space)");
	if (status)
		return tt_seterr(status, "block I/O failed: %s", strerror(-status));
	return 0;
}

int tt_store_put(struct tt_store *s, const uint8_t key[TT_KEY_BYTES],
		 const void *buf, size_t len)
{
	struct tt_txn *t;
	int present, ret;

	tt_clearerr();
	ret = block_len_ok(&s->geo, len);
	if (ret)
		return ret;
	ret = tt_store_write_begin(s, key, 1, &t);
	if (ret)
		return ret;
	tt_txn_slot(t, 0, &present);
	if (present) {
		ret = tt_txn_finish(t, NULL);
		return ret < 0 ? ret : 0;
	}
	return one_block(s, t, buf);
}

int tt_store_get(struct tt_store *s, const uint8_t key[TT_KEY_BYTES],
		 void *buf, size_t len)
{
	struct tt_txn *t;
	int64_t slot;
	int ret;

	tt_clearerr();
	ret = block_len_ok(&s->geo, len);
	if (ret)
		return ret;
	if (tt_store_lookup(s, key, 1, &slot) == 0)
		return tt_seterr(-ENOENT, "key not in the store");
	ret = tt_store_read_begin(s, &slot, 1, &t);
	if (ret)
		return ret;
	return one_block(s, t, buf);
}
