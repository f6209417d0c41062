"""The lean first stage: a window that reads no stored fields, its page fetched by document version.

Reading each hit's `_id` (a stored field, decompressed with `_source`) is most of what a window of 100
costs the cluster beyond its query, and the caller sees a page of 10. So where the hits can be named
without it, the first stage asks for no stored field (`stored_fields: _none_`, `seq_no_primary_term`):
in a shard, `_seq_no` and `_primary_term` name one version of one document (an index of several shards
is searched shard by shard so that each hit's shard is known: `rerank/shards.py`). That holds when
every index the window reaches has a length table keyed by version (`LengthIndex.by_version`),
and the probes give each hit's term frequencies (or, for a window this caller had reranked lately, the
term-vector cache, which keys such hits by index, table and version); then nothing else needs the
`_id` (a hit new since the table was built is named by version for `_mtermvectors`: `identify`).
The page's documents come back in one more search (`terms` on `_seq_no`) with the caller's
`_source`, `fields`, `docvalue_fields`, `stored_fields` and `version`, and must be the same versions:
those of the likely page (the first stage's top two pages) asked for beside the first stage of a
first sight or a page never kept (`beside`: the caller's query itself, each hit with its version; over
several shards where the index's routing is known), or otherwise while the window is scored (`ahead`),
any other after it; a page showing `_source` alone is kept per caller
and version (`PageCache`).

Anything else (a hit of another index, a version gone by the page fetch, a window declined or fallen
back) raises `Miss`: the pipeline reranks again with the full first stage, as before, so an answer
never differs from what that one would give."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any
from urllib.parse import urlencode

import orjson
from cachetools import LRUCache

from bmx_rerank.errors import SearchError, UpstreamError
from bmx_rerank.rerank import shards, tf_probe
from bmx_rerank.rerank.hits import SHARD, HitColumns
from bmx_rerank.rerank.term_vector_cache import numbered_in
from bmx_rerank.rerank.window import Window
from bmx_rerank.stats.cache import StatsView
from bmx_rerank.stats.routing import routed_shards, routing_keys
from bmx_rerank.upstream import Cluster, index_path

# What a lean window may carry: what shapes its hits (the query phase) and what a page fetch can
# reproduce for the page. Anything else (highlight, script_fields, inner hits, sort, collapse, explain,
# rescore, suggest, profile, ...) keeps the full first stage.
BODY = frozenset(
    {
        "query",
        "size",
        "from",
        "track_total_hits",
        "aggs",
        "aggregations",
        "timeout",
        "terminate_after",
        "post_filter",
        "min_score",
        "ext",
        "track_scores",
    }
)
FETCHED = ("_source", "fields", "docvalue_fields", "stored_fields", "version", "seq_no_primary_term")
PARAMS = frozenset(
    {
        "preference",
        "routing",
        "timeout",
        "request_cache",
        "allow_no_indices",
        "ignore_unavailable",
        "expand_wildcards",
        "ignore_throttled",
        "typed_keys",
        "rest_total_hits_as_int",
        "track_total_hits",
        "terminate_after",
        "search_type",
        "allow_partial_search_results",
        "max_concurrent_shard_requests",
        "pre_filter_shard_size",
        "batched_reduce_size",
        "ccs_minimize_roundtrips",
        tf_probe.PARAM,  # the probes' own
    }
)
FETCHED_PARAMS = (
    "_source",
    "_source_includes",
    "_source_excludes",
    "stored_fields",
    "docvalue_fields",
    "version",
)
# what the page fetch keeps of the window's parameters: where it searches, and what each hit shows
PAGE_PARAMS = (
    "preference",
    "routing",
    "allow_no_indices",
    "ignore_unavailable",
    "expand_wildcards",
    "timeout",
)


# How far ahead a lean window's page is guessed, in pages: the documents of the first stage's top
# AHEAD x (from + size) hits are fetched as soon as its answer is read, while the window is scored,
# instead of after it (on SciFact the top 20 held the reranked page of 10 in 98 % of first sights:
# benchmarks/RESULTS.md). A page hit outside them is fetched after, as before; a guess costs the
# cluster a fetch of AHEAD times the page's documents.
AHEAD = 2


# Seconds a window waits for its statistics to say whether it can be lean (they are in memory once a
# snapshot is loaded: a cold load goes full rather than hold the search)
STATS_WAIT = 0.05


class Miss(Exception):
    """This window cannot be answered lean: rerank it again with the full first stage."""


async def narrow(window: Window, fans_out: Callable[[], Awaitable[bool]]) -> bool:
    """Make the window's first stage lean when it can be (see the module docstring); whether it did.

    A probed window, or one unprobed because this caller had it reranked lately (`seen`: its
    frequencies are in the term-vector cache, kept by version for lean hits). On one index of several
    shards, searched shard by shard (`window.shards`, `rerank/shards.py`) where its answer merges
    exactly and the cluster takes a shard preference (`fans_out`, asked only then)."""
    body, params = window.body, window.params
    if body is None or (window.probe is None and window.unprobed_because != "seen"):
        return False
    if not set(body) - {*FETCHED} <= BODY or not set(params) - {*FETCHED_PARAMS} <= PARAMS:
        return False
    if b'"inner_hits"' in orjson.dumps(body.get("query")) or not await _by_version(window):
        return False
    shards = _shard_count(window)
    if shards is None or (shards > 1 and not (_merges(window) and await fans_out())):
        return False
    window.shards = shards
    window.page_fetch = (
        {k: body[k] for k in FETCHED if k in body},
        {k: v for k, v in params.items() if k in FETCHED_PARAMS or k in PAGE_PARAMS},
    )
    window.body = lean_body(body)
    window.params = {k: v for k, v in params.items() if k not in FETCHED_PARAMS}
    return True


def lean_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """A first stage's body asking for no stored field, each hit named by its version instead."""
    return {
        **{k: v for k, v in body.items() if k not in FETCHED},
        "stored_fields": "_none_",
        "seq_no_primary_term": True,
        "version": True,  # from doc values, as `_seq_no`: what `frequencies` checks term vectors against
    }


def page_body(by_index: Mapping[str, Sequence[int]], shown: Mapping[str, Any]) -> dict[str, Any]:
    """The search of one shard's page documents: per index, a `terms` on their `_seq_no`, each hit
    showing `shown` (what the caller asked a hit to show)."""
    which = [
        {"bool": {"filter": [{"term": {"_index": ix}}, {"terms": {"_seq_no": list(seqs)}}]}}
        for ix, seqs in by_index.items()
    ]
    return {
        "query": {"bool": {"filter": [{"bool": {"should": which}}]}},
        "size": sum(map(len, by_index.values())),
        "track_total_hits": False,
        **shown,
        "seq_no_primary_term": True,
    }


def check_hits(window: Window, hits: HitColumns) -> None:
    """Every hit is named by its version: its index has a table keyed so in every field, over as many
    shards as the window searched (a pattern may reach an index that has none, or another), and it
    carries `_seq_no` and `_primary_term`. `Miss` if not."""
    indices = set(hits.index)
    for task in window.stats.values():
        tables = task.result().lengths or {}
        if not all(
            ix in tables and tables[ix].by_version and tables[ix].shards == window.shards for ix in indices
        ):
            raise Miss
    if not hits.versioned:
        raise Miss


async def fetch(
    cluster: Cluster,
    window: Window,
    headers: Mapping[str, str],
    hits: Sequence[Mapping[str, Any]],
    *,
    page: bool,
) -> list[dict[str, Any] | None]:
    """The documents of `hits` (lean hits) by version, each as a hit of the index expression, None where
    that version is gone. `page`: showing what the caller asked each hit to show; else only its `_id`.
    One search a shard: per index, a `terms` on `_seq_no` (unique in a shard); those of several shards
    in one `_msearch` where its header lines can carry the parameters."""
    if not hits:
        return []
    assert window.page_fetch is not None
    shown, params = window.page_fetch
    if not page:
        shown = {"_source": False}
        params = {k: v for k, v in params.items() if k in PAGE_PARAMS}
    by_shard: dict[int, dict[str, list[int]]] = {}
    for hit in hits:
        by_shard.setdefault(hit.get(SHARD, 0), {}).setdefault(str(hit["_index"]), []).append(
            int(hit["_seq_no"])
        )

    searches = {shard: page_body(by_index, shown) for shard, by_index in by_shard.items()}
    answers = await _each_shard(cluster, window, headers, searches, params)
    found = {
        (h.get("_index"), shard, h.get("_seq_no")): h
        for shard, answer in zip(searches, answers, strict=True)
        for h in answer.get("hits", {}).get("hits", [])
    }
    out: list[dict[str, Any] | None] = []
    for hit in hits:
        got = found.pop((hit["_index"], hit.get(SHARD, 0), hit["_seq_no"]), None)
        out.append(got if got is not None and got.get("_primary_term") == hit["_primary_term"] else None)
    return out


async def _each_shard(
    cluster: Cluster,
    window: Window,
    headers: Mapping[str, str],
    searches: Mapping[int, dict[str, Any]],
    params: Mapping[str, str],
) -> list[dict[str, Any]]:
    """Each search of `searches` (by shard) on that shard alone (any copy holds the same versions; on
    one shard, the window's search as it is): in one `_msearch` where its header lines can carry
    `params`, else (also where the `_msearch` or one of its items fails) each on its own, failing as
    it fails. The answers in the order of `searches`."""

    def query(shard: int) -> dict[str, str]:
        return {**params, "preference": f"_shards:{shard}"} if window.shards > 1 else dict(params)

    if len(searches) > 1 and shards.in_header(params):
        lines = shards.msearch_lines(
            window.index_expr, ((query(shard), orjson.dumps(body)) for shard, body in searches.items())
        )
        with contextlib.suppress(UpstreamError):
            answered = await cluster.post_ndjson("/_msearch", lines, headers, "bmx_page_exception")
            if (answers := shards.items(answered, len(searches))) is not None:
                return answers

    async def search(shard: int, body: dict[str, Any]) -> dict[str, Any]:
        path = f"/{index_path(window.index_expr)}/_search" + (
            "?" + urlencode(q) if (q := query(shard)) else ""
        )
        return await cluster.request("POST", path, body, headers)  # type: ignore[no-any-return]

    return list(await asyncio.gather(*(search(shard, body) for shard, body in searches.items())))


async def identify(
    cluster: Cluster, window: Window, headers: Mapping[str, str], hits: Sequence[dict[str, Any]]
) -> None:
    """Give lean `hits` their `_id` (and `_routing`), for the calls that name documents by id
    (`_mtermvectors`); a hit whose version is gone keeps none (it is dropped, as a changed one is)."""
    for hit, doc in zip(hits, await fetch(cluster, window, headers, hits, page=False), strict=True):
        if doc is not None and "_id" in doc:
            hit["_id"] = doc["_id"]
            if "_routing" in doc:
                hit["_routing"] = doc["_routing"]


PageKey = tuple[str, str, str, int, int, str]  # (caller, table/shard, index, _seq_no, _primary_term, shape)
# What a page fetch may show for its documents to be kept (`PageCache`): a version's `_source` never
# changes; `fields`, `docvalue_fields` and `stored_fields` follow the mapping, which can.
CACHED_BODY = frozenset({"_source", "version", "seq_no_primary_term"})
CACHED_PARAMS = frozenset({"_source", "_source_includes", "_source_excludes", "version", *PAGE_PARAMS})


class PageCache:
    """Page documents as a caller saw them, by document version: a repeated window's page needs no
    fetch. Keyed by the caller (what one may read never answers another), the length table (a
    re-created index has another), the version and what the caller asked each hit to show. Each is
    held as its JSON bytes (decoded again on a hit: a page is ~10 documents), so the bound in bytes is
    what it holds; least recently used first out."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._docs: LRUCache[PageKey, bytes] = LRUCache(maxsize=max(1, max_bytes), getsizeof=_held)

    def keeps(self, window: Window) -> bool:
        """Whether this lean window's page documents are kept: the cache is on, and the page shows
        nothing that can change under a version (`CACHED_BODY`, `CACHED_PARAMS`)."""
        assert window.page_fetch is not None
        shown, params = window.page_fetch
        return self.max_bytes > 0 and set(shown) <= CACHED_BODY and set(params) <= CACHED_PARAMS

    def keys(self, window: Window, who: str, hits: Sequence[Mapping[str, Any]]) -> list[PageKey] | None:
        """The hits' keys, None when this window's page is not kept (`keeps`)."""
        if not self.keeps(window):
            return None
        assert window.page_fetch is not None
        shown, params = window.page_fetch
        shape = orjson.dumps(
            [shown, {k: v for k, v in params.items() if k not in PAGE_PARAMS}], option=orjson.OPT_SORT_KEYS
        ).decode()
        named = tables(window)
        return [
            (
                who,
                numbered_in(named[h["_index"]], h.get(SHARD, 0)),
                h["_index"],
                h["_seq_no"],
                h["_primary_term"],
                shape,
            )
            for h in hits
        ]

    def holds(self, key: PageKey) -> bool:
        return key in self._docs

    def __len__(self) -> int:
        return len(self._docs)

    def get(self, key: PageKey) -> dict[str, Any] | None:
        raw = self._docs.get(key)
        return None if raw is None else orjson.loads(raw)

    def put(self, key: PageKey, doc: dict[str, Any]) -> None:
        with contextlib.suppress(ValueError):  # a document larger than the whole cache is not kept
            # a copy: orjson's own bytes keep the capacity of its output buffer (~16 KiB for a 2 KiB
            # document), which the bound would not count
            self._docs[key] = bytes(memoryview(orjson.dumps(doc)))


def _held(raw: bytes) -> int:
    """Bytes an entry holds: its JSON and the bytes object around it, plus its key and LRU slot."""
    return len(raw) + 200


Version = tuple[Any, Any, Any, Any]  # a lean hit's (index, shard, _seq_no, _primary_term)


def version(hit: Mapping[str, Any]) -> Version:
    return (hit["_index"], hit.get(SHARD, 0), hit["_seq_no"], hit["_primary_term"])


class Ahead:
    """The documents of a lean window's likely page, asked for before the page is known (`ahead`,
    `beside`). Its task gives each document found with the hit that names its version."""

    def __init__(self, task: asyncio.Task[list[tuple[Mapping[str, Any], dict[str, Any]]]]) -> None:
        self.task = task

    async def found(self) -> dict[Version, dict[str, Any]]:
        """The documents fetched, by version (a version gone or changed is not there)."""
        return {version(named): doc for named, doc in await self.task}


def ahead(
    cluster: Cluster,
    window: Window,
    headers: Mapping[str, str],
    hits: Sequence[dict[str, Any]],
    *,
    cache: PageCache,
    who: str,
) -> Ahead | None:
    """Start fetching the documents of the first stage's top `AHEAD` pages of lean `hits` that
    `cache` does not hold; None when there are none, or when that would be more than half the window
    (a page that large is not guessed)."""
    top = _likely(window)
    if top == 0 or 2 * top > len(hits):
        return None
    likely = list(hits[:top])
    keys = cache.keys(window, who, likely)
    if keys is not None:
        likely = [h for h, k in zip(likely, keys, strict=True) if not cache.holds(k)]
    if not likely:
        return None

    async def fetched() -> list[tuple[Mapping[str, Any], dict[str, Any]]]:
        docs = await fetch(cluster, window, headers, likely, page=True)
        return [(h, d) for h, d in zip(likely, docs, strict=True) if d is not None]

    return Ahead(asyncio.ensure_future(fetched()))


# What of a window's body picks its hits, for a search of its likely page beside it (`beside`)
PICKS = ("query", "post_filter", "min_score")


def beside(cluster: Cluster, window: Window, headers: Mapping[str, str]) -> Ahead | None:
    """Start a search of the likely page beside a lean first stage whose page is not in the page cache
    (a first sight's, or one never kept), before its answer names the page: the caller's query (without
    the probes, aggregations or the window's stored-field savings) for its top `AHEAD` pages, each hit
    showing what the caller asked and its version. The cluster answers it while it answers the first
    stage, instead of after it. Only where the window is `AHEAD` pages or more twice over, as `ahead`.
    Over several shards a version is one of a shard, and a hit does not say its shard: there, each hit's
    shard is the one its `_routing`, else its `_id`, routes to, where the index's length table knows its
    routing (`routes`: as a table of several shards finds a hit's length); else nothing is searched
    beside. A document of another version than the window's is not used; a failed search guesses
    nothing (the page is fetched after, as without it)."""
    top = _likely(window)
    plan = window.plan
    assert window.page_fetch is not None
    if plan.body is None or top == 0 or 2 * top > int(plan.body.get("size", 10)):
        return None
    routing = routes(window) if window.shards > 1 else {}
    if routing is None:
        return None
    shown, params = window.page_fetch
    body = {
        **{k: plan.body[k] for k in PICKS if k in plan.body},
        "size": top,
        "track_total_hits": False,
        **shown,
        "seq_no_primary_term": True,
    }
    path = f"/{index_path(window.index_expr)}/_search" + ("?" + urlencode(params) if params else "")

    async def searched() -> list[tuple[Mapping[str, Any], dict[str, Any]]]:
        try:
            answer = await cluster.request("POST", path, body, headers)
        except SearchError:  # refused, failed or cut short: the page is fetched after
            return []
        hits = answer.get("hits", {}).get("hits", []) if isinstance(answer, dict) else []
        named = [h for h in hits if "_seq_no" in h and "_primary_term" in h and "_index" in h]
        if window.shards == 1:
            return [(h, h) for h in named]
        return _routed(named, routing, window.shards)

    return Ahead(asyncio.ensure_future(searched()))


def routes(window: Window) -> dict[str, int] | None:
    """The routing shard count of each index of a window over several shards, from its length tables
    (checked against every document when they were built: `LengthIndex.routing_shards`); None where
    one does not know it, or is not of the window's shards."""
    out: dict[str, int] = {}
    for task in window.stats.values():
        for ix, table in (task.result().lengths or {}).items():
            count = getattr(table, "routing_shards", None)
            if count is None or table.shards != window.shards or out.setdefault(ix, count) != count:
                return None
    return out or None


def _routed(
    hits: Sequence[dict[str, Any]], routing: Mapping[str, int], shards: int
) -> list[tuple[Mapping[str, Any], dict[str, Any]]]:
    """Each hit of an index in `routing` named by its version (its index, shard, `_seq_no` and
    `_primary_term`), its shard the one its routing key goes to, with the hit as it came."""
    known = [h for h in hits if h["_index"] in routing and (h.get("_routing") is not None or h.get("_id"))]
    out: list[tuple[Mapping[str, Any], dict[str, Any]]] = []
    for ix in {h["_index"] for h in known}:
        mine = [h for h in known if h["_index"] == ix]
        keys = routing_keys([h.get("_id", "") for h in mine], [h.get("_routing") for h in mine])
        for hit, shard in zip(mine, routed_shards(keys, routing[ix], shards).tolist(), strict=True):
            named = {
                "_index": ix,
                SHARD: shard,
                "_seq_no": hit["_seq_no"],
                "_primary_term": hit["_primary_term"],
            }
            out.append((named, hit))
    return out


def _likely(window: Window) -> int:
    """How many of the window's first hits are guessed to hold its page: its top `AHEAD` pages."""
    return AHEAD * (window.plan.from_ + window.plan.size)


async def fill_page(
    cluster: Cluster,
    window: Window,
    headers: Mapping[str, str],
    body: dict[str, Any],
    *,
    keep_seq: bool,
    keep_version: bool,
    cache: PageCache,
    who: str,
    meanwhile: Callable[[], None] | None = None,
) -> str:
    """The page of a reranked lean window (`body`'s hits, which carry `_seq_no`) replaced by its
    documents as the caller asked to see them (from `cache`, else those fetched ahead, else one
    fetch), with the rerank's `_score` (and explanation); `Miss` when one of them is gone or changed.

    `meanwhile` (the request's work that the page does not wait for) runs while the cluster answers
    a fetch of the page's documents (ahead or after), else before the answer. Says how the fetch ahead
    served the page: "none" made; "unused" (the page all in the cache); "covered"; "fetched_after"
    (part of the page outside it)."""
    hits = body.get("hits", {}).get("hits", [])
    keys = cache.keys(window, who, hits)
    docs = [cache.get(k) for k in keys] if keys is not None else [None] * len(hits)
    wanted = [i for i, d in enumerate(docs) if d is None]
    outcome = "none"
    if window.ahead is not None:
        outcome = "unused"
        if wanted:  # else it is cancelled with the window (`Window.close`)
            if meanwhile is not None and not window.ahead.task.done():  # its fetch is on the wire
                meanwhile, now = None, meanwhile
                now()
            found = await window.ahead.found()
            for i in wanted:
                docs[i] = doc = found.get(version(hits[i]))
                if doc is not None and keys is not None:
                    cache.put(keys[i], doc)
            wanted = [i for i in wanted if docs[i] is None]
            outcome = "fetched_after" if wanted else "covered"
    if wanted:
        fetching = fetch(cluster, window, headers, [hits[i] for i in wanted], page=True)
        if meanwhile is None:
            fetched = await fetching
        else:
            fetched, _ = await asyncio.gather(fetching, _once_sent(meanwhile))
            meanwhile = None
        for i, doc in zip(wanted, fetched, strict=True):
            docs[i] = doc
            if doc is not None and keys is not None:
                cache.put(keys[i], doc)
    if meanwhile is not None:  # nothing was waited for
        meanwhile()
    page = []
    drop = {"_score", "sort", "matched_queries"}
    drop |= set() if keep_seq else {"_seq_no", "_primary_term"}
    drop |= set() if keep_version else {"_version"}
    for hit, doc in zip(hits, docs, strict=True):
        if doc is None:
            raise Miss
        shown = {k: v for k, v in doc.items() if k not in drop}
        shown["_score"] = hit["_score"]
        if "_bmx_explanation" in hit:
            shown["_bmx_explanation"] = hit["_bmx_explanation"]
        page.append(shown)
    body["hits"] = {**body["hits"], "hits": page}
    return outcome


async def on_the_wire() -> None:
    """Until a call started just before is on the wire, so that what follows runs while the cluster
    answers: a turn of the event loop for that call's task to write its request (the proxy's own
    client, `h1`, writes it whole there), one more for the task aiohttp writes a body in (started
    lazily before Python 3.12), which the client wrappers' calls still go by."""
    await asyncio.sleep(0)
    await asyncio.sleep(0)


async def _once_sent(work: Callable[[], None]) -> None:
    """`work`, once the call started just before it is on the wire (`on_the_wire`)."""
    await on_the_wire()
    work()


def tables(window: Window) -> dict[str, str]:
    """Each index's length table, by what names its build (a mapped table's file ident): what a lean
    hit's version is a version of (an index re-created under its name has another)."""
    views = [t.result() for t in window.stats.values()]
    return {
        ix: str(getattr(getattr(t, "layout", None), "ident", id(t)))
        for ix, t in (views[0].lengths or {}).items()
    }


def _shard_count(window: Window) -> int | None:
    """How many searches the lean window takes: 1 where every index has one shard, the shard count of
    the one index it reaches otherwise (several indices of several shards: None, not lean)."""
    counts = {
        ix: t.shards for task in window.stats.values() for ix, t in (task.result().lengths or {}).items()
    }
    if all(n == 1 for n in counts.values()):
        return 1
    return next(iter(counts.values())) if len(counts) == 1 else None


def _merges(window: Window) -> bool:
    """A search of one shard at a time answers, merged, as the search of all: nothing in it is
    computed over shards (aggregations, `dfs_query_then_fetch`) or picks shards itself (`routing`, a
    caller's `preference`), and its window starts at the first hit."""
    body, asked = window.body or {}, window.plan.params
    return (
        not {"aggs", "aggregations"} & set(body)
        and not {"routing", "preference", "search_type"} & set(asked)
        and not body.get("from")
    )


def by_version(view: StatsView) -> bool:
    """Every index of the view has a length table keyed by version: its hits need no `_id`."""
    tables = view.lengths
    return bool(tables) and all(t.by_version for t in tables.values())


async def _by_version(window: Window) -> bool:
    """Every field's statistics are in hand (within STATS_WAIT), each `by_version`."""
    tasks = list(window.stats.values())
    if not tasks:
        return False
    if not all(t.done() for t in tasks):
        await asyncio.sleep(0)  # a lookup of statistics in memory is done in its task's first step
    if not all(t.done() for t in tasks):
        await asyncio.wait(tasks, timeout=STATS_WAIT)
    if not all(t.done() and not t.cancelled() and t.exception() is None for t in tasks):
        return False
    return all(by_version(t.result()) for t in tasks)
