/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The object store.
 *
 * A store is 1..TT_MAX_MEMBERS files or block devices formatted together.
 * Each slot holds one KV block; a key (16 bytes, e.g. a hash of vLLM's
 * chained block hash) names the block stored in a slot.
 *
 * Data safety: a slot is published only by its commit record, written after
 * the slot's data is durable, and the record carries a checksum of the data.
 * A slot being overwritten is first made empty on disk, and a slot is reused
 * only once its EMPTY record is on disk.  A read whose bytes do not match the
 * record's checksum is reported per block and the slot is dropped: the store
 * never serves bytes that differ from what was stored.
 *
 * Per-block status codes (tt_txn_finish(), tt_txn_prepare()); one rule for
 * every path, host memory or a device data path:
 *   0            ok: a read's memory holds exactly the stored bytes, a
 *                write's block is committed (or was already stored)
 *   -EBADMSG     read: the bytes were read without error but fail their
 *                checksum: the block is corrupt and its slot was dropped
 *   I/O error    -EIO, or the engine's own errno (-ENOSPC: a member's
 *                filesystem is full; -ETIMEDOUT, -EAGAIN, ...): the block's
 *                bytes did not all move.  A read's memory holds undefined
 *                bytes and the stored block is kept (an I/O error is never
 *                taken for corruption, verification on or off); a write's
 *                block is not committed
 *   -ENODATA     write: a layer was never submitted, nothing committed
 *   -ECANCELED   write: vetoed (tt_txn_veto())
 * A block keeps the first failure it met; when only a whole layer is known
 * to have failed (a refused submit, a data path's layer error), every block
 * with bytes in that layer fails.
 *
 * Data moves layer by layer through transactions (struct tt_txn): begin with
 * the blocks, then one call per layer that submits that layer's objects of
 * every block at once, then wait per layer and finish.  Memory is described
 * once by a tt_memmap (paged KV cache: a base and a block stride per
 * (layer, span)), so the caller passes only block ids per layer.
 *
 * A store handle is not thread-safe: use it from one thread at a time.
 */
#ifndef TUTTI_STORE_H
#define TUTTI_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "tutti/format.h"
#include "tutti/layout.h"
#include "tutti/engine.h"

#ifdef __cplusplus
extern "C" {
#endif
#pragma GCC visibility push(default)	/* the exported API: libtutti.map */
/* cffi: begin */

struct tt_store;
struct tt_txn;

/* tt_format_params.flags */
#define TT_FORMAT_FORCE		(1u << 0)	/* overwrite an existing store */
/* files: take their whole size now (fallocate), not block by block as written */
#define TT_FORMAT_PREALLOC	(1u << 1)

struct tt_format_params {
	struct tt_fingerprint fp;
	uint32_t n_spans;	/* 0: 2 (K and V) */
	uint32_t span_bytes;	/* 0: block_size*kv_heads*head_dim*dtype size */
	uint64_t n_slots;	/* 0: as many as fit on the smallest member */
	uint32_t stripe_objs;	/* 0: 1 MiB worth of objects */
	uint32_t flags;
};

/* tt_open_params.flags */
#define TT_OPEN_RDONLY		(1u << 0)	/* no writes; shared lock */
#define TT_OPEN_NO_VERIFY	(1u << 1)	/* skip read checksums (unsafe) */
#define TT_OPEN_SHARED		(1u << 2)	/* no exclusive lock (multi-process) */

struct tt_open_params {
	uint32_t flags;
	const struct tt_fingerprint *expect;	/* NULL: accept any model */
	const char *engine;			/* NULL: "auto" */
	struct tt_engine_params engine_params;
	/*
	 * Threads for the checksums of data the CPU moves (each layer's
	 * objects on read and write); 0: the CPUs the process may run on, at most 8;
	 * 1: the caller's thread only.
	 */
	uint32_t cpu_threads;
};

struct tt_store_stats {
	uint64_t lookups, hits;
	uint64_t blocks_read, blocks_written;
	uint64_t commits, evictions;
	uint64_t corrupt_blocks;	/* detected on read, dropped */
	struct tt_engine_stats engine;
};

struct tt_store_info {
	uint8_t uuid[16];
	struct tt_geometry geo;
	struct tt_fingerprint fp;
	uint64_t member_bytes;
	uint64_t table_bytes;
	uint64_t created_ns;
	uint64_t n_committed;
	uint64_t n_free;
	uint64_t n_bad_records;		/* found unreadable at open */
	uint64_t n_clearing;		/* emptied, EMPTY record not on disk yet (free after the next sync) */
	char engine[16];
	struct tt_store_stats stats;
};

/*
 * Bytes the store wrote, per member (SSD endurance; docs/operations.md).
 * Counted in the write path whatever the engine or data path: every byte
 * handed to a member for writing — data objects at their stride (4 KiB
 * aligned), slot-table pages, the superblock copy B that keeps the count —
 * and, in a store's first count, format's own writes.  A write that then
 * fails counts (the device may have written part of it); of a batch the
 * engine refused, what of it completed counts; of a layer a data path
 * refused, nothing.
 *
 * A store formatted with the counter (TT_FEAT_COMPAT_WRITTEN) keeps each
 * member's count in its superblock copy B, saved at close and every
 * TT_WRITTEN_SAVE_BYTES written to a member (the environment variable
 * TUTTI_WRITTEN_SAVE_BYTES, read at open, overrides it; a value that is not
 * a whole number from 1 makes open fail with -EINVAL).  A process that
 * dies loses at most what was counted since the last save; a copy B that is
 * unreadable at open (a torn save) restarts that member's count at 0, from
 * that open, and is rewritten at once by a writable open.
 */
#define TT_WRITTEN_SAVE_BYTES	(1ull << 30)

/* tt_written.state */
#define TT_WRITTEN_NONE		0u	/* no count on disk (formatted before the counter):
					 * members count from this open, never saved */
#define TT_WRITTEN_KEPT		1u	/* every member's count read from its copy B */
#define TT_WRITTEN_RESTARTED	2u	/* some member's copy B was unreadable at open: its
					 * count restarted at 0 (tt_member_written.restarted) */

/* tt_written.not_saving: why this handle does not save the counts (0: it does) */
#define TT_WRITTEN_SAVING		0u
#define TT_WRITTEN_NO_COUNTER		1u	/* state NONE */
#define TT_WRITTEN_READ_ONLY		2u	/* opened read-only */
#define TT_WRITTEN_UNKNOWN_FEATURES	3u	/* features of a newer libtutti: its copy B
						 * may hold fields this one would lose */
#define TT_WRITTEN_COPY_A_DAMAGED	4u	/* some member's copy A is damaged: that
						 * member's copy B is its only good
						 * superblock and is never rewritten (the
						 * others still save) */

struct tt_member_written {
	uint64_t bytes;		/* written to the member since since_ns */
	uint64_t saved;		/* the count its copy B holds now (bytes - saved is lost
				 * if the process dies now) */
	uint64_t since_ns;	/* counting began (CLOCK_REALTIME): format, the open
				 * that restarted it, or (state NONE) this open */
	uint64_t saved_ns;	/* when its copy B was written; 0: never */
	uint32_t restarted;	/* its copy B was unreadable at this open */
	uint32_t saving;	/* this handle saves its count */
};

struct tt_written {
	uint32_t state;		/* TT_WRITTEN_* */
	uint32_t not_saving;	/* TT_WRITTEN_SAVING or why not */
	uint32_t n_members;
	uint32_t reserved;
	uint64_t bytes;		/* sum of the members' bytes (counts saturate, never wrap) */
	uint64_t since_open;	/* bytes written through this handle */
	uint64_t save_every;	/* bytes written to a member between saves */
	uint64_t saves;		/* copy-B saves that reached the disk (this handle) */
	uint64_t save_errors;	/* saves that failed (the count stays in memory) */
	struct tt_member_written member[TT_MAX_MEMBERS];	/* by member index */
};

/*
 * Where block @b's object (layer, span) is in memory:
 *   base[layer * n_spans + span] + b * stride[layer * n_spans + span]
 * Bytes copied per object: the store's span_bytes.
 */
struct tt_memmap {
	uint32_t n_layers;
	uint32_t n_spans;
	const uint64_t *base;
	const uint64_t *stride;
};

/**
 * tt_dtype_size() - bytes per element of a dtype name ("bfloat16", "fp8"...)
 * Return: the size, or 0 if unknown.
 */
unsigned tt_dtype_size(const char *dtype);

/**
 * tt_store_plan() - fill in a format's defaults and check it
 * @p: parameters; zero fields are replaced by their defaults
 * @n_members: stripe width
 * @member_bytes: usable bytes of the smallest member (for n_slots = 0)
 * @geo: resulting geometry
 * @need_bytes: bytes each member must hold
 *
 * Return: 0, -EINVAL (bad parameters) or -ENOSPC (does not fit).
 */
int tt_store_plan(struct tt_format_params *p, unsigned n_members,
		  uint64_t member_bytes, struct tt_geometry *geo,
		  uint64_t *need_bytes);

/**
 * tt_store_format() - write a new, empty store over @paths
 * @paths: member files or block devices (files are created/extended)
 * @n: number of members
 * @p: parameters (see tt_store_plan())
 *
 * Checks everything before writing anything: sizes, mounts, an existing
 * store (kept unless TT_FORMAT_FORCE): a member holding a Tutti superblock
 * of any version, valid or damaged, in either copy (tt_store_probe()).
 * With TT_FORMAT_PREALLOC each file's space is reserved before anything is
 * written (an extent pool: no allocation on the I/O path, -ENOSPC here
 * rather than at a save; -EOPNOTSUPP where the file system cannot).
 * Return: 0 or a negative errno (-EEXIST: a store is there).
 */
int tt_store_format(const char *const *paths, unsigned n,
		    const struct tt_format_params *p);

/* tt_probe.kind: what a member's superblock area holds */
#define TT_PROBE_NONE		0u	/* no Tutti superblock in either copy */
#define TT_PROBE_STORE		1u	/* a valid superblock of this format version */
#define TT_PROBE_OTHER_VERSION	2u	/* a valid Tutti superblock of another version */
#define TT_PROBE_DAMAGED	3u	/* Tutti magic, but no copy's checksum holds */

struct tt_probe {
	uint32_t kind;			/* TT_PROBE_* */
	uint32_t version;		/* STORE, OTHER_VERSION: its format version */
	char magic[8];			/* STORE, OTHER_VERSION: as found (no NUL) */
	struct tt_features feat;	/* STORE: feature masks (of both copies) */
	uint8_t uuid[16];		/* STORE */
	uint32_t member_index;		/* STORE */
	uint32_t n_members;		/* STORE */
};

/**
 * tt_store_probe() - does @path hold a Tutti superblock, of any version?
 * @path: a file or block device (opened read-only, not locked, never created)
 * @out: what either superblock copy holds
 *
 * The check format makes before it overwrites anything, for callers that
 * want to ask first (tutti-admin format's prompt, tutti-admin list).  Reads
 * at most the two superblock copies; a file shorter than that is probed on
 * what it holds.  Return: 0, or a negative errno if @path cannot be read.
 */
int tt_store_probe(const char *path, struct tt_probe *out);

/**
 * tt_store_open() - open a formatted store
 * @paths: its members, in any order
 * @n: number of members
 * @p: options, or NULL
 * @out: the store
 *
 * Return: 0 or a negative errno: -EINVAL not a Tutti store / damaged,
 * -ENODEV missing or foreign member, -EMEDIUMTYPE fingerprint mismatch,
 * -EBUSY in use or mounted, -EFBIG truncated member, -EOPNOTSUPP another
 * format version or an incompatible feature this libtutti does not know,
 * -EROFS a read-only-compatible feature it does not know (open read-only).
 */
int tt_store_open(const char *const *paths, unsigned n,
		  const struct tt_open_params *p, struct tt_store **out);

/** tt_store_close() - abort open transactions, release everything. */
void tt_store_close(struct tt_store *s);

/** tt_store_get_info() - geometry, fingerprint, occupancy and counters. */
int tt_store_get_info(struct tt_store *s, struct tt_store_info *info);

/**
 * tt_store_get_features() - the store's feature masks
 *
 * Bits outside TT_FEAT_*_KNOWN are features of a newer libtutti (compat
 * ones ignored; ro_compat ones mean the store was opened read-only).
 */
void tt_store_get_features(const struct tt_store *s, struct tt_features *f);

/**
 * tt_store_get_written() - the bytes the store wrote, per member
 * @s: store
 * @out: the counts (see struct tt_written; no I/O)
 *
 * Return: 0.
 */
int tt_store_get_written(const struct tt_store *s, struct tt_written *out);

/** tt_store_geometry() - the geometry (valid while @s is open). */
const struct tt_geometry *tt_store_geometry(const struct tt_store *s);

/**
 * tt_store_locate() - tt_locate() with bounds checks, callable through an ABI
 * binding (tt_locate() is inline)
 *
 * Return: 0 and @out, or -EINVAL if (slot, layer, span) lies outside the store.
 */
int tt_store_locate(const struct tt_store *s, uint64_t slot, uint32_t layer,
		    uint32_t span, struct tt_extent *out);

/**
 * tt_key_from_bytes() - derive a 16-byte key from arbitrary bytes (XXH3-128)
 */
void tt_key_from_bytes(const void *data, size_t len, uint8_t key[TT_KEY_BYTES]);

/**
 * tt_store_lookup() - find committed slots of keys
 * @s: store
 * @keys: n keys of TT_KEY_BYTES bytes each, back to back
 * @n: number of keys
 * @slots: out, slot of each key or -1
 *
 * Hits become most recently used.  Return: number of hits.
 */
int tt_store_lookup(struct tt_store *s, const uint8_t *keys, unsigned n,
		    int64_t *slots);

/**
 * tt_store_invalidate() - drop committed slots (durably)
 * Return: number dropped, or a negative errno (-ERANGE bad slot).
 */
int tt_store_invalidate(struct tt_store *s, const int64_t *slots, unsigned n);

/**
 * tt_store_list() - committed slots in [@first, @first + @count) and their keys
 * @s: store
 * @first: first slot
 * @count: number of slots (clamped to the store)
 * @keys: out (may be NULL), keys of the first @cap committed slots found,
 *        TT_KEY_BYTES each, back to back
 * @slots: out (may be NULL), their slot numbers
 * @cap: capacity of @keys and @slots in entries
 *
 * From the in-memory index: no I/O, LRU order untouched.
 * Return: number of committed slots in the range (may exceed @cap).
 */
int tt_store_list(struct tt_store *s, uint64_t first, uint64_t count,
		  uint8_t *keys, int64_t *slots, unsigned cap);

/**
 * tt_store_slot_record() - the committed record of @slot: key, generation,
 * data checksum (what a peer is told it will get, and checks it got)
 * @s: store
 * @slot: slot number
 * @out: a copy of the in-memory record
 *
 * From the in-memory index: no I/O.
 * Return: 0, -ERANGE (slot out of range) or -ENOENT (slot not committed).
 */
int tt_store_slot_record(struct tt_store *s, uint64_t slot,
			 struct tt_slot_record *out);

/**
 * tt_sum_block() - the data checksum a commit records for a block held
 * contiguously in @buf (layout as tt_store_put(): @n_objs objects of
 * @span_bytes each, (layer, span) order)
 *
 * The same XXH3 rule (and code) as every commit and load, so bytes received
 * from elsewhere are checked against a record's data_sum without a store.
 * Return: 0 and @out, -EINVAL (no object) or -ENOMEM.
 */
int tt_sum_block(const void *buf, uint32_t span_bytes, uint32_t n_objs,
		 uint64_t *out);

/**
 * tt_copy_sum_block() - copy a block from @src to @dst and return in @out
 * the tt_sum_block() of the copy
 *
 * Object by object: each is hashed from @dst right after it was copied,
 * while still in cache, so checking received bytes costs one pass over
 * memory, and what the checksum vouches for is what @dst holds (a late
 * writer of @src cannot slip bytes in between).  @dst and @src must not
 * overlap.  Return: 0 and @out, -EINVAL (no object) or -ENOMEM.
 */
int tt_copy_sum_block(void *dst, const void *src, uint32_t span_bytes,
		      uint32_t n_objs, uint64_t *out);

/**
 * tt_store_write_begin() - start storing blocks under @keys
 * @s: store (not read-only)
 * @keys: n keys, back to back
 * @n: number of blocks
 * @out: the transaction
 *
 * Picks a slot per key: free first, then the least recently used (the
 * victim is made empty on disk before any of its bytes change; if that
 * cannot be recorded, nothing is evicted).  After a write met a full
 * filesystem (-ENOSPC), evicting comes before free slots, which may have no
 * space behind them.  A key already committed is not stored again
 * (tt_txn_slot() reports it).
 * Return: 0, -ENOSPC (more new keys than slots free or evictable: refused
 * before anything is evicted) or an error.
 */
int tt_store_write_begin(struct tt_store *s, const uint8_t *keys, unsigned n,
			 struct tt_txn **out);

/**
 * tt_store_read_begin() - start loading committed slots
 * @s: store
 * @slots: n slots (from tt_store_lookup()); they stay pinned until finish
 * @n: number of blocks
 * @out: the transaction
 *
 * Return: 0, -ERANGE (slot out of range), -ENOENT (slot not committed).
 */
int tt_store_read_begin(struct tt_store *s, const int64_t *slots, unsigned n,
			struct tt_txn **out);

/** tt_txn_slot() - slot of block @i, and whether it is already stored. */
int64_t tt_txn_slot(const struct tt_txn *t, unsigned i, int *present);

/**
 * tt_txn_layer() - submit one layer of every block of the transaction
 * @t: transaction
 * @layer: layer index
 * @mem: where blocks are in memory
 * @block_ids: memory block id of each of the transaction's blocks
 *
 * Writes copy nothing for aligned memory; the checksum of each object is
 * taken while the device writes it, so the caller must not change the
 * memory of a submitted layer before tt_txn_finish().
 * Return: 0 or a negative errno.  If the engine refused the layer, whatever
 * of it had started has landed, every block of the transaction with bytes
 * to move is failed with that error, and the transaction can still be
 * finished (the other blocks' outcome stands) or aborted.
 */
int tt_txn_layer(struct tt_txn *t, uint32_t layer, const struct tt_memmap *mem,
		 const uint32_t *block_ids);

/**
 * tt_txn_wait_layer() - wait for one submitted layer; verify reads
 * Return: 0, or the first I/O error of that layer, or the layer's failure
 * at submit (the blocks concerned are marked).
 */
int tt_txn_wait_layer(struct tt_txn *t, uint32_t layer);

/**
 * tt_txn_poll() - has every submitted layer's I/O completed? Never waits.
 * @t: transaction
 *
 * Reaps whatever completions the engine (or data path) already has, so that
 * a caller can put off tt_txn_finish() or tt_txn_prepare() until they would
 * wait for no data I/O (a write's finish still flushes and writes its
 * records). A layer whose I/O failed counts as completed: finish reports it.
 * A data path that cannot tell without waiting counts as completed.
 * Return: 1 completed, 0 some I/O still in flight.
 */
int tt_txn_poll(struct tt_txn *t);

/**
 * tt_txn_finish() - complete the transaction and free it
 * @t: transaction
 * @status: out (may be NULL), per block: the codes at the top of this file
 *
 * Writes: waits for data, flushes, then writes the commit records and
 * flushes again; blocks with a layer never submitted are not committed
 * (-ENODATA).  If the data flush fails, nothing is committed.  If only the
 * commit records fail to reach the disk, the error is returned and the
 * blocks whose status is 0 are served by this handle (their data is
 * durable) but may be absent after a reopen (never wrong).  Reads: compares
 * every block's checksum.
 * Return: number of blocks ok, or a negative errno.
 */
int tt_txn_finish(struct tt_txn *t, int32_t *status);

/** tt_txn_abort() - drop a transaction: nothing of it is committed. */
void tt_txn_abort(struct tt_txn *t);

/**
 * tt_txn_prepare() - make a write transaction's data durable, commit nothing
 * @t: write transaction
 * @status: out (may be NULL), per block: 0 durable (or already stored), or
 *          -EIO / -ENODATA (a layer never submitted) as tt_txn_finish()
 *
 * Waits for every submitted layer and flushes the data; no record is
 * written. tt_txn_finish() then commits the blocks whose status is 0 and
 * that were not vetoed, without flushing the data again. For a commit across
 * stores (one per tensor-parallel rank): every store prepares, the group
 * agrees on which blocks are durable everywhere, then each commits those.
 * Return: number of blocks ok, or a negative errno.
 */
int tt_txn_prepare(struct tt_txn *t, int32_t *status);

/**
 * tt_txn_veto() - block @i of a write transaction will not be committed
 *
 * Its slot is released at finish and its status is -ECANCELED; a block that
 * was already stored (tt_txn_slot() present) stays stored.
 * Return: 0, or -EINVAL (not a write transaction, @i out of range).
 */
int tt_txn_veto(struct tt_txn *t, unsigned i);

/**
 * tt_store_put() - store one block held contiguously in @buf
 * @buf: n_layers * n_spans objects of span_bytes each, (layer, span) order
 * Return: 0 (also if already present) or a negative errno (-ENOSPC: a
 * member's filesystem is full; the store evicts to make room next time).
 */
int tt_store_put(struct tt_store *s, const uint8_t key[TT_KEY_BYTES],
		 const void *buf, size_t len);

/**
 * tt_store_get() - load one block into @buf (layout as tt_store_put())
 * Return: 0, -ENOENT (miss), -EBADMSG (corrupt, dropped) or an I/O error
 * (the block is kept; @buf holds undefined bytes).
 */
int tt_store_get(struct tt_store *s, const uint8_t key[TT_KEY_BYTES],
		 void *buf, size_t len);

struct tt_check_result {
	uint64_t checked;	/* committed slots read */
	uint64_t ok;
	uint64_t bad;		/* read, but the bytes fail their checksum */
	uint64_t bad_records;	/* damaged slot records in the range */
	uint64_t repaired;	/* bad slots/records cleared (repair only) */
	uint64_t unreadable;	/* an I/O error: kept, never repaired */
};

/**
 * tt_store_check() - verify committed slots in [@first, @first + @count)
 * @s: store
 * @first: first slot
 * @count: number of slots (clamped to the store)
 * @repair: clear bad slots and damaged records (durably); a slot that could
 *          not be read (I/O error) is counted unreadable and never cleared
 * @res: out; counts are added to it, so a caller can check in chunks
 * @bad: out (may be NULL), slot numbers found bad, up to @bad_cap
 * @bad_cap: capacity of @bad
 *
 * Return: number of bad slots and damaged records found in this call (not
 * counting unreadable ones), or a negative errno.
 */
int tt_store_check(struct tt_store *s, uint64_t first, uint64_t count,
		   int repair, struct tt_check_result *res, int64_t *bad,
		   unsigned bad_cap);

/**
 * tt_store_register_memory() - register an area for fixed-buffer I/O
 *
 * The area must stay mapped until the store is closed.
 * Return: 0 or a negative errno (harmless: I/O works without it).
 */
int tt_store_register_memory(struct tt_store *s, void *addr, size_t len);

/**
 * tt_store_member_fds() - the members' open files, for a data path
 * @s: store
 * @fds: out, one per member in member order (TT_MAX_MEMBERS is enough)
 * @bytes: out (may be NULL), bytes of the store on each member
 *
 * The files stay owned by the store. Return: the number of members.
 */
int tt_store_member_fds(const struct tt_store *s, int *fds, uint64_t *bytes);

/* cffi: end */
#pragma GCC visibility pop
#ifdef __cplusplus
}
#endif
#endif
