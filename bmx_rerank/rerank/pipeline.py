"""The imperative shell of a rerank: the calls to the cluster, overlapped, around the pure verbs.

For one search: `_analyze` of every leaf of the scoring tree (and the augmentations) with its field's
search analyzer, and one statistics lookup per field, start together with the first-stage search (sent
with one `preference` per window, see `window_request`); once the window is back, the term vectors of
the hits the cache misses are fetched for every field in one `_mtermvectors`, hits deleted or changed
since the first stage are dropped; then `score_tree` and `pack`."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp
import orjson
from cachetools import TTLCache

from bmx_rerank.errors import SearchError, UpstreamError
from bmx_rerank.metrics import Metrics
from bmx_rerank.rerank import filter_path, tf_probe
from bmx_rerank.rerank.analysis_cache import AnalysisCache
from bmx_rerank.rerank.augment import LLMConfig, LLMProvider, feedback_terms, resolve_llm
from bmx_rerank.rerank.candidates import IDENTITY_HEADERS, TermVectorCache, cache_key, caller, doc_refs
from bmx_rerank.rerank.pack import fallback, pack
from bmx_rerank.rerank.plan import Plan
from bmx_rerank.rerank.query import Node, Text, fields, leaves
from bmx_rerank.rerank.rescore import leaf_queries, score_tree
from bmx_rerank.rerank.stats_source import StatsSource
from bmx_rerank.rerank.widen import widen
from bmx_rerank.stats.cache import StatsView
from bmx_rerank.upstream import (
    DocTerms,
    analyze,
    mtermvectors_fields,
    request_json_retrying,
    search_analyzer,
)

log = logging.getLogger("bmx_rerank.proxy")

ON_ERROR = ("fallback", "fail")
ANALYZER_TTL = 60.0  # seconds a field's search analyzer is remembered (mappings change rarely)
ANALYZER_CACHE = 4096  # (index, field) pairs remembered at most
Pair = tuple[str, str]  # (field, text): one text analysed with one field's search analyzer
# Seconds (at most a quarter of --timeout) the first stage may wait for what its probes need (the
# analysis, the once-per-cluster parameter check): past it the search goes without probes, so a slow
# cluster answers within --timeout plus this, not twice the timeout.
PROBE_WAIT = 0.5
PROBE_MODES = ("auto", "on", "off")
# `auto` probes a window this caller has not had reranked within SEEN_TTL seconds: a repeated one goes
# unprobed, its frequencies from the term-vector cache. At most SEEN_WINDOWS (caller, window) pairs.
SEEN_TTL = 600.0
SEEN_WINDOWS = 16384
THREAD_HITS = 1000  # windows this large are scored and packed in a worker thread, off the event loop
TERMVECTOR_BATCH = 500  # documents per `_mtermvectors` call: bounded answers, each parsed on its own


@dataclass
class SideCalls:
    """Calls started before the first stage returns; awaited (or cancelled) once it has.

    `body` and `params` are the first-stage request to send for the window (see `window_request`)."""

    index_expr: str
    plan: Plan
    tokens: asyncio.Task[dict[Pair, list[str]]] | None
    stats: dict[str, asyncio.Task[StatsView]]
    body: dict[str, Any] | None = None
    params: dict[str, str] = field(default_factory=dict)
    window: str = ""  # digest of the window request (see `window_digest`)
    probe: tf_probe.Probe | None = None  # term frequencies come with the first stage's hits
    # why the first stage carries no probes (marker `tf_probes`; None: it does); `first_stage` decides,
    # and a first stage that skips it (an `_msearch` item, the client wrapper) is "not_tried"
    unprobed_because: str | None = "not_tried"
    unprobed: tuple[dict[str, Any] | None, dict[str, str]] | None = None  # body, params without probes
    frequencies: list[tf_probe.Frequencies | None] | None = None  # per hit, read from the probes

    def tasks(self) -> list[asyncio.Task[Any]]:
        return [t for t in (self.tokens, *self.stats.values()) if t is not None]

    def cancel(self) -> None:
        for task in self.tasks():
            if not task.done():
                task.cancel()
            elif not task.cancelled():
                task.exception()  # retrieved, so asyncio does not warn about it

    def msearch_header(self, header: Mapping[str, Any], url_preference: str | None = None) -> dict[str, Any]:
        """An `_msearch` item header with the window's preference, unless the caller set one (in the
        header, or for every item in the `_msearch` URL)."""
        if "preference" in header or url_preference is not None:
            return dict(header)
        return {**header, "preference": self.params["preference"]}


@dataclass
class Outcome:
    body: dict[str, Any]
    kind: str  # "bmx" | "bm25" | "fallback" | "skipped; reason=..."


class WindowDeclined(Exception):
    """The window cannot be reranked honestly: the cluster's own answer goes back, with the reason."""

    def __init__(self, reason: str, marker: Mapping[str, Any]) -> None:
        super().__init__(reason)
        self.reason = reason
        self.marker = dict(marker)


def scoring_tree(plan: Plan) -> Node:
    """What the plan scores: its tree, or (plans without one) its text on the spec's field."""
    assert plan.spec is not None
    return plan.scoring if plan.scoring is not None else Text(plan.spec.field, plan.query_text)


def window_digest(index_expr: str, plan: Plan) -> str:
    """What identifies a window request: the index expression, the first-stage body (which asks for
    0..window_size, the same for every page of one query) and the parameters, the caller's
    `preference` included."""
    return hashlib.sha256(
        orjson.dumps([index_expr, plan.body, sorted(plan.params.items())], option=orjson.OPT_SORT_KEYS)
    ).hexdigest()


def window_request(
    index_expr: str, plan: Plan, digest: str | None = None
) -> tuple[dict[str, Any] | None, dict[str, str]]:
    """The first-stage body and query parameters for the window.

    - `preference`: the caller's if given, else one derived from the index and the window request
      (which is the same for every page of one query: it asks for 0..window_size): pages 0, 10, 20 are
      served by the same shard copies, so they neither repeat nor skip hits.
    - `version: true`: the term vectors of a hit are used only if their `_version` is the hit's (see
      `Reranker._term_vectors`); the field is removed from the answer unless the caller asked for it."""
    params = dict(plan.params)
    body = None if plan.body is None else {**plan.body, "version": True}
    if "preference" not in params:
        params["preference"] = f"bmx-{(digest or window_digest(index_expr, plan))[:16]}"
    return body, params


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
        llm: LLMProvider | None = None,
        lengths: tf_probe.LengthCache | None = None,
        analyses: AnalysisCache | None = None,
        probes: str = "off",
        identity_headers: Sequence[str] = IDENTITY_HEADERS,
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
        self.identity_headers = tuple(identity_headers)
        self._analyzers: TTLCache[tuple[str, str], str | None] = TTLCache(ANALYZER_CACHE, ANALYZER_TTL)
        if llm is None and (llm_config := LLMConfig.from_env()) is not None:
            llm = LLMProvider(llm_config)
        self.llm = llm
        self.lengths = lengths if lengths is not None else tf_probe.LengthCache()
        self.analyses = analyses if analyses is not None else AnalysisCache()
        if probes not in PROBE_MODES:
            raise ValueError(f"probes must be one of {PROBE_MODES}, got {probes!r}")
        self.probes = probes
        # (caller, window digest) of windows reranked lately with their documents cached (`auto`)
        self._seen: TTLCache[tuple[str, str], bool] = TTLCache(maxsize=SEEN_WINDOWS, ttl=SEEN_TTL)
        self._named_scores: bool | None = None  # does the cluster report named query scores?
        # (index expression, fields) whose probes the cluster refused (not text with positions): not
        # probed again for a while.
        self._refused: TTLCache[tuple[str, tuple[str, ...]], bool] = TTLCache(maxsize=1024, ttl=300)

    async def prepare(self, plan: Plan) -> Plan:
        """The plan with the augmentations a provider finds before the first stage (`llm`), widened."""
        spec = plan.spec
        if spec is None or spec.augment.provider != "llm" or plan.body is None:
            return plan
        augment = await resolve_llm(spec.augment, plan.query_text, self.llm)
        body = dict(plan.body)
        # As plan_search widens given queries: not when a combination reads the first stage's score.
        if spec.widen and augment.queries and spec.combine in (None, "replace") and "query" in body:
            body["query"] = widen(body["query"], spec.field_names, augment.queries)
        return replace(plan, spec=replace(spec, augment=augment), body=body)

    def start(self, index_expr: str, plan: Plan, headers: Mapping[str, str]) -> SideCalls:
        """Start analysis and the statistics lookups (one per field, in parallel), to overlap with the
        first stage; the returned calls also carry the first-stage request to send."""
        assert plan.spec is not None
        tokens = None
        if _single_index(index_expr):
            tokens = asyncio.ensure_future(self._tokens(index_expr, plan, headers))
        stats = {
            f: asyncio.ensure_future(self._stats(index_expr, f, headers)) for f in fields(scoring_tree(plan))
        }
        digest = window_digest(index_expr, plan)
        body, params = window_request(index_expr, plan, digest)
        return SideCalls(index_expr, plan, tokens, stats, body, params, digest)

    async def first_stage(self, side: SideCalls, headers: Mapping[str, str]) -> None:
        """Add term-frequency probes to the first-stage request where they are safe (see tf_probe)
        and, in `auto`, where they pay; else note why not (`side.unprobed_because`)."""
        side.unprobed_because = await self._probe(side, headers)

    async def _probe(self, side: SideCalls, headers: Mapping[str, str]) -> str | None:
        """Put the probes in `side`'s request and return None, or return why not.

        `auto` probes only a window this caller has not had reranked lately (a repeated one is served
        by the term-vector cache, as cheaply as without probes) and only when the lengths will not need
        `_mtermvectors` either: a field's statistics carry a length table. (Without one, a new window's
        lengths are rarely all in the length cache: probes would then cost the first stage ~20 % and
        still fetch term vectors; `on` takes that bet.)
        What it waits for (the tokens, the parameter check, the statistics) is bounded by PROBE_WAIT."""
        body, params = side.body, side.params
        assert side.plan.spec is not None
        if self.probes == "off":
            return "off"
        if side.tokens is None or body is None:
            return "index_pattern"  # tokens are known only once the hits name their index
        if side.plan.spec.augment.provider == "prf":
            return "prf"  # feedback reads every term of the window's documents: their term vectors
        if why := tf_probe.why_not(body, orjson.dumps(body), params):
            return why
        auto = self.probes == "auto"
        if auto and self._seen_window(side, headers):
            return "seen"
        tables = auto  # a length cache cannot say before the search whether it holds these hits
        wait = PROBE_WAIT if self.timeout is None else min(PROBE_WAIT, self.timeout / 4)
        try:
            tokens, views = await asyncio.wait_for(self._probe_inputs(side, headers, tables), wait)
        except (SearchError, asyncio.TimeoutError):
            return "timeout"  # `finish` analyses again on the hits' index, or fails as it would have
        if tokens is None:
            return "no_named_scores"
        if tables and not any(v.lengths is not None for v in views):
            return "no_lengths"
        probe = tf_probe.probe_terms(tokens)
        if probe is None:
            return "tokens"  # none, or more than MAX_PROBES
        if (side.index_expr, probe.fields) in self._refused:
            return "refused"
        side.probe, side.unprobed = probe, (body, params)
        side.body = tf_probe.with_probes(body, probe)
        side.params = {**params, tf_probe.PARAM: "true"}
        return None

    def _seen_window(self, side: SideCalls, headers: Mapping[str, str]) -> bool:
        """Whether this caller had this window reranked lately with its documents cached (never when
        the term-vector cache is off)."""
        return (
            self.cache.max_bytes > 0 and (caller(headers, self.identity_headers), side.window) in self._seen
        )

    async def _probe_inputs(
        self, side: SideCalls, headers: Mapping[str, str], tables: bool
    ) -> tuple[dict[Pair, list[str]] | None, list[StatsView]]:
        """The query's tokens when the cluster takes probes (else None) and, with `tables`, the
        statistics views that could be had. The shared tasks are shielded: giving up on probes never
        cancels them, and a failed statistics lookup fails the rerank later, as without probes."""
        if not await self._reports_named_scores(side.index_expr, headers):
            return None, []
        assert side.tokens is not None
        tokens = await asyncio.shield(side.tokens)
        if not tables:
            return tokens, []
        views = await asyncio.gather(
            *(asyncio.shield(t) for t in side.stats.values()), return_exceptions=True
        )
        return tokens, [v for v in views if isinstance(v, StatsView)]

    def drop_probes(self, side: SideCalls) -> bool:
        """After the cluster refused a first stage with probes: the request without them, to send
        instead (True), remembering the refusal; False when it had none (its answer is the caller's).

        Probes only fit text fields indexed with positions; a keyword field, a field indexed with
        `index_options: freqs`, or an invalid query of the caller's make the probed search a 400."""
        if side.probe is None or side.unprobed is None:
            return False
        self._refused[(side.index_expr, side.probe.fields)] = True
        side.body, side.params = side.unprobed
        side.probe = side.unprobed = None
        side.unprobed_because = "refused"
        return True

    async def _reports_named_scores(self, index: str, headers: Mapping[str, str]) -> bool:
        """Whether the cluster accepts `include_named_queries_score` (Elasticsearch >= 8.8, OpenSearch
        >= 2.13): asked once with an empty search, with the caller's credentials. Only the cluster's
        refusal of the parameter is remembered; any other failure means no probes for this search."""
        if self._named_scores is None:
            url = f"{self.base_url}/{index}/_search?{tf_probe.PARAM}=true"
            body = {"size": 0, "track_total_hits": False, "query": {"match_none": {}}}
            try:
                await self._timed(
                    "probe_check",
                    request_json_retrying(self.session, "POST", url, body, headers, self.timeout),
                )
                self._named_scores = True
            except UpstreamError as exc:
                if exc.status == 400 and tf_probe.PARAM in exc.reason:
                    self._named_scores = False
                return False
            except SearchError:  # unreachable, slow, or not JSON: no probes; the search decides
                return False
        return self._named_scores

    async def _stats(self, index_expr: str, field: str, headers: Mapping[str, str]) -> StatsView:
        # The lookup's coroutine is made here, inside the task: a task cancelled before it ran then
        # leaves no coroutine that was never awaited.
        return await self._timed("stats", self.stats.get(index_expr, field, headers))

    async def finish(
        self, side: SideCalls, response: Mapping[str, Any], headers: Mapping[str, str]
    ) -> Outcome:
        """Rerank the first stage's answer; on failure fall back or raise, as configured."""
        plan = side.plan
        assert plan.spec is not None
        if side.probe is not None:  # before anything else: even a fallback must not show the probes
            side.frequencies = tf_probe.take_frequencies(response.get("hits", {}).get("hits", []), side.probe)
        try:
            body = await self._rerank(side, response, headers)
            self.metrics.reranks.labels("reranked").inc()
            return Outcome(filter_path.apply(body, plan.filter_path), plan.spec.mode)
        except asyncio.CancelledError:
            side.cancel()
            raise
        except WindowDeclined as declined:
            side.cancel()
            self.metrics.reranks.labels("declined").inc()
            marker = {**declined.marker, "reranked": False, "skipped": declined.reason}
            body = fallback(response, plan, marker)
            return Outcome(filter_path.apply(body, plan.filter_path), f"skipped; reason={declined.reason}")
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
        tree = scoring_tree(plan)
        names = fields(tree)
        base = {**spec.marker(), "fields": names, "combine": getattr(spec, "combine", None) or "replace"}
        hits = response.get("hits", {}).get("hits", [])
        if not hits:
            side.cancel()
            marker = {"reranked": True, **base, "estimated": None, "stale": None, "candidates": 0}
            return fallback(response, plan, {**marker, "dropped": 0, "unmatched": 0})
        tokens = await self._tokens_after(side, hits, headers)
        who = caller(headers, self.identity_headers)
        probe = side.probe
        probed = (
            probe is not None
            and side.frequencies is not None
            and probe.covers(tokens)
            and set(names) <= set(probe.fields)
        )
        # what a cached entry must know per field: the window's tokens; PRF reads every term
        needs = None if spec.augment.provider == "prf" else {f: set(_field_tokens(tokens, f)) for f in names}
        (terms, fetched), views = await asyncio.gather(
            self._probed_terms(hits, side.frequencies, names, headers, side.stats)  # type: ignore[arg-type]
            if probed
            else self._term_vectors(hits, names, headers, needs),
            asyncio.gather(*(self._complete(side.stats[f], _field_tokens(tokens, f)) for f in names)),
        )
        alive = [i for i, t in enumerate(terms) if t is not None]
        if alive and self.cache.max_bytes > 0:
            self._seen[(who, side.window)] = True
        source = "probes" if probed else "termvectors" if fetched else "cache"
        self.metrics.tf.labels(source, side.unprobed_because or "probed").inc()
        marker = {
            "reranked": True,
            **base,
            # where the frequencies came from, and why the first stage carried no probes (None: it did)
            "tf": source,
            "tf_probes": side.unprobed_because,
            "estimated": any(v.estimated for v in views),
            # which fields have no exact snapshot (a policy scores a query's other fields too)
            "estimated_fields": [f for f, v in zip(names, views, strict=True) if v.estimated],
            "stale": any(v.stale for v in views),
            "built_at": min((v.built_at for v in views if v.built_at), default=None),
            "candidates": len(hits),
            "dropped": len(hits) - len(alive),
        }
        if not alive:
            raise WindowDeclined("window_gone", marker)
        docs = {f: [terms[i][f] for i in alive] for f in names}  # type: ignore[index]
        corpus = {f: v.corpus for f, v in zip(names, views, strict=True)}
        augmented, weights = list(spec.augment.queries), [1.0, *spec.augment.weights]
        if spec.augment.provider == "prf":
            augmented, weights, tokens = await self._feedback(tree, views, corpus, docs, tokens, spec)
            marker["augment"] = {"provider": "prf", "queries": len(augmented), "terms": augmented}
        args = (tree, corpus, docs, tokens, augmented, weights, spec.scoring_request())
        big = len(hits) >= THREAD_HITS  # a large window: scoring and packing must not hold the event loop
        folded = await asyncio.to_thread(score_tree, *args) if big else score_tree(*args)
        if not folded.matched.any() and (getattr(spec, "combine", None) or "replace") == "replace":
            # Every score would be 0.0: the cluster matched these hits by something BMX cannot see.
            raise WindowDeclined("no_text_match", {**marker, "unmatched": len(alive)})
        kept = [hits[i] for i in alive]
        if big:
            return await asyncio.to_thread(pack, response, kept, folded, plan, marker)
        return pack(response, kept, folded, plan, marker)

    async def _feedback(self, tree, views, corpus, docs, tokens, spec) -> tuple[list, list, dict]:
        """PRF: expansion terms from the window's best documents under the original query (see
        `augment`), from the term vectors already fetched; each term a one-token augmentation, scored on
        every field as it is (terms are indexed tokens already: no analysis). `corpus` is completed for
        the new terms in place (a no-op with exact statistics)."""
        first = score_tree(tree, corpus, docs, tokens, [], [1.0], spec.scoring_request())
        original = {t for toks in tokens.values() for t in toks}
        found: dict[str, float] = {}
        for f, view in zip(list(corpus), views, strict=True):
            candidates = list(dict.fromkeys(t for d in docs[f] for t in d.tf))
            view = await self._timed("stats_terms", view.for_terms(candidates))
            corpus[f] = view.corpus
            for term, weight in feedback_terms(view.corpus, docs[f], first.scores, original, spec.augment):
                found[term] = max(found.get(term, 0.0), weight)
        picked = sorted(found, key=lambda t: -found[t])[: spec.augment.terms]
        tokens = {**tokens, **{(f, t): [t] for f in corpus for t in picked}}
        return picked, [1.0, *(found[t] for t in picked)], tokens

    async def _complete(self, stats: Awaitable[StatsView], tokens: Sequence[str]) -> StatsView:
        """The statistics view, completed for the query's terms (estimated mode fetches them lazily)."""
        view = await stats
        return await self._timed("stats_terms", view.for_terms(list(dict.fromkeys(tokens))))

    async def _tokens_after(
        self, side: SideCalls, hits: Sequence[Mapping[str, Any]], headers
    ) -> dict[Pair, list[str]]:
        """Analysed tokens; for a pattern/alias over several indices, analysed on the first hit's index."""
        if side.tokens is not None:
            try:
                return await side.tokens
            except UpstreamError as exc:
                if exc.status not in (400, 404):
                    raise
        return await self._tokens(hits[0]["_index"], side.plan, headers)

    async def _tokens(self, index: str, plan: Plan, headers: Mapping[str, str]) -> dict[Pair, list[str]]:
        """Every leaf's text and every augmentation, analysed with the search analyzer of its field."""
        assert plan.spec is not None
        tree = scoring_tree(plan)
        names = fields(tree)
        analyzers = await asyncio.gather(*(self._search_analyzer(index, f, headers) for f in names))
        by_field = dict(zip(names, analyzers, strict=True))
        pairs = list(
            dict.fromkeys(p for leaf in leaves(tree) for p in leaf_queries(leaf, plan.spec.augment.queries))
        )
        who = caller(headers, self.identity_headers)

        def cached(f: str, text: str) -> Awaitable[list[str]]:
            key = (who, index, f"analyzer:{by_field[f]}" if by_field[f] else f"field:{f}", text)
            return self.analyses.tokens(key, lambda: self._analyze(index, f, text, headers, by_field[f]))

        found = await asyncio.gather(*(cached(f, t) for f, t in pairs))
        return dict(zip(pairs, found, strict=True))

    async def _search_analyzer(self, index: str, field: str, headers: Mapping[str, str]) -> str | None:
        """The field's search analyzer, if its mapping sets one (and the caller may read the mapping).

        A mapping read is remembered for ANALYZER_TTL seconds and shared by every caller: it is the
        index's, not the caller's, and who may search the index learns nothing else from it (each caller
        still runs `_analyze` and the search with its own credentials). A failed read is not
        remembered: one caller without view_index_metadata (or a missing index) must not decide the
        analyzer of the others, nor fill the memory with names of indices that do not exist."""
        key = (index, field)
        if key in self._analyzers:
            return self._analyzers[key]
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
        self._analyzers[key] = name
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
        self,
        hits: Sequence[Mapping[str, Any]],
        names: Sequence[str],
        headers: Mapping[str, str],
        needs: Mapping[str, Collection[str]] | None = None,
    ) -> tuple[list[dict[str, DocTerms] | None], int]:
        """Each hit's terms in every field (None: dropped), cached per field; the misses in ONE
        `_mtermvectors` for all fields; and how many hits that fetched. A cached partial entry serves
        only if it knows every token of `needs[field]` (None: full term vectors only).

        A hit is dropped when its document is gone (deleted between the first stage and this call) or
        changed (its term vectors carry another `_version` than the hit: updated, and refreshed, in
        between). A changed document's terms are not cached: they are not the hit's version, and
        `_mtermvectors` does not say which `_seq_no` they are (the next search's hit will)."""
        who = caller(headers, self.identity_headers)
        found: list[dict[str, DocTerms]] = []
        get = self.cache.get
        for hit in hits:
            cached = {f: get(cache_key(hit, f, who), None if needs is None else needs[f]) for f in names}
            found.append({f: d for f, d in cached.items() if d is not None})
        missing = [i for i, d in enumerate(found) if len(d) < len(names)]
        refs = dict(zip(missing, doc_refs([hits[i] for i in missing]), strict=True))  # only those fetched
        self.metrics.cache.labels("hit").inc(sum(len(d) for d in found))
        self.metrics.cache.labels("miss").inc(len(hits) * len(names) - sum(len(d) for d in found))
        gone: set[int] = set()
        if missing:
            batches = [missing[i : i + TERMVECTOR_BATCH] for i in range(0, len(missing), TERMVECTOR_BATCH)]
            parts = await asyncio.gather(
                *(
                    self._timed(
                        "termvectors",
                        mtermvectors_fields(
                            self.session,
                            self.base_url,
                            [refs[i] for i in batch],
                            names,
                            headers,
                            self.timeout,
                            realtime=False,  # the refreshed view the hits (and their _seq_no) come from
                        ),
                    )
                    for batch in batches
                )
            )
            fetched = [terms for part in parts for terms in part]
            for i, by_field in zip(missing, fetched, strict=True):
                if not _same_version(hits[i], by_field.values()):
                    gone.add(i)
                    continue
                for f, terms in by_field.items():
                    found[i].setdefault(f, terms)
                    key = cache_key(hits[i], f, who)
                    self.cache.put(key, terms)
                    self.lengths.put(key, terms.length)  # a later probed window needs only this
        return [None if i in gone else d for i, d in enumerate(found)], len(missing)

    async def _probed_terms(
        self,
        hits: Sequence[Mapping[str, Any]],
        frequencies: Sequence[tf_probe.Frequencies | None],
        names: Sequence[str],
        headers: Mapping[str, str],
        stats: Mapping[str, Awaitable[StatsView]],
    ) -> tuple[list[dict[str, DocTerms] | None], int]:
        """`_term_vectors`' answer from the probes: each hit's query-term frequencies as the first
        stage reported them, its lengths from the length cache, else from the statistics snapshot's
        length table (`StatsView.lengths`, exact document versions only); `_mtermvectors` only for the
        hits both miss (their lengths are then remembered), dropped as `_term_vectors` drops them.
        What it finds goes into the term-vector cache, as `_term_vectors`' fetches do.

        A hit whose probes cannot be read exactly is scored from its term vectors, as without probes."""
        refs = doc_refs(hits)
        who = caller(headers, self.identity_headers)
        keys = [{f: cache_key(h, f, who) for f in names} for h in hits]
        lengths = [
            {f: self.lengths.get(k) for f, k in key.items()} if tf is not None else {}
            for key, tf in zip(keys, frequencies, strict=True)
        ]
        missing = [i for i, n in enumerate(lengths) if len(n) < len(names) or None in n.values()]
        self.metrics.cache.labels("hit").inc((len(hits) - len(missing)) * len(names))
        self.metrics.cache.labels("miss").inc(len(missing) * len(names))
        probed = [i for i in missing if frequencies[i] is not None]
        if probed:
            views = await asyncio.gather(*(stats[f] for f in names))
            tabled = table_lengths([hits[i] for i in probed], names, views)
            for i, found_lengths in zip(probed, tabled, strict=True):
                lengths[i] = {f: n if n is not None else found_lengths[f] for f, n in lengths[i].items()}
            missing = [i for i, n in enumerate(lengths) if len(n) < len(names) or None in n.values()]
        found: list[dict[str, DocTerms] | None] = [
            None if i in missing or tf is None else {f: tf_probe.probed_doc(r, h, tf[f], n[f]) for f in names}  # type: ignore[arg-type]
            for i, (r, h, tf, n) in enumerate(zip(refs, hits, frequencies, lengths, strict=True))
        ]
        if missing:
            fetched = await self._timed(
                "termvectors",
                mtermvectors_fields(
                    self.session,
                    self.base_url,
                    [refs[i] for i in missing],
                    names,
                    headers,
                    self.timeout,
                    realtime=False,
                ),
            )
            for i, by_field in zip(missing, fetched, strict=True):
                tf = frequencies[i]
                if not _same_version(hits[i], by_field.values()):
                    continue  # dropped, as `_term_vectors` drops it
                if tf is None:
                    found[i] = dict(by_field)
                    continue
                for f, terms in by_field.items():
                    self.lengths.put(keys[i][f], terms.length)
                found[i] = {
                    f: tf_probe.probed_doc(refs[i], hits[i], tf[f], by_field[f].length) for f in names
                }
        for key, by_field in zip(keys, found, strict=True):  # for next time (probed: partial entries)
            for f, doc in (by_field or {}).items():
                self.cache.put(key[f], doc)
        return found, len(missing)

    async def _timed(self, call: str, awaitable: Awaitable[Any]) -> Any:
        start = time.perf_counter()
        try:
            return await awaitable
        finally:
            self.metrics.upstream_seconds.labels(call).observe(time.perf_counter() - start)


def table_lengths(
    hits: Sequence[Mapping[str, Any]], names: Sequence[str], views: Sequence[StatsView]
) -> list[dict[str, int | None]]:
    """Each hit's length per field from the length table of its index in that field's view: None
    where the view has no table for the index or the table not this version of the document."""
    out: list[dict[str, int | None]] = [{} for _ in hits]
    by_index: dict[str, list[int]] = {}
    for i, hit in enumerate(hits):
        by_index.setdefault(str(hit.get("_index")), []).append(i)
    for name, view in zip(names, views, strict=True):
        tables = view.lengths or {}
        for index, rows in by_index.items():
            table = tables.get(index)
            found: list[int | None] = [None] * len(rows)
            if table is not None:
                found = table.lookup(
                    [str(hits[i].get("_id")) for i in rows],
                    [None if (r := hits[i].get("_routing")) is None else str(r) for i in rows],
                    [hits[i].get("_seq_no") for i in rows],
                    [hits[i].get("_primary_term") for i in rows],
                )
            for i, n in zip(rows, found, strict=True):
                out[i][name] = n
    return out


def _single_index(index_expr: str) -> bool:
    """An expression `_analyze` accepts before we know which indices the hits come from."""
    return bool(index_expr) and not any(c in index_expr for c in "*,") and not index_expr.startswith("_")


def _field_tokens(tokens: Mapping[Pair, Sequence[str]], name: str) -> list[str]:
    """Every token analysed on field `name` (the terms its statistics must hold)."""
    return [t for (f, _), toks in tokens.items() if f == name for t in toks]


def _same_version(hit: Mapping[str, Any], terms: Iterable[DocTerms]) -> bool:
    """The term vectors are of the hit's document as the hit shows it: found, and of its `_version`
    (when the hit carries one)."""
    version = hit.get("_version")
    return all(t.found and (not isinstance(version, int) or t.version == version) for t in terms)
