"""Every live document of one index, in pages of ids, from one consistent reader: a point in time
(`search_after` on `_shard_doc`), or a scroll where the cluster has no usable PIT. A sliced reader
(`part`) lets n processes or machines scan disjoint parts that together hold every document.

PIT pages are retried on a dropped connection; scroll pages are not (a retried scroll call would skip
a page). A reader is always closed, best-effort, when the scan ends or fails."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import aclosing
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any
from urllib.parse import quote

import aiohttp

from bmx_rerank.errors import SearchError, UpstreamError
from bmx_rerank.upstream import Cluster, DocRef

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


async def scan_ids(
    cluster: Cluster,
    index: str,
    headers: Mapping[str, str],
    page_size: int = 1000,
    totals: list[int] | None = None,
    part: Part | None = None,
    versions: bool = False,
) -> AsyncIterator[list[DocRef]]:
    """Every live document of `index` in pages, from one consistent reader (PIT, else scroll); with
    `part` (i, n), only slice i of n (`slice: {id, max}`: disjoint slices that together hold every
    document, so n processes or machines can sweep one index). With `versions`, `SweptRef`s: each
    hit's `_seq_no`, `_primary_term` and `_version` (for the length table).

    Appends the reader's total hit count to `totals` when the first page arrives. Close it
    (`contextlib.aclosing`) when not read to the end: that closes the PIT or scroll at once, while the
    session still works, instead of whenever the generator is collected."""
    pit = await _open_pit(cluster, index, headers, part)
    if pit is not None:
        gen = _scan_pit(cluster, pit, headers, page_size, totals, part, versions)
    else:
        gen = _scan_scroll(cluster, index, headers, page_size, totals, part, versions)
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
) -> AsyncIterator[list[DocRef]]:
    pit_id = pit[1]
    after: list[Any] | None = None
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
            yield [swept_ref(h) for h in hits] if versions else [_ref(h) for h in hits]
            after = hits[-1]["sort"]
    finally:
        await _close_pit(cluster, (pit[0], pit_id), headers)


async def _scan_scroll(
    cluster: Cluster,
    index: str,
    headers: Mapping[str, str],
    page_size: int,
    totals: list[int] | None,
    part: Part | None = None,
    versions: bool = False,
) -> AsyncIterator[list[DocRef]]:
    body: dict[str, Any] = {"size": page_size, "_source": False, "sort": ["_doc"], "track_total_hits": True}
    if versions:
        body.update(VERSIONS)
    if part is not None and part[1] > 1:
        body["slice"] = {"id": part[0], "max": part[1]}
    answer = await cluster.request("POST", f"/{index_path(index)}/_search?scroll={KEEP_ALIVE}", body, headers)
    scroll_id = answer.get("_scroll_id")
    if totals is not None:
        totals.append(int(answer["hits"]["total"]["value"]))
    try:
        while answer["hits"]["hits"]:
            hits = answer["hits"]["hits"]
            yield [swept_ref(h) for h in hits] if versions else [_ref(h) for h in hits]
            answer = await cluster.request(
                "POST",
                "/_search/scroll",
                {"scroll": KEEP_ALIVE, "scroll_id": scroll_id},
                headers,
            )
            scroll_id = answer.get("_scroll_id", scroll_id)
    finally:
        if scroll_id:
            await _quietly(cluster.request("DELETE", "/_search/scroll", {"scroll_id": scroll_id}, headers))


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


def swept_ref(hit: Mapping[str, Any]) -> SweptRef:
    """A hit of a scan with `VERSIONS`."""
    return SweptRef(
        hit["_index"],
        hit["_id"],
        hit.get("_routing"),
        hit.get("_seq_no"),
        hit.get("_primary_term"),
        hit.get("_version"),
    )


def index_path(index_expr: str) -> str:
    """An index expression as a path segment (commas and wildcards kept, as the cluster expects)."""
    return quote(index_expr, safe=",*-_.:")
