"""The imperative shell of a rerank: the calls to the cluster, overlapped, around the pure verbs.

For one search: `_analyze` of the query (and augmentations) and the statistics lookup start together
with the first-stage search; once the window is back, the term vectors of the hits the cache misses
are fetched in one `_mtermvectors`; then `rescore` and `pack`."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from bmx_rerank.errors import SearchError, UpstreamError
from bmx_rerank.metrics import Metrics
from bmx_rerank.rerank import filter_path
from bmx_rerank.rerank.candidates import TermVectorCache, cache_key, caller, doc_refs
from bmx_rerank.rerank.pack import fallback, pack
from bmx_rerank.rerank.plan import Plan
from bmx_rerank.rerank.rescore import rescore
from bmx_rerank.rerank.stats_source import StatsSource
from bmx_rerank.stats.cache import StatsView
from bmx_rerank.upstream import DocTerms, analyze, mtermvectors, search_analyzer

log = logging.getLogger("bmx_rerank.proxy")

ON_ERROR = ("fallback", "fail")
ANALYZER_TTL = 60.0  # seconds a field's search analyzer is remembered (mappings change rarely)
ANALYZER_CACHE = 4096  # (index, field) pairs remembered at most


@dataclass
class SideCalls:
    """Calls started before the first stage returns; awaited (or cancelled) once it has."""

    index_expr: str
    plan: Plan
    tokens: asyncio.Task[list[list[str]]] | None
    stats: asyncio.Task[StatsView]

    def cancel(self) -> None:
        for task in (self.tokens, self.stats):
            if task is not None and not task.done():
                task.cancel()
            elif task is not None and not task.cancelled():
                task.exception()  # retrieved, so asyncio does not warn about it


@dataclass
class Outcome:
    body: dict[str, Any]
    kind: str  # "bmx" | "bm25" | "fallback"


class Reranker:
    """Reranks windows for one upstream; shared by every request of a proxy app."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        stats: StatsSource,
        metrics: Metrics,
        *,
        cache: TermVectorCache | None = None,
        timeout: float | None = 30.0,
        on_error: str = "fallback",
    ) -> None:
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
        self.session = session
        self.base_url = base_url
        self.stats = stats
        self.metrics = metrics
        self.cache = cache if cache is not None else TermVectorCache()
        self.timeout = timeout
        self.on_error = on_error
        self._analyzers: dict[tuple[str, str], tuple[float, str | None]] = {}

    def start(self, index_expr: str, plan: Plan, headers: Mapping[str, str]) -> SideCalls:
        """Start analysis and the statistics lookup, to overlap with the first stage."""
        assert plan.spec is not None
        tokens = None
        if _single_index(index_expr):
            tokens = asyncio.ensure_future(self._tokens(index_expr, plan, headers))
        stats = asyncio.ensure_future(
            self._timed("stats", self.stats.get(index_expr, plan.spec.field, headers))
        )
        return SideCalls(index_expr, plan, tokens, stats)

    async def finish(
        self, side: SideCalls, response: Mapping[str, Any], headers: Mapping[str, str]
    ) -> Outcome:
        """Rerank the first stage's answer; on failure fall back or raise, as configured."""
        plan = side.plan
        assert plan.spec is not None
        try:
            body = await self._rerank(side, response, headers)
            self.metrics.reranks.labels("reranked").inc()
            return Outcome(filter_path.apply(body, plan.filter_path), plan.spec.mode)
        except asyncio.CancelledError:
            side.cancel()
            raise
        except Exception as exc:  # any failure of the rerank itself: the policy decides
            side.cancel()
            error = exc if isinstance(exc, SearchError) else None
            kind = error.type if error else "bmx_rerank_exception"
            reason = error.reason if error else f"{exc.__class__.__name__}: {exc}"
            self.metrics.errors.labels(kind).inc()
            log.warning(f"rerank failed: {kind}", extra={"fields": {"error": kind, "reason": reason[:300]}})
            if self.on_error == "fail":
                self.metrics.reranks.labels("failed").inc()
                raise (error or SearchError(500, kind, reason)) from exc
            self.metrics.reranks.labels("fallback").inc()
            marker = {
                "reranked": False,
                "fallback": True,
                **plan.spec.marker(),
                "error": {"type": kind, "reason": reason},
            }
            return Outcome(filter_path.apply(fallback(response, plan, marker), plan.filter_path), "fallback")

    async def _rerank(self, side: SideCalls, response: Mapping[str, Any], headers: Mapping[str, str]) -> dict:
        plan = side.plan
        spec = plan.spec
        assert spec is not None
        hits = response.get("hits", {}).get("hits", [])
        if not hits:
            side.cancel()
            marker = {"reranked": True, **spec.marker(), "estimated": None, "stale": None, "candidates": 0}
            return fallback(response, plan, marker)
        tokens = await self._tokens_after(side, hits, headers)
        refs_docs = self._term_vectors(hits, spec.field, headers)
        docs, view = await asyncio.gather(refs_docs, self._complete(side.stats, tokens))
        weights = [1.0, *spec.augment.weights]
        scored = rescore(view.corpus, docs, tokens, weights, spec.scoring_request())
        marker = {
            "reranked": True,
            **spec.marker(),
            "estimated": bool(view.estimated),
            "stale": bool(view.stale),
            "built_at": view.built_at,
            "candidates": len(hits),
        }
        return pack(response, scored, plan, marker)

    async def _complete(self, stats: Awaitable[StatsView], tokens: Sequence[Sequence[str]]) -> StatsView:
        """The statistics view, completed for the query's terms (estimated mode fetches them lazily)."""
        view = await stats
        vocabulary = list(dict.fromkeys(t for query in tokens for t in query))
        return await self._timed("stats_terms", view.for_terms(vocabulary))

    async def _tokens_after(
        self, side: SideCalls, hits: Sequence[Mapping[str, Any]], headers
    ) -> list[list[str]]:
        """Analysed tokens; for a pattern/alias over several indices, analysed on the first hit's index."""
        if side.tokens is not None:
            try:
                return await side.tokens
            except UpstreamError as exc:
                if exc.status not in (400, 404):
                    raise
        return await self._tokens(hits[0]["_index"], side.plan, headers)

    async def _tokens(self, index: str, plan: Plan, headers: Mapping[str, str]) -> list[list[str]]:
        assert plan.spec is not None
        field = plan.spec.field
        analyzer = await self._search_analyzer(index, field, headers)
        texts = [plan.query_text, *plan.spec.augment.queries]
        return list(await asyncio.gather(*(self._analyze(index, field, t, headers, analyzer) for t in texts)))

    async def _search_analyzer(self, index: str, field: str, headers: Mapping[str, str]) -> str | None:
        """The field's search analyzer, if its mapping sets one (and the caller may read the mapping).

        A mapping read is remembered for ANALYZER_TTL seconds and shared by every caller: it is the
        index's, not the caller's, and who may search the index learns nothing else from it (each caller
        still runs `_analyze` and the search with its own credentials). A failed read is not
        remembered: one caller without view_index_metadata (or a missing index) must not decide the
        analyzer of the others, nor fill the memory with names of indices that do not exist."""
        key = (index, field)
        cached = self._analyzers.get(key)
        if cached is not None and cached[0] > time.monotonic():
            return cached[1]
        try:
            name = await self._timed(
                "mapping", search_analyzer(self.session, self.base_url, index, field, headers, self.timeout)
            )
        except UpstreamError as exc:
            # Reading mappings needs view_index_metadata, which a search-only user may lack: analyze
            # with the field then, which is exact unless the mapping sets a search_analyzer.
            if exc.status not in (400, 401, 403, 404, 405):
                raise
            return None
        self._analyzers.pop(key, None)
        self._analyzers[key] = (time.monotonic() + ANALYZER_TTL, name)
        while len(self._analyzers) > ANALYZER_CACHE:
            del self._analyzers[next(iter(self._analyzers))]
        return name

    async def _analyze(
        self, index: str, field: str, text: str, headers: Mapping[str, str], analyzer: str | None
    ) -> list[str]:
        if not text.strip():
            return []
        return await self._timed(
            "analyze",
            analyze(
                self.session, self.base_url, index, field, text, headers, self.timeout, analyzer=analyzer
            ),
        )

    async def _term_vectors(
        self, hits: Sequence[Mapping[str, Any]], field: str, headers: Mapping[str, str]
    ) -> list[DocTerms]:
        refs = doc_refs(hits)
        who = caller(headers)
        keys = [cache_key(h, field, who) for h in hits]
        found: list[DocTerms | None] = [self.cache.get(k) for k in keys]
        missing = [i for i, d in enumerate(found) if d is None]
        self.metrics.cache.labels("hit").inc(len(hits) - len(missing))
        self.metrics.cache.labels("miss").inc(len(missing))
        if missing:
            fetched = await self._timed(
                "termvectors",
                mtermvectors(
                    self.session,
                    self.base_url,
                    [refs[i] for i in missing],
                    field,
                    headers,
                    self.timeout,
                    realtime=False,  # the refreshed view the hits (and their _seq_no) come from
                ),
            )
            for i, terms in zip(missing, fetched, strict=True):
                found[i] = terms
                self.cache.put(keys[i], terms)
        return [d for d in found if d is not None]

    async def _timed(self, call: str, awaitable: Awaitable[Any]) -> Any:
        start = time.perf_counter()
        try:
            return await awaitable
        finally:
            self.metrics.upstream_seconds.labels(call).observe(time.perf_counter() - start)


def _single_index(index_expr: str) -> bool:
    """An expression `_analyze` accepts before we know which indices the hits come from."""
    return bool(index_expr) and not any(c in index_expr for c in "*,") and not index_expr.startswith("_")
