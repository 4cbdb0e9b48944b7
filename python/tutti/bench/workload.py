"""The serving benchmark's workload and its TTFT statistics (no vLLM needed here).

The workload is the one the paper measures: many long documents, each asked several
questions.  A request's prompt is the document's tokens followed by the question's, so the
requests about one document share a long prefix, and the documents together hold far more
KV than the engine's own cache (the caller sizes that cache), so only a second tier can keep
them.  Two arrival orders, both at a given mean rate and fixed by the seed, so every
configuration of one run is sent exactly the same prompts at the same offsets:

- ``poisson_schedule`` ("shuffled"): the (document, question) pairs in a random order at the
  arrivals of a Poisson process.  A document's first question is the earliest of its
  questions' random positions, so first sightings (cold prefills) crowd the start of a run
  and hits its end: a finite run is one long transient.
- ``session_schedule`` ("sessions"): documents open at a steady pace and
  each document's later questions follow the one before after exponential gaps, as users
  asking about a document do.  Cold prefills then arrive at the same rate throughout; the
  hit rate ramps up for the first few gaps and drains after the last opening, and
  ``steady_window`` names the arrivals between, where the load is the nominal one.
"""
import random
from collections import Counter
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Request:
    """One request of a workload: ``key`` names it across configurations."""

    key: str
    doc: int
    question: int
    prompt: list
    at_s: float          # send time, seconds after the workload's start


def token_ids(n, seed, vocab_size):
    """``n`` deterministic token ids avoiding the special ids 0..2 (tutti.tiny_model's).

    ``seed``: an int or a str (random.Random hashes a str with SHA-512: the same in every
    process, unlike ``hash()``).
    """
    rng = random.Random(seed)
    return [rng.randrange(3, vocab_size) for _ in range(n)]


def document_requests(tag, *, docs, questions, doc_tokens, question_tokens, vocab_size, seed):
    """Every (document, question) prompt of one workload, in document order, unsent (at_s 0)."""
    if docs < 1 or questions < 1 or doc_tokens < 1 or question_tokens < 1:
        raise ValueError("docs, questions, doc_tokens and question_tokens must be >= 1")
    out = []
    for d in range(docs):
        doc = token_ids(doc_tokens, f"{seed}/{tag}/doc/{d}", vocab_size)
        for q in range(questions):
            ask = token_ids(question_tokens, f"{seed}/{tag}/q/{d}/{q}", vocab_size)
            out.append(Request(f"{tag}/d{d}/q{q}", d, q, doc + ask, 0.0))
    return out


def poisson_schedule(requests, rate, seed):
    """The requests in a random order, sent at the arrivals of a Poisson process of ``rate``/s.

    The first request goes at time 0; inter-arrival gaps are exponential with mean 1/rate.
    """
    if not rate > 0:
        raise ValueError(f"rate must be > 0 requests/s, got {rate!r}")
    rng = random.Random(seed)
    order = list(requests)
    rng.shuffle(order)
    t, out = 0.0, []
    for i, r in enumerate(order):
        if i:
            t += rng.expovariate(rate)
        out.append(Request(r.key, r.doc, r.question, r.prompt, t))
    return out


def session_schedule(requests, rate, seed, reuse=16.0):
    """Steady-state arrivals at a mean of ``rate`` requests/s (see the module's docstring).

    Documents open (their first question is sent) at every ``questions``-th arrival of a Poisson
    process of ``rate`` (Erlang gaps of mean questions / rate: as many openings as a Poisson
    process of rate / questions, less spread); each later question of a document follows the one
    before after an exponential gap of mean ``reuse`` / rate seconds, i.e. about ``reuse`` other
    requests arrive between two questions about one document.  While documents keep opening,
    about (questions - 1) * reuse / questions documents are in use at once: the working set the
    KV tiers see.  The first request goes at 0.
    """
    if not rate > 0:
        raise ValueError(f"rate must be > 0 requests/s, got {rate!r}")
    if not reuse > 0:
        raise ValueError(f"reuse must be > 0 requests, got {reuse!r}")
    by_doc = {}
    for r in requests:
        by_doc.setdefault(r.doc, []).append(r)
    questions = max(len(qs) for qs in by_doc.values())
    rng = random.Random(seed)
    docs = list(by_doc)
    rng.shuffle(docs)
    timed, opened = [], 0.0
    for i, d in enumerate(docs):
        if i:  # every questions-th point of a Poisson process of the rate: steadier than one of rate/q
            opened += sum(rng.expovariate(rate) for _ in range(questions))
        t = opened
        for j, r in enumerate(sorted(by_doc[d], key=lambda x: x.question)):
            if j:
                t += rng.expovariate(rate / reuse)
            timed.append((t, r))
    timed.sort(key=lambda x: (x[0], x[1].key))
    return [Request(r.key, r.doc, r.question, r.prompt, t) for t, r in timed]


def steady_window(schedule, rate, reuse=16.0):
    """(start, end) seconds of a ``session_schedule`` run in which the load is the nominal one.

    Starts once every question level has had time to build up ((questions - 1) mean gaps after the
    first opening) and ends at the last document's opening (after it, only follow-ups drain).  A
    request belongs to the window when it was sent in [start, end].
    """
    first, questions = {}, Counter()
    for r in schedule:
        first.setdefault(r.doc, r.at_s)
        questions[r.doc] += 1
    return (max(questions.values()) - 1) * reuse / rate, max(first.values())


def summarize(ttfts, quantile=0.9):
    """p50/p90/p99/mean/max of TTFTs in seconds; a failed request (None) counts as infinite.

    ``quantile`` is the SLO's (``p_slo``), so the SLO check reads one number.
    """
    xs = np.array([float("inf") if t is None else t for t in ttfts], dtype=float)
    if not len(xs):
        raise ValueError("no requests to summarize")
    failed = int(np.isinf(xs).sum())
    # method="higher": a quantile is an observed TTFT (and infinite when a failure lies there).
    def q(p):
        return float(np.quantile(xs, p, method="higher"))
    finite = xs[np.isfinite(xs)]
    return {"n": int(len(xs)), "failed": failed, "p50": q(0.5), "p90": q(0.9), "p99": q(0.99),
            "p_slo": q(quantile), "mean": float(finite.mean()) if len(finite) else None,
            "max": float(xs.max())}


def slo_met(summary, slo_s, key="p_slo"):
    return summary[key] <= slo_s


def max_rate_meeting_slo(per_rate, slo_s, key="p_slo"):
    """The highest swept rate at which the SLO holds, and at every lower swept rate too.

    ``per_rate``: {rate: summarize(...)}.  Returns (rate or None, "exact" | "at least" | "below"):
    "at least" when the SLO held at every rate swept (the true maximum may be higher), "below"
    (rate None) when it failed already at the lowest one.  ``key``: which quantile of the
    summaries the SLO bounds (default the configured one, ``p_slo``; "p50" for the median).
    """
    rates = sorted(per_rate)
    if not rates:
        raise ValueError("no rates")
    best = None
    for r in rates:
        if not slo_met(per_rate[r], slo_s, key):
            break
        best = r
    if best is None:
        return None, "below"
    return best, "at least" if best == rates[-1] else "exact"


def rate_ratio(a, b):
    """How many times rate ``a`` is rate ``b``, as text: bounds when either is open-ended."""
    (ra, ka), (rb, kb) = a, b
    if ra is None:
        return "—"
    if rb is None:
        return "unbounded (the reference meets the SLO at no swept rate)"
    x = ra / rb
    if ka == "at least" and kb != "at least":
        return f"≥ {x:.2f}"
    if kb == "at least" and ka != "at least":
        return f"≤ {x:.2f}"
    return f"{x:.2f}" if ka == kb == "exact" else f"~{x:.2f}"
