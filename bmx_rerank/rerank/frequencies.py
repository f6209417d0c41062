"""Each hit's term frequencies and length per scored field: from the first stage's probes, the caches,
the statistics' length tables, or `_mtermvectors`.

A hit is dropped (None) when its document is gone (deleted between the first stage and the term
vectors) or changed (its term vectors carry another `_version` than the hit: updated, and refreshed, in
between). A changed document's terms are not cached: they are not the hit's version, and
`_mtermvectors` does not say which `_seq_no` they are (the next search's hit will)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

import numpy as np

from bmx_rerank.metrics import Metrics
from bmx_rerank.rerank import tf_probe
from bmx_rerank.rerank.hits import HitColumns
from bmx_rerank.rerank.term_vector_cache import (
    CacheKey,
    Naming,
    ProbedDoc,
    SeenWindow,
    Terms,
    TermVectorCache,
    VersionKey,
    WindowKey,
    field_keys,
    hits_digest,
    token_bytes,
)
from bmx_rerank.scoring import Candidates
from bmx_rerank.stats.cache import StatsView
from bmx_rerank.upstream import Cluster, DocRef, DocTerms

TERMVECTOR_BATCH = 500  # documents per `_mtermvectors` call: bounded answers, each parsed on its own
HitTerms = dict[str, Terms]  # one hit's terms per field


@dataclass(frozen=True)
class Nameless:
    """A lean window's hits (`rerank/lean.py`): they carry no `_id`. `identify` names those
    `_mtermvectors` needs (sets `_id` on the ones it still finds); the caches key them by index, length
    table (`tables`: index -> the table's identity) and version."""

    identify: Callable[[list[dict[str, Any]]], Awaitable[None]]
    tables: Mapping[str, str]


@dataclass
class ProbedTerms:
    """A probed window's terms: the probes' table (`counts`) for the hits `scored` from it, with their
    lengths per field (`lengths[hit, field]`), and the term vectors of the hits whose probes could not
    be read (`vectors`); any other hit is dropped. Scoring reads the table's columns (`features`); the
    per-hit entries the term-vector cache keeps are made only when asked for (`entries`), after the
    answer is on its way."""

    counts: tf_probe.ProbeCounts
    names: Sequence[str]
    lengths: np.ndarray  # (hits, fields) int64, -1 where not known
    scored: np.ndarray  # (hits,) bool
    vectors: dict[int, HitTerms] = field(default_factory=dict)

    @property
    def alive(self) -> list[int]:
        """The hits that are scored, in the window's order."""
        return self._alive.nonzero()[0].tolist()

    @property
    def _alive(self) -> np.ndarray:
        alive = self.scored.copy()
        alive[list(self.vectors)] = True
        return alive

    def features(self, name: str, vocabulary: Sequence[str]) -> Candidates:
        """`rescore.candidate_features` of the alive hits in field `name`: the table's columns where
        the probes were read, the term vectors' counts where not."""
        j = self.names.index(name)
        if not self.vectors:  # every hit scored from the table, as most windows are
            rows = self.scored.nonzero()[0]
            return Candidates(
                self.counts.tf(name, vocabulary, rows), self.lengths[rows, j].astype(np.float64)
            )
        alive = self._alive.nonzero()[0]
        from_table = self.scored[alive]
        rows = alive[from_table]
        tf = np.zeros((len(alive), len(vocabulary)), dtype=np.float64)
        length = np.empty(len(alive), dtype=np.float64)
        if rows.size:
            tf[from_table] = self.counts.tf(name, vocabulary, rows)
            length[from_table] = self.lengths[rows, j]
        for k in (~from_table).nonzero()[0].tolist():
            doc = self.vectors[int(alive[k])][name]
            tf[k] = [doc.tf.get(t, 0) for t in vocabulary]
            length[k] = doc.length
        return Candidates(tf, length)

    def entries(self) -> list[tuple[int, str, Terms]]:
        """Each alive hit's entry in each field (hit, field, entry), in the window's order, as the
        term-vector cache keeps them: partial ones (`ProbedDoc`) of the table's rows."""
        rows = self.scored.nonzero()[0].tolist()
        lengths = self.lengths[rows].tolist()
        out: list[tuple[int, str, Terms]] = []
        for j, f in enumerate(self.names):
            tokens = self.counts.tokens(f)
            held = token_bytes(dict.fromkeys(tokens, 0))  # a field's entries know the same tokens
            counts = self.counts.counts_of(f, rows)
            out += [(i, f, ProbedDoc.of(tokens, counts[k], lengths[k][j], held)) for k, i in enumerate(rows)]
        out += [(i, f, doc) for i, by_field in self.vectors.items() for f, doc in by_field.items()]
        if len(self.names) > 1 or self.vectors:
            out.sort(key=itemgetter(0))  # stable: each hit's fields in their order
        return out


class TermFrequencies:
    """Where a window's frequencies come from, with the caches shared by every request."""

    def __init__(
        self,
        cluster: Cluster,
        metrics: Metrics,
        *,
        cache: TermVectorCache,
        lengths: tf_probe.LengthCache,
    ) -> None:
        self.cluster = cluster
        self.metrics = metrics
        self.cache = cache
        self.lengths = lengths

    def seen_window(
        self,
        key: WindowKey,
        hits: HitColumns,
        who: str,
        names: Sequence[str],
        tokens: Mapping[tuple[str, str], Sequence[str]],
        *,
        tables: Mapping[str, str] | None = None,
        look: bool = True,
    ) -> tuple[bytes | None, SeenWindow | None]:
        """The window's digest (`hits_digest`; None when a hit has no version or the cache is off),
        and the window the cache kept under `key` for that digest (None: not kept, or not `look`ed
        for)."""
        if self.cache.max_bytes <= 0:
            return None, None  # nothing is kept: no digest to compute
        digest = hits_digest(hits, who, tokens, tables=tables)
        seen = self.cache.window(key, digest) if look and digest is not None else None
        if seen is not None:
            self._count(len(hits) * len(names), len(hits) * len(names))
        return digest, seen

    def keep_window(self, key: WindowKey, seen: SeenWindow, *, again: bool) -> None:
        self.cache.keep_window(key, seen, again=again)

    async def from_term_vectors(
        self,
        hits: Sequence[Mapping[str, Any]],
        names: Sequence[str],
        versions: Sequence[VersionKey | None],
        headers: Mapping[str, str],
        needs: Mapping[str, AbstractSet[str]] | None = None,
        nameless: Nameless | None = None,
    ) -> tuple[list[HitTerms | None], int]:
        """Each hit's terms in every field (None: dropped), cached per field under its version
        (`versions`: each hit's `version_key`, the caller's); the misses in ONE `_mtermvectors` for all
        fields; and how many hits that fetched. A cached partial entry serves only if it knows every
        token of `needs[field]` (None: full term vectors only). `nameless`: the hits are a lean
        window's (see `from_probes`)."""
        found: list[HitTerms] = []
        get = self.cache.get
        keys = field_keys(versions, names)
        wanted = [(f, None if needs is None else needs[f]) for f in names]
        for key in keys:
            got: HitTerms = {}
            for f, need in wanted:
                if (doc := get(key[f], need)) is not None:
                    got[f] = doc
            found.append(got)
        missing = [i for i, d in enumerate(found) if len(d) < len(names)]
        self._count(sum(len(d) for d in found), len(hits) * len(names))
        gone: set[int] = set()
        named = await _named(hits, missing, nameless)
        gone.update(set(missing) - set(named))  # changed since: dropped
        missing = named
        if missing:
            fetched = await self._fetch([hits[i] for i in missing], names, headers)
            for i, by_field in zip(missing, fetched, strict=True):
                if not same_version(hits[i], by_field.values()):
                    gone.add(i)
                    continue
                for f, terms in by_field.items():
                    found[i].setdefault(f, terms)
                    key = keys[i][f]
                    self.cache.put(key, terms)
                    self.lengths.put(key, terms.length)  # a later probed window needs only this
        return [None if i in gone else d for i, d in enumerate(found)], len(missing)

    async def from_probes(
        self,
        columns: HitColumns,
        counts: tf_probe.ProbeCounts,
        names: Sequence[str],
        naming: Naming,
        headers: Mapping[str, str],
        stats: Mapping[str, Awaitable[StatsView]],
        nameless: Nameless | None = None,
    ) -> tuple[ProbedTerms, int]:
        """`from_term_vectors`' answer from the probes: each hit's query-term frequencies as the first
        stage reported them, its lengths from the statistics snapshot's length table
        (`StatsView.lengths`, exact document versions only), else from the length cache (by the hit's
        `version_key`, named for those alone); `_mtermvectors` only for the hits both miss (their
        lengths are then remembered), dropped as `from_term_vectors` drops them. What it finds is for
        the term-vector cache too (`remember`), as fetched term vectors are.

        The table first: it answers a window's hits in one vectorised lookup, where the cache takes one
        a hit and field (both are exact, so which answers does not change a length).

        A hit whose probes cannot be read exactly is scored from its term vectors, as without probes.
        Hits of a lean first stage carry no `_id` (`nameless`): those `_mtermvectors` needs are named
        first (one that cannot be named any more is dropped)."""
        hits, usable = columns.hits, counts.usable
        lengths = np.full((len(hits), len(names)), -1, np.int64)  # unprobed: unknown, fetched below
        if usable.any():
            views = [await stats[f] for f in names]  # in already, as a rule: no task made to wait
            lengths = table_lengths(columns, names, views)
            lengths[~usable] = -1
        get, looked_up, known = self.lengths.get, 0, 0
        for i in (usable & (lengths < 0).any(axis=1)).nonzero()[0].tolist():
            version = naming.key(hits[i])
            for j, f in enumerate(names):
                if lengths[i, j] < 0:
                    n = get(_field_key(version, f))
                    if n is not None:
                        lengths[i, j] = n
                    looked_up, known = looked_up + 1, known + (n is not None)
        self._count(known, looked_up)
        unknown = (lengths < 0).any(axis=1) | ~usable
        found = ProbedTerms(counts, names, lengths, scored=~unknown)
        missing = await _named(hits, np.flatnonzero(unknown).tolist(), nameless)  # the others stay dropped
        if missing:
            fetched = await self._fetch([hits[i] for i in missing], names, headers)
            for i, by_field in zip(missing, fetched, strict=True):
                if not same_version(hits[i], by_field.values()):
                    continue  # dropped, as `from_term_vectors` drops it
                if not usable[i]:
                    found.vectors[i] = dict(by_field)
                    continue
                version = naming.key(hits[i])
                for f, terms in by_field.items():
                    self.lengths.put(_field_key(version, f), terms.length)
                    lengths[i, names.index(f)] = terms.length
                found.scored[i] = True
        return found, len(missing)

    def remember(self, columns: HitColumns, naming: Naming, names: Sequence[str], found: ProbedTerms) -> None:
        """Keep what `from_probes` found in the term-vector cache, for next time (partial entries): apart
        from it, so that the pipeline does it while the cluster answers the page's fetch. None are made
        (nor the hits' keys) when the cache keeps nothing."""
        if self.cache.max_bytes <= 0:
            return
        self.keep_entries(naming.keys(columns), found)

    def keep_entries(self, versions: Sequence[VersionKey | None], found: ProbedTerms) -> None:
        """`remember` of hits named `versions` (their `version_key`s)."""
        put = self.cache.put
        for i, f, doc in found.entries():
            if (version := versions[i]) is not None:
                put((*version, f), doc)

    def keep_entries_later(
        self, versions: Callable[[], Sequence[VersionKey | None]], found: ProbedTerms
    ) -> None:
        """`keep_entries`, the hits' keys made now (`Naming.later`): a kept window's, made only if it
        comes back changed (`SeenWindow.entries`)."""
        self.keep_entries(versions(), found)

    async def _fetch(
        self, hits: Sequence[Mapping[str, Any]], names: Sequence[str], headers: Mapping[str, str]
    ) -> list[HitTerms]:
        """The hits' term vectors in every field, TERMVECTOR_BATCH documents per `_mtermvectors`, from
        the refreshed view the hits (and their `_seq_no`) come from."""
        refs = doc_refs(hits)
        batches = [refs[i : i + TERMVECTOR_BATCH] for i in range(0, len(refs), TERMVECTOR_BATCH)]
        parts = await asyncio.gather(
            *(
                self.metrics.timed(
                    "termvectors", self.cluster.mtermvectors_fields(batch, names, headers, realtime=False)
                )
                for batch in batches
            )
        )
        return [terms for part in parts for terms in part]

    def _count(self, hit: int, looked_up: int) -> None:
        self.metrics.cache.labels("hit").inc(hit)
        self.metrics.cache.labels("miss").inc(looked_up - hit)


def table_lengths(hits: HitColumns, names: Sequence[str], views: Sequence[StatsView]) -> np.ndarray:
    """Each hit's length per field (`[hit, field]`) from the length table of its index in that field's
    view: -1 where the view has no table for the index or the table not this version of the document."""
    out = np.full((len(hits), len(names)), -1, np.int64)
    indices = _strings(hits.index)
    # A lean hit has no `_id` ("": never routed by one) but its shard (`SHARD`), where a table keyed
    # by version looks; a hit without its shard (None) is routed by `_id`.
    columns = (
        _strings(hits.column("_id", "")),
        _strings(hits.column("_routing"), keep_none=True),
        hits.seq_no,
        hits.primary_term,
        hits.shard,
    )
    one_index = len(set(indices)) == 1  # as most windows: every hit in one lookup
    by_index: dict[str, list[int]] = {}
    if not one_index:
        for i, index in enumerate(indices):
            by_index.setdefault(index, []).append(i)
    for j, view in enumerate(views):
        tables = view.lengths or {}
        if one_index:
            if (table := tables.get(indices[0])) is not None:
                out[:, j] = table.find(*columns)
            continue
        for index, rows in by_index.items():
            if (table := tables.get(index)) is not None:
                out[rows, j] = table.find(*([c[i] for i in rows] for c in columns))
    return out


def _field_key(version: VersionKey | None, name: str) -> CacheKey | None:
    """A hit's cache key in field `name`, from its `version_key`."""
    return None if version is None else (*version, name)


def _strings(values: list[Any], *, keep_none: bool = False) -> list[Any]:
    """`values` as strings (already so, as a hit's `_id` is, without a call each); `keep_none`: None
    stays None."""
    if set(map(type, values)) <= ({str, type(None)} if keep_none else {str}):
        return values
    return [None if keep_none and v is None else str(v) for v in values]


async def _named(
    hits: Sequence[Mapping[str, Any]], missing: list[int], nameless: Nameless | None
) -> list[int]:
    """The `missing` hits `_mtermvectors` can name: a lean window's are given their `_id` first, and
    those whose version is gone by then are left out."""
    if nameless is None or not missing:
        return missing
    await nameless.identify([hits[i] for i in missing if "_id" not in hits[i]])  # type: ignore[misc]
    return [i for i in missing if "_id" in hits[i]]


def doc_refs(hits: Sequence[Mapping[str, Any]], *, nameless: bool = False) -> list[DocRef]:
    """Where each hit lives; `_index` and `_id` come back even with `_source: false`, not with
    `stored_fields: _none_` (a lean first stage: `nameless` names them "")."""
    refs = []
    unnamed: dict[str, DocRef] = {}  # a lean window's hits of one index share theirs (it is frozen)
    for hit in hits:
        if nameless and "_index" in hit and "_id" not in hit:
            index = hit["_index"]
            refs.append(unnamed.get(index) or unnamed.setdefault(index, DocRef(index, "")))
            continue
        if "_id" not in hit or "_index" not in hit:
            raise ValueError("a hit without _index/_id cannot be reranked (stored_fields: _none_?)")
        routing = hit.get("_routing")
        refs.append(DocRef(hit["_index"], str(hit["_id"]), None if routing is None else str(routing)))
    return refs


def same_version(hit: Mapping[str, Any], terms: Iterable[DocTerms]) -> bool:
    """The term vectors are of the hit's document as the hit shows it: found, and of its `_version`
    (when the hit carries one)."""
    version = hit.get("_version")
    return all(t.found and (not isinstance(version, int) or t.version == version) for t in terms)


def probed_bytes(found: ProbedTerms, hits: int) -> int:
    """What a kept window of `hits` holds to make its documents' entries later (`SeenWindow.entries`):
    the probes' table and lengths, and what names each hit (`Naming.later`): at most its version key (a
    tuple of five with its list slot and numbers, ~150 bytes; its strings are the hits' own, ~60
    more), at least its version's columns (four list slots, a score and a `_seq_no`, ~70 bytes)."""
    table = found.counts
    arrays = table.counts.nbytes + table.usable.nbytes + found.lengths.nbytes + found.scored.nbytes
    return int(arrays + 210 * hits + 400)
