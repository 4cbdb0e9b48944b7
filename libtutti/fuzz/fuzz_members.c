// SPDX-License-Identifier: Apache-2.0
/*
 * Description: a store of 1..4 members given in any order: each member's
 * bytes from the input, assembled by tt_store_open() (uuid, index, count,
 * superblocks agreeing), then used as a user would.
 *
 * Input: a control byte (fuzz.h, applied to every member), a byte whose
 * low 2 bits are the member count - 1 and whose high bits pick the order
 * the paths are given in, then the members' bytes back to back, split
 * evenly.
 */
#include "fuzz.h"

/* The @k-th permutation of 0..n-1 (k taken modulo n!). */
static void permutation(unsigned n, unsigned k, unsigned *out)
{
	unsigned pool[FUZZ_MAX_MEMBERS];

	for (unsigned i = 0; i < n; i++)
		pool[i] = i;
	for (unsigned i = 0; i < n; i++) {
		unsigned left = n - i, pick = k % left;

		k /= left;
		out[i] = pool[pick];
		memmove(&pool[pick], &pool[pick + 1], (left - pick - 1) * sizeof(pool[0]));
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	unsigned order[FUZZ_MAX_MEMBERS], ctl, n;
	size_t part;

	if (size < 2)
		return 0;
	ctl = data[0];
	n = (data[1] & 3) + 1;
	permutation(n, data[1] >> 2, order);
	data += 2;
	size -= 2;
	part = size / n;
	for (unsigned i = 0; i < n; i++) {
		uint8_t *buf = fuzz_copy(data + i * part, part);

		fuzz_seal(buf, part, ctl);
		fuzz_fill_member(i, buf, part, fuzz_member_size(buf, part, ctl));
		free(buf);
	}
	fuzz_open_exercise(n, order, ctl);
	return 0;
}
