"""Scoring a window: analyzed query tokens, candidate term vectors and corpus statistics in, BMX out.

Glue between the proxy's data (strings, term-frequency maps) and the scoring core's arrays."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bmx_rerank.rerank.candidates import candidate_features
from bmx_rerank.scoring import Query, Request, score_terms
from bmx_rerank.stats.corpus import CorpusStats
from bmx_rerank.upstream import DocTerms


@dataclass(frozen=True)
class TokenLabel:
    """What one column of the per-term breakdown is: a live query token, its query (0 = original)."""

    token: str
    query: int
    weight: float


@dataclass(frozen=True)
class Scored:
    scores: np.ndarray  # (n,)
    parts: np.ndarray  # (n, m_live) per-token contributions, summing to scores
    labels: tuple[TokenLabel, ...]  # one per column of parts


def rescore(
    corpus: CorpusStats,
    docs: Sequence[DocTerms],
    token_lists: Sequence[Sequence[str]],
    weights: Sequence[float],
    request: Request,
) -> Scored:
    """Exact scores of `docs` for the original query (`token_lists[0]`) and its weighted augmentations."""
    vocabulary = list(dict.fromkeys(t for tokens in token_lists for t in tokens))
    column = {t: j for j, t in enumerate(vocabulary)}
    stats = corpus.term_stats(vocabulary)
    queries = [
        Query(np.array([column[t] for t in tokens], dtype=np.int64), np.full(len(tokens), float(w)))
        for tokens, w in zip(token_lists, weights, strict=True)
    ]
    parts = score_terms(stats, candidate_features(docs, vocabulary), queries, request)
    labels = tuple(
        TokenLabel(t, qi, float(w))
        for qi, (tokens, w) in enumerate(zip(token_lists, weights, strict=True))
        for t in tokens
        if stats.df[column[t]] > 0
    )
    assert len(labels) == parts.shape[1], "live-token labels must line up with the scoring core's columns"
    return Scored(parts.sum(axis=1), parts, labels)
