"""Term frequencies from the first stage itself, so a window needs no `_mtermvectors` for them.

For each distinct analysed query token the first stage carries a named `intervals` query matching
exactly that token (`keyword` analyzer: the token is already analysed). The probes sit in a branch
that can never match: a `bool` whose `filter` is a term on an `_id` no document has, beside the
caller's query as the other `should` clause of a `bool` of two. Lucene drops that branch in the query
phase (its scorer is empty in every segment), which leaves the caller's query alone, run as it runs
without the probes: which documents match, their scores, the total and the aggregations are its own.
The fetch phase still evaluates every named query on every hit. With `include_named_queries_score`
(Elasticsearch >= 8.8, OpenSearch >= 2.13) the engine reports, per hit, each matching probe's score s = tf / (tf + 1) (the intervals
query's saturation with pivot 1), so tf = round(s / (1 - s)). A named `match_all` in the same branch
(`CANARY`) must come back on every hit: a hit without it had its probes rewritten away (an engine
that folds the never-matching branch into `match_none`), and is read from its term vectors instead.

What the search cannot say is the field's length |D|: it comes from a bounded cache keyed by the
document version (and caller, as term vectors are), filled by `_mtermvectors` for the hits it misses.
Lengths are one integer per document version, so the cache covers far more documents than full term
vectors would."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import chain, repeat
from typing import Any

import numpy as np
from cachetools import LRUCache

from bmx_rerank.rerank.term_vector_cache import CacheKey

PARAM = "include_named_queries_score"
# what asks the cluster whether it takes a parameter (or a preference): a search that matches nothing
MATCH_NONE = {"size": 0, "track_total_hits": False, "query": {"match_none": {}}}
PREFIX = "_bmx_tf_"
MAX_PROBES = 64  # distinct tokens probed at most; longer (augmented) queries use `_mtermvectors`
# float32 scores s = tf/(tf+1) for tf and tf+1 differ by ~1/tf^2, i.e. many float32 steps of ~6e-8
# below this bound: reading back is exact. Above it a hit's terms come from `_mtermvectors`.
MAX_TF = 1000
CANARY = PREFIX + "hit"  # matches every hit: proves the probes were evaluated on it
NEVER = "\u0000bmx-never-matches"  # an `_id` no document has (ids are at most 512 bytes of UTF-8)
# Body keys whose answer the probes would change: the caller's own named queries (matched_queries),
# an explanation or profile (they would show the probes). Highlighting too: the plain highlighter
# marks the probes' tokens where the caller's query has none (measured on both engines).
UNSAFE_KEYS = ("explain", "profile")
NAMED = re.compile(rb'"_name"\s*:')
# Hits fetched again inside the answer (collapse or nested `inner_hits`, `top_hits` aggregations)
# report the probes as their `matched_queries` too (measured on both engines).
NESTED_HITS = re.compile(rb'"(inner_hits|top_hits)"\s*:')


@dataclass(frozen=True)
class Probe:
    """The (field, token) pairs probed in one first stage, in order; probe i is named PREFIX + str(i)."""

    pairs: tuple[tuple[str, str], ...]

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(f for f, _ in self.pairs))

    def tokens(self, field: str) -> list[str]:
        return [t for f, t in self.pairs if f == field]

    def covers(self, tokens: Mapping[tuple[str, str], Sequence[str]]) -> bool:
        """Whether every (field, token) a rerank scores was probed."""
        probed = set(self.pairs)
        return all((f, t) in probed for (f, _), toks in tokens.items() for t in toks)


def why_not(body: Mapping[str, Any], raw: bytes, params: Mapping[str, str]) -> str | None:
    """Why this first stage cannot carry probes (its answer would show them), or None when it can.

    `raw` is the serialized first stage; a `"_name"` anywhere in it (the caller's named queries, in
    the query, inner hits or a rescore) keeps the answer's `matched_queries` the caller's own."""
    if any(body.get(k) for k in UNSAFE_KEYS) or PARAM in params or "explain" in params:
        return "explain"
    if "highlight" in body:
        return "highlight"
    if NAMED.search(raw):
        return "named_queries"
    if NESTED_HITS.search(raw):
        return "inner_hits"
    if not isinstance(body.get("query"), Mapping):
        return "no_query"
    return None


def probe_terms(tokens: Mapping[tuple[str, str], Sequence[str]]) -> Probe | None:
    """The probe of a query's tokens ((field, text) -> tokens, augmentations included), None when
    there are none or too many."""
    pairs = tuple(dict.fromkeys((f, t) for (f, _), toks in tokens.items() for t in toks))
    if not pairs or len(pairs) > MAX_PROBES:
        return None
    return Probe(pairs)


def with_probes(body: Mapping[str, Any], probe: Probe) -> dict[str, Any]:
    """The first-stage body with the probes in a branch that never matches.

    The caller's query is wrapped, never merged into: its own `bool` keeps its clauses and its
    `minimum_should_match`. The outer `bool` is a disjunction of it and the branch that never matches,
    so a document matches as the caller's query matches it, and scores its score alone. (A `must` for
    the caller's query, with the branch an optional `should`, is the same answer, but Lucene runs such a
    `bool` as a conjunction instead of the caller's own query: 0.3-0.5 ms more for a window of 100 on
    SciFact, benchmarks/RESULTS.md.)"""
    probes = [
        {"intervals": {f: {"match": {"query": term, "analyzer": "keyword"}, "_name": f"{PREFIX}{i}"}}}
        for i, (f, term) in enumerate(probe.pairs)
    ]
    return with_named(body, probes)


def with_named(body: Mapping[str, Any], named: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """`body` whose query is a disjunction of its own and a branch that never matches, holding the
    `named` queries and the canary (`with_probes`)."""
    never = {
        "bool": {"filter": [{"term": {"_id": NEVER}}], "should": [*named, {"match_all": {"_name": CANARY}}]}
    }
    return {**body, "query": {"bool": {"should": [body["query"], never]}}}


Frequencies = dict[str, dict[str, int]]  # field -> probed token -> tf (0: not in the field)


@dataclass(frozen=True, eq=False)
class ProbeCounts:
    """A window's probed term frequencies as one table: `counts[h, j]` is hit h's frequency of
    `probe.pairs[j]` (0: not in the field), read exactly only where `usable[h]` (`take_frequencies`).

    Kept as a table so that scoring reads its columns as they are (`tf`), and the term-vector cache's
    entries are made from a field's slice of it (`tokens`, `counts_of`) after the answer is on its way;
    `of` reads one hit's row as maps."""

    probe: Probe
    counts: np.ndarray  # (hits, pairs) int64
    usable: np.ndarray  # (hits,) bool

    def of(self, h: int) -> Frequencies | None:
        """Hit h's frequencies per field, each map its own (None: its probes cannot be read exactly)."""
        if not self.usable[h]:
            return None
        row = self.counts[h].tolist()
        return {
            f: dict(zip(tokens, [row[j] for j in js], strict=True))
            for f, (js, tokens) in self._columns.items()
        }

    def rows(self) -> list[Frequencies | None]:
        return [self.of(h) for h in range(len(self.usable))]

    def tokens(self, field: str) -> tuple[str, ...]:
        """The tokens probed in `field`, in the order of `counts_of`'s columns."""
        return tuple(self._columns[field][1])

    def counts_of(self, field: str, rows: Sequence[int]) -> list[list[int]]:
        """`rows`' frequencies of the tokens probed in `field` (`tokens`), a list each, from one slice
        of the table."""
        return self.counts[np.ix_(rows, self._columns[field][0])].tolist()  # type: ignore[no-any-return]

    def tf(self, field: str, vocabulary: Sequence[str], rows: Sequence[int]) -> np.ndarray:
        """The frequency of each vocabulary token in `field` for each of `rows` (float64, as the
        scoring core reads it); 0 for a token not probed, as a probed entry's `tf.get(token, 0)`."""
        column = self._column
        picked = [column.get((field, t), -1) for t in vocabulary]
        rows = np.asarray(rows, dtype=np.int64)
        if -1 not in picked:  # every token probed (probes that cover the query): its columns at once
            return self.counts[np.ix_(rows, picked)].astype(np.float64)
        table = self.counts[rows]
        padded = np.concatenate([table, np.zeros((len(rows), 1), dtype=np.int64)], axis=1)  # -1: zeros
        return padded[:, picked].astype(np.float64)

    @cached_property
    def _columns(self) -> dict[str, tuple[list[int], list[str]]]:
        """Per field, its pairs' columns and tokens, in the pairs' order."""
        out: dict[str, tuple[list[int], list[str]]] = {f: ([], []) for f in self.probe.fields}
        for j, (f, token) in enumerate(self.probe.pairs):
            out[f][0].append(j)
            out[f][1].append(token)
        return out

    @cached_property
    def _column(self) -> dict[tuple[str, str], int]:
        return {pair: j for j, pair in enumerate(self.probe.pairs)}


def take_frequencies(hits: Sequence[dict[str, Any]], probe: Probe) -> ProbeCounts:
    """The hits' term frequencies of the probed tokens, removing the probes' `matched_queries` from the
    hits (the caller had none: see `why_not`).

    A hit is not `usable` when its scores cannot be read back exactly (a term more frequent than
    MAX_TF, a score that is no number) or it lacks the `CANARY` (its probes were not evaluated).
    The window's (hit, probe, score) triples are gathered with C-level loops and converted at once
    (float32 as the engine computed them, then tf): a window is ~100 hits x ~15 probes."""
    pairs = probe.pairs
    number = {f"{PREFIX}{i}": i for i in range(len(pairs))}  # a probe's name -> its pair
    take = getattr(hits, "take_matched", None)  # a window of typed hits (`shards.WindowHits`): no dict made
    named = take() if take is not None else list(map(dict.pop, hits, repeat("matched_queries"), repeat(None)))
    if not set(map(type, named)) <= {dict}:  # a hit without them, or another kind of map: read as a dict
        named = [n if type(n) is dict else dict(n) if isinstance(n, Mapping) else {} for n in named]
    usable = np.fromiter(map(dict.__contains__, named, repeat(CANARY)), bool, len(named))
    names = list(chain.from_iterable(named))
    scores: list[Any] = list(chain.from_iterable(map(dict.values, named)))
    # every score a float, as the engines send them (counting is cheaper than a set of the types)
    if list(map(type, scores)).count(float) != len(scores) and not set(map(type, scores)) <= {float, int}:
        scores = [x if type(x) in (float, int) else float("nan") for x in scores]
    pair = np.fromiter(map(number.get, names, repeat(-1)), np.int64, len(names))  # -1: not a probe of ours
    hit_of = np.repeat(np.arange(len(named)), np.fromiter(map(len, named), np.int64, len(named)))
    ours = (pair >= 0) & usable[hit_of]  # a hit without the canary: its probes were not evaluated
    # as the engine computed them, in float32 (through float64, which holds every score exactly)
    s = np.fromiter(scores, np.float64, len(scores)).astype(np.float32).astype(np.float64)[ours]
    with np.errstate(divide="ignore", invalid="ignore"):
        counts = np.rint(s / (1.0 - s))
    readable = (s < 1.0) & (counts >= 1) & (counts <= MAX_TF)
    rows = hit_of[ours]
    usable[rows[~readable]] = False
    table = np.zeros((len(hits), len(pairs)), dtype=np.int64)  # a probe not reported: tf 0
    table[rows[readable], pair[ours][readable]] = counts[readable]
    return ProbeCounts(probe, table, usable)


class LengthCache:
    """A bounded LRU map from a document version (`CacheKey`) to its field length."""

    def __init__(self, capacity: int = 1_000_000) -> None:
        self.capacity = capacity
        self._items: LRUCache[CacheKey, int] = LRUCache(maxsize=max(1, capacity))

    def get(self, key: CacheKey | None) -> int | None:
        if key is None or self.capacity <= 0:
            return None
        return self._items.get(key)

    def put(self, key: CacheKey | None, length: int) -> None:
        if key is not None and self.capacity > 0:
            self._items[key] = length

    def __len__(self) -> int:
        return len(self._items)
