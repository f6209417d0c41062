"""A deliberately naive, per-document BMX/BM25 straight from BMX.md: loops over token lists, no numpy.

The tests compare the vectorized core against it on random corpora, and the proxy's multi-field
answers against `FieldsCorpus` (documents of a `title` and a `text` field drawn from `WORDS`)."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

WORDS = "alpha beta gamma delta epsilon zeta theta kappa lambda sigma omega".split()
FIELDS = ("title", "text")


def entropy_of(tf: int) -> float:
    p = 1.0 / (1.0 + math.exp(-tf))
    return -p * math.log(p)


def corpus_stats(corpus: list[list[str]]) -> tuple[int, float, Counter, dict[str, float]]:
    docs = [d for d in corpus if d]
    n = len(docs)
    avgdl = sum(len(d) for d in docs) / n if n else 0.0
    df: Counter = Counter()
    ent: dict[str, float] = {}
    for d in docs:
        for term, tf in Counter(d).items():
            df[term] += 1
            ent[term] = ent.get(term, 0.0) + entropy_of(tf)
    return n, avgdl, df, ent


def idf(n: int, df: int) -> float:
    return math.log(1 + (n - df + 0.5) / (df + 0.5))


def bmx(corpus, doc, query, weights=None, alpha=None, beta=None) -> float:
    return bmx_from(corpus_stats(corpus), doc, query, weights, alpha, beta)


def bmx_from(stats, doc, query, weights=None, alpha=None, beta=None) -> float:
    """BMX of one document from given statistics `(n, avgdl, df, raw entropy)` (df and entropy: maps
    from term; a term absent has df 0), e.g. the estimated ones a proxy used."""
    n, avgdl, df, ent = stats
    weights = weights or [1.0] * len(query)
    pairs = [(q, w) for q, w in zip(query, weights, strict=True) if df.get(q, 0) > 0]
    if not pairs:
        return 0.0
    m = len(pairs)
    alpha = min(max(avgdl / 100, 0.5), 1.5) if alpha is None else alpha
    beta = 1 / math.log(1 + n) if beta is None else beta
    top = max(ent[q] for q, _ in pairs)
    e = {q: (ent[q] / top if top > 0 else 0.0) for q, _ in pairs}
    mean_e = sum(e[q] for q, _ in pairs) / m
    counts = Counter(doc)
    sim = sum(1 for q, _ in pairs if counts[q] > 0) / m
    total = 0.0
    for q, w in pairs:
        tf = counts[q]
        if tf == 0:
            continue
        part = idf(n, df[q]) * tf * (alpha + 1) / (tf + alpha * len(doc) / avgdl + alpha * mean_e)
        total += w * (part + beta * e[q] * sim)
    return total


def bm25(corpus, doc, query, k1=1.2, b=0.75) -> float:
    n, avgdl, df, _ = corpus_stats(corpus)
    counts = Counter(doc)
    total = 0.0
    for q in query:
        tf = counts[q]
        if df[q] == 0 or tf == 0:
            continue
        total += idf(n, df[q]) * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len(doc) / avgdl))
    return total


class FieldsCorpus:
    """The indexed documents as token lists per field: the brute force's whole input."""

    def __init__(self, docs: dict[str, dict[str, Any]]) -> None:
        self.docs = docs
        self.tokens = {f: {i: d[f].split() for i, d in docs.items()} for f in FIELDS}

    def bmx(self, field: str, doc_id: str, text: str) -> float:
        """Naive BMX of one document's field for a text, with that field's statistics."""
        return bmx(list(self.tokens[field].values()), self.tokens[field][doc_id], text.split())

    def holds(self, field: str, doc_id: str, text: str) -> bool:
        return bool(set(self.tokens[field][doc_id]) & set(text.split()))
