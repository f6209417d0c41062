"""Every live document of one index, in pages of ids, from one consistent reader: a point in time
(`search_after` on `_shard_doc`), or a scroll where the cluster has no usable PIT. A sliced reader
(`part`) lets n processes or machines scan disjoint parts that together hold every document.

A scan for the length table (`versions`) also tells each hit's shard number: a PIT's `_shard_doc` sort
value holds it in its high 32 bits (the shard's index in the request, which for one index is its
number: Elasticsearch 8.19 and 9.1, OpenSearch 3.3; checked once a shard during the scan); a scroll's
hits do not say, so over an index of several shards it scrolls each shard on its own
(`preference=_shards:i`), all at once and read in turn, so each context is used as often as one
scroll's would be.

PIT pages are retried on a dropped connection; scroll pages are not (a retried scroll call would skip
a page). A reader is always closed, best-effort, when the scan ends or fails."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import aclosing
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any

import aiohttp

from bmx_rerank.errors import SearchError, UpstreamError
from bmx_rerank.upstream import Cluster, DocRef, index_path

KEEP_ALIVE = "5m"
Part = tuple[int, int]  # (slice id, number of slices)
VERSIONS = {"seq_no_primary_term": True, "version": True}  # what a scan needs for the length table


@dataclass(frozen=True)
class SweptRef(DocRef):
    """A scanned document with the version the scan saw: its length is recorded only if the term
    vectors read afterwards are of that same `_version`."""

    seq_no: int | None = dataclass_field(default=None, compare=False)
    primary_term: int | None = dataclass_field(default=None, compare=False)
    version: int | None = dataclass_field(default=None, compare=False)
    shard: int | None = dataclass_field(default=None, compare=False)  # the shard's number, None: unknown


async def scan_ids(
    cluster: Cluster,
    index: str,
    headers: Mapping[str, str],
    page_size: int = 1000,
    totals: list[int] | None = None,
    part: Part | None = None,
    versions: bool = False,
    shard_count: int | None = None,
) -> AsyncIterator[list[DocRef]]:
    """Every live document of `index` in pages, from one consistent reader (PIT, else scroll); with
    `part` (i, n), only slice i of n (`slice: {id, max}`: disjoint slices that together hold every
    document, so n processes or machines can sweep one index). With `versions`, `SweptRef`s: each
    hit's `_seq_no`, `_primary_term`, `_version` and shard (for the length table); a scroll reads the
    index's `shard_count` (None: from its settings) to scroll each shard on its own.

    Appends the reader's total hit count to `totals` when the first page arrives. Close it
    (`contextlib.aclosing`) when not read to the end: that closes the PIT or scroll at once, while the
    session still works, instead of whenever the generator is collected."""
    pit = await _open_pit(cluster, index, headers, part)
    if pit is not None:
        gen = _scan_pit(cluster, pit, headers, page_size, totals, part, versions, index)
    else:
        gen = _scan_scrolls(cluster, index, headers, page_size, totals, part, versions, shard_count)
    async with aclosing(gen):
        async for page in gen:
            yield page


async def _open_pit(
    cluster: Cluster,
    index: str,
    headers: Mapping[str, str],
    part: Part | None = None,
) -> tuple[str, str] | None:
    """(flavor, pit id), or None when the cluster offers no PIT that `_shard_doc` can page through."""
    try:
        answer = await cluster.request(
            "POST", f"/{index_path(index)}/_pit?keep_alive={KEEP_ALIVE}", None, headers
        )
        return ("es", answer["id"])
    except UpstreamError as exc:
        if exc.type == "index_not_found_exception" or exc.status == 403:
            raise
    try:
        answer = await cluster.request(
            "POST",
            f"/{index_path(index)}/_search/point_in_time?keep_alive={KEEP_ALIVE}",
            None,
            headers,
        )
    except UpstreamError as exc:
        if exc.type == "index_not_found_exception" or exc.status == 403:
            raise
        return None
    pit = ("os", answer["pit_id"])
    try:  # OpenSearch versions differ in whether a PIT can sort on _shard_doc
        await cluster.request("POST", "/_search", _pit_body(pit[1], 1, None, part), headers)
    except SearchError as exc:
        await _close_pit(cluster, pit, headers)
        if not isinstance(exc, UpstreamError):
            raise  # the cluster went away: not a reason to fall back to a scroll
        return None
    return pit


def _pit_body(
    pit_id: str, size: int, after: list[Any] | None, part: Part | None = None, versions: bool = False
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "size": size,
        "_source": False,
        "pit": {"id": pit_id, "keep_alive": KEEP_ALIVE},
        "sort": [{"_shard_doc": "asc"}],
        "track_total_hits": after is None,
    }
    if versions:
        body.update(VERSIONS)
    if after is not None:
        body["search_after"] = after
    if part is not None and part[1] > 1:
        body["slice"] = {"id": part[0], "max": part[1]}
    return body


async def _scan_pit(
    cluster: Cluster,
    pit: tuple[str, str],
    headers: Mapping[str, str],
    page_size: int,
    totals: list[int] | None,
    part: Part | None = None,
    versions: bool = False,
    index: str = "",
) -> AsyncIterator[list[DocRef]]:
    pit_id = pit[1]
    after: list[Any] | None = None
    # The sort value is read as a shard only once a document of that shard was found there with
    # `preference=_shards:N` (one search a shard): a cluster that encodes it otherwise gives no shards
    checked: set[int] = set()
    trusted = True
    try:
        while True:
            body = _pit_body(pit_id, page_size, after, part, versions)
            answer = await cluster.request("POST", "/_search", body, headers, retried=True)
            pit_id = answer.get("pit_id", pit_id)
            hits = answer["hits"]["hits"]
            if after is None and totals is not None:
                totals.append(int(answer["hits"]["total"]["value"]))
            if not hits:
                return
            if versions:
                shards = [_pit_shard(h) for h in hits]
                for hit, shard in zip(hits, shards, strict=True):
                    if trusted and shard is not None and shard not in checked:
                        trusted = await _in_shard(cluster, index, hit, shard, headers)
                        checked.add(shard)
                yield [swept_ref(h, s if trusted else None) for h, s in zip(hits, shards, strict=True)]
            else:
                yield [_ref(h) for h in hits]
            after = hits[-1]["sort"]
    finally:
        await _close_pit(cluster, (pit[0], pit_id), headers)


async def _in_shard(
    cluster: Cluster, index: str, hit: Mapping[str, Any], shard: int, headers: Mapping[str, str]
) -> bool:
    """Whether the hit's document is in shard `shard` (by its `_id`, and its `_routing` if any)."""
    which: list[dict[str, Any]] = [{"ids": {"values": [hit["_id"]]}}]
    if hit.get("_routing") is not None:
        which.append({"term": {"_routing": hit["_routing"]}})
    body = {"size": 0, "track_total_hits": True, "query": {"bool": {"filter": which}}}
    url = f"/{index_path(index)}/_search?preference=_shards:{shard}"
    answer = await cluster.request("POST", url, body, headers, retried=True)
    return int(answer["hits"]["total"]["value"]) == 1


def _pit_shard(hit: Mapping[str, Any]) -> int | None:
    """The shard of a PIT hit sorted on `_shard_doc`: the high 32 bits of its sort value."""
    value = (hit.get("sort") or [None])[0]
    return value >> 32 if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


async def _scan_scrolls(
    cluster: Cluster,
    index: str,
    headers: Mapping[str, str],
    page_size: int,
    totals: list[int] | None,
    part: Part | None = None,
    versions: bool = False,
    shard_count: int | None = None,
) -> AsyncIterator[list[DocRef]]:
    """One scroll; for the length table over several shards, one a shard (each hit's shard known),
    opened together (their total is the index's) and read a page each in turn until all are done."""
    body: dict[str, Any] = {"size": page_size, "_source": False, "sort": ["_doc"], "track_total_hits": True}
    if versions:
        body.update(VERSIONS)
    if part is not None and part[1] > 1:
        body["slice"] = {"id": part[0], "max": part[1]}
    count = (shard_count or await _shard_count(cluster, index, headers)) if versions else None
    if count is None or count == 1:
        shards: list[int | None] = [0 if count == 1 else None]
    else:
        shards = list(range(count))
    scrolls: dict[int | None, str | None] = {}  # open scrolls: shard -> scroll id
    try:
        answers = []
        for shard in shards:
            where = f"&preference=_shards:{shard}" if len(shards) > 1 else ""
            url = f"/{index_path(index)}/_search?scroll={KEEP_ALIVE}{where}"
            answer = await cluster.request("POST", url, body, headers)
            scrolls[shard] = answer.get("_scroll_id")
            answers.append((shard, answer))
        if totals is not None:
            totals.append(sum(int(a["hits"]["total"]["value"]) for _, a in answers))
        while answers:
            following = []
            for shard, answer in answers:
                hits = answer["hits"]["hits"]
                if not hits:
                    await close_scroll(cluster, scrolls.pop(shard), headers)
                    continue
                yield [swept_ref(h, shard) for h in hits] if versions else [_ref(h) for h in hits]
                answer = await cluster.request(
                    "POST",
                    "/_search/scroll",
                    {"scroll": KEEP_ALIVE, "scroll_id": scrolls[shard]},
                    headers,
                )
                scrolls[shard] = answer.get("_scroll_id", scrolls[shard])
                following.append((shard, answer))
            answers = following
    finally:
        for scroll_id in scrolls.values():
            await close_scroll(cluster, scroll_id, headers)


async def close_scroll(cluster: Cluster, scroll_id: str | None, headers: Mapping[str, str]) -> None:
    """Free a scroll's context now, not when it times out; best effort (`_quietly`)."""
    if scroll_id:
        await _quietly(cluster.request("DELETE", "/_search/scroll", {"scroll_id": scroll_id}, headers))


async def index_settings(cluster: Cluster, index: str, headers: Mapping[str, str]) -> dict[str, Any] | None:
    """One concrete index's flat settings; None when the caller may not read them (needs
    `view_index_metadata`): then no routing is trusted (`stats.routing.routing_candidates`), no window
    is scored in the engine (`rerank.in_engine.layout`) and no length field is added."""
    url = f"/{index_path(index)}/_settings?flat_settings=true"
    try:
        answer = await cluster.request("GET", url, None, headers, retried=True)
    except UpstreamError as exc:
        if exc.status in (401, 403):
            return None
        raise
    if not isinstance(answer, Mapping) or len(answer) != 1:
        return None
    (found,) = answer.values()
    settings = found.get("settings") if isinstance(found, Mapping) else None
    return dict(settings) if isinstance(settings, Mapping) else None


async def _shard_count(cluster: Cluster, index: str, headers: Mapping[str, str]) -> int | None:
    """The index's number of primary shards from its settings; None when they cannot be read (then the
    scroll's hits have no shard: the table stays keyed by `_id`)."""
    settings = await index_settings(cluster, index, headers)
    try:
        return int((settings or {})["index.number_of_shards"])
    except (KeyError, TypeError, ValueError):
        return None


async def _close_pit(cluster: Cluster, pit: tuple[str, str], headers: Mapping[str, str]) -> None:
    if pit[0] == "es":
        call = cluster.request("DELETE", "/_pit", {"id": pit[1]}, headers)
    else:
        call = cluster.request("DELETE", "/_search/point_in_time", {"pit_id": [pit[1]]}, headers)
    await _quietly(call)


async def _quietly(call: Any) -> None:
    """Best-effort cleanup: the context expires by itself; never mask the error that got us here."""
    try:
        await asyncio.wait_for(call, 10)
    except (SearchError, asyncio.TimeoutError, aiohttp.ClientError, asyncio.CancelledError):
        pass


def _ref(hit: Mapping[str, Any]) -> DocRef:
    return DocRef(hit["_index"], hit["_id"], hit.get("_routing"))


def swept_ref(hit: Mapping[str, Any], shard: int | None = None) -> SweptRef:
    """A hit of a scan with `VERSIONS`, found in `shard` (None: not known)."""
    return SweptRef(
        hit["_index"],
        hit["_id"],
        hit.get("_routing"),
        hit.get("_seq_no"),
        hit.get("_primary_term"),
        hit.get("_version"),
        shard,
    )
