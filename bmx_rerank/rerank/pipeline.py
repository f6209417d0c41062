"""One rerank, end to end: the only way a front end (the proxy, the client wrappers) reranks.

    rerank(index, plan, headers, first_stage)
      augment   the LLM's queries, when the spec asks a provider for them, widen the first stage
      open      the window: its request, with the query's analysis and the statistics started beside it
      probe     term-frequency probes in the first stage, where they are safe and pay (`probing`);
                a lean first stage, reading no stored field, where the hits can be named without (`lean`)
      search    the first stage, through the front end's own `first_stage` (again without probes when
                the cluster refuses them)
      finish    term frequencies (`frequencies`), scores (`rescore`, `scoring`), the page (`pack`)
      close     whatever still runs is cancelled, on every path

A lean window that misses (`lean.Miss`) is searched again with the full first stage.

The front end passes its upstream call as `first_stage` and gets an `Outcome` back: the reranked body,
or the cluster's own answer to hand back as it is. `rerank_each` does the same for several windows sent
in one request (`_msearch`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Protocol, TypeVar
from urllib.parse import quote

import numpy as np
import orjson
from cachetools import LRUCache, TTLCache

from bmx_rerank import deadline as deadlines
from bmx_rerank import defaults
from bmx_rerank.errors import SearchError, UpstreamError, timed_out
from bmx_rerank.identity import IDENTITY_HEADERS, caller
from bmx_rerank.metrics import Metrics
from bmx_rerank.rerank import in_engine, lean, shards, tf_probe
from bmx_rerank.rerank.analysis import Analysis, AnalysisCache, AnalysisDeclined
from bmx_rerank.rerank.augment import LLMConfig, LLMProvider, feedback_terms, resolve_llm
from bmx_rerank.rerank.frequencies import HitTerms, Nameless, ProbedTerms, TermFrequencies, probed_bytes
from bmx_rerank.rerank.hits import HitColumns
from bmx_rerank.rerank.pack import fallback, pack, strip, wants_version
from bmx_rerank.rerank.plan import Plan
from bmx_rerank.rerank.probing import Prober
from bmx_rerank.rerank.query import Text, fields
from bmx_rerank.rerank.rescore import features_of, remembered, score_tree
from bmx_rerank.rerank.term_vector_cache import (
    Features,
    KeptScores,
    Naming,
    SeenWindow,
    TermVectorCache,
)
from bmx_rerank.rerank.widen import widen
from bmx_rerank.rerank.window import Tokens, Window, drop, known_index, window_digest, window_request
from bmx_rerank.stats.cache import StatsView
from bmx_rerank.stats.scan import index_settings
from bmx_rerank.stats.source import StatsSource
from bmx_rerank.upstream import Cluster, index_path

log = logging.getLogger("bmx_rerank.proxy")

if sys.version_info >= (3, 11):
    from asyncio import timeout_at
else:  # the same, before asyncio had it (aiohttp's own dependency there)
    from async_timeout import timeout_at

ON_ERROR = ("fallback", "fail")
THREAD_HITS = 1000  # windows this large are scored and packed in a worker thread, off the event loop
THREAD_BYTES = 1 << 20  # an answer this large is decoded in a worker thread, as the proxy parses one
T = TypeVar("T")
# Windows over several shards whose split between their shards is kept, per caller, to ask each shard
# for its share next time (`shards.shard_sizes`): a few ints each
SPLITS = 10_000
UNEVEN, UNEVEN_TTL = 1024, 600.0  # index expressions, seconds (`Reranker.uneven`)
# What each caller's index lets the engine score (`in_engine.Layout`), learned from its mapping and
# settings, or that the engine refused its script lately: a mapping changed (a length sub-field
# added, its documents filled) is seen within the minute
LAYOUTS, LAYOUT_TTL = 4096, 60.0
# Under `in_engine`, how often the engine scored each window lately, per caller (as
# `probing.SEEN_WINDOWS`). A window asked for more than ENGINE_SIGHTS times goes the sidecar's way once,
# which keeps it, and is the sidecar's warm rerank from then on. Measured on SciFact (RESULTS.md): the
# engine's rerank costs about 1.9x a `rescore`, the sidecar's warm one 1.6x, the sight that keeps a
# window 2.9x. So keeping pays after about three more sights, and a window is kept only once it has
# shown it repeats: a query's first pages stay the engine's (a rent-or-buy rule).
ENGINE_SCORED, ENGINE_SCORED_TTL, ENGINE_SIGHTS = 16384, 600.0, 3


@dataclass(frozen=True)
class Answer:
    """The cluster's answer to a first stage: its status, its JSON when a rerank can read it (None:
    not JSON, not an object, or not a success), and the front end's own form of it (`raw`: bytes and
    headers, a client's response object or exception), handed back as it is when not reranked."""

    status: int
    data: dict[str, Any] | None
    raw: Any = None
    # the answer's bytes, left for the rerank to decode (a lean window's `_msearch`: `shards.decode`;
    # an unprobed lean window's one search: `shards.decode_search`)
    payload: bytes | None = None
    columns: HitColumns | None = None  # its hits' columns, where read already (`shards.merge`)


class FirstStage(Protocol):
    """Sends one first-stage search (body, query parameters) the way the front end sends searches.
    `undecoded`: a successful answer's JSON may be left to the rerank (`Answer.payload`, no `data`),
    which decodes only what it reads of it; a front end that has it decoded already passes `data`."""

    def __call__(
        self, body: dict[str, Any] | None, params: Mapping[str, str], *, undecoded: bool = False
    ) -> Awaitable[Answer]: ...


class MultiSearch(Protocol):
    """Sends one `_msearch` (its NDJSON body, query parameters) the way the front end sends searches: a
    lean window's search of each of its shards in one request. Its answer is left undecoded
    (`Answer.payload`): the rerank decodes only what the merge reads (`shards.decode`)."""

    def __call__(self, body: bytes, params: Mapping[str, str]) -> Awaitable[Answer]: ...


class BatchFirstStage(Protocol):
    """Sends several windows' first stages in one request; the answer's data holds `responses`."""

    def __call__(self, windows: Mapping[int, Window]) -> Awaitable[Answer]: ...


@dataclass(frozen=True)
class Marker:
    """What happened to a search, as `X-BMX-Rerank` says it: the mode it was reranked with, or
    "fallback", or "skipped" with the reason."""

    kind: str  # "bmx" | "bm25" | "fallback" | "skipped"
    reason: str | None = None

    def __str__(self) -> str:
        return f"skipped; reason={self.reason}" if self.kind == "skipped" else self.kind


def _unscored(answer: Answer) -> str | None:
    """Why a search carrying the script does not give its window's page (None: it does): refused
    (`in_engine.refusal`), or answered in part (`in_engine.incomplete`)."""
    return in_engine.refusal(answer.raw) if answer.data is None else in_engine.incomplete(answer.data)


def skipped(reason: str) -> Marker:
    return Marker("skipped", reason)


@dataclass(frozen=True)
class Outcome:
    """A rerank's result: `body` and `marker` when the window was answered by the rerank (reranked,
    declined or fallen back); else (None) `answer` goes back as the cluster gave it."""

    answer: Answer
    body: dict[str, Any] | None = None
    marker: Marker | None = None


class WindowDeclined(Exception):
    """The window cannot be reranked honestly: the cluster's own answer goes back, with the reason."""

    def __init__(self, reason: str, marker: Mapping[str, Any]) -> None:
        super().__init__(reason)
        self.reason = reason
        self.marker = dict(marker)


class Reranker:
    """Reranks windows for one upstream; shared by every request of a proxy app or client wrapper."""

    def __init__(
        self,
        cluster: Cluster,
        stats: StatsSource,
        metrics: Metrics,
        *,
        cache: TermVectorCache | None = None,
        on_error: str = "fallback",
        llm: LLMProvider | None = None,
        lengths: tf_probe.LengthCache | None = None,
        analyses: AnalysisCache | None = None,
        probes: str = "off",
        identity_headers: Sequence[str] = IDENTITY_HEADERS,
        pages: lean.PageCache | None = None,
        scored_in_engine: bool = False,
    ) -> None:
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
        self.cluster = cluster
        self.stats = stats
        self.metrics = metrics
        self.on_error = on_error
        self.identity_headers = tuple(identity_headers)
        if llm is None and (llm_config := LLMConfig.from_env()) is not None:
            llm = LLMProvider(llm_config)
        self.llm = llm
        cache = cache if cache is not None else TermVectorCache()
        self.analysis = Analysis(cluster, metrics, cache=analyses, identity_headers=identity_headers)
        self.prober = Prober(
            cluster, metrics, mode=probes, remember_windows=cache.max_bytes > 0, kept=self._kept
        )
        lengths = lengths if lengths is not None else tf_probe.LengthCache()
        self.frequencies = TermFrequencies(cluster, metrics, cache=cache, lengths=lengths)
        self.pages = pages if pages is not None else lean.PageCache(defaults.PAGE_CACHE_BYTES)
        self.shard_form: int | None = None  # which of `shards.FORMS` the cluster takes, once learned
        # whether the cluster's `_msearch` takes the probes' parameter (OpenSearch's refuses it),
        # once learned
        self.msearch_probes: bool | None = None
        # (caller, window digest) -> how many of the window's hits each shard gave, the last time
        self.splits: LRUCache[tuple[str, str], tuple[int, ...]] = LRUCache(maxsize=SPLITS)
        # index expressions whose first sights' even shares fell short often lately: their first
        # sights ask every shard for the whole window (an index routed unevenly would send each twice)
        self.uneven = shards.ShortShares(UNEVEN, UNEVEN_TTL)
        # `in_engine`: windows the engine can score exactly are scored there (opt-in)
        self.scored_in_engine = scored_in_engine
        self.layouts: TTLCache[tuple[str, str, str], in_engine.Layout] = TTLCache(LAYOUTS, LAYOUT_TTL)
        self.engine_scored: TTLCache[tuple[str, str], int] = TTLCache(ENGINE_SCORED, ENGINE_SCORED_TTL)

    def _kept(self, key: tuple[str, str]) -> bool:
        return self.frequencies.cache.holds_window(key)

    async def rerank(
        self,
        index_expr: str,
        plan: Plan,
        headers: Mapping[str, str],
        first_stage: FirstStage,
        msearch: MultiSearch | None = None,
    ) -> Outcome:
        """Rerank one search: `plan` (with a spec) on `index_expr`, with the caller's `headers` on
        every call, the first stage sent through `first_stage` (a lean window's shards in one
        `msearch`, where the front end offers one). Raises only what the front end must answer as an
        error: its own first stage's failures, and a failed rerank under `on_error=fail`."""
        start = time.perf_counter()
        who = caller(headers, self.identity_headers)
        deadline = deadlines.current()
        window: Window | None = None
        answer: Answer | None = None
        bound = _until(deadline)
        try:
            async with bound:
                plan = await self.augment(plan)
                if self.scored_in_engine:
                    scored = await self._in_engine(index_expr, plan, headers, who, first_stage)
                    if scored is not None:
                        self.metrics.rerank_seconds.observe(time.perf_counter() - start)
                        return scored
                for may_be_lean in (True, False):  # a lean window that misses goes again, full
                    if window is not None:
                        window.close()
                    window, answer = self.open(index_expr, plan, headers, analyse_later=True), None
                    await self.prober.add(window, who, headers)
                    if may_be_lean and await lean.narrow(window, partial(self._fans_out, window, headers)):
                        self.metrics.first_stage.labels("lean").inc()
                    searched: Awaitable[Answer] = self._search(window, first_stage, msearch, headers, who)
                    # a first sight's page, or one never kept, is asked for beside the first stage
                    window.page_kept = (
                        window.lean and self.prober.had(window, who) and self.pages.keeps(window)
                    )
                    unkept = window.lean and not window.page_kept
                    if window.analysis_gate is not None or unkept:
                        searched = asyncio.ensure_future(searched)
                    if unkept:  # once the first stage is on its way
                        window.ahead = lean.beside(self.cluster, window, headers)
                    window.analyse()  # the analysis, if held back, goes once the search is written
                    try:
                        answer = await searched
                    except lean.Miss:
                        self.metrics.first_stage.labels("lean_missed").inc()
                        continue
                    if answer.status == 400 and window.lean:  # as the caller sent it, would it be one?
                        continue
                    if answer.status == 400 and self.prober.drop(window):
                        answer = await first_stage(window.body, window.params)
                    if answer.status >= 300 or answer.data is None:
                        return Outcome(answer)
                    try:
                        body, marker = await self.finish(window, answer.data, who, headers, answer.columns)
                    except lean.Miss:
                        self.metrics.first_stage.labels("lean_missed").inc()
                        continue
                    self.metrics.rerank_seconds.observe(time.perf_counter() - start)
                    return Outcome(answer, body, marker)
                raise AssertionError("the full first stage never misses")
        except asyncio.TimeoutError:  # TimeoutError itself from Python 3.11 on
            if deadline is None or not _past(deadline, bound):
                raise
            # a lean answer names no document: it cannot stand for the cluster's
            lean_answer = window is not None and window.lean
            if window is None or answer is None or answer.status >= 300 or answer.data is None or lean_answer:
                self.metrics.reranks.labels("deadline").inc()
                raise past_deadline(deadline) from None
            body, marker = self._past_deadline(window, answer.data)
            return Outcome(answer, body, marker)
        finally:
            if window is not None:
                window.close()

    async def _in_engine(
        self, index_expr: str, plan: Plan, headers: Mapping[str, str], who: str, first_stage: FirstStage
    ) -> Outcome | None:
        """The window scored by the engine (`in_engine`), or None: the sidecar's own rerank answers it
        (the search's shape or the index's layout does not allow it, or the engine refused the script:
        then its index is not tried again for `LAYOUT_TTL`; or the sidecar keeps the window, or is to
        keep it: a repeat, see `ENGINE_SIGHTS`)."""
        leaf, spec = plan.scored, plan.spec
        assert spec is not None
        why = in_engine.declined(plan) if known_index(index_expr) else "indices"
        if why is None:
            assert isinstance(leaf, Text)
            key = (who, index_expr, leaf.field)
            if (layout := self.layouts.get(key)) is None:
                layout = self.layouts[key] = await self._layout(index_expr, leaf.field, headers)
            why = layout.reason
        digest = seen = None  # with no term-vector cache (`remember_windows` off) nothing is kept
        if why is None and self.prober.remember_windows:
            digest = window_digest(index_expr, plan)
            seen = (who, digest)
            if self._kept(seen):
                why = "kept"
            elif self.engine_scored.get(seen, 0) >= ENGINE_SIGHTS:
                self.engine_scored.pop(seen, None)
                why = "repeated"
        if why is not None:
            self.metrics.in_engine.labels(why).inc()
            return None
        assert isinstance(leaf, Text)
        _, search_params = window_request(index_expr, plan, digest)  # every search on the same copies
        edge = None  # several shards: the global window's edge searched first, while the terms are read
        if layout.edged(plan.params):
            edge = asyncio.ensure_future(first_stage(in_engine.edge_search(plan), search_params))
        try:
            if edge is not None:
                await lean.on_the_wire()
            scripted = await self._script_params(index_expr, plan, leaf, headers)
            if scripted is None:
                return None
            params, view = scripted
            answer, why = await self._engine_scored(
                plan, params, edge, layout.shards, first_stage, search_params
            )
        finally:
            drop(edge)
        if answer is None:
            if why in ("no_length", "refused"):  # the index is not tried again for a while
                self.layouts[who, index_expr, leaf.field] = in_engine.Layout(why)
            self.metrics.in_engine.labels(why).inc()
            return None
        assert answer.data is not None
        hits_obj = dict(answer.data.get("hits", {}))
        hits = hits_obj.get("hits", [])
        best = hits_obj.get("max_score")  # the rescored window's best (OpenSearch sets it after a rescore)
        if hits and not (best if best is not None else any(h.get("_score") for h in hits)):
            self.metrics.in_engine.labels("no_match").inc()  # nothing matched: declined, as the sidecar does
            return None
        if not plan.wants_seq_no:
            hits_obj["hits"] = [strip(h, keep_seq=False) for h in hits]
        marker = {
            "reranked": True,
            **spec.marker(),
            "fields": [leaf.field],
            "combine": "replace",
            "tf": "engine",  # scored by the engine: no hit's frequencies or length came to the sidecar
            **_statistics_marker([leaf.field], [view]),
            "candidates": _window_hits(hits_obj.get("total"), spec.window_size),
            "dropped": 0,
            "fetch": "page",  # stored fields read for the page's hits alone
        }
        body = {**answer.data, "hits": hits_obj, "_bmx": marker}
        self.metrics.in_engine.labels("scored").inc()
        if seen is not None:
            self.engine_scored[seen] = self.engine_scored.get(seen, 0) + 1
        self.metrics.reranks.labels("reranked").inc()
        return Outcome(answer, plan.shaped(body), Marker(spec.mode))

    async def _engine_scored(
        self,
        plan: Plan,
        params: Mapping[str, Any],
        edge: asyncio.Future[Answer] | None,
        shards: int,
        first_stage: FirstStage,
        search_params: Mapping[str, str],
    ) -> tuple[Answer, None] | tuple[None, str]:
        """The engine's answer, its window scored by the script; or why the sidecar scores it. Over
        several shards (`edge`: its search on the way), a first page is asked for beside the edge with
        each shard's window (`in_engine.speculated`), and stands when its hits are within the global
        window; else the search that keeps to the edge's cutoff goes after it."""
        beside = None
        if edge is not None and in_engine.speculates(plan, search_params, shards):
            named = {**search_params, tf_probe.PARAM: "true"}
            beside = asyncio.ensure_future(first_stage(in_engine.speculated(plan, params), named))
        try:
            cutoff = None
            if edge is not None:
                found = (await edge).data
                cutoff, why = in_engine.window_edge(found) if found is not None else (None, "edge_refused")
                if why is not None:
                    return None, why
            if beside is not None:
                answer = await beside
                if (why := _unscored(answer)) is not None:
                    return None, why
                held = in_engine.within(answer.data, cutoff)
                self.metrics.in_engine_edges.labels("beside" if held else "after").inc()
                if held:
                    return answer, None
            elif edge is not None:
                self.metrics.in_engine_edges.labels("after").inc()
            answer = await first_stage(in_engine.rescored(plan, params, cutoff), search_params)
            if (why := _unscored(answer)) is not None:
                return None, why
            hits = answer.data.get("hits", {}).get("hits", [])
            if cutoff is not None and any(h.get("_score") == 0 for h in hits):
                return None, "zero"  # a hit below the edge, or one of the window with no query term
            return answer, None
        finally:
            drop(beside)

    async def _script_params(
        self, index_expr: str, plan: Plan, leaf: Text, headers: Mapping[str, str]
    ) -> tuple[dict[str, Any], StatsView] | None:
        """The engine's script's parameters for `leaf`'s terms, and the statistics they come from; or
        None (counted: the terms or their statistics could not be read, or no document holds a term)."""
        assert plan.spec is not None
        stats = self._statistics(index_expr, leaf.field, headers)
        try:
            # no `_analyze` where the field's analyzer is the standard one and every word is known
            known = self.analysis.known(index_expr, plan)
            analysed = known if known is not None else await self.analysis.tokens(index_expr, plan, headers)
            tokens = analysed[(leaf.field, leaf.text)]
            view = await self._complete(stats, tokens)
        except (AnalysisDeclined, SearchError):  # the sidecar's rerank declines, falls back or fails
            self.metrics.in_engine.labels("unread").inc()
            return None
        finally:
            if not stats.done():
                stats.cancel()
        request = plan.spec.scoring_request()
        params = in_engine.script_params(view.corpus, tokens, request, leaf.field, leaf.boost)
        if params is None:  # no document holds a token: the sidecar's rerank declines it
            self.metrics.in_engine.labels("no_match").inc()
            return None
        return params, view

    async def _layout(self, index_expr: str, field: str, headers: Mapping[str, str]) -> in_engine.Layout:
        """What `index_expr` lets the engine score on `field`, read with the caller's own rights (an
        index they may not read is scored by the sidecar, which answers as the cluster does)."""
        index = index_path(index_expr)
        try:
            mapping, settings = await asyncio.gather(
                self.cluster.request(
                    "GET",
                    f"/{index}/_mapping/field/{quote(field)},{quote(field)}.{in_engine.SUFFIX}",
                    None,
                    headers,
                    retried=True,
                ),
                index_settings(self.cluster, index_expr, headers),
            )
        except UpstreamError:
            return in_engine.Layout("refused")
        return in_engine.layout(field, mapping or {}, settings)

    async def _search(
        self,
        window: Window,
        first_stage: FirstStage,
        msearch: MultiSearch | None,
        headers: Mapping[str, str],
        who: str,
    ) -> Answer:
        """The window's first stage: one search, or a lean window's search of each shard merged
        (`shards`; in one `msearch` where it can go so), `lean.Miss` when a shard's answer is no
        success or does not merge."""
        if window.shards == 1:
            # a lean window reads its hits' columns, their probes and its page's hits alone: left
            # undecoded, its hits decoded typed (`shards.decode_search`)
            answer = await first_stage(window.body, window.params, undecoded=window.lean)
            return answer if answer.data is not None or answer.payload is None else await _decoded(answer)
        assert window.body is not None
        # each shard asked for its share of the window (that of the last time, else an even one) and
        # a margin, and for the whole window again where those answers do not hold it
        seen = self.splits.get((who, window.digest))
        whole = seen is None and window.index_expr in self.uneven
        sizes = None if whole else shards.shard_sizes(window.body, seen, window.shards)
        found, status, raw = await self._search_shards(window, first_stage, msearch, headers, sizes)
        short = sizes is not None and not shards.hold_window(found, sizes, int(window.body.get("size", 10)))
        if sizes is not None and seen is None:
            self.uneven.add(window.index_expr, short)
        if short:
            self.metrics.first_stage.labels("shares_short").inc()
            found, status, raw = await self._search_shards(window, first_stage, msearch, headers, None)
        merged = shards.merge(found, window.body)
        if merged is None:
            raise lean.Miss
        answer, columns = merged
        self.splits[who, window.digest] = tuple(np.bincount(columns.shard, minlength=window.shards).tolist())
        return Answer(status, answer, raw, columns=columns)

    async def _search_shards(
        self,
        window: Window,
        first_stage: FirstStage,
        msearch: MultiSearch | None,
        headers: Mapping[str, str],
        sizes: Sequence[int] | None,
    ) -> tuple[list[Any], int, Any]:
        """The answers of the window's search of each shard (`sizes[i]` hits of shard i, else the whole
        window), its status and raw answer: in one `msearch` where it can go so, else one search a
        shard; `lean.Miss` if one failed."""
        assert self.shard_form is not None
        together = await self._msearch(window, msearch, headers, sizes) if msearch is not None else None
        if together is not None:
            return together
        answers = await shards.search_each(
            partial(first_stage, undecoded=True), window, self.shard_form, sizes
        )
        if any(a.status >= 300 for a in answers):
            raise lean.Miss
        found = await _each_decoded(answers)
        if found is None:
            raise lean.Miss
        return found, answers[0].status, answers[0].raw

    async def _msearch(
        self, window: Window, msearch: MultiSearch, headers: Mapping[str, str], sizes: Sequence[int] | None
    ) -> tuple[list[Any], int, Any] | None:
        """The window's shards' answers from one `_msearch` (`sizes` as `_search_shards`'s), its status and
        raw answer; None where it cannot go so: a parameter no header line carries, or probes the
        cluster's `_msearch` refuses (`_msearch_takes_probes`). `lean.Miss` if an item failed."""
        assert self.shard_form is not None and window.body is not None
        on_url = {k: v for k, v in window.params.items() if k == tf_probe.PARAM}
        body = shards.msearch_body(window, self.shard_form, on_url=on_url.keys(), sizes=sizes)
        if body is None or (on_url and not await self._msearch_takes_probes(window, headers)):
            return None
        found, answer = await self._msearch_items(window, msearch, body, on_url)
        return found, answer.status, answer.raw

    @staticmethod
    async def _msearch_items(
        window: Window, msearch: MultiSearch, body: bytes, on_url: Mapping[str, str]
    ) -> tuple[list[Any], Answer]:
        """One `_msearch` of the window's shards, its items decoded (`shards.decode`); `lean.Miss` when
        it failed or an item did."""
        answer = await msearch(body, on_url)
        found = None
        if answer.status < 300 and answer.payload is not None:
            found = await _off_loop(
                partial(shards.decode, answer.payload, window.shards), len(answer.payload)
            )
        if found is None:
            raise lean.Miss
        return found, answer

    async def _msearch_takes_probes(self, window: Window, headers: Mapping[str, str]) -> bool:
        """Whether the cluster's `_msearch` takes the probes' parameter: asked once, with a search that
        matches nothing (not learned when it fails otherwise)."""
        if self.msearch_probes is None:
            lines = [orjson.dumps({"index": window.index_expr}), orjson.dumps(tf_probe.MATCH_NONE)]
            try:
                await self.cluster.post_ndjson(
                    f"/_msearch?{tf_probe.PARAM}=true", lines, headers, "bmx_probe_exception"
                )
            except UpstreamError as exc:
                if exc.status == 400 and tf_probe.PARAM in exc.reason:
                    self.msearch_probes = False
                return False
            except SearchError:  # unreachable or slow: one search a shard, this time
                return False
            self.msearch_probes = True
        return self.msearch_probes

    async def _fans_out(self, window: Window, headers: Mapping[str, str]) -> bool:
        """Whether the cluster takes a preference for one shard in a form of `shards.FORMS`: asked
        once, with a search that matches nothing (not learned when it fails otherwise)."""
        if self.shard_form is None:
            for form in range(len(shards.FORMS)):
                pref = quote(shards.preference(form, 0, "bmx"), safe="")
                try:
                    await self.cluster.request(
                        "POST",
                        f"/{index_path(window.index_expr)}/_search?preference={pref}",
                        tf_probe.MATCH_NONE,
                        headers,
                    )
                except UpstreamError as exc:
                    if exc.status == 400 and exc.reason.startswith("no Preference for"):
                        continue
                    return False
                self.shard_form = form
                break
            else:
                self.shard_form = len(shards.FORMS)
        return self.shard_form < len(shards.FORMS)

    async def rerank_each(
        self,
        searches: Mapping[int, tuple[str, Plan]],
        headers: Mapping[str, str],
        first_stage: BatchFirstStage,
    ) -> tuple[Answer, dict[int, Any]]:
        """Rerank several searches whose first stages go in one request (`_msearch`, unprobed): the
        cluster's answer, and each search's reranked body (or the cluster's item, or an error body when
        the item's rerank failed under `on_error=fail`) by its position."""
        who = caller(headers, self.identity_headers)
        augmented = {i: (ix, await self.augment(p)) for i, (ix, p) in searches.items()}
        windows = {i: self.open(ix, p, headers) for i, (ix, p) in augmented.items()}
        deadline = deadlines.current()
        answer: Answer | None = None
        items: Any = None
        bound = _until(deadline)
        try:
            async with bound:
                answer = await first_stage(windows)
                items = (answer.data or {}).get("responses")
                if answer.status >= 300 or not isinstance(items, list):
                    return answer, {}
                bodies = await asyncio.gather(
                    *(
                        self._finish_item(w, items[i] if i < len(items) else None, who, headers)
                        for i, w in windows.items()
                    )
                )
                return answer, dict(zip(windows, bodies, strict=True))
        except asyncio.TimeoutError:  # TimeoutError itself from Python 3.11 on
            if deadline is None or not _past(deadline, bound):
                raise
            if answer is None or not isinstance(items, list):
                self.metrics.reranks.labels("deadline").inc()
                raise past_deadline(deadline) from None
            out = {}
            for i, window in windows.items():
                item = items[i] if i < len(items) else None
                usable = isinstance(item, dict) and "error" not in item and "hits" in item
                out[i] = self._past_deadline(window, item)[0] if usable else item
            return answer, out
        finally:
            for window in windows.values():
                window.close()

    async def augment(self, plan: Plan) -> Plan:
        """The plan with the augmentations a provider finds before the first stage (`llm`) and the first
        stage widened with them (`plan_search` widened it with the queries given in the request)."""
        spec = plan.spec
        if spec is None or spec.augment.provider != "llm" or plan.body is None:
            return plan
        augment = await resolve_llm(spec.augment, plan.query_text, self.llm)
        body = dict(plan.body)
        # As plan_search widens given queries: not when a combination reads the first stage's score.
        if spec.widen and augment.queries and spec.combine in (None, "replace") and "query" in body:
            body["query"] = widen(body["query"], spec.field_names, augment.queries)
        return replace(plan, spec=replace(spec, augment=augment), body=body)

    def open(
        self, index_expr: str, plan: Plan, headers: Mapping[str, str], *, analyse_later: bool = False
    ) -> Window:
        """The window's request, with the analysis and the statistics lookups (one per field) started,
        to overlap with the first stage. `analyse_later`: where the tokens can be guessed (nothing
        waits for the analysis before the first stage is sent), the analysis waits for
        `Window.analyse`. The caller closes it."""
        assert plan.spec is not None
        tokens, guessed, gate = None, None, None
        known = self.analysis.known(index_expr, plan) if known_index(index_expr) else None
        if known is not None:
            tokens = asyncio.get_running_loop().create_future()  # no `_analyze`: every word is known
            tokens.set_result(known)
            self.metrics.token_guesses.labels("known").inc()
        elif known_index(index_expr):
            guessed = self.analysis.guess(index_expr, plan)
            gate = asyncio.Event() if analyse_later and guessed is not None else None
            tokens = asyncio.ensure_future(self._analysed(index_expr, plan, headers, gate))
        stats = {f: self._statistics(index_expr, f, headers) for f in fields(plan.scored)}
        digest = window_digest(index_expr, plan)
        body, params = window_request(index_expr, plan, digest)
        window = Window(index_expr, plan, digest, body, params, tokens, stats)
        window.guessed, window.analysis_gate = guessed, gate
        return window

    async def finish(
        self,
        window: Window,
        response: Mapping[str, Any],
        who: str,
        headers: Mapping[str, str],
        columns: HitColumns | None = None,
    ) -> tuple[dict[str, Any], Marker]:
        """The first stage's answer reranked (its hits' `columns`, where read already); on failure
        declined, fallen back or raised, as configured."""
        plan = window.plan
        assert plan.spec is not None
        frequencies = None
        hits = response.get("hits", {}).get("hits", [])
        if window.lean and hits:  # its likely page fetched while it is scored
            if columns is None:  # what every step reads of each hit, read once
                columns = HitColumns.of(hits)
            lean.check_hits(window, columns)
            if window.ahead is None and not window.page_kept:  # not asked for beside the first stage
                window.ahead = lean.ahead(self.cluster, window, headers, hits, cache=self.pages, who=who)
                if window.ahead is not None:
                    await lean.on_the_wire()  # its request written, then the window scored
        if window.probe is not None:  # before anything else: even a fallback must not show the probes
            frequencies = tf_probe.take_frequencies(hits, window.probe)
        try:
            body = await self._score(window, response, columns, frequencies, who, headers)
            self.metrics.reranks.labels("reranked").inc()
            return plan.shaped(body), Marker(plan.spec.mode)
        except lean.Miss:
            raise
        except WindowDeclined as declined:
            if window.lean:  # declined or failed, a lean window goes again, full: the answer is its
                raise lean.Miss from None
            self.metrics.reranks.labels("declined").inc()
            marker = {**declined.marker, "reranked": False, "skipped": declined.reason}
            return plan.shaped(fallback(response, plan, marker)), skipped(declined.reason)
        except Exception as exc:  # any failure of the rerank itself: the policy decides
            if window.lean:
                raise lean.Miss from exc
            deadline = deadlines.current()
            if deadline is not None and deadline.expired():  # a call cut short by the deadline
                return self._past_deadline(window, response, stripped=True)
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
            return plan.shaped(fallback(response, plan, marker)), Marker("fallback")
        finally:
            window.close()

    def _past_deadline(
        self, window: Window, response: Mapping[str, Any], *, stripped: bool = False
    ) -> tuple[dict[str, Any], Marker]:
        """The first stage's answer, paged as asked and marked `skipped; reason=deadline`: what a search
        gets when its deadline passes with that answer in hand."""
        plan = window.plan
        assert plan.spec is not None
        if window.probe is not None and not stripped:  # the probes never show, even here
            with contextlib.suppress(Exception):
                tf_probe.take_frequencies(response.get("hits", {}).get("hits", []), window.probe)
        self.metrics.reranks.labels("deadline").inc()
        log.warning("rerank past its deadline", extra={"fields": {"index": window.index_expr}})
        marker = {**plan.spec.marker(), "reranked": False, "skipped": "deadline"}
        return plan.shaped(fallback(response, plan, marker)), skipped("deadline")

    async def _finish_item(self, window: Window, item: Any, who: str, headers: Mapping[str, str]) -> Any:
        """One `_msearch` item: reranked, or the cluster's item when it is an error or has no hits."""
        if not isinstance(item, dict) or "error" in item or "hits" not in item:
            window.close()
            return item
        try:
            return (await self.finish(window, item, who, headers))[0]
        except SearchError as err:
            return err.body()

    async def _score(
        self,
        window: Window,
        response: Mapping[str, Any],
        columns: HitColumns | None,
        frequencies: tf_probe.ProbeCounts | None,
        who: str,
        headers: Mapping[str, str],
    ) -> dict[str, Any]:
        """The window scored and packed, its page filled (a lean one's `columns` read and checked)."""
        plan = window.plan
        spec = plan.spec
        assert spec is not None
        tree = plan.scored
        names = fields(tree)
        combine = spec.combine or "replace"
        base = {**spec.marker(), "fields": names, "combine": combine}
        hits = response.get("hits", {}).get("hits", [])
        if not hits:
            window.close()
            marker = {"reranked": True, **base, "estimated": None, "stale": None, "candidates": 0}
            return fallback(response, plan, {**marker, "dropped": 0, "unmatched": 0})
        if not window.lean and any("_id" not in h for h in hits):  # hidden by the caller's stored_fields
            raise WindowDeclined("stored_fields", {"reranked": True, **base, "candidates": len(hits)})
        if columns is None:
            columns = HitColumns.of(hits)
        try:
            tokens = await self._tokens(window, hits, headers)
        except AnalysisDeclined as declined:
            raise WindowDeclined(
                declined.reason, {"reranked": True, **base, "candidates": len(hits)}
            ) from None
        # A window is kept whole (rerank/term_vector_cache.py: in a small LRU of its own the first
        # time); never with PRF, which reads every term of the window's documents.
        prf = spec.augment.provider == "prf"
        kept_as = (who, window.digest)
        again = self.prober.had(window, who)
        tables = lean.tables(window) if window.lean else None
        digest, seen = (None, None)
        if not prf:
            # a probed window's probes are read (their guess checked) as they came: kept, not looked up
            look = window.probe is None
            digest, seen = self.frequencies.seen_window(
                kept_as, columns, who, names, tokens, tables=tables, look=look
            )
        terms: list[HitTerms | None] | None = None
        probed: ProbedTerms | None = None
        naming = Naming(who, tables)  # the hits' keys are made only where a cache is asked hit by hit
        if seen is not None:
            source, views = "window", await self._views(window, names, tokens)
            alive = list(range(len(hits)))
        else:
            found, source, views = await self._frequencies(
                window, columns, frequencies, names, tokens, naming, headers, prf=prf
            )
            if isinstance(found, ProbedTerms):
                probed, alive = found, found.alive
            else:
                terms, alive = found, [i for i, t in enumerate(found) if t is not None]
        if alive:
            self.prober.saw(window, who)
        # a probed window's entries, kept for next time while its page is fetched (see below)
        remember = partial(self.frequencies.remember, columns, naming, names, probed) if probed else None
        self.metrics.tf.labels(source, window.unprobed_because or "probed").inc()
        marker = {
            "reranked": True,
            **base,
            # where the frequencies came from, and why the first stage carried no probes (None: it did)
            "tf": source,
            "tf_probes": window.unprobed_because,
            **_statistics_marker(names, views),
            "candidates": len(hits),
            "dropped": len(hits) - len(alive),
            # where the hits' stored fields were read: each hit of the window, or the page's alone
            "fetch": "page" if window.lean else "window",
        }
        if not alive:
            raise WindowDeclined("window_gone", marker)
        corpus = {f: v.corpus for f, v in zip(names, views, strict=True)}
        augmented, weights = list(spec.augment.queries), [1.0, *spec.augment.weights]
        # what the scores are made of besides the features: a kept window's scores answer only for it
        how = (tree, tuple(augmented), tuple(weights), spec.scoring_request())
        corpora = tuple(corpus.values())
        kept_scores = seen.scores if seen is not None else None
        explain = bool(spec.explain)
        folded = kept_scores.answer(how, corpora, explain=explain) if kept_scores is not None else None
        big = len(hits) >= THREAD_HITS  # a large window: scoring and packing must not hold the event loop
        if folded is None:
            features: Features = seen.features() if seen is not None else {}
            compute = probed.features if probed is not None else None
            if terms is not None:
                docs = {f: [terms[i][f] for i in alive] for f in names}  # type: ignore[index]
                if prf:
                    augmented, weights, tokens = await self._feedback(plan, views, corpus, docs, tokens)
                    marker["augment"] = {"provider": "prf", "queries": len(augmented), "terms": augmented}
                compute = features_of(docs)
            read = remembered(features, compute)
            args = (tree, corpus, read, len(alive), tokens, augmented, weights, spec.scoring_request())
            folded = await asyncio.to_thread(score_tree, *args) if big else score_tree(*args)
        if not folded.matched.any() and combine == "replace":
            # Every score would be 0.0: the cluster matched these hits by something BMX cannot see.
            raise WindowDeclined("no_text_match", {**marker, "unmatched": len(alive)})
        if (
            digest is not None
            and len(alive) == len(hits)
            and (kept_scores is None or kept_scores.folded is not folded)
        ):
            scores = KeptScores.of(how, corpora, folded, whole=explain)
            if seen is not None:
                window_kept = seen.scored(scores)
            elif probed is not None:
                # a probed window kept whole: its documents' entries wait in it (`SeenWindow.entries`),
                # made only if it comes back changed; a first sight puts none (0.7 ms for 100 hits) and,
                # lean, makes no key for them (0.1 ms)
                entries = partial(self.frequencies.keep_entries_later, naming.later(columns), probed)
                window_kept = SeenWindow.of(
                    digest, features, scores, entries, probed_bytes(probed, len(hits))
                )
                remember, again = None, True  # in the main LRU, where its documents' entries went
            else:
                window_kept = SeenWindow.of(digest, features, scores)
            self.frequencies.keep_window(kept_as, window_kept, again=again)
        kept, first = hits, columns.first
        if len(alive) < len(hits):
            every = list(hits)  # a lean window's hits made dicts at once (`shards.WindowHits`)
            kept, first = [every[i] for i in alive], first[alive]
        packed = replace(plan, wants_seq_no=True) if window.lean else plan  # the page fetch finds them so
        if big:
            body = await asyncio.to_thread(pack, response, kept, first, folded, packed, marker)
        else:
            body = pack(response, kept, first, folded, packed, marker)
        if window.lean:
            served = await lean.fill_page(
                self.cluster,
                window,
                headers,
                body,
                keep_seq=plan.wants_seq_no,
                keep_version=wants_version(plan),
                cache=self.pages,
                who=who,
                meanwhile=remember,  # the entries kept while the cluster answers
            )
            self.metrics.page_ahead.labels(served).inc()
        elif remember is not None:
            remember()
        return body

    async def _frequencies(
        self,
        window: Window,
        columns: HitColumns,
        frequencies: tf_probe.ProbeCounts | None,
        names: Sequence[str],
        tokens: Tokens,
        naming: Naming,
        headers: Mapping[str, str],
        *,
        prf: bool,
    ) -> tuple[list[HitTerms | None] | ProbedTerms, str, list[StatsView]]:
        """Each hit's terms (from the probes when they cover the query, as a `ProbedTerms`; else from
        the term-vector cache and `_mtermvectors`, each hit named by `naming`), where they came from,
        and each field's statistics completed for the tokens."""
        probe = window.probe
        covered = probe is not None and probe.covers(tokens)
        if window.probes_guessed:  # probes made of a guess: did it hold? (`rerank/word_tokens.py`)
            self.metrics.token_guesses.labels("covered" if covered else "missed").inc()
            if not covered:
                self.analysis.missed(window.index_expr, names)
        probed = covered and probe is not None and frequencies is not None and set(names) <= set(probe.fields)
        # what a cached entry must know per field: the window's tokens; PRF reads every term
        needs = None if prf else {f: set(_field_tokens(tokens, f)) for f in names}
        found = (
            self.frequencies.from_probes(
                columns,
                frequencies,  # type: ignore[arg-type]  # not None where probed
                names,
                naming,
                headers,
                window.stats,
                self._nameless(window, headers) if window.lean else None,
            )
            if probed
            else self.frequencies.from_term_vectors(
                columns.hits,
                names,
                naming.keys(columns),
                headers,
                needs,
                self._nameless(window, headers) if window.lean else None,
            )
        )
        if all(_in_hand(window.stats[f]) for f in names):  # no call to wait for: none made a task
            views = await self._views(window, names, tokens)
            terms, fetched = await found
        else:
            (terms, fetched), views = await asyncio.gather(found, self._views(window, names, tokens))
        return terms, "probes" if probed else "termvectors" if fetched else "cache", views

    async def _views(self, window: Window, names: Sequence[str], tokens: Tokens) -> list[StatsView]:
        """Each field's statistics, completed for the window's tokens: as they are where they hold
        every term (exact statistics), else every field's terms fetched at once."""
        views = [await window.stats[f] for f in names]
        if all(v.complete for v in views):
            return views
        return list(
            await asyncio.gather(*(self._complete(window.stats[f], _field_tokens(tokens, f)) for f in names))
        )

    async def _feedback(self, plan: Plan, views, corpus, docs, tokens) -> tuple[list, list, dict]:
        """PRF: expansion terms from the window's best documents under the original query (see
        `augment`), from the term vectors already fetched; each term a one-token augmentation, scored on
        every field as it is (terms are indexed tokens already: no analysis). `corpus` is completed for
        the new terms in place (a no-op with exact statistics)."""
        spec = plan.spec
        assert spec is not None
        n = len(next(iter(docs.values()), []))
        first = score_tree(
            plan.scored, corpus, features_of(docs), n, tokens, [], [1.0], spec.scoring_request()
        )
        original = {t for toks in tokens.values() for t in toks}
        found: dict[str, float] = {}
        for f, view in zip(list(corpus), views, strict=True):
            candidates = list(dict.fromkeys(t for d in docs[f] for t in d.tf))
            view = await self.metrics.timed("stats_terms", view.for_terms(candidates))
            corpus[f] = view.corpus
            for term, weight in feedback_terms(view.corpus, docs[f], first.scores, original, spec.augment):
                found[term] = max(found.get(term, 0.0), weight)
        picked = sorted(found, key=lambda t: -found[t])[: spec.augment.terms]
        tokens = {**tokens, **{(f, t): [t] for f in corpus for t in picked}}
        return picked, [1.0, *(found[t] for t in picked)], tokens

    def _nameless(self, window: Window, headers: Mapping[str, str]) -> Nameless:
        """How a lean window's hits are named: by version for the caches, by `_id` for `_mtermvectors`."""
        return Nameless(lambda hits: lean.identify(self.cluster, window, headers, hits), lean.tables(window))

    async def _complete(self, stats: Awaitable[StatsView], tokens: Sequence[str]) -> StatsView:
        """The statistics view, completed for the query's terms (estimated mode fetches them lazily)."""
        view = await stats
        return await self.metrics.timed("stats_terms", view.for_terms(list(dict.fromkeys(tokens))))

    async def _tokens(self, window: Window, hits: Sequence[Mapping[str, Any]], headers) -> Tokens:
        """Analysed tokens; for a pattern/alias over several indices, analysed on the first hit's index."""
        if window.tokens is not None:
            try:
                return await window.tokens
            except UpstreamError as exc:
                if exc.status not in (400, 404):
                    raise
        return await self.analysis.tokens(hits[0]["_index"], window.plan, headers, searched=window.index_expr)

    async def _analysed(
        self, index_expr: str, plan: Plan, headers: Mapping[str, str], gate: asyncio.Event | None
    ) -> Tokens:
        if gate is not None:
            await gate.wait()
        return await self.analysis.tokens(index_expr, plan, headers)

    def _statistics(
        self, index_expr: str, field: str, headers: Mapping[str, str]
    ) -> asyncio.Future[StatsView]:
        """A field's statistics: at once where the source holds them in memory (`cached`: no task,
        nothing to wait for), else looked up beside the first stage."""
        cached = getattr(self.stats, "cached", None)  # a source may only `get`
        view = cached(index_expr, field, headers) if cached is not None else None
        if view is None:
            return asyncio.ensure_future(self._stats(index_expr, field, headers))
        done: asyncio.Future[StatsView] = asyncio.get_running_loop().create_future()
        done.set_result(view)
        return done

    async def _stats(self, index_expr: str, field: str, headers: Mapping[str, str]) -> StatsView:
        # The lookup's coroutine is made here, inside the task: a task cancelled before it ran then
        # leaves no coroutine that was never awaited.
        return await self.metrics.timed("stats", self.stats.get(index_expr, field, headers))


def _statistics_marker(names: Sequence[str], views: Sequence[StatsView]) -> dict[str, Any]:
    """What the marker says of the statistics a rerank scored `names` with (`views`, one a field)."""
    return {
        "estimated": any(v.estimated for v in views),
        # which fields have no exact snapshot (a policy scores a query's other fields too)
        "estimated_fields": [f for f, v in zip(names, views, strict=True) if v.estimated],
        "stale": any(v.stale for v in views),
        "built_at": min((v.built_at for v in views if v.built_at), default=None),
    }


def _window_hits(total: Any, window_size: int) -> int | None:
    """How many hits a window held, from the answer's total (None: not counted, `track_total_hits: false`)."""
    if isinstance(total, int):  # `rest_total_hits_as_int`
        return min(total, window_size)
    if not isinstance(total, dict) or not isinstance(total.get("value"), int):
        return None
    return min(total["value"], window_size)  # a lower bound ("gte") counts at least this many


def _in_hand(stats: asyncio.Future[StatsView]) -> bool:
    """Whether a field's statistics are in and hold every term, so `Reranker._views` calls nothing (not
    `Reranker._complete`, which completes them)."""
    return stats.done() and not stats.cancelled() and stats.exception() is None and stats.result().complete


async def _decoded(answer: Answer) -> Answer:
    """A lean window's answer from its one shard, left undecoded by the front end, decoded
    (`shards.decode_search`: its hits as `Hit`s where they are plain lean hits); no JSON object, it is
    handed back as the cluster sent it."""
    payload = answer.payload
    assert payload is not None
    found = await _off_loop(partial(shards.decode_search, payload), len(payload))
    return answer if found is None else replace(answer, data=found[0], columns=found[1])


async def _each_decoded(answers: Sequence[Answer]) -> list[dict[str, Any]] | None:
    """A lean window's answers from each of its shards, decoded where the front end left them so: their
    hits as `Hit`s (`shards.decode_each`, as an `_msearch`'s items). None where one is no JSON object."""
    if all(a.data is not None for a in answers):  # a front end that decodes its answers itself
        return [a.data for a in answers]  # type: ignore[misc]
    if any(a.payload is None for a in answers):
        return None
    payloads: list[bytes] = [a.payload for a in answers]  # type: ignore[misc]
    return await _off_loop(partial(shards.decode_each, payloads), sum(map(len, payloads)))


async def _off_loop(decode: Callable[[], T], size: int) -> T:
    """`decode()` of a `size`-byte answer, in a worker thread when it is larger than THREAD_BYTES."""
    return await asyncio.to_thread(decode) if size > THREAD_BYTES else decode()


def _until(deadline: deadlines.Deadline | None) -> contextlib.AbstractAsyncContextManager[Any]:
    """`asyncio.timeout_at` the deadline (on the running loop's clock), or no bound."""
    if deadline is None:
        return contextlib.nullcontext()
    loop = asyncio.get_running_loop()
    return timeout_at(deadline.loop_time(loop.time()))


def _past(deadline: deadlines.Deadline, bound: Any) -> bool:
    """Whether a TimeoutError is the deadline's: its own bound fired (uvloop's clock runs in whole
    milliseconds, so that timer may fire a little before the monotonic clock reaches the deadline),
    or a call's timeout, cut to what was left, ended past it."""
    fired = getattr(bound, "expired", False)  # asyncio.Timeout: a method; async_timeout: a property
    return deadline.expired() or bool(fired() if callable(fired) else fired)


def past_deadline(deadline: deadlines.Deadline) -> SearchError:
    """The 504 of a search whose deadline passed before the cluster's first-stage answer was in hand."""
    return timed_out(
        f"[bmx] the search did not finish within its deadline of {deadline.seconds:g}s (--deadline, "
        "ext.bmx.deadline, timeout)"
    )


def _field_tokens(tokens: Mapping[tuple[str, str], Sequence[str]], name: str) -> list[str]:
    """Every token analysed on field `name` (the terms its statistics must hold)."""
    return [t for (f, _), toks in tokens.items() if f == name for t in toks]
