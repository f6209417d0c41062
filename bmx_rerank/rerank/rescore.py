"""Scoring a window: analyzed query tokens, candidate term vectors and corpus statistics in, BMX out.

Glue between the proxy's data (strings, term-frequency maps) and the scoring core's arrays: `rescore`
scores one text on one field, `score_tree` every leaf of a scoring tree on its own field, folded as
the query combines them (see `rerank.query`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import chain
from typing import NamedTuple

import numpy as np

from bmx_rerank.rerank.query import Node, Text
from bmx_rerank.scoring import Candidates, Query, Request, score_terms
from bmx_rerank.stats.corpus import CorpusStats
from bmx_rerank.upstream import DocTerms

# A window's candidate features in one field for one vocabulary: (field, vocabulary) -> tf and lengths
FeaturesOf = Callable[[str, Sequence[str]], Candidates]


def features_of(docs: Mapping[str, Sequence[DocTerms]]) -> FeaturesOf:
    """The candidate features of the documents `docs` holds per field."""
    return lambda field, vocabulary: candidate_features(docs[field], vocabulary)


def remembered(memo: dict[tuple[str, tuple[str, ...]], Candidates], compute: FeaturesOf | None) -> FeaturesOf:
    """`compute`, each answer kept in `memo` by (field, vocabulary) and read from it again (None:
    `memo` holds every answer asked for: a window kept whole, see `rerank/term_vector_cache.py`)."""

    def read(field: str, vocabulary: Sequence[str]) -> Candidates:
        key = (field, tuple(vocabulary))
        found = memo.get(key)
        if found is None:
            if compute is None:
                raise KeyError(f"no candidate features kept for {key}")
            found = compute(field, vocabulary)
            found.tf.flags.writeable = found.length.flags.writeable = False  # read again, never changed
            memo[key] = found
        return found

    return read


class TokenLabel(NamedTuple):
    """What one column of the per-term breakdown is: a live query token, its query (0 = original). A
    tuple: a window makes one per live token and leaf."""

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
    features: Callable[[Sequence[str]], Candidates],
    token_lists: Sequence[Sequence[str]],
    weights: Sequence[float],
    request: Request,
) -> Scored:
    """Exact scores of the documents `features` reads (vocabulary -> their tf and lengths) for the
    original query (`token_lists[0]`) and its weighted augmentations."""
    vocabulary = list(dict.fromkeys(t for tokens in token_lists for t in tokens))
    column = {t: j for j, t in enumerate(vocabulary)}
    stats = corpus.term_stats(vocabulary)
    queries = [
        Query(np.array([column[t] for t in tokens], dtype=np.int64), np.full(len(tokens), float(w)))
        for tokens, w in zip(token_lists, weights, strict=True)
    ]
    parts = score_terms(stats, features(vocabulary), queries, request)
    live = (stats.df > 0).tolist()
    labels = tuple(
        TokenLabel(t, qi, float(w))
        for qi, (tokens, w) in enumerate(zip(token_lists, weights, strict=True))
        for t in tokens
        if live[column[t]]
    )
    assert len(labels) == parts.shape[1], "live-token labels must line up with the scoring core's columns"
    return Scored(parts.sum(axis=1), parts, labels)


@dataclass(frozen=True)
class Folded:
    """A scoring tree scored over a window: each node's scores (its boost applied) and its parts.

    A `Text` node keeps the per-token breakdown of its field's score (`leaf`, before the boost); a
    `Combine` node the folded scores of its parts, in the query's order."""

    node: Node
    scores: np.ndarray  # (n,)
    matched: np.ndarray  # (n,) bool: some query token of this subtree is in the document's field
    children: tuple[Folded, ...] = ()
    leaf: Scored | None = None


def leaf_queries(leaf: Text, augmented: Sequence[str]) -> list[tuple[str, str]]:
    """The (field, text) pairs one leaf scores: its own text, then each augmented query on its field.

    WQA with several fields: every leaf merges the augmentations into its query, analysed and scored
    on the leaf's own field (with the leaf's statistics), as if the augmented queries had been written
    next to the leaf's text."""
    return [(leaf.field, leaf.text), *((leaf.field, q) for q in augmented)]


def score_tree(
    node: Node,
    corpus: Mapping[str, CorpusStats],
    features: FeaturesOf,
    n: int,
    tokens: Mapping[tuple[str, str], Sequence[str]],
    augmented: Sequence[str],
    weights: Sequence[float],
    request: Request,
) -> Folded:
    """Score every leaf of `n` documents on its field (its analysed text and the augmentations,
    weighted) and fold the leaves as the tree says: boosts multiply, `sum` adds, `max` takes the best
    plus `tie_breaker` times the others (as Lucene's DisjunctionMaxQuery)."""
    if isinstance(node, Text):
        lists = [list(tokens[pair]) for pair in leaf_queries(node, augmented)]
        scored = rescore(corpus[node.field], partial(features, node.field), lists, weights, request)
        matched = (scored.parts > 0).any(axis=1)
        return Folded(node, scored.scores * node.boost, matched, leaf=scored)
    parts = tuple(score_tree(p, corpus, features, n, tokens, augmented, weights, request) for p in node.parts)
    stack = np.array([p.scores for p in parts]).reshape(len(parts), n)
    if node.how == "sum":
        total = stack.sum(axis=0)
    else:
        best = stack.max(axis=0) if len(parts) else np.zeros(n)
        total = best + node.tie_breaker * (stack.sum(axis=0) - best)
    matched = np.array([p.matched for p in parts]).reshape(len(parts), n).any(axis=0)
    return Folded(node, total * node.boost, matched, parts)


def candidate_features(docs: Sequence[DocTerms], vocabulary: Sequence[str]) -> Candidates:
    """tf of each vocabulary term per document, and each document's full length in the field.

    Looks up the few query terms in each document, not each document's many terms in the query
    (`map` over the bound `get`: the per-term loop runs in C, faster than a comprehension)."""
    zeros = [0] * len(vocabulary)
    flat = list(chain.from_iterable(map(doc.tf.get, vocabulary, zeros) for doc in docs))
    tf = np.array(flat, dtype=np.float64).reshape(len(docs), len(vocabulary))
    length = np.array([doc.length for doc in docs], dtype=np.float64)
    return Candidates(tf, length)
