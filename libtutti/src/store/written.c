// SPDX-License-Identifier: Apache-2.0
/*
 * Bytes the store wrote, per member (SSD endurance, docs/operations.md).
 *
 * The write path counts what it hands to each member (txn.c: data objects;
 * slots.c: table pages; this file: its own saves); a store formatted with
 * TT_FEAT_COMPAT_WRITTEN keeps each member's count in that member's
 * superblock copy B.
 *
 * Why copy B only: copy A never changes after format, so every reader, of
 * any version, selects copy A and finds the members' copies A alike (open
 * requires it); a torn copy-B write leaves copy A valid and costs the count
 * only.  Copy B is rewritten only while copy A of the same member is valid,
 * so no member is ever left without a good superblock, and only by a
 * libtutti that knows every feature bit of the store (a newer one's copy B
 * may hold fields this one would lose).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "tutti/error.h"
#include "store_impl.h"
#include "../support/util.h"

/* Bytes per member between saves: TT_WRITTEN_SAVE_BYTES, or the environment's. */
static int save_every(uint64_t *out)
{
	const char *env = getenv("TUTTI_WRITTEN_SAVE_BYTES");
	unsigned long long v;
	char *end;

	*out = TT_WRITTEN_SAVE_BYTES;
	if (!env || !*env)
		return 0;
	errno = 0;
	v = strtoull(env, &end, 10);
	if (errno || *end || !v || *env < '0' || *env > '9')
		return tt_seterr(-EINVAL, "TUTTI_WRITTEN_SAVE_BYTES=%s: not a byte count "
				 "(a whole number from 1)", env);
	*out = v;
	return 0;
}

/* Counts saturate: a count read from a crafted copy B never wraps. */
static uint64_t sat_add(uint64_t a, uint64_t b)
{
	return a + b < a ? UINT64_MAX : a + b;
}

static int unknown_features(const struct tt_features *f)
{
	return (f->compat & ~TT_FEAT_COMPAT_KNOWN) || (f->ro_compat & ~TT_FEAT_RO_COMPAT_KNOWN) ||
	       (f->incompat & ~TT_FEAT_INCOMPAT_KNOWN);
}

int tt_written_init(struct tt_store *s, const struct tt_sb_extra *x)
{
	struct tt_written *w = &s->wr;
	int kept = !!(s->sb.feat.compat & TT_FEAT_COMPAT_WRITTEN);
	uint64_t now = tt_now_ns();
	int ret;

	memset(w, 0, sizeof(*w));
	memset(s->wr_unsaved, 0, sizeof(s->wr_unsaved));
	ret = save_every(&w->save_every);
	if (ret)
		return ret;
	w->n_members = s->n_members;
	w->state = kept ? TT_WRITTEN_KEPT : TT_WRITTEN_NONE;
	if (!kept)
		w->not_saving = TT_WRITTEN_NO_COUNTER;
	else if (s->flags & TT_OPEN_RDONLY)
		w->not_saving = TT_WRITTEN_READ_ONLY;
	else if (unknown_features(&s->sb.feat))
		w->not_saving = TT_WRITTEN_UNKNOWN_FEATURES;
	for (unsigned i = 0; i < s->n_members; i++) {
		struct tt_member_written *m = &w->member[i];

		if (kept && x[i].written_ok) {
			m->bytes = m->saved = x[i].written.bytes;
			m->since_ns = x[i].written.since_ns;
			m->saved_ns = x[i].written.saved_ns;
		} else {
			m->since_ns = now;
			if (kept) {
				m->restarted = 1;
				s->wr_unsaved[i] = 1;
				w->state = TT_WRITTEN_RESTARTED;
			}
		}
		m->saving = w->not_saving == TT_WRITTEN_SAVING && x[i].copy_a_ok;
	}
	for (unsigned i = 0; i < s->n_members && w->not_saving == TT_WRITTEN_SAVING; i++)
		if (!w->member[i].saving)
			w->not_saving = TT_WRITTEN_COPY_A_DAMAGED;
	return 0;
}

void tt_written_add(struct tt_store *s, unsigned member, uint64_t bytes)
{
	if (member >= s->n_members)
		return;
	s->wr.member[member].bytes = sat_add(s->wr.member[member].bytes, bytes);
	s->wr.since_open = sat_add(s->wr.since_open, bytes);
}

void tt_written_add_ios(struct tt_store *s, const struct tt_io *ios, uint32_t n,
			int moved_only)
{
	for (uint32_t i = 0; i < n; i++)
		if (ios[i].op == TT_OP_WRITE && (!moved_only || !ios[i].res))
			tt_written_add(s, ios[i].member, ios[i].len);
}

/*
 * Copy B goes to the member file with pwrite, as format writes superblocks
 * (the engines never write below the slot table: kqueue refuses to), then
 * the engine's flush makes it durable with everything written before it.
 */
void tt_written_save(struct tt_store *s, int all)
{
	struct tt_written *w = &s->wr;
	struct tt_sb_written sw[TT_MAX_MEMBERS];
	unsigned pick[TT_MAX_MEMBERS], n = 0;
	struct tt_superblock *buf, one;
	uint64_t now;
	int ret = 0;

	for (unsigned i = 0; i < s->n_members; i++) {
		const struct tt_member_written *m = &w->member[i];
		uint64_t delta = m->bytes - m->saved;

		if (m->saving && (s->wr_unsaved[i] || (all ? delta != 0 : delta >= w->save_every)))
			pick[n++] = i;
	}
	if (!n)
		return;
	buf = tt_alloc_aligned(TT_SB_SIZE);
	if (!buf) {
		w->save_errors++;
		return;
	}
	now = tt_now_ns();
	for (unsigned k = 0; k < n && !ret; k++) {
		unsigned i = pick[k];

		tt_written_add(s, i, TT_SB_SIZE);	/* a save counts itself */
		sw[k] = (struct tt_sb_written){ .bytes = w->member[i].bytes,
						.since_ns = w->member[i].since_ns,
						.saved_ns = now };
		one = s->sb;
		one.member_index = i;
		tt_sb_seal_copy(buf, &one, 1, &sw[k]);
		ret = tt_member_pwrite(&s->members[i], buf, TT_SB_SIZE, TT_SB_SIZE);
	}
	free(buf);
	if (!ret)
		ret = tt_engine_flush(s->eng);
	if (ret) {
		w->save_errors++;
		return;
	}
	for (unsigned k = 0; k < n; k++) {
		struct tt_member_written *m = &w->member[pick[k]];

		m->saved = sw[k].bytes;
		m->saved_ns = now;
		s->wr_unsaved[pick[k]] = 0;
	}
	w->saves++;
}

int tt_store_get_written(const struct tt_store *s, struct tt_written *out)
{
	*out = s->wr;
	out->bytes = 0;
	for (unsigned i = 0; i < out->n_members; i++)
		out->bytes = sat_add(out->bytes, out->member[i].bytes);
	return 0;
}
