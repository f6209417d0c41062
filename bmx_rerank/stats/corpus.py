"""Exact corpus statistics of one text field: N, total length, and per term df and raw entropy.

Pure and additive: statistics of disjoint document sets (shards, indices, sweep batches) combine by
summing, so a sweep can fold batches in any order and an alias or index pattern sums its indices.

Raw entropy is accumulated exactly: a document's contribution h(sigmoid(tf)) depends on tf alone and
is a float64 that is an integer multiple of 2^-ENTROPY_SCALE_BITS, so `EntropyAccumulator` sums those
integers and rounds once at the end. The result is the correctly rounded exact sum whatever the order
of the documents, which is what makes statistics of one index identical bit for bit whether it has
one shard or three.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from bmx_rerank.scoring import TermStats, entropy_contribution

# Python strings in an object array: a term costs its own size (about 50 bytes + its length) instead of
# the widest term's width times four (numpy's fixed-width `U`). numpy's variable-width StringDType
# would be leaner still, but its `searchsorted` fails on long or non-ASCII terms (numpy 2.4).
TERM_DTYPE = np.dtype(object)

# h(sigmoid(tf)) in float64 is exactly 0 from tf = 37 on (sigmoid rounds to 1); every smaller
# contribution is a multiple of 2^-104, so integers at this scale add up exactly.
ENTROPY_SCALE_BITS = 112
_MAX_TF = 64
_CONTRIB = entropy_contribution(np.arange(_MAX_TF + 1, dtype=np.float64))
_CONTRIB[0] = 0.0
_CONTRIB_INT: list[int] = []
for _c in _CONTRIB.tolist():
    _num, _den = float(_c).as_integer_ratio()
    assert (1 << ENTROPY_SCALE_BITS) % _den == 0, "contribution finer than the fixed-point scale"
    _CONTRIB_INT.append(_num * ((1 << ENTROPY_SCALE_BITS) // _den))
assert _CONTRIB_INT[-1] == 0, "contributions must vanish before _MAX_TF"

# Terms whose place in the vocabulary a `CorpusStats` remembers once looked up: query words recur (a few
# thousand make most of a workload's queries), and a dict finds one by its hash where the binary search
# compares ~16 Python strings scattered over memory (74 us for a query's terms inside a rerank against
# 20 us in a loop: benchmarks/RESULTS.md). At most about 1 MiB a statistics object; emptied when full.
REMEMBERED_TERMS = 8192


def entropy_units(tf: int) -> int:
    """A document's exact entropy contribution for a term it holds `tf` times, in 2^-112 units."""
    return _CONTRIB_INT[tf] if tf <= _MAX_TF else 0


def units_to_float(units: int) -> float:
    """Correctly rounded float of a fixed-point entropy sum (int / int division rounds exactly)."""
    return units / (1 << ENTROPY_SCALE_BITS)


def terms_array(terms: Iterable[str]) -> np.ndarray:
    """A terms array in the dtype CorpusStats uses (Python `str` elements)."""
    if isinstance(terms, np.ndarray) and terms.dtype == TERM_DTYPE:
        return terms
    if isinstance(terms, np.ndarray):
        items = terms.tolist()
    else:
        items = terms if isinstance(terms, list) else list(terms)
    out = np.empty(len(items), dtype=TERM_DTYPE)
    out[:] = items
    return out


@dataclass(frozen=True)
class CorpusStats:
    """Statistics over the documents that hold at least one token in the field (BMX.md's corpus C).

    `terms` is sorted so lookups are a binary search and the arrays stay compact for large vocabularies."""

    n_docs: int
    total_length: int
    terms: np.ndarray  # (v,) sorted unique terms, variable-width string dtype
    df: np.ndarray  # (v,) int64
    entropy: np.ndarray  # (v,) float64, raw entropy
    # term -> its position in `terms` (-1: not there), for the terms looked up (`REMEMBERED_TERMS`)
    _places: dict[str, int] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "terms", terms_array(self.terms))
        object.__setattr__(self, "df", np.asarray(self.df, dtype=np.int64))
        object.__setattr__(self, "entropy", np.asarray(self.entropy, dtype=np.float64))
        if not (self.terms.shape == self.df.shape == self.entropy.shape) or self.terms.ndim != 1:
            raise ValueError("terms, df and entropy must be 1-d arrays of one length")

    def __getstate__(self) -> dict[str, object]:
        return {k: v for k, v in self.__dict__.items() if k != "_places"}  # what was looked up is no data

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state, _places={})

    @property
    def avgdl(self) -> float:
        return self.total_length / self.n_docs if self.n_docs else 0.0

    @property
    def vocabulary_size(self) -> int:
        return int(self.terms.shape[0])

    @property
    def nbytes(self) -> int:
        """Memory held: the arrays plus the term strings themselves."""
        return int(
            self.df.nbytes + self.entropy.nbytes + self.terms.nbytes + sum(map(sys.getsizeof, self.terms))
        )

    @classmethod
    def empty(cls) -> CorpusStats:
        return cls(0, 0, terms_array([]), np.zeros(0, np.int64), np.zeros(0))

    @classmethod
    def from_documents(cls, docs: Iterable[Mapping[str, int]]) -> CorpusStats:
        """Statistics of documents given as term -> frequency maps; documents without tokens don't count."""
        acc = EntropyAccumulator()
        for doc in docs:
            acc.add(doc)
        return acc.finish()

    def __add__(self, other: CorpusStats) -> CorpusStats:
        """Statistics of the union of two disjoint corpora."""
        return _combine(self, other, 1)

    def __sub__(self, other: CorpusStats) -> CorpusStats:
        """Statistics with the documents of `other` (a subset) taken out; terms left with df 0 vanish."""
        return _combine(self, other, -1)

    def term_stats(self, terms: Sequence[str]) -> TermStats:
        """Scoring-core statistics for `terms` in the given order; unknown terms get df = 0."""
        df, entropy = self.lookup(terms)
        return TermStats(self.n_docs, self.avgdl, df, entropy)

    def lookup(self, terms: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """df and raw entropy of `terms` (0 for terms the corpus does not hold)."""
        wanted = terms.tolist() if isinstance(terms, np.ndarray) else list(terms)
        if not self.vocabulary_size or not wanted:
            return np.zeros(len(wanted), np.int64), np.zeros(len(wanted))
        places = self._places
        at = list(map(places.get, wanted))
        if None in at:
            new = [i for i, p in enumerate(at) if p is None]
            found = self._search([wanted[i] for i in new])
            if len(places) + len(new) > REMEMBERED_TERMS:
                places.clear()
            room = len(new) <= REMEMBERED_TERMS
            for i, p in zip(new, found, strict=True):
                at[i] = p
                if room:
                    places[wanted[i]] = p
        pos = np.fromiter(at, np.int64, len(at))
        known = pos >= 0
        return np.where(known, self.df[pos], 0), np.where(known, self.entropy[pos], 0.0)

    def _search(self, terms: list[str]) -> list[int]:
        """Each term's position in the sorted vocabulary, -1 where it is not there."""
        wanted = terms_array(terms)
        pos = np.minimum(np.searchsorted(self.terms, wanted), self.vocabulary_size - 1)
        return np.where(self.terms[pos] == wanted, pos, -1).tolist()  # type: ignore[no-any-return]

    def same_as(self, other: CorpusStats) -> bool:
        """Bit-for-bit equality of every number (dataclass equality cannot compare arrays)."""
        return (
            self.n_docs == other.n_docs
            and self.total_length == other.total_length
            and np.array_equal(self.terms, other.terms)
            and np.array_equal(self.df, other.df)
            and np.array_equal(self.entropy, other.entropy)
        )


class EntropyAccumulator:
    """Folds documents' term frequencies into exact statistics; order of documents does not matter.

    Mutable on purpose (a sweep feeds it millions of documents); `finish` returns the frozen result.
    Per document it only counts terms and (term, tf > 1) pairs, in C (`Counter.update`); df and
    entropy units are derived from those counts when they pile up (`compact_every` keys) and at the
    end, so the per-token Python work is minimal and memory stays bounded by the vocabulary."""

    def __init__(self, compact_every: int = 2_000_000) -> None:
        self.n_docs = 0
        self.n_seen = 0  # documents offered, including those without a token in the field
        self.total_length = 0
        self.compact_every = compact_every
        self._terms: Counter[str] = Counter()
        self._pairs: Counter[tuple[str, int]] = Counter()
        self._df: dict[str, int] = {}
        self._units: dict[str, int] = {}

    def add(self, doc: Mapping[str, int]) -> None:
        """One document as term -> frequency (entries with frequency <= 0 are ignored)."""
        terms = [t for t, c in doc.items() if c > 0]
        self.add_split(terms, [(t, int(c)) for t, c in doc.items() if c > 1])

    def add_split(
        self, terms: Collection[str], repeated: Sequence[tuple[str, int]], length: int | None = None
    ) -> None:
        """One document as its distinct terms, plus (term, tf) for the few with tf > 1, and its length
        if the caller has it (it must equal the sum of the frequencies).

        Most terms occur once per document: those cost one C-level count of a string whose hash
        is cached; only the repeated ones are counted as (term, tf) pairs. `terms` may be a dict's
        keys: counted without copying them into a list."""
        self.n_seen += 1
        if not terms:
            return
        self.n_docs += 1
        if length is None:
            length = len(terms) + sum(tf for _, tf in repeated) - len(repeated)
        self.total_length += length
        self._terms.update(terms)
        if repeated:
            self._pairs.update(repeated)
        if len(self._pairs) + len(self._terms) >= self.compact_every:
            self._compact()

    def _compact(self) -> None:
        df, units, table = self._df, self._units, _CONTRIB_INT
        one = table[1]
        for term, count in self._terms.items():
            df[term] = df.get(term, 0) + count
            units[term] = units.get(term, 0) + count * one
        for (term, tf), count in self._pairs.items():  # replace the tf = 1 assumed above
            units[term] += count * ((table[tf] if tf <= _MAX_TF else 0) - one)
        self._terms.clear()
        self._pairs.clear()

    def finish(self) -> CorpusStats:
        return self.finish_exact().stats

    def finish_exact(self) -> ExactStats:
        """The statistics, plus each term's exact entropy sum in 2^-112 units (for exact refreshes)."""
        self._compact()
        terms = sorted(self._df)
        units = [self._units[t] for t in terms]
        stats = CorpusStats(
            self.n_docs,
            self.total_length,
            terms_array(terms),
            np.fromiter((self._df[t] for t in terms), np.int64, len(terms)),
            np.fromiter(map(units_to_float, units), np.float64, len(terms)),
        )
        return ExactStats(stats, units)


@dataclass(frozen=True)
class ExactStats:
    """Statistics with the exact integer entropy sums behind their rounded floats.

    Adding two of these adds integers and rounds once, so statistics refreshed with new documents
    are bit-for-bit those a full rebuild gives; adding plain CorpusStats adds rounded floats."""

    stats: CorpusStats
    units: list[int]  # aligned with stats.terms

    def __post_init__(self) -> None:
        if len(self.units) != self.stats.vocabulary_size:
            raise ValueError("one exact entropy sum per term expected")

    def __add__(self, other: ExactStats) -> ExactStats:
        a, b = self.stats, other.stats
        df = dict(zip(a.terms.tolist(), a.df.tolist(), strict=True))
        units = dict(zip(a.terms.tolist(), self.units, strict=True))
        for term, d, u in zip(b.terms.tolist(), b.df.tolist(), other.units, strict=True):
            df[term] = df.get(term, 0) + d
            units[term] = units.get(term, 0) + u
        terms = sorted(df)
        total = [units[t] for t in terms]
        stats = CorpusStats(
            a.n_docs + b.n_docs,
            a.total_length + b.total_length,
            terms_array(terms),
            np.fromiter((df[t] for t in terms), np.int64, len(terms)),
            np.fromiter(map(units_to_float, total), np.float64, len(terms)),
        )
        return ExactStats(stats, total)


def _combine(a: CorpusStats, b: CorpusStats, sign: int) -> CorpusStats:
    if b.vocabulary_size == 0 and b.n_docs == 0:
        return a
    if sign > 0 and a.vocabulary_size == 0 and a.n_docs == 0:
        return b
    terms, inverse = np.unique(np.concatenate([a.terms, b.terms]), return_inverse=True)
    df = np.zeros(terms.shape[0], np.int64)
    entropy = np.zeros(terms.shape[0])
    np.add.at(df, inverse, np.concatenate([a.df, sign * b.df]))
    np.add.at(entropy, inverse, np.concatenate([a.entropy, sign * b.entropy]))
    n_docs = a.n_docs + sign * b.n_docs
    total = a.total_length + sign * b.total_length
    if sign < 0:
        if np.any(df < 0) or n_docs < 0 or total < 0:
            raise ValueError("cannot subtract statistics of documents the corpus does not hold")
        keep = df > 0
        terms, df, entropy = terms[keep], df[keep], np.maximum(entropy[keep], 0.0)
    return CorpusStats(n_docs, total, terms, df, entropy)


def sum_in_order(parts: Sequence[CorpusStats]) -> CorpusStats:
    """Sum statistics in the given order (callers pass indices sorted by name: a fixed float order).
    One part is returned as is: no re-sorting of a large vocabulary for the common single index."""
    if not parts:
        return CorpusStats.empty()
    total = parts[0]
    for part in parts[1:]:
        total = total + part
    return total
