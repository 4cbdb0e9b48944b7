// SPDX-License-Identifier: Apache-2.0
/*
 * Checksums (xxHash, XXH3-64).  Each object is hashed on its own, seeded
 * with its index in the slot, so layers can be verified in any order as
 * they arrive and a misplaced object cannot pass for another.  A slot's
 * checksum is the hash of its objects' hashes.
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "tutti/error.h"
#include "store_impl.h"

typedef XXH64_hash_t (*sum_fn_t)(const void *, size_t, XXH64_hash_t);

static sum_fn_t sum_fn = XXH3_64bits_withSeed;
static pthread_once_t sum_once = PTHREAD_ONCE_INIT;

/*
 * A libxxhash built with its x86 dispatcher (Debian's, Ubuntu's) also exports
 * XXH3_64bits_withSeed_dispatch, which picks AVX2 / AVX-512 at run time where
 * the default entry point is SSE2: the same hash, 1.8x as fast on data not in
 * cache (the streamed reads hash objects where they lie in the page cache).
 * Looked up in the very library that provides XXH3_64bits_withSeed (loaded
 * RTLD_LOCAL under Python, so not in the global scope); absent, the default
 * stays.  TUTTI_XXH_DISPATCH=0 keeps the default.
 */
static void sum_pick(void)
{
	const char *env = getenv("TUTTI_XXH_DISPATCH");
	Dl_info info;
	void *lib, *f;

	if ((env && !strcmp(env, "0")) || !dladdr((void *)XXH3_64bits_withSeed, &info) ||
	    !info.dli_fname)
		return;
	lib = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
	if (!lib)
		return;
	f = dlsym(lib, "XXH3_64bits_withSeed_dispatch");
	if (f)
		memcpy(&sum_fn, &f, sizeof(sum_fn));
	dlclose(lib);
}

uint64_t tt_sum_object(const void *p, uint32_t len, uint32_t obj_index)
{
	pthread_once(&sum_once, sum_pick);
	return sum_fn(p, len, obj_index);
}

uint64_t tt_sum_combine(const uint64_t *sums, uint32_t n)
{
	return XXH3_64bits(sums, (size_t)n * sizeof(*sums));
}

/*
 * The data checksum of a block at @src; with @dst, each object is copied
 * there first and hashed from the copy, while it is still in cache.
 */
static int sum_block(uint8_t *dst, const uint8_t *src, uint32_t span_bytes,
		     uint32_t n_objs, uint64_t *out)
{
	uint64_t *sums;

	if (n_objs == 0)
		return tt_seterr(-EINVAL, "a block has at least one object");
	sums = malloc((size_t)n_objs * sizeof(*sums));
	if (!sums)
		return tt_seterr(-ENOMEM, "no memory for %u object checksums", n_objs);
	for (uint32_t m = 0; m < n_objs; m++) {
		size_t off = (size_t)m * span_bytes;
		const uint8_t *obj = src + off;

		if (dst) {
			memcpy(dst + off, obj, span_bytes);
			obj = dst + off;
		}
		sums[m] = tt_sum_object(obj, span_bytes, m);
	}
	*out = tt_sum_combine(sums, n_objs);
	free(sums);
	return 0;
}

int tt_sum_block(const void *buf, uint32_t span_bytes, uint32_t n_objs,
		 uint64_t *out)
{
	return sum_block(NULL, buf, span_bytes, n_objs, out);
}

int tt_copy_sum_block(void *dst, const void *src, uint32_t span_bytes,
		      uint32_t n_objs, uint64_t *out)
{
	return sum_block(dst, src, span_bytes, n_objs, out);
}

uint64_t tt_sum_record(const struct tt_slot_record *r, uint64_t slot)
{
	return XXH3_64bits_withSeed(r, offsetof(struct tt_slot_record, rec_sum), slot);
}

uint64_t tt_sum_superblock(const struct tt_superblock *sb)
{
	return XXH3_64bits(sb, offsetof(struct tt_superblock, sb_sum));
}

uint64_t tt_sum_fingerprint(const struct tt_fingerprint *fp)
{
	return XXH3_64bits(fp, sizeof(*fp));
}

void tt_key_from_bytes(const void *data, size_t len, uint8_t key[TT_KEY_BYTES])
{
	XXH128_hash_t h = XXH3_128bits(data, len);
	XXH128_canonical_t c;

	XXH128_canonicalFromHash(&c, h);
	for (unsigned i = 0; i < TT_KEY_BYTES; i++)
		key[i] = c.digest[i];
}
