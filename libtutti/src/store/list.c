// SPDX-License-Identifier: Apache-2.0
/*
 * Listing committed slots: what a group of stores (one per tensor-parallel
 * rank) compares to find blocks committed on some ranks only, and what a
 * node tells its cluster peers it holds (tt_store_slot_record()).
 */
#include <errno.h>
#include <string.h>

#include "tutti/error.h"
#include "store_impl.h"

int tt_store_list(struct tt_store *s, uint64_t first, uint64_t count,
		  uint8_t *keys, int64_t *slots, unsigned cap)
{
	const struct tt_slots *sl = &s->slots;
	uint64_t end = first < sl->n ? first + (count < sl->n - first ? count : sl->n - first) : first;
	int found = 0;

	for (uint64_t i = first; i < end; i++) {
		if (sl->state[i] != TT_MS_COMMITTED)
			continue;
		if ((unsigned)found < cap) {
			if (keys)
				memcpy(keys + (size_t)found * TT_KEY_BYTES, sl->rec[i].key, TT_KEY_BYTES);
			if (slots)
				slots[found] = (int64_t)i;
		}
		found++;
	}
	return found;
}

int tt_store_slot_record(struct tt_store *s, uint64_t slot,
			 struct tt_slot_record *out)
{
	const struct tt_slots *sl = &s->slots;

	if (slot >= sl->n)
		return tt_seterr(-ERANGE, "slot %llu outside the store's %llu slots",
				 (unsigned long long)slot, (unsigned long long)sl->n);
	if (sl->state[slot] != TT_MS_COMMITTED)
		return tt_seterr(-ENOENT, "slot %llu is not committed",
				 (unsigned long long)slot);
	*out = sl->rec[slot];
	return 0;
}
