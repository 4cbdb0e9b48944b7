// SPDX-License-Identifier: Apache-2.0
/*
 * fault engine: wraps a real engine and makes chosen I/O fail (fault.h).
 *
 * Each batch the store submits is copied into a shadow batch holding only
 * what really goes to the device (ios a rule fails are left out, a torn
 * write is cut short); when the shadow completes, the rules' verdicts and
 * the device's results are written back into the caller's ios.  The caller
 * sees one outstanding request per batch, so tt_engine_wait() works as with
 * any engine, and a delayed batch simply completes some reaps later.  A
 * RATE rule gives a shadow a due time (the engine's emulated pipe, one
 * batch after the other), and the shadow completes no earlier.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tutti/error.h"
#include "tutti/fault.h"
#include "engine_impl.h"
#include "../support/util.h"

#define FAULT_PAGE	4096u
#define FAULT_MAX_HITS	4096u
#define FAULT_GARBAGE	0xa5

struct fault_rule {
	struct tt_fault f;
	uint64_t seen;		/* matching events so far */
};

struct shadow {
	struct tt_batch *outer;
	struct tt_batch in;	/* what goes to the device */
	uint32_t *src;		/* in.ios[j] is outer io src[j] */
	int32_t *forced;	/* per outer io: its error, 0 = the device's result */
	uint32_t *keep;		/* per outer io: bytes that really moved, if forced */
	int32_t submit_err;	/* the inner engine refused the shadow */
	uint32_t delay;		/* reaps left once the device is done */
	uint64_t due_ns;	/* RATE: not complete before (CLOCK_MONOTONIC); 0: none */
	struct shadow *next;
};

struct fault {
	struct tt_engine_ops ops;	/* tt_fault_ops, named after the inner engine */
	char name[24];
	struct tt_engine *inner;
	struct fault_rule rules[TT_FAULT_MAX_RULES];
	unsigned n_rules;
	int64_t full_left;		/* FULL: bytes that may still be allocated */
	uint64_t pipe_free_ns;		/* RATE: when the emulated pipe is idle again */
	struct shadow *live;
	struct tt_fault_hit hits[FAULT_MAX_HITS];
	unsigned n_hits;
	int hits_lost;
};

static const struct tt_engine_ops tt_fault_ops;

static struct fault *fault_of(struct tt_engine *e)
{
	return e && e->ops->init == tt_fault_ops.init ? e->priv : NULL;
}

static void note_hit(struct fault *f, const struct tt_fault *r, const struct tt_io *io,
		     int err)
{
	struct tt_fault_hit *h;

	if (f->n_hits == FAULT_MAX_HITS) {
		f->hits_lost = 1;
		return;
	}
	h = &f->hits[f->n_hits++];
	h->kind = r->kind;
	h->op = io ? io->op : TT_FAULT_ANY_OP;
	h->err = err;
	h->member = io ? io->member : 0;
	h->off = io ? io->off : 0;
	h->len = io ? io->len : 0;
}

static int rule_err(const struct tt_fault *r)
{
	return r->err ? r->err : -EIO;
}

/* Count an event against rule @r; does the rule fire on it? */
static int rule_fires(struct fault_rule *r)
{
	uint64_t k = r->seen++;

	return k >= r->f.nth && (!r->f.count || k - r->f.nth < r->f.count);
}

static int rule_matches(const struct fault_rule *r, unsigned kind, unsigned op)
{
	return r->f.kind == kind && (r->f.op == TT_FAULT_ANY_OP || r->f.op == op);
}

/* Does a write of @io touch a hole of its (sparse) member file? */
static int touches_hole(const struct tt_engine *e, const struct tt_io *io)
{
	off_t h = lseek(e->fds[io->member], (off_t)io->off, SEEK_HOLE);

	return h >= 0 && (uint64_t)h < io->off + io->len;
}

/* FULL: may this write allocate?  Holes eat the free space left. */
static int full_refuses(struct tt_engine *e, struct fault *f, const struct tt_io *io)
{
	if (io->op != TT_OP_WRITE || !touches_hole(e, io))
		return 0;
	if (f->full_left >= (int64_t)io->len) {
		f->full_left -= io->len;
		return 0;
	}
	return 1;
}

/*
 * The rule that decides io @io's fate, or NULL: every rule of an io kind
 * counts the io, the first one firing wins.
 */
static const struct tt_fault *io_verdict(struct tt_engine *e, struct fault *f,
					 const struct tt_io *io)
{
	const struct tt_fault *won = NULL;

	for (unsigned k = 0; k < f->n_rules; k++) {
		struct fault_rule *r = &f->rules[k];
		unsigned kind = r->f.kind;

		if (kind == TT_FAULT_SUBMIT || kind == TT_FAULT_FLUSH || kind == TT_FAULT_RATE ||
		    !rule_matches(r, kind, io->op))
			continue;
		if (kind == TT_FAULT_FULL && !full_refuses(e, f, io))
			continue;
		if (rule_fires(r) && !won)
			won = &r->f;
	}
	return won;
}

/* A SUBMIT rule firing on batch @b, or NULL. */
static const struct tt_fault *submit_verdict(struct fault *f, const struct tt_batch *b)
{
	const struct tt_fault *won = NULL;

	for (unsigned k = 0; k < f->n_rules; k++) {
		struct fault_rule *r = &f->rules[k];

		if (rule_matches(r, TT_FAULT_SUBMIT, b->ios[0].op) && rule_fires(r) && !won)
			won = &r->f;
	}
	return won;
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* RATE: nanoseconds the pipe needs for io @io (0: no RATE rule fires on it). */
static uint64_t rate_cost_ns(struct fault *f, const struct tt_io *io)
{
	uint64_t ns = 0;

	for (unsigned k = 0; k < f->n_rules; k++) {
		struct fault_rule *r = &f->rules[k];

		/* @arg MB/s = @arg / 1000 bytes per nanosecond */
		if (rule_matches(r, TT_FAULT_RATE, io->op) && rule_fires(r))
			ns += (uint64_t)io->len * 1000u / r->f.arg;
	}
	return ns;
}

/* RATE: the shadow's ios queue behind what the pipe already holds. */
static void rate_schedule(struct fault *f, struct shadow *sh, uint64_t cost_ns)
{
	uint64_t start = now_ns();

	if (!cost_ns)
		return;
	if (f->pipe_free_ns > start)
		start = f->pipe_free_ns;
	sh->due_ns = start + cost_ns;
	f->pipe_free_ns = sh->due_ns;
}

/* RATE: the earliest due time of a shadow the device is done with; 0: none waits. */
static uint64_t rate_next_due(const struct fault *f)
{
	uint64_t due = 0;

	for (const struct shadow *sh = f->live; sh; sh = sh->next)
		if (!sh->in.inflight && sh->due_ns && (!due || sh->due_ns < due))
			due = sh->due_ns;
	return due;
}

/* Sleep until @due_ns (CLOCK_MONOTONIC); bounded by the rate rule that set it. */
static void sleep_until(uint64_t due_ns)
{
	struct timespec ts = { .tv_sec = (time_t)(due_ns / 1000000000u),
			       .tv_nsec = (long)(due_ns % 1000000000u) };

	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

static void shadow_free(struct shadow *sh)
{
	free(sh->in.ios);
	free(sh->src);
	free(sh->forced);
	free(sh->keep);
	free(sh);
}

static struct shadow *shadow_new(struct tt_batch *b)
{
	struct shadow *sh = calloc(1, sizeof(*sh));

	if (!sh)
		return NULL;
	sh->outer = b;
	sh->in.ios = calloc(b->n, sizeof(*sh->in.ios));
	sh->src = calloc(b->n, sizeof(*sh->src));
	sh->forced = calloc(b->n, sizeof(*sh->forced));
	sh->keep = calloc(b->n, sizeof(*sh->keep));
	if (!sh->in.ios || !sh->src || !sh->forced || !sh->keep) {
		shadow_free(sh);
		return NULL;
	}
	return sh;
}

/* Put outer io @i into the shadow, cut to @len bytes. */
static void shadow_add(struct shadow *sh, uint32_t i, uint32_t len)
{
	struct tt_io *io = &sh->in.ios[sh->in.n];

	*io = sh->outer->ios[i];
	io->len = len;
	sh->src[sh->in.n++] = i;
}

/* Decide the fate of outer io @i (of the first @handed, which reach the device). */
static void shadow_io(struct tt_engine *e, struct fault *f, struct shadow *sh, uint32_t i)
{
	const struct tt_io *io = &sh->outer->ios[i];
	const struct tt_fault *r = io_verdict(e, f, io);
	uint32_t keep;

	if (!r) {
		shadow_add(sh, i, io->len);
		return;
	}
	switch (r->kind) {
	case TT_FAULT_DELAY:
		if (sh->delay < r->arg)
			sh->delay = r->arg;
		note_hit(f, r, io, 0);
		shadow_add(sh, i, io->len);
		return;
	case TT_FAULT_SHORT:
		keep = TT_MIN(r->arg, io->len) / FAULT_PAGE * FAULT_PAGE;
		if (keep)
			shadow_add(sh, i, keep);
		sh->keep[i] = keep;
		sh->forced[i] = rule_err(r);
		break;
	case TT_FAULT_FULL:
		sh->forced[i] = -ENOSPC;
		break;
	default:
		sh->forced[i] = rule_err(r);
		break;
	}
	note_hit(f, r, io, sh->forced[i]);
}

static int fault_submit(struct tt_engine *e, struct tt_batch *b)
{
	struct fault *f = e->priv;
	const struct tt_fault *sr = submit_verdict(f, b);
	uint32_t handed = sr ? TT_MIN(sr->arg, b->n) : b->n;
	struct shadow *sh = shadow_new(b);
	uint64_t cost_ns = 0;
	int ret;

	if (!sh)
		return tt_seterr(-ENOMEM, "fault engine: out of memory");
	for (uint32_t i = 0; i < b->n; i++) {
		if (i < handed) {
			shadow_io(e, f, sh, i);
			continue;
		}
		sh->forced[i] = rule_err(sr);
	}
	for (uint32_t j = 0; j < sh->in.n; j++)
		cost_ns += rate_cost_ns(f, &sh->in.ios[j]);
	rate_schedule(f, sh, cost_ns);
	/* The whole batch failed for its caller, moved or not. */
	for (uint32_t i = 0; sr && i < b->n; i++)
		note_hit(f, sr, &b->ios[i], rule_err(sr));
	ret = sh->in.n ? tt_engine_submit(f->inner, &sh->in) : 0;
	if (ret)
		sh->submit_err = ret;	/* what did start completes; the rest fails */
	b->next = b->n;
	b->reqs = 1;
	b->inflight = 1;
	sh->next = f->live;
	f->live = sh;
	e->st = f->inner->st;
	if (sr)
		return tt_seterr(rule_err(sr), "injected fault: submit of %u ios failed after %u",
				 b->n, handed);
	return ret;
}

/* Write the verdicts and the device's results back into the caller's batch. */
static void shadow_complete(struct fault *f, struct shadow *sh)
{
	struct tt_batch *b = sh->outer;

	for (uint32_t j = 0; j < sh->in.n; j++) {
		int32_t res = sh->in.ios[j].res;

		if (res > 0)	/* never started: the inner submit failed */
			res = sh->submit_err ? sh->submit_err : -EIO;
		b->ios[sh->src[j]].res = res;
	}
	for (uint32_t i = 0; i < b->n; i++) {
		struct tt_io *io = &b->ios[i];

		if (sh->forced[i]) {
			io->res = sh->forced[i];
			/* A failed read leaves whatever the device left: garbage. */
			if (io->op == TT_OP_READ && sh->keep[i] < io->len)
				memset((char *)io->buf + sh->keep[i], FAULT_GARBAGE,
				       io->len - sh->keep[i]);
		}
		if (io->res < 0 && !b->err)
			b->err = io->res;
	}
	b->inflight = 0;
	(void)f;
}

/*
 * Complete every shadow whose device part is done, whose delay ran out and
 * whose due time (RATE) has passed.
 */
static int reap_ready(struct fault *f)
{
	struct shadow **pp = &f->live;
	uint64_t now = now_ns();
	int done = 0;

	while (*pp) {
		struct shadow *sh = *pp;

		if (sh->in.inflight || sh->delay || sh->due_ns > now) {
			if (!sh->in.inflight && sh->delay)
				sh->delay--;
			pp = &sh->next;
			continue;
		}
		*pp = sh->next;
		shadow_complete(f, sh);
		shadow_free(sh);
		done++;
	}
	return done;
}

static int inner_busy(const struct fault *f)
{
	for (const struct shadow *sh = f->live; sh; sh = sh->next)
		if (sh->in.inflight)
			return 1;
	return 0;
}

static int fault_reap(struct tt_engine *e, int wait)
{
	struct fault *f = e->priv;
	int done = reap_ready(f), ret = 0;
	uint64_t due;

	if (!done && inner_busy(f)) {
		ret = f->inner->ops->reap(f->inner, wait);
		if (ret >= 0)
			done = reap_ready(f);
	} else if (!done && wait && (due = rate_next_due(f))) {
		sleep_until(due);
		done = reap_ready(f);
	}
	e->st = f->inner->st;
	return ret < 0 ? ret : done;
}

static int fault_flush(struct tt_engine *e)
{
	struct fault *f = e->priv;
	const struct tt_fault *won = NULL;
	int ret;

	for (unsigned k = 0; k < f->n_rules; k++) {
		struct fault_rule *r = &f->rules[k];

		if (r->f.kind == TT_FAULT_FLUSH && rule_fires(r) && !won)
			won = &r->f;
	}
	if (won) {
		note_hit(f, won, NULL, rule_err(won));
		return tt_seterr(rule_err(won), "injected fault: flush failed");
	}
	ret = tt_engine_flush(f->inner);
	e->st = f->inner->st;
	return ret;
}

static int fault_reg(struct tt_engine *e, void *addr, size_t len)
{
	struct fault *f = e->priv;

	return tt_engine_register(f->inner, addr, len);
}

static int fault_init(struct tt_engine *e)
{
	(void)e;
	return 0;	/* tt_fault_engine_open() sets everything up */
}

static void fault_fini(struct tt_engine *e)
{
	struct fault *f = e->priv;

	/* Nothing of a shadow may be freed while the device still moves it. */
	while (inner_busy(f))
		if (f->inner->ops->reap(f->inner, 1) < 0)
			break;
	while (f->live) {
		struct shadow *sh = f->live;

		f->live = sh->next;
		shadow_free(sh);
	}
	tt_engine_close(f->inner);
	free(f);
}

static const struct tt_engine_ops tt_fault_ops = {
	.name = "fault",
	.init = fault_init,
	.fini = fault_fini,
	.submit = fault_submit,
	.reap = fault_reap,
	.reg = fault_reg,
	.flush = fault_flush,
};

int tt_fault_wanted(const char *name)
{
	const char *env = getenv("TUTTI_FAULTS");

	return (name && !strncmp(name, "fault:", 6)) || (env && *env);
}

int tt_fault_engine_open(const char *name, const int *fds, unsigned n,
			 const struct tt_engine_params *params, struct tt_engine **out)
{
	const char *inner = name && !strncmp(name, "fault:", 6) ? name + 6 : name;
	const char *env = getenv("TUTTI_FAULTS");
	struct tt_fault rules[TT_FAULT_MAX_RULES];
	struct tt_engine *e;
	struct fault *f;
	int n_rules = 0, ret;

	if (env && *env) {
		n_rules = tt_fault_parse(env, rules, TT_FAULT_MAX_RULES);
		if (n_rules < 0)
			return tt_seterr(n_rules, "TUTTI_FAULTS: %s", tt_errmsg());
	}
	e = calloc(1, sizeof(*e));
	f = calloc(1, sizeof(*f));
	if (!e || !f) {
		free(e);
		free(f);
		return tt_seterr(-ENOMEM, "fault engine: out of memory");
	}
	ret = tt_engine_open_plain(inner, fds, n, params, &f->inner);
	if (ret) {
		free(e);
		free(f);
		return ret;
	}
	f->ops = tt_fault_ops;
	snprintf(f->name, sizeof(f->name), "fault:%s", tt_engine_name(f->inner));
	f->ops.name = f->name;
	e->ops = &f->ops;
	memcpy(e->fds, fds, n * sizeof(*fds));
	e->n_members = n;
	e->p = f->inner->p;
	e->priv = f;
	ret = tt_engine_fault_arm(e, rules, (unsigned)n_rules);
	if (ret) {
		tt_engine_close(e);
		return ret;
	}
	*out = e;
	return 0;
}

int tt_engine_fault_arm(struct tt_engine *e, const struct tt_fault *rules, unsigned n)
{
	struct fault *f = fault_of(e);

	if (!f)
		return tt_seterr(-EOPNOTSUPP, "engine %s injects no faults (open it as fault:%s)",
				 e ? tt_engine_name(e) : "?", e ? tt_engine_name(e) : "uring");
	if (n > TT_FAULT_MAX_RULES)
		return tt_seterr(-EINVAL, "%u fault rules (at most %u)", n, TT_FAULT_MAX_RULES);
	for (unsigned k = 0; k < n; k++) {
		if (rules[k].kind < TT_FAULT_SUBMIT || rules[k].kind > TT_FAULT_RATE)
			return tt_seterr(-EINVAL, "fault rule %u: unknown kind %u", k,
					 rules[k].kind);
		if (rules[k].kind == TT_FAULT_RATE && !rules[k].arg)
			return tt_seterr(-EINVAL, "fault rule %u: a rate needs mbps > 0", k);
		if (rules[k].err > 0)
			return tt_seterr(-EINVAL, "fault rule %u: err must be a negative errno", k);
	}
	f->n_rules = n;
	f->full_left = 0;
	f->pipe_free_ns = 0;
	for (unsigned k = 0; k < n; k++) {
		f->rules[k].f = rules[k];
		f->rules[k].seen = 0;
		if (rules[k].kind == TT_FAULT_FULL)
			f->full_left = rules[k].arg;
	}
	return 0;
}

int tt_engine_fault_hits(struct tt_engine *e, struct tt_fault_hit *hits, unsigned cap)
{
	struct fault *f = fault_of(e);
	unsigned n;
	int lost;

	if (!f)
		return tt_seterr(-EOPNOTSUPP, "engine injects no faults");
	n = TT_MIN(cap, f->n_hits);
	memcpy(hits, f->hits, n * sizeof(*hits));
	lost = f->hits_lost || n < f->n_hits;
	f->n_hits = 0;
	f->hits_lost = 0;
	return lost ? tt_seterr(-ENOBUFS, "fault hits were lost") : (int)n;
}

/* --- text form ---------------------------------------------------------- */

static const struct { const char *name; unsigned kind; } fault_kinds[] = {
	{ "submit", TT_FAULT_SUBMIT }, { "io", TT_FAULT_IO }, { "short", TT_FAULT_SHORT },
	{ "delay", TT_FAULT_DELAY }, { "flush", TT_FAULT_FLUSH }, { "full", TT_FAULT_FULL },
	{ "rate", TT_FAULT_RATE },
};

static const struct { const char *name; int err; } fault_errs[] = {
	{ "EIO", -EIO }, { "ENOSPC", -ENOSPC }, { "EAGAIN", -EAGAIN },
	{ "ETIMEDOUT", -ETIMEDOUT }, { "ENODEV", -ENODEV }, { "EINTR", -EINTR },
};

/* @s as an unsigned number (decimal or 0x...), whole. */
static int parse_u64(const char *s, uint64_t *v)
{
	char *end;

	if (!*s || *s == '-')
		return -1;
	errno = 0;
	*v = strtoull(s, &end, 0);
	return errno || *end ? -1 : 0;
}

static int parse_err(const char *s, int32_t *err)
{
	uint64_t v;

	for (unsigned i = 0; i < TT_ARRAY_SIZE(fault_errs); i++) {
		if (!strcmp(s, fault_errs[i].name)) {
			*err = fault_errs[i].err;
			return 0;
		}
	}
	if (parse_u64(s, &v) || !v || v > 4095)
		return -1;
	*err = -(int32_t)v;
	return 0;
}

/* One option of a rule: "read", "write" or "key=value". */
static int parse_option(struct tt_fault *r, const char *opt)
{
	const char *eq = strchr(opt, '=');
	const char *val = eq ? eq + 1 : "";
	size_t klen = eq ? (size_t)(eq - opt) : strlen(opt);
	uint64_t v = 0;

	if (!eq) {
		if (!strcmp(opt, "read") || !strcmp(opt, "write")) {
			r->op = opt[0] == 'r' ? TT_OP_READ : TT_OP_WRITE;
			return 0;
		}
		return -1;
	}
	if (klen == 3 && !strncmp(opt, "err", 3))
		return parse_err(val, &r->err);
	if (parse_u64(val, &v))
		return -1;
	if (klen == 3 && !strncmp(opt, "nth", 3))
		r->nth = v;
	else if (klen == 5 && !strncmp(opt, "count", 5))
		r->count = v;
	else if (v > UINT32_MAX)
		return -1;
	else if ((klen == 5 && !strncmp(opt, "after", 5) && r->kind == TT_FAULT_SUBMIT) ||
		 (klen == 4 && !strncmp(opt, "keep", 4) && r->kind == TT_FAULT_SHORT) ||
		 (klen == 5 && !strncmp(opt, "reaps", 5) && r->kind == TT_FAULT_DELAY) ||
		 (klen == 4 && !strncmp(opt, "free", 4) && r->kind == TT_FAULT_FULL) ||
		 (klen == 4 && !strncmp(opt, "mbps", 4) && r->kind == TT_FAULT_RATE))
		r->arg = (uint32_t)v;
	else
		return -1;
	return 0;
}

/* One rule: "KIND[:OPTION]...", in a writable copy. */
static int parse_rule(char *text, struct tt_fault *r)
{
	char *save = NULL, *tok = strtok_r(text, ":", &save);

	memset(r, 0, sizeof(*r));
	r->op = TT_FAULT_ANY_OP;
	r->count = 1;
	for (unsigned i = 0; tok && i < TT_ARRAY_SIZE(fault_kinds); i++)
		if (!strcmp(tok, fault_kinds[i].name))
			r->kind = fault_kinds[i].kind;
	if (!r->kind)
		return tt_seterr(-EINVAL, "fault rule '%s': unknown kind (submit, io, short, "
				 "delay, flush, full, rate)", tok ? tok : "");
	if (r->kind == TT_FAULT_FULL || r->kind == TT_FAULT_RATE)
		r->count = 0;	/* a full filesystem stays full, a slow device slow */
	while ((tok = strtok_r(NULL, ":", &save)))
		if (parse_option(r, tok))
			return tt_seterr(-EINVAL, "fault rule option '%s' not understood", tok);
	if (r->kind == TT_FAULT_RATE && !r->arg)
		return tt_seterr(-EINVAL, "fault rule 'rate' needs mbps=N (N > 0)");
	return 0;
}

int tt_fault_parse(const char *spec, struct tt_fault *out, unsigned cap)
{
	char *copy = strdup(spec ? spec : ""), *save = NULL, *rule;
	unsigned n = 0;
	int ret = 0;

	if (!copy)
		return tt_seterr(-ENOMEM, "out of memory");
	for (rule = strtok_r(copy, ";", &save); rule && !ret; rule = strtok_r(NULL, ";", &save)) {
		if (n == cap) {
			ret = tt_seterr(-EINVAL, "more than %u fault rules", cap);
			break;
		}
		ret = parse_rule(rule, &out[n++]);
	}
	free(copy);
	return ret ? ret : (int)n;
}

int tt_store_set_faults(struct tt_store *s, const char *spec)
{
	struct tt_fault rules[TT_FAULT_MAX_RULES];
	int n = tt_fault_parse(spec, rules, TT_FAULT_MAX_RULES);

	if (n < 0)
		return n;
	return tt_engine_fault_arm(tt_store_engine(s), rules, (unsigned)n);
}
