"""Exact corpus statistics of one text field: N, total length, and per term df and raw entropy.

Pure and additive: statistics of disjoint document sets (shards, indices, sweep batches) combine by
summing, so a sweep can fold batches in any order and an alias or index pattern sums its indices.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from bmx_rerank.scoring import TermStats, entropy_contribution


@dataclass(frozen=True)
class CorpusStats:
    """Statistics over the documents that hold at least one token in the field (BMX.md's corpus C).

    `terms` is sorted so lookups are a binary search and the arrays stay compact for large vocabularies."""

    n_docs: int
    total_length: int
    terms: np.ndarray  # (v,) sorted unique terms, dtype str
    df: np.ndarray  # (v,) int64
    entropy: np.ndarray  # (v,) float64, raw entropy

    @property
    def avgdl(self) -> float:
        return self.total_length / self.n_docs if self.n_docs else 0.0

    @property
    def vocabulary_size(self) -> int:
        return int(self.terms.shape[0])

    @classmethod
    def empty(cls) -> CorpusStats:
        return cls(0, 0, np.array([], dtype=str), np.zeros(0, np.int64), np.zeros(0))

    @classmethod
    def from_documents(cls, docs: Iterable[Mapping[str, int]]) -> CorpusStats:
        """Statistics of documents given as term -> frequency maps; documents without tokens don't count."""
        n_docs = 0
        total = 0
        df: dict[str, int] = {}
        ent: dict[str, float] = {}
        for doc in docs:
            counts = {t: int(c) for t, c in doc.items() if c > 0}
            if not counts:
                continue
            n_docs += 1
            total += sum(counts.values())
            contrib = entropy_contribution(np.fromiter(counts.values(), np.float64, len(counts)))
            for term, h in zip(counts, contrib, strict=True):
                df[term] = df.get(term, 0) + 1
                ent[term] = ent.get(term, 0.0) + float(h)
        terms = np.array(sorted(df), dtype=str)
        return cls(
            n_docs,
            total,
            terms,
            np.array([df[t] for t in terms.tolist()], np.int64),
            np.array([ent[t] for t in terms.tolist()], np.float64),
        )

    def __add__(self, other: CorpusStats) -> CorpusStats:
        """Statistics of the union of two disjoint corpora."""
        terms, inverse = np.unique(np.concatenate([self.terms, other.terms]), return_inverse=True)
        df = np.zeros(terms.shape[0], np.int64)
        entropy = np.zeros(terms.shape[0])
        np.add.at(df, inverse, np.concatenate([self.df, other.df]))
        np.add.at(entropy, inverse, np.concatenate([self.entropy, other.entropy]))
        return CorpusStats(
            self.n_docs + other.n_docs, self.total_length + other.total_length, terms, df, entropy
        )

    def term_stats(self, terms: Sequence[str]) -> TermStats:
        """Scoring-core statistics for `terms` in the given order; unknown terms get df = 0."""
        wanted = np.asarray(list(terms), dtype=str)
        df = np.zeros(wanted.shape[0], np.int64)
        entropy = np.zeros(wanted.shape[0])
        if self.vocabulary_size and wanted.size:
            pos = np.searchsorted(self.terms, wanted)
            pos_clipped = np.minimum(pos, self.vocabulary_size - 1)
            found = self.terms[pos_clipped] == wanted
            df[found] = self.df[pos_clipped[found]]
            entropy[found] = self.entropy[pos_clipped[found]]
        return TermStats(self.n_docs, self.avgdl, df, entropy)
