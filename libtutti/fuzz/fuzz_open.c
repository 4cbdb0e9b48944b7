// SPDX-License-Identifier: Apache-2.0
/*
 * Description: one store member's bytes (both superblock copies, the slot
 * table and its records, anything after) opened as a store, then used as a
 * user would.  Input: a control byte (fuzz.h), then the member's bytes.
 */
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const unsigned order[1] = { 0 };
	unsigned ctl;
	uint8_t *buf;
	size_t len;

	if (size < 1)
		return 0;
	ctl = data[0];
	len = size - 1;
	buf = fuzz_copy(data + 1, len);
	fuzz_seal(buf, len, ctl);
	fuzz_fill_member(0, buf, len, fuzz_member_size(buf, len, ctl));
	free(buf);
	fuzz_open_exercise(1, order, ctl);
	return 0;
}
