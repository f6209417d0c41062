"""Corpus statistics as the proxy and the CLI use them: build, publish, load, check and refresh.

- `build` sweeps the live documents of an index expression and returns exact `CorpusStats`;
- `build_snapshots` / `refresh` do the same and publish snapshots to the store index (`stats_store`);
- `freshness` says, per concrete index, what is stored and whether the index moved on since;
- `StatsCache.get` is what the proxy calls per search: loads snapshots once, checks drift at most
  every `check_interval` seconds, and falls back to the estimated mode when an index has no snapshot.

Statistics are kept per concrete index and summed over the indices an alias or pattern names, so one
snapshot serves every expression that includes its index.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import aiohttp
import numpy as np
import orjson

from bmx_rerank import estimate, stats_store
from bmx_rerank.corpus import CorpusStats, EntropyAccumulator, terms_array
from bmx_rerank.errors import SearchError, UpstreamError
from bmx_rerank.freshness import (
    IndexMarks,
    appends_only,
    drifted,
    incremental_possible,
    new_operations,
    same_state,
)
from bmx_rerank.stats_errors import empty_corpus
from bmx_rerank.stats_store import CHUNK_TERMS, DEFAULT_STORE, SnapshotInfo, now_iso
from bmx_rerank.sweep import (
    Progress,
    SweepResult,
    fold_pages,
    index_marks,
    live_count,
    refresh_index,
    resolve_text_field,
    sweep_index,
)
from bmx_rerank.upstream import DocRef, request_json

log = logging.getLogger(__name__)

DEFAULT_BATCH = 200
DEFAULT_CONCURRENCY = 4


@dataclass(frozen=True)
class StatsView:
    """Statistics for one search: the corpus numbers and how far to trust them."""

    corpus: CorpusStats
    estimated: bool  # no exact snapshot: entropy estimated from df and ttf (see `estimate`)
    stale: bool  # drift detected since the snapshot was built
    built_at: str | None  # ISO timestamp of the (oldest) snapshot, None if estimated
    _complete: Callable[[Sequence[str]], Awaitable[StatsView]] | None = field(
        default=None, repr=False, compare=False
    )

    async def for_terms(self, terms: Sequence[str]) -> StatsView:
        """This view with `terms` guaranteed present: a no-op for exact statistics (they hold the whole
        vocabulary); in estimated mode it fetches df and ttf of the terms not yet estimated."""
        if self._complete is None:
            return self
        return await self._complete(terms)


@dataclass(frozen=True)
class Freshness:
    """What is stored for one concrete index and whether the index changed since."""

    index: str
    field: str
    snapshot: SnapshotInfo | None
    current: IndexMarks | None  # None when `_stats` was not allowed or failed
    stale: bool | None  # None: unknown (no snapshot, or no permission to read the markers)
    reason: str
    operations_since: int | None

    def to_json(self) -> dict[str, Any]:
        info = self.snapshot
        return {
            "index": self.index,
            "field": self.field,
            "snapshot": info.snapshot if info else None,
            "built_at": info.built_at if info else None,
            "method": info.method if info else None,
            "live_docs": info.live_docs if info else None,
            "stale": self.stale,
            "reason": self.reason,
            "operations_since": self.operations_since,
            "age_seconds": _age_seconds(info.built_at) if info else None,
        }


# --- building -------------------------------------------------------------------------------------


async def build(
    session: aiohttp.ClientSession,
    base_url: str,
    index: str,
    field: str,
    headers: Mapping[str, str],
    *,
    batch_size: int = DEFAULT_BATCH,
    concurrency: int = DEFAULT_CONCURRENCY,
    progress: Progress | None = None,
) -> CorpusStats:
    """Exact statistics of `field` over every live document of an index, alias or pattern (summed)."""
    results = await sweep_all(
        session,
        base_url,
        index,
        field,
        headers,
        batch_size=batch_size,
        concurrency=concurrency,
        progress=progress,
    )
    return sum_in_order([r.stats for r in results.values()])


async def sweep_all(
    session: aiohttp.ClientSession,
    base_url: str,
    index_expr: str,
    field: str,
    headers: Mapping[str, str],
    *,
    batch_size: int = DEFAULT_BATCH,
    concurrency: int = DEFAULT_CONCURRENCY,
    progress: Progress | None = None,
    only: Sequence[str] | None = None,
    allow_empty: bool = False,
) -> dict[str, SweepResult]:
    """Sweep each concrete index behind `index_expr` (or those in `only`), one after the other; an
    error when none of them holds a token in the field, unless `allow_empty`."""
    indices = await resolve_text_field(session, base_url, index_expr, field, headers)
    out: dict[str, SweepResult] = {}
    for name in indices if only is None else [i for i in indices if i in only]:
        result = await sweep_index(
            session,
            base_url,
            name,
            field,
            headers,
            batch_size=batch_size,
            concurrency=concurrency,
            progress=progress,
        )
        out[name] = result
    if not allow_empty and out and all(r.stats.n_docs == 0 for r in out.values()):
        # One empty index among others (a new daily index) is fine and gets an empty snapshot;
        # nothing to build from at all is an error.
        raise empty_corpus(",".join(out), field)
    return out


async def build_snapshots(
    session: aiohttp.ClientSession,
    base_url: str,
    index_expr: str,
    field: str,
    headers: Mapping[str, str],
    *,
    store: str = DEFAULT_STORE,
    batch_size: int = DEFAULT_BATCH,
    concurrency: int = DEFAULT_CONCURRENCY,
    progress: Progress | None = None,
    only: Sequence[str] | None = None,
    allow_empty: bool = False,
) -> list[SnapshotInfo]:
    """Full sweep of every concrete index behind `index_expr`, each published as a new snapshot.

    Sweeps everything before publishing anything, so a failure leaves every pointer as it was."""
    results = await sweep_all(
        session,
        base_url,
        index_expr,
        field,
        headers,
        batch_size=batch_size,
        concurrency=concurrency,
        progress=progress,
        only=only,
        allow_empty=allow_empty,
    )
    infos = []
    for name, result in results.items():
        info = snapshot_info(
            name,
            field,
            result.stats,
            result.marks,
            result.live_docs,
            result.exact_marks,
            result.seconds,
            "build",
            exact_units=True,
        )
        await stats_store.publish(session, base_url, headers, info, result.stats, store, result.units)
        infos.append(info)
    return infos


@dataclass(frozen=True)
class RefreshOutcome:
    """What `refresh` did for one concrete index."""

    index: str
    action: str  # "unchanged", "incremental", "rebuilt", "built"
    reason: str
    snapshot: SnapshotInfo | None
    new_documents: int = 0


async def refresh(
    session: aiohttp.ClientSession,
    base_url: str,
    index_expr: str,
    field: str,
    headers: Mapping[str, str],
    *,
    store: str = DEFAULT_STORE,
    batch_size: int = DEFAULT_BATCH,
    concurrency: int = DEFAULT_CONCURRENCY,
    progress: Progress | None = None,
    force_rebuild: bool = False,
) -> list[RefreshOutcome]:
    """Bring each concrete index's snapshot up to date: nothing if unchanged, the appended documents
    alone if only appends happened since (proved from sequence numbers and live counts), else a full
    rebuild. Indices without a snapshot are built; an empty one among others gets an empty snapshot,
    as with `build_snapshots`."""
    indices = await resolve_text_field(session, base_url, index_expr, field, headers)
    pointers = await stats_store.read_pointers(
        session, base_url, headers, [(i, field) for i in indices], store
    )
    outcomes = []
    for name in indices:
        info = pointers.get((name, field))
        outcome = None
        if info is None:
            action, reason = "built", "no snapshot"
        elif force_rebuild:
            action, reason = "rebuilt", "rebuild requested"
        else:
            current = (await index_marks(session, base_url, name, headers)).get(name)
            if current is not None and info.exact_marks and not drifted(info.marks, current):
                outcomes.append(RefreshOutcome(name, "unchanged", "no write since the snapshot", info))
                continue
            if current is not None and info.exact_marks and incremental_possible(info.marks, current):
                outcome = await _try_incremental(
                    session, base_url, name, field, headers, store, info, current, batch_size, concurrency
                )
            action, reason = "rebuilt", _rebuild_reason(info, current)
        if outcome is None:
            (new,) = await build_snapshots(
                session,
                base_url,
                name,
                field,
                headers,
                store=store,
                batch_size=batch_size,
                concurrency=concurrency,
                progress=progress,
                only=[name],
                allow_empty=len(indices) > 1,
            )
            outcome = RefreshOutcome(name, action, reason, new, new.live_docs)
        outcomes.append(outcome)
    return outcomes


def _rebuild_reason(info: SnapshotInfo, current: IndexMarks | None) -> str:
    if current is None:
        return "sequence numbers unavailable"
    if not info.exact_marks:
        return "writes landed during the last build"
    if info.marks.uuid != current.uuid:
        return "index was recreated"
    if not incremental_possible(info.marks, current):
        return "shard layout changed or writes in flight"
    return "updates or deletes since the snapshot"


async def _try_incremental(
    session: aiohttp.ClientSession,
    base_url: str,
    name: str,
    field: str,
    headers: Mapping[str, str],
    store: str,
    info: SnapshotInfo,
    current: IndexMarks,
    batch_size: int,
    concurrency: int,
) -> RefreshOutcome | None:
    """Add the documents appended since the snapshot; None when that would not be exact."""
    started = time.perf_counter()
    await refresh_index(session, base_url, name, headers)
    ops = new_operations(info.marks, current)
    refs: dict[int, list[DocRef]] = {}
    for shard, (lo, hi) in ops.items():
        refs[shard] = await _docs_in_seq_range(session, base_url, name, shard, lo, hi, headers)
    live_now = await live_count(session, base_url, name, headers)
    found = {shard: len(r) for shard, r in refs.items()}
    if not appends_only(ops, found, info.live_docs, live_now):
        return None
    acc = EntropyAccumulator()

    async def pages() -> AsyncIterator[list[DocRef]]:
        for r in refs.values():
            yield r

    await fold_pages(
        session, base_url, pages(), field, headers, acc, batch_size=batch_size, concurrency=concurrency
    )
    after = (await index_marks(session, base_url, name, headers)).get(name)
    if after is None or not same_state(current, after) or acc.n_seen != sum(found.values()):
        return None  # a write raced the refresh: a rebuild is the safe answer
    old = await stats_store.load_exact(session, base_url, headers, info, store)
    if old is None:
        return None  # a snapshot without exact sums: rebuild rather than add rounded floats
    total = old + acc.finish_exact()  # integer sums, rounded once: bit-identical to a rebuild
    new_info = snapshot_info(
        name,
        field,
        total.stats,
        current,
        live_now,
        True,
        time.perf_counter() - started,
        "refresh",
        exact_units=True,
    )
    await stats_store.publish(session, base_url, headers, new_info, total.stats, store, total.units)
    return RefreshOutcome(name, "incremental", "only appends since the snapshot", new_info, acc.n_seen)


async def _docs_in_seq_range(
    session: aiohttp.ClientSession,
    base_url: str,
    index: str,
    shard: int,
    lo: int,
    hi: int,
    headers: Mapping[str, str],
    page: int = 1000,
) -> list[DocRef]:
    """Live documents of one shard whose `_seq_no` lies in (lo, hi], paged on `_seq_no`."""
    out: list[DocRef] = []
    after: list[Any] | None = None
    url = f"{base_url}/{quote(index)}/_search?preference=_shards:{shard}"
    while True:
        body: dict[str, Any] = {
            "size": page,
            "_source": False,
            "query": {"range": {"_seq_no": {"gt": lo, "lte": hi}}},
            "sort": [{"_seq_no": "asc"}],
            "track_total_hits": False,
        }
        if after is not None:
            body["search_after"] = after
        hits = (await request_json(session, "POST", url, body, headers))["hits"]["hits"]
        out.extend(DocRef(h["_index"], h["_id"], h.get("_routing")) for h in hits)
        if len(hits) < page:
            return out
        after = hits[-1]["sort"]


def snapshot_info(
    name: str,
    field: str,
    stats: CorpusStats,
    marks: IndexMarks,
    live_docs: int,
    exact: bool,
    seconds: float,
    method: str,
    *,
    exact_units: bool = False,
) -> SnapshotInfo:
    """Describe statistics about to be published under a fresh snapshot id (CHUNK_TERMS per chunk)."""
    n_chunks = max(1, -(-stats.vocabulary_size // CHUNK_TERMS))
    return SnapshotInfo(
        uuid.uuid4().hex,
        name,
        field,
        stats.n_docs,
        stats.total_length,
        stats.vocabulary_size,
        n_chunks,
        live_docs,
        marks,
        exact,
        now_iso(),
        round(seconds, 3),
        method,
        exact_units,
    )


def sum_in_order(parts: Sequence[CorpusStats]) -> CorpusStats:
    """Sum statistics in the given order (callers pass indices sorted by name: a fixed float order).
    One part is returned as is: no re-sorting of a large vocabulary for the common single index."""
    if not parts:
        return CorpusStats.empty()
    total = parts[0]
    for part in parts[1:]:
        total = total + part
    return total


# --- freshness ------------------------------------------------------------------------------------


async def freshness(
    session: aiohttp.ClientSession,
    base_url: str,
    index_expr: str,
    field: str,
    headers: Mapping[str, str],
    *,
    store: str = DEFAULT_STORE,
) -> list[Freshness]:
    """Per concrete index: the stored snapshot and whether the index changed since (cheap: three calls)."""
    indices = await resolve_text_field(session, base_url, index_expr, field, headers)
    pointers, marks = await asyncio.gather(
        stats_store.read_pointers(session, base_url, headers, [(i, field) for i in indices], store),
        _marks_or_none(session, base_url, index_expr, headers),
    )
    return [
        judge(name, field, pointers.get((name, field)), None if marks is None else marks.get(name))
        for name in indices
    ]


def judge(index: str, field: str, info: SnapshotInfo | None, current: IndexMarks | None) -> Freshness:
    """Freshness of one index from its snapshot info and current markers (pure)."""
    if info is None:
        return Freshness(index, field, None, current, None, "no snapshot: estimated mode", None)
    if current is None:
        return Freshness(index, field, info, None, None, "sequence numbers unavailable", None)
    ops = current.operations - info.marks.operations
    if info.marks.uuid != current.uuid:
        return Freshness(index, field, info, current, True, "index was recreated since the snapshot", None)
    if drifted(info.marks, current):
        return Freshness(index, field, info, current, True, f"{ops} write(s) since the snapshot", ops)
    if not info.exact_marks:
        return Freshness(index, field, info, current, True, "writes landed during the build", 0)
    return Freshness(index, field, info, current, False, "up to date", 0)


async def _marks_or_none(
    session: aiohttp.ClientSession, base_url: str, index_expr: str, headers: Mapping[str, str]
) -> dict[str, IndexMarks] | None:
    """Markers, or None when the caller may not read index stats (freshness then reads as unknown)."""
    try:
        return await index_marks(session, base_url, index_expr, headers)
    except UpstreamError as exc:
        if exc.status in (401, 403):
            return None
        raise


async def describe(
    session: aiohttp.ClientSession,
    base_url: str,
    index_expr: str,
    field: str,
    headers: Mapping[str, str],
    terms: Sequence[str] = (),
    *,
    store: str = DEFAULT_STORE,
) -> dict[str, Any]:
    """What `stats show --json` prints: the summed statistics the proxy would use, their freshness per
    index, and df / raw entropy of `terms` (given in their indexed, analyzed form)."""
    view = await StatsCache(session, base_url, store=store).get(index_expr, field, headers)
    view = await view.for_terms(terms)
    fresh = await freshness(session, base_url, index_expr, field, headers, store=store)
    df, entropy = view.corpus.lookup(terms)
    return {
        "index": index_expr,
        "field": field,
        "n_docs": view.corpus.n_docs,
        "total_length": view.corpus.total_length,
        "avgdl": view.corpus.avgdl,
        # estimated mode holds only the terms asked about: its vocabulary size means nothing
        "vocabulary_size": None if view.estimated else view.corpus.vocabulary_size,
        "estimated": view.estimated,
        "stale": view.stale,
        "built_at": view.built_at,
        "freshness": [f.to_json() for f in fresh],
        "terms": {t: {"df": int(d), "entropy": float(e)} for t, d, e in zip(terms, df, entropy, strict=True)},
    }


def _age_seconds(iso: str) -> float:
    from datetime import datetime, timezone

    return round((datetime.now(timezone.utc) - datetime.fromisoformat(iso)).total_seconds(), 1)


# --- query time -----------------------------------------------------------------------------------


@dataclass
class _Entry:
    view: StatsView
    checked_at: float
    snapshots: tuple[str, ...]  # snapshot ids behind the view; () in estimated mode
    indices: tuple[str, ...]
    estimate: _Estimate | None = None


@dataclass
class _Estimate:
    """Estimated-mode numbers fetched so far for one (expression, field)."""

    n_docs: int
    total_length: int
    df: dict[str, int]
    ttf: dict[str, float]


class StatsCache:
    """Statistics per (index expression, field) for the proxy: loaded once, checked for drift at most
    every `check_interval` seconds (pointer + markers: two small calls), reloaded when another sidecar
    published a new snapshot. Loaded snapshots are shared between expressions naming the same index."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        *,
        check_interval: float = 5.0,
        store: str = DEFAULT_STORE,
        estimator: str = estimate.DEFAULT_ESTIMATOR,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.session = session
        self.base_url = base_url.rstrip("/")
        self.check_interval = check_interval
        self.store = store
        self.estimator = estimate.ESTIMATORS[estimator]
        self.clock = clock
        self._entries: dict[tuple[str, str], _Entry] = {}
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._loaded: dict[str, CorpusStats] = {}  # snapshot id -> statistics

    async def get(self, index_expr: str, field: str, headers: Mapping[str, str]) -> StatsView:
        """Statistics for an index expression (name, alias, or pattern) and field, summed over its
        indices; loads from the store, caches in memory, checks drift at most every check_interval s;
        falls back to the estimated mode when no snapshot exists. Uses the caller's headers for every
        cluster call."""
        key = (index_expr, field)
        entry = self._entries.get(key)
        if entry is not None and self.clock() - entry.checked_at < self.check_interval:
            return self._for_caller(index_expr, field, headers, entry)
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:  # one check per key at a time; waiters reuse its result
            entry = self._entries.get(key)
            if entry is not None and self.clock() - entry.checked_at < self.check_interval:
                return self._for_caller(index_expr, field, headers, entry)
            try:
                fresh = await self._check(index_expr, field, headers, entry)
            except SearchError as exc:
                if entry is None or isinstance(exc, UpstreamError) or exc.status not in (502, 504):
                    raise
                # The cluster did not answer the check: keep serving what we have (the statistics of
                # a moment ago beat none) and try again after the next interval.
                log.warning(
                    "statistics check failed, serving the cached view", extra={"fields": {"error": exc.type}}
                )
                entry.checked_at = self.clock()
                return self._for_caller(index_expr, field, headers, entry)
            self._entries[key] = fresh
            return self._for_caller(index_expr, field, headers, fresh)

    async def _check(
        self, index_expr: str, field: str, headers: Mapping[str, str], old: _Entry | None
    ) -> _Entry:
        indices = await resolve_text_field(self.session, self.base_url, index_expr, field, headers)
        pointers, marks = await asyncio.gather(
            stats_store.read_pointers(
                self.session, self.base_url, headers, [(i, field) for i in indices], self.store
            ),
            _marks_or_none(self.session, self.base_url, index_expr, headers),
        )
        infos = [pointers.get((i, field)) for i in indices]
        if any(info is None for info in infos):
            missing = [i for i, info in zip(indices, infos, strict=True) if info is None]
            log.info("no statistics snapshot: estimated mode", extra={"fields": {"indices": missing}})
            return await self._estimated(index_expr, field, headers, tuple(indices))
        snapshots = tuple(info.snapshot for info in infos if info)
        verdicts = [
            judge(i, field, info, None if marks is None else marks.get(i))
            for i, info in zip(indices, infos, strict=True)
        ]
        stale = any(v.stale for v in verdicts)
        if old is not None and old.snapshots == snapshots:
            view = StatsView(old.view.corpus, False, stale, old.view.built_at)
            return _Entry(view, self.clock(), snapshots, tuple(indices))
        parts = await asyncio.gather(*(self._load(info, headers) for info in infos if info))
        built_at = min(info.built_at for info in infos if info)
        view = StatsView(sum_in_order(parts), False, stale, built_at)
        live = set(snapshots) | {s for e in self._entries.values() for s in e.snapshots}
        self._loaded = {s: c for s, c in self._loaded.items() if s in live}
        return _Entry(view, self.clock(), snapshots, tuple(indices))

    async def _load(self, info: SnapshotInfo, headers: Mapping[str, str]) -> CorpusStats:
        cached = self._loaded.get(info.snapshot)
        if cached is None:
            cached = await stats_store.load(self.session, self.base_url, headers, info, self.store)
            self._loaded[info.snapshot] = cached
        return cached

    # estimated mode -----------------------------------------------------------------------------

    async def _estimated(
        self,
        index_expr: str,
        field: str,
        headers: Mapping[str, str],
        indices: tuple[str, ...],
    ) -> _Entry:
        base = await estimate_base(self.session, self.base_url, index_expr, indices, field, headers)
        est = _Estimate(base[0], base[1], {}, {})
        view = StatsView(CorpusStats(base[0], base[1], terms_array([]), [], []), True, False, None)
        return _Entry(view, self.clock(), (), indices, est)

    def _for_caller(
        self, index_expr: str, field: str, headers: Mapping[str, str], entry: _Entry
    ) -> StatsView:
        """The entry's view; in estimated mode one whose `for_terms` fetches with `headers`, the
        credentials of the caller it is handed to (not those of whoever filled the cache)."""
        if entry.estimate is None:
            return entry.view
        headers = dict(headers)

        async def complete(wanted: Sequence[str]) -> StatsView:
            est = entry.estimate
            assert est is not None
            missing = sorted({t for t in wanted if t not in est.df})
            if missing:
                got = await estimate_terms(
                    self.session, self.base_url, index_expr, entry.indices, field, missing, headers
                )
                for term, (d, t) in got.items():
                    est.df[term] = d
                    est.ttf[term] = t
                entry.view = StatsView(self._estimated_corpus(est), True, False, None)
            return self._for_caller(index_expr, field, headers, entry)

        return dataclasses.replace(entry.view, _complete=complete)

    def _estimated_corpus(self, est: _Estimate) -> CorpusStats:
        terms = sorted(est.df)
        df = np.array([est.df[t] for t in terms], np.int64)
        ttf = np.array([est.ttf[t] for t in terms], np.float64)
        keep = df > 0
        return CorpusStats(
            est.n_docs,
            est.total_length,
            terms_array(np.array(terms, dtype=object)[keep].tolist()),
            df[keep],
            self.estimator(df[keep], ttf[keep]),
        )


async def estimate_base(
    session: aiohttp.ClientSession,
    base_url: str,
    index_expr: str,
    indices: Sequence[str],
    field: str,
    headers: Mapping[str, str],
) -> tuple[int, int]:
    """N (live documents with the field, all shards; unlike a snapshot's N this includes documents whose
    value analyzes to no token: the exact count would need a `*` wildcard over the whole vocabulary on
    every check) and an estimated total length: N times the
    average length Lucene's field statistics give on one shard (shard-local, deleted documents
    included, hence an estimate)."""
    count_body = {"query": {"exists": {"field": field}}}
    n_docs = int(
        (
            await request_json(
                session, "POST", f"{base_url}/{quote(index_expr, safe=',*')}/_count", count_body, headers
            )
        )["count"]
    )
    body = {
        "doc": {field: "x"},
        "fields": [field],
        "field_statistics": True,
        "term_statistics": False,
        "positions": False,
        "offsets": False,
    }
    tv = await request_json(session, "POST", f"{base_url}/{quote(indices[0])}/_termvectors", body, headers)
    fstats = tv.get("term_vectors", {}).get(field, {}).get("field_statistics") or {}
    doc_count, sum_ttf = fstats.get("doc_count", 0), fstats.get("sum_ttf", 0)
    avgdl = sum_ttf / doc_count if doc_count > 0 and sum_ttf > 0 else 1.0
    return n_docs, int(round(avgdl * n_docs))


async def estimate_terms(
    session: aiohttp.ClientSession,
    base_url: str,
    index_expr: str,
    indices: Sequence[str],
    field: str,
    terms: Sequence[str],
    headers: Mapping[str, str],
) -> dict[str, tuple[int, float]]:
    """Per term: exact live df over all shards (`_msearch` of term counts) and an estimated ttf = df times
    the mean tf one shard's term statistics give (the artificial-document `_termvectors` trick)."""
    lines = []
    for term in terms:
        lines.append(orjson.dumps({"index": index_expr}))
        lines.append(orjson.dumps({"size": 0, "track_total_hits": True, "query": {"term": {field: term}}}))
    answer = await stats_store.post_ndjson(
        session, f"{base_url}/_msearch", lines, headers, "bmx_estimate_exception"
    )
    answers = answer["responses"]
    df = {}
    for term, ans in zip(terms, answers, strict=True):
        if "error" in ans:
            err = ans["error"]
            raise UpstreamError(
                ans.get("status", 500), err.get("type", "bmx_estimate_exception"), err.get("reason", "")
            )
        df[term] = int(ans["hits"]["total"]["value"])
    ratio: dict[str, float] = {}
    body_tv = {
        # The terms are already analyzed: split them on whitespace only, so a stemming analyzer
        # cannot turn them into other terms before their statistics are looked up.
        "doc": {field: " ".join(terms)},
        "per_field_analyzer": {field: "whitespace"},
        "fields": [field],
        "term_statistics": True,
        "field_statistics": False,
        "positions": False,
        "offsets": False,
    }
    tv = await request_json(session, "POST", f"{base_url}/{quote(indices[0])}/_termvectors", body_tv, headers)
    for term, data in (tv.get("term_vectors", {}).get(field, {}).get("terms") or {}).items():
        d, t = data.get("doc_freq", 0), data.get("ttf", 0)
        if d and t:
            ratio[term] = t / d
    return {term: (df[term], df[term] * ratio.get(term, 1.0)) for term in terms}
