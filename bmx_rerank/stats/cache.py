"""The proxy's statistics: `StatsCache.get` per search, loading snapshots once, checking drift at most
every `check_interval` seconds, and falling back to the estimated mode when an index has no snapshot.

The hot path only; building and refreshing snapshots is `bmx_rerank.stats.build`."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import aiohttp
import numpy as np
from cachetools import LRUCache

from bmx_rerank import defaults
from bmx_rerank.errors import SearchError, UpstreamError, timed_out
from bmx_rerank.identity import IDENTITY_HEADERS, caller
from bmx_rerank.singleflight import SingleFlight
from bmx_rerank.stats import estimate, length_files, store
from bmx_rerank.stats.corpus import CorpusStats, sum_in_order, terms_array
from bmx_rerank.stats.freshness import judge
from bmx_rerank.stats.length_index import LengthIndex, default_dir
from bmx_rerank.stats.snapshot import SnapshotInfo
from bmx_rerank.stats.store import DEFAULT_STORE
from bmx_rerank.stats.sweep import marks_or_none, resolve_text_field
from bmx_rerank.upstream import Cluster

log = logging.getLogger(__name__)

MAX_ENTRIES = 4096  # (caller, expression, field) views kept at most
LENGTH_WAIT = 10.0  # seconds a view waits for its length tables to be written before it goes without
LENGTH_RETRY = 60.0  # seconds before a failed length table is written again
# Seconds a search waits for its view's due check (three small calls, a few milliseconds) before it is
# served the view unconfirmed, marked stale: the marker's `stale: false` is never a guess.
CHECK_WAIT = 0.25


class LengthTable(Protocol):
    """What a search asks of a length table: `DocLengths` (tests, `FixedStats`) or, in the proxy, the
    memory-mapped `LengthIndex` every worker shares."""

    by_version: bool  # found without `_id`, given the hit's shard (`LengthIndex.by_version`)
    # shards a `by_version` table spans: a hit's shard number is in [0, shards), and needed unless 1;
    # 0 for a table keyed by `_id` (`DocLengths`), which takes no shard number
    shards: int

    def __len__(self) -> int: ...

    def find(
        self,
        ids: Sequence[str],
        routings: Sequence[str | None],
        seq_nos: Sequence[object],
        primary_terms: Sequence[object],
        shards: Sequence[object] | None = None,
    ) -> np.ndarray:
        """Each hit's length, int64, -1 where the table does not hold its exact version."""


_Key = tuple[str, str, str]  # (caller digest, index expression, field)


@dataclass(frozen=True)
class StatsView:
    """Statistics for one search: the corpus numbers and how far to trust them."""

    corpus: CorpusStats
    estimated: bool  # no exact snapshot: entropy estimated from df and ttf (see `estimate`)
    stale: bool  # drift detected since the snapshot was built
    built_at: str | None  # ISO timestamp of the (oldest) snapshot, None if estimated
    # concrete index name -> the exact document lengths its snapshot holds (`stats.lengths`); None, or
    # an index absent: no table (estimated mode, built without, re-created index): `_mtermvectors`
    lengths: Mapping[str, LengthTable] | None = None
    _complete: Callable[[Sequence[str]], Awaitable[StatsView]] | None = field(
        default=None, repr=False, compare=False
    )

    @property
    def complete(self) -> bool:
        """Whether it holds every term already (exact statistics): `for_terms` would fetch nothing."""
        return self._complete is None

    async def for_terms(self, terms: Sequence[str]) -> StatsView:
        """This view with `terms` guaranteed present: a no-op for exact statistics (they hold the whole
        vocabulary); in estimated mode it fetches df and ttf of the terms not yet estimated."""
        if self._complete is None:
            return self
        return await self._complete(terms)


# --- query time -----------------------------------------------------------------------------------


@dataclass
class _Entry:
    view: StatsView
    checked_at: float
    snapshots: tuple[str, ...]  # snapshot ids behind the view; () in estimated mode
    indices: tuple[str, ...]
    estimate: _Estimate | None = None
    tables: Mapping[str, LengthTable] | None = None  # every loaded length table, before the UUID check


@dataclass
class _Estimate:
    """Estimated-mode numbers fetched so far for one (expression, field)."""

    n_docs: int
    total_length: int
    df: dict[str, int]
    ttf: dict[str, float]


class StatsCache:
    """Statistics per (caller, index expression, field) for the proxy.

    Per caller: an expression such as `logs-*` resolves to the indices that caller may search (the
    cluster resolves `_field_caps` with its credentials), so one caller's sums never answer another
    with different rights, and estimated-mode numbers (fetched under the caller's document-level
    security) are never shared. Callers are told apart by a digest of their authentication headers.

    Each view is checked for drift at most every `check_interval` seconds (pointer + markers: two
    small calls), reloaded when another sidecar published a new snapshot. Past the interval one check
    runs for every search; they wait for it at most `CHECK_WAIT` seconds, then are served the cached
    view marked stale while it goes on; a caller with no view waits, never longer than `timeout`.
    Loaded snapshots are shared by snapshot id: a caller reaches one only through a pointer it read
    with its own credentials.

    Length tables are memory-mapped files under `lengths_dir` (default `length_index.default_dir()`),
    one per snapshot, written by the first process that needs one and mapped by every other: N serving
    processes share one copy in the page cache (`stats.length_index`)."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        *,
        check_interval: float = 5.0,
        store: str = DEFAULT_STORE,
        estimator: str = estimate.DEFAULT_ESTIMATOR,
        clock: Callable[[], float] = time.monotonic,
        timeout: float = defaults.TIMEOUT,
        identity_headers: Sequence[str] = IDENTITY_HEADERS,
        max_entries: int = MAX_ENTRIES,
        lengths_dir: str | Path | None = None,
    ) -> None:
        self.cluster = Cluster(session, base_url)
        self.check_interval = check_interval
        self.store = store
        self.estimator = estimate.ESTIMATORS[estimator]
        self.clock = clock
        self.timeout = timeout
        self.identity_headers = tuple(identity_headers)
        self._entries: LRUCache[_Key, _Entry] = LRUCache(max_entries)
        self._refreshing: SingleFlight[_Key, _Entry] = SingleFlight()
        self._loaded: dict[str, CorpusStats] = {}  # snapshot id -> statistics
        self._lengths: dict[str, LengthIndex | None] = {}  # snapshot id -> its length table
        self.lengths_dir = Path(lengths_dir) if lengths_dir is not None else default_dir()
        self._building: dict[str, asyncio.Task[LengthIndex]] = {}  # file ident -> its build
        self._failed: dict[str, float] = {}  # file ident -> when its build failed
        self.length_wait = min(LENGTH_WAIT, timeout / 2)
        self.length_retry = LENGTH_RETRY
        self.check_wait = CHECK_WAIT

    async def get(self, index_expr: str, field: str, headers: Mapping[str, str]) -> StatsView:
        """Statistics for an index expression (name, alias, or pattern) and field, summed over the
        indices the caller may search; loads from the store, caches in memory, checks drift at most
        every check_interval s; falls back to the estimated mode when no snapshot exists. Uses the
        caller's headers for every cluster call."""
        if (view := self.cached(index_expr, field, headers)) is not None:
            return view
        key = (caller(headers, self.identity_headers), index_expr, field)
        entry = self._entries.get(key)
        if entry is not None:  # checked `check_interval` ago or more: one check for every search
            check = self._refreshing.start(key, lambda: self._refreshed(key, dict(headers), entry))
            try:  # it says whether the index moved on since (the marker's `stale`)
                checked = await asyncio.wait_for(asyncio.shield(check), self.check_wait)
            except asyncio.TimeoutError:
                # a slow cluster: the view as it was, not confirmed, so marked stale and without its
                # length tables (used only while the index UUID behind them was confirmed within
                # `check_interval`: a re-created index would match old versions); the check goes on
                view = self._for_caller(index_expr, field, headers, entry)
                return dataclasses.replace(view, stale=True, lengths=None)
            return self._for_caller(index_expr, field, headers, checked)
        # Nothing yet: wait for the one load of this key (bounded by `timeout`); a caller giving up
        # does not cancel it for the others.
        fresh = await self._refreshing.run(key, lambda: self._refreshed(key, dict(headers), None))
        return self._for_caller(index_expr, field, headers, fresh)

    def cached(self, index_expr: str, field: str, headers: Mapping[str, str]) -> StatsView | None:
        """`get`'s view where it answers at once, from memory and checked within `check_interval`;
        None where `get` would load or refresh it."""
        entry = self._entries.get((caller(headers, self.identity_headers), index_expr, field))
        if entry is None or self.clock() - entry.checked_at >= self.check_interval:
            return None
        return self._for_caller(index_expr, field, headers, entry)

    async def settled(self) -> None:
        """Wait for the background refreshes under way (tests, shutdown)."""
        await self._refreshing.settled()

    async def _refreshed(self, key: _Key, headers: Mapping[str, str], old: _Entry | None) -> _Entry:
        _, index_expr, field = key
        try:
            try:
                fresh = await asyncio.wait_for(self._check(index_expr, field, headers, old), self.timeout)
            except asyncio.TimeoutError as exc:
                raise timed_out(
                    f"statistics of [{index_expr}] field [{field}] took longer than {self.timeout}s"
                ) from exc
        except SearchError as exc:
            transient = not isinstance(exc, UpstreamError) and exc.status in (502, 504)
            if old is not None and transient:
                # The cluster did not answer the check: keep serving what we have (the statistics of
                # a moment ago beat none) and try again after the next interval.
                log.warning(
                    "statistics check failed, serving the cached view", extra={"fields": {"error": exc.type}}
                )
                old.checked_at = self.clock()
                return old
            if (
                old is not None
            ):  # the cluster said no (rights revoked, index gone): the next search asks again
                self._entries.pop(key, None)
            raise
        self._entries[key] = fresh
        return fresh

    async def _check(
        self, index_expr: str, field: str, headers: Mapping[str, str], old: _Entry | None
    ) -> _Entry:
        indices = await resolve_text_field(self.cluster, index_expr, field, headers)
        pointers, marks = await asyncio.gather(
            store.read_pointers(self.cluster, headers, [(i, field) for i in indices], self.store),
            marks_or_none(self.cluster, index_expr, headers),
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
        same = [
            i
            for i, info in zip(indices, infos, strict=True)
            if info is not None and marks is not None and i in marks and marks[i].uuid == info.marks.uuid
        ]
        if old is not None and old.snapshots == snapshots:
            # a length table still being written when the view was made is picked up now
            await asyncio.gather(*(self._await_lengths(info, headers) for info in infos if info))
            tables = _tables(indices, infos, self._lengths)
            lengths = _same_index(tables, same)
            view = StatsView(old.view.corpus, False, stale, old.view.built_at, lengths)
            return _Entry(view, self.clock(), snapshots, tuple(indices), tables=tables)
        loaded = await asyncio.gather(*(self._load(info, headers) for info in infos if info))
        parts = [corpus for corpus, _ in loaded]
        tables = _tables(indices, infos, self._lengths)
        built_at = min(info.built_at for info in infos if info)
        view = StatsView(sum_in_order(parts), False, stale, built_at, _same_index(tables, same))
        live = set(snapshots) | {s for e in self._entries.values() for s in e.snapshots}
        self._loaded = {s: c for s, c in self._loaded.items() if s in live}
        self._lengths = {s: t for s, t in self._lengths.items() if s in live}
        return _Entry(view, self.clock(), snapshots, tuple(indices), tables=tables)

    async def _load(
        self, info: SnapshotInfo, headers: Mapping[str, str]
    ) -> tuple[CorpusStats, LengthIndex | None]:
        cached = self._loaded.get(info.snapshot)
        if cached is None:
            cached, _ = await asyncio.gather(
                store.load(self.cluster, headers, info, self.store),
                self._await_lengths(info, headers),
            )
            self._loaded[info.snapshot] = cached
        else:
            await self._await_lengths(info, headers)
        return cached, self._lengths.get(info.snapshot)

    async def _await_lengths(self, info: SnapshotInfo, headers: Mapping[str, str]) -> None:
        """Make the snapshot's length table (`self._lengths`) a mapped file: opened when a process
        already wrote it, else written from the store's chunks (one process at a time per file, under
        a lock). A build runs on its own: a view waits for it at most `length_wait` seconds and is
        served without the table meanwhile (hits then read `_mtermvectors`); a later check picks the
        table up. A failed build is logged and tried again after `length_retry` seconds."""
        snapshot = info.snapshot
        if snapshot in self._lengths:
            return
        if info.length_docs is None:
            self._lengths[snapshot] = None
            return
        ident = length_files.ident(self.cluster.base_url, self.store, info)
        path = self.lengths_dir / f"{ident}.bmxlen"
        opened = length_files.open_index(path, ident)
        if opened is not None:
            self._lengths[snapshot] = opened
            return
        task = self._building.get(ident)
        if task is None:
            if self.clock() - self._failed.get(ident, -math.inf) < self.length_retry:
                return
            task = asyncio.ensure_future(self._build_index(info, dict(headers), path, ident))
            self._building[ident] = task
            task.add_done_callback(lambda t: self._built(snapshot, ident, t))
        await asyncio.wait([task], timeout=self.length_wait)

    def _built(self, snapshot: str, ident: str, task: asyncio.Task[LengthIndex]) -> None:
        self._building.pop(ident, None)
        if task.cancelled() or task.exception() is not None:
            self._failed[ident] = self.clock()
            error = "cancelled" if task.cancelled() else repr(task.exception())
            log.warning("length table not built", extra={"fields": {"snapshot": snapshot, "error": error}})
            return
        self._failed.pop(ident, None)
        self._lengths[snapshot] = task.result()

    async def _build_index(
        self, info: SnapshotInfo, headers: Mapping[str, str], path: Path, ident: str
    ) -> LengthIndex:
        return await length_files.write(self.cluster, self.store, info, headers, path, ident)

    # estimated mode -----------------------------------------------------------------------------

    async def _estimated(
        self,
        index_expr: str,
        field: str,
        headers: Mapping[str, str],
        indices: tuple[str, ...],
    ) -> _Entry:
        base = await estimate.estimate_base(self.cluster, index_expr, indices, field, headers)
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
                try:
                    got = await asyncio.wait_for(
                        estimate.estimate_terms(
                            self.cluster, index_expr, entry.indices, field, missing, headers
                        ),
                        self.timeout,
                    )
                except asyncio.TimeoutError as exc:
                    raise timed_out(
                        f"term statistics of [{index_expr}] took longer than {self.timeout}s"
                    ) from exc
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


def _tables(
    indices: Sequence[str], infos: Sequence[SnapshotInfo | None], loaded: Mapping[str, LengthIndex | None]
) -> dict[str, LengthTable]:
    """Each index's length table, where its snapshot has one ready."""
    return {
        i: table
        for i, info in zip(indices, infos, strict=True)
        if info is not None and (table := loaded.get(info.snapshot)) is not None
    }


def _same_index(
    tables: Mapping[str, LengthTable] | None, same: Sequence[str]
) -> dict[str, LengthTable] | None:
    """The length tables of the indices that are still the one their snapshot was built from (same
    index UUID): a re-created index starts again at `_seq_no` 0, and its documents would match the
    old index's versions. Unknown markers (no right to read them) count as not the same."""
    kept = {i: tables[i] for i in same if tables and i in tables}
    return kept or None
