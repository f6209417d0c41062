"""The scoring core: BMX, WQA and BM25 as pure numpy functions.

Arrays in, arrays out: no I/O, no globals, float64 throughout. Every later layer (proxy, client
wrapper, CLI, benchmarks) gathers the same three inputs and calls `score`:

- `TermStats`: corpus-wide statistics of the distinct terms a query uses (N, avgdl, df, raw entropy),
- `Candidates`: each candidate's term frequency of those terms and its length,
- `Query`: the query's tokens as indices into those terms, in order, duplicates kept, with weights.

Definitions follow `BMX.md` (the paper, arXiv 2408.06643, and its reference implementation,
baguetter 0.1.1, `baguetter/indices/sparse/models/bmx/index.py`); where they differ the reference wins
unless a mode names the paper's variant.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

MODES = ("bmx", "bm25")
WQA_MODES = ("merged", "sum")
Scorer = Callable[["TermStats", "Candidates", "Query"], np.ndarray]
NORMALIZATIONS = ("paper", "reference", "none")


@dataclass(frozen=True)
class TermStats:
    """Corpus statistics for `u` distinct terms: the exact, corpus-wide numbers BMX needs."""

    n_docs: int
    avgdl: float
    df: np.ndarray  # (u,) documents holding the term
    entropy: np.ndarray  # (u,) raw entropy: sum over every holding document of h(sigmoid(tf))

    def __post_init__(self) -> None:
        df, entropy = _floats(self.df), _floats(self.entropy)
        if (
            df.ndim == entropy.ndim == 1
            and df.shape == entropy.shape
            and 0 <= self.n_docs
            and (self.n_docs == 0 or (math.isfinite(self.avgdl) and self.avgdl > 0))
            and _within(df, self.n_docs)
            and _within(entropy)
        ):
            object.__setattr__(self, "df", df)
            object.__setattr__(self, "entropy", entropy)
            return
        self._refuse()

    def _refuse(self) -> None:
        """Raise what is wrong, the first check failed in order (`__post_init__` accepts at once)."""
        object.__setattr__(self, "df", _array("df", self.df, ndim=1))
        object.__setattr__(self, "entropy", _array("entropy", self.entropy, ndim=1))
        if self.df.shape != self.entropy.shape:
            raise ValueError(
                f"df and entropy must have the same shape, got {self.df.shape} and {self.entropy.shape}"
            )
        if self.n_docs < 0:
            raise ValueError(f"n_docs must be >= 0, got {self.n_docs}")
        if self.n_docs > 0 and not (math.isfinite(self.avgdl) and self.avgdl > 0):
            raise ValueError(f"avgdl must be finite and > 0 when n_docs > 0, got {self.avgdl}")
        if (self.df < 0).any() or (self.df > self.n_docs).any():
            raise ValueError("df must lie in [0, n_docs]")
        if (self.entropy < 0).any():
            raise ValueError("entropy must be >= 0")

    @property
    def n_terms(self) -> int:
        return int(self.df.shape[0])


@dataclass(frozen=True)
class Candidates:
    """Per-candidate features: `tf[i, j]` occurrences of term j in candidate i, and its length |D|."""

    tf: np.ndarray  # (n, u)
    length: np.ndarray  # (n,)

    def __post_init__(self) -> None:
        tf, length = _floats(self.tf), _floats(self.length)
        if (
            tf.ndim == 2
            and length.ndim == 1
            and tf.shape[0] == length.shape[0]
            and _within(tf)
            and _within(length)
        ):
            object.__setattr__(self, "tf", tf)
            object.__setattr__(self, "length", length)
            return
        self._refuse()

    def _refuse(self) -> None:
        """Raise what is wrong, the first check failed in order (`__post_init__` accepts at once)."""
        object.__setattr__(self, "tf", _array("tf", self.tf, ndim=2))
        object.__setattr__(self, "length", _array("length", self.length, ndim=1))
        if self.tf.shape[0] != self.length.shape[0]:
            raise ValueError(f"tf has {self.tf.shape[0]} rows but length has {self.length.shape[0]} entries")
        if (self.tf < 0).any() or (self.length < 0).any():
            raise ValueError("tf and length must be >= 0")

    @property
    def n(self) -> int:
        return int(self.length.shape[0])


@dataclass(frozen=True)
class Query:
    """Query tokens as term indices (duplicates kept, in order) and one weight per token.

    With WQA `merged`, the tokens of the original and augmented queries are concatenated and each token
    carries its query's weight (1 for the original)."""

    tokens: np.ndarray  # (m,) int indices into the term axis
    weights: np.ndarray = field(default=None)  # type: ignore[assignment]  # (m,), default all 1

    def __post_init__(self) -> None:
        tokens = np.asarray(self.tokens, dtype=np.int64).reshape(-1)
        object.__setattr__(self, "tokens", tokens)
        if self.weights is None:
            object.__setattr__(self, "weights", np.ones(tokens.shape[0]))
            return
        weights = _floats(self.weights)
        if not (weights.ndim == 1 and weights.shape == tokens.shape and _within(weights)):
            weights = _array("weights", self.weights, 1)
            if weights.shape != tokens.shape:
                raise ValueError(
                    f"weights must have one entry per token, got {weights.shape} for {tokens.shape}"
                )
            if (weights < 0).any():
                raise ValueError("weights must be >= 0")
        object.__setattr__(self, "weights", weights)

    @property
    def m(self) -> int:
        return int(self.tokens.shape[0])


@dataclass(frozen=True)
class BMXParams:
    """alpha and beta; None means the reference defaults (from avgdl and N)."""

    alpha: float | None = None
    beta: float | None = None

    def __post_init__(self) -> None:
        for name in ("alpha", "beta"):
            _check_non_negative(name, getattr(self, name))


@dataclass(frozen=True)
class BM25Params:
    """Lucene's BM25 parameters."""

    k1: float = 1.2
    b: float = 0.75

    def __post_init__(self) -> None:
        _check_non_negative("k1", self.k1)
        _check_non_negative("b", self.b)
        if self.b > 1:
            raise ValueError(f"b must lie in [0, 1], got {self.b}")


def idf(n_docs: int, df: np.ndarray) -> np.ndarray:
    """Lucene's BM25 IDF: ln(1 + (N - df + 0.5) / (df + 0.5))."""
    df = np.asarray(df, dtype=np.float64)
    return np.log1p((n_docs - df + 0.5) / (df + 0.5))


def entropy_contribution(tf: np.ndarray) -> np.ndarray:
    """One document's contribution to a term's raw entropy: h(sigmoid(tf)) with h(p) = -p ln p.

    Summed over every document holding a term this gives its raw entropy (BMX.md); it is additive, so
    statistics of shards or indices combine by summing."""
    tf = np.asarray(tf, dtype=np.float64)
    p = 1.0 / (1.0 + np.exp(-tf))
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(p > 0, -p * np.log(p), 0.0)


def default_alpha(avgdl: float) -> float:
    """Reference default: clamp(avgdl / 100, 0.5, 1.5)."""
    return float(min(max(avgdl / 100.0, 0.5), 1.5))


def default_beta(n_docs: int) -> float:
    """Reference default: 1 / ln(1 + N)."""
    return 1.0 / math.log1p(n_docs) if n_docs > 0 else 0.0


def live_tokens(stats: TermStats, query: Query) -> Query:
    """Drop query tokens whose term no document holds (df = 0), as the reference does."""
    _check_tokens(stats, query)
    keep = stats.df[query.tokens] > 0
    if keep.all():
        return query
    return Query(query.tokens[keep], query.weights[keep])


@dataclass(frozen=True)
class _Columns:
    """A query reduced to its distinct live terms: the work is done once per term, not per token."""

    query: Query  # live tokens only
    inverse: np.ndarray  # (m,) token -> distinct-term column
    tf: np.ndarray  # (n, u) term frequencies of the distinct terms
    df: np.ndarray  # (u,)

    def per_term(self, per_token: np.ndarray) -> np.ndarray:
        """Sum a per-token vector into its distinct terms (how duplicated tokens add up)."""
        return np.bincount(self.inverse, weights=per_token, minlength=self.tf.shape[1])


def _columns(stats: TermStats, cands: Candidates, query: Query) -> _Columns:
    _check_candidates(stats, cands)
    query = live_tokens(stats, query)
    distinct, inverse = _distinct(query.tokens)
    return _Columns(query, inverse, cands.tf[:, distinct], stats.df[distinct])


def _distinct(tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`np.unique(tokens, return_inverse=True)` of term indices (small integers >= 0): the distinct
    ones in ascending order and each token's place among them, by marking them (a few C calls where
    `unique` sorts in Python-level steps)."""
    if not tokens.size:
        return tokens.copy(), np.zeros(0, np.intp)
    marked = np.zeros(int(tokens.max()) + 1, bool)
    marked[tokens] = True
    return np.flatnonzero(marked), (np.cumsum(marked) - 1)[tokens]


def _ratio(num: np.ndarray, den: np.ndarray, where: np.ndarray) -> np.ndarray:
    """num / den where a term matches, 0 elsewhere (an unmatched term contributes nothing)."""
    return np.divide(num, den, out=np.zeros(np.broadcast(num, den).shape), where=where)


def _bmx_pieces(stats: TermStats, cands: Candidates, query: Query, params: BMXParams | None):
    """Shared by `bmx` and `bmx_terms`: per-term tf part, match mask, per-token entropy, similarity."""
    cols = _columns(stats, cands, query)
    m = cols.query.m
    params = params or BMXParams()
    alpha = default_alpha(stats.avgdl) if params.alpha is None else params.alpha
    beta = default_beta(stats.n_docs) if params.beta is None else params.beta
    raw = stats.entropy[cols.query.tokens]
    top = raw.max() if m else 0.0
    ent = raw / top if top > 0 else np.zeros_like(raw)
    mean_ent = ent.mean() if m else 0.0
    matched = cols.tf > 0
    denom = cols.tf + alpha * (cands.length[:, None] / stats.avgdl + mean_ent) if m else cols.tf
    tf_part = _ratio(idf(stats.n_docs, cols.df) * (alpha + 1) * cols.tf, denom, matched)
    matched = matched.astype(np.float64)
    similarity = matched @ cols.per_term(np.ones(m)) / m if m else np.zeros(cands.n)
    return cols, tf_part, matched, ent, beta, similarity


def bmx_terms(
    stats: TermStats, cands: Candidates, query: Query, params: BMXParams | None = None
) -> np.ndarray:
    """Per-token BMX contributions, shape (n, m) over the live tokens, for explanations.

    score(D,Q) = sum_{i: tf(q_i,D)>0} w_i [IDF(q_i) tf (a+1) / (tf + a|D|/avgdl + a*Ebar) + b E(q_i) S(Q,D)]
    with E the raw entropy over the query's max, Ebar its mean over the tokens, S the matching share of
    tokens. The beta term counts only matching tokens (reference semantics)."""
    cols, tf_part, matched, ent, beta, similarity = _bmx_pieces(stats, cands, query, params)
    inv = cols.inverse
    return cols.query.weights * (tf_part[:, inv] + beta * similarity[:, None] * matched[:, inv] * ent)


def bmx(stats: TermStats, cands: Candidates, query: Query, params: BMXParams | None = None) -> np.ndarray:
    """BMX score of every candidate: the row sums of `bmx_terms`, computed per distinct term.

    Reference semantics; WQA `merged` when the query's tokens carry their queries' weights."""
    cols, tf_part, matched, ent, beta, similarity = _bmx_pieces(stats, cands, query, params)
    weights = cols.query.weights
    return tf_part @ cols.per_term(weights) + beta * similarity * (matched @ cols.per_term(weights * ent))


def _bm25_part(stats: TermStats, cands: Candidates, query: Query, params: BM25Params | None):
    cols = _columns(stats, cands, query)
    params = params or BM25Params()
    norm = params.k1 * (1.0 - params.b + params.b * cands.length[:, None] / stats.avgdl)
    num = idf(stats.n_docs, cols.df) * (params.k1 + 1) * cols.tf
    return cols, _ratio(num, cols.tf + norm, cols.tf > 0)


def bm25_terms(
    stats: TermStats, cands: Candidates, query: Query, params: BM25Params | None = None
) -> np.ndarray:
    """Per-token BM25 contributions, IDF * tf (k1 + 1) / (tf + k1 (1 - b + b |D|/avgdl)).

    The classic form, as the shared test vectors define it: Lucene drops the constant (k1 + 1), which
    changes no ranking. Unlike Elasticsearch it uses exact corpus-wide N, df, avgdl and lengths."""
    cols, part = _bm25_part(stats, cands, query, params)
    return cols.query.weights * part[:, cols.inverse]


def bm25(stats: TermStats, cands: Candidates, query: Query, params: BM25Params | None = None) -> np.ndarray:
    """BM25 score of every candidate with exact statistics (row sums of `bm25_terms`)."""
    cols, part = _bm25_part(stats, cands, query, params)
    return part @ cols.per_term(cols.query.weights)


def normalizer(m: int, n_docs: int, kind: str, mode: str = "bmx") -> float:
    """The per-query constant a normalized score is divided by (0 when there is nothing to score).

    `paper`: as the paper normalizes the mode's score, m (ln(1 + (N - 0.5)/1.5) + 1) for BMX and
    m ln(1 + (N - 0.5)/1.5) for BM25 (its appendix B); `reference`: m ln(1 + (N - 0.5)/1.5)
    (baguetter); `none`: 1. Neither is a strict bound: a normalized score can exceed 1. m counts the
    live (df > 0) tokens."""
    _check_choice("normalize", kind, NORMALIZATIONS)
    if kind == "none":
        return 1.0
    if m == 0 or n_docs == 0:
        return 0.0
    top_idf = math.log1p((n_docs - 0.5) / 1.5)
    return m * (top_idf + 1.0 if kind == "paper" and mode == "bmx" else top_idf)


def normalize(scores: np.ndarray, m: int, n_docs: int, kind: str, mode: str = "bmx") -> np.ndarray:
    """Scores divided by `normalizer` (all zero when it is 0)."""
    scores = np.asarray(scores, dtype=np.float64)
    divisor = normalizer(m, n_docs, kind, mode)
    return scores / divisor if divisor > 0 else np.zeros_like(scores)


@dataclass(frozen=True)
class Request:
    """Everything one rerank needs besides the arrays: mode, parameters, WQA and normalization."""

    mode: str = "bmx"
    alpha: float | None = None
    beta: float | None = None
    k1: float = 1.2
    b: float = 0.75
    wqa_mode: str = "merged"
    normalize: str = "none"

    def __post_init__(self) -> None:
        _check_choice("mode", self.mode, MODES)
        _check_choice("wqa_mode", self.wqa_mode, WQA_MODES)
        _check_choice("normalize", self.normalize, NORMALIZATIONS)
        BMXParams(self.alpha, self.beta)
        BM25Params(self.k1, self.b)

    def scorers(self) -> tuple[Scorer, Scorer]:
        """The (per-candidate, per-token) scorers this request names."""
        if self.mode == "bm25":
            p25 = BM25Params(self.k1, self.b)
            return (lambda s, c, q: bm25(s, c, q, p25)), (lambda s, c, q: bm25_terms(s, c, q, p25))
        px = BMXParams(self.alpha, self.beta)
        return (lambda s, c, q: bmx(s, c, q, px)), (lambda s, c, q: bmx_terms(s, c, q, px))


def score(
    stats: TermStats,
    cands: Candidates,
    queries: Sequence[Query],
    request: Request | None = None,
) -> np.ndarray:
    """Final score of every candidate for a query and its augmentations (`queries[0]` is the original).

    `merged` (reference WQA) scores the concatenated tokens in one pass; `sum` (the paper's equation)
    adds each augmented query's own score times its weight. Normalization divides by the live token count
    over all queries, which for `merged` is the m of the merged query."""
    request = request or Request()
    scorer, _ = request.scorers()
    return _combine(stats, cands, queries, request, scorer, lambda parts: sum(parts))


def score_terms(
    stats: TermStats,
    cands: Candidates,
    queries: Sequence[Query],
    request: Request | None = None,
) -> np.ndarray:
    """Per-token contributions (n, m_live) behind `score`, in merged token order, for `explain`."""
    request = request or Request()
    _, scorer = request.scorers()
    return _combine(stats, cands, queries, request, scorer, lambda parts: np.concatenate(parts, axis=1))


def _combine(stats, cands, queries, request, scorer, join) -> np.ndarray:
    if not queries:
        raise ValueError("queries must hold at least the original query")
    if request.wqa_mode == "merged" or len(queries) == 1:
        merged = merge(queries)
        out = scorer(stats, cands, merged)
    else:
        out = join([scorer(stats, cands, _unit_weights(q)) * _query_weight(q) for q in queries])
    m = sum(live_tokens(stats, q).m for q in queries)
    return normalize(out, m, stats.n_docs, request.normalize, request.mode)


def merge(queries: Sequence[Query]) -> Query:
    """Concatenate queries into one for WQA `merged`: each token keeps its query's weight."""
    if len(queries) == 1:
        return queries[0]
    return Query(
        np.concatenate([q.tokens for q in queries]),
        np.concatenate([q.weights for q in queries]),
    )


def _query_weight(query: Query) -> float:
    """The single weight a `sum`-mode query carries (all its tokens share it)."""
    if query.m == 0:
        return 0.0
    w = query.weights
    if (w != w[0]).any():
        raise ValueError("in wqa_mode 'sum' every token of one query must carry the same weight")
    return float(w[0])


def _unit_weights(query: Query) -> Query:
    return Query(query.tokens, np.ones(query.m))


def _floats(value: object) -> np.ndarray:
    return np.asarray(value, dtype=np.float64)


def _within(arr: np.ndarray, high: float = math.inf) -> bool:
    """Every entry finite and in [0, high], in two reductions (NaN fails every comparison): the inputs'
    checks accept a valid input at once, and only a refused one is checked step by step for its message."""
    if not arr.size:
        return True
    top = arr.max()
    return bool(arr.min() >= 0 and top <= high and math.isfinite(top))


def _array(name: str, value: object, ndim: int) -> np.ndarray:
    arr = np.asarray(value, dtype=np.float64)
    if arr.ndim != ndim:
        raise ValueError(f"{name} must be a {ndim}-d array, got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} must be finite")
    return arr


def _check_non_negative(name: str, value: float | None) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}, got {value!r}")


def _check_tokens(stats: TermStats, query: Query) -> None:
    if query.m and (query.tokens.min() < 0 or query.tokens.max() >= stats.n_terms):
        raise ValueError(f"query tokens must index the {stats.n_terms} terms of the statistics")


def _check_candidates(stats: TermStats, cands: Candidates) -> None:
    if cands.tf.shape[1] != stats.n_terms:
        raise ValueError(f"tf has {cands.tf.shape[1]} columns but the statistics hold {stats.n_terms} terms")
