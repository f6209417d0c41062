"""The proxy's statistics: `StatsCache.get` per search, loading snapshots once, checking drift at most
every `check_interval` seconds, and falling back to the estimated mode when an index has no snapshot.

The hot path only; building and refreshing snapshots is `bmx_rerank.stats.build`."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

import aiohttp
import numpy as np

from bmx_rerank.errors import SearchError, UpstreamError
from bmx_rerank.stats import estimate, store
from bmx_rerank.stats.corpus import CorpusStats, sum_in_order, terms_array
from bmx_rerank.stats.freshness import judge
from bmx_rerank.stats.store import DEFAULT_STORE, SnapshotInfo
from bmx_rerank.stats.sweep import marks_or_none, resolve_text_field

log = logging.getLogger(__name__)


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
            store.read_pointers(
                self.session, self.base_url, headers, [(i, field) for i in indices], self.store
            ),
            marks_or_none(self.session, self.base_url, index_expr, headers),
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
            cached = await store.load(self.session, self.base_url, headers, info, self.store)
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
        base = await estimate.estimate_base(self.session, self.base_url, index_expr, indices, field, headers)
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
                got = await estimate.estimate_terms(
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
