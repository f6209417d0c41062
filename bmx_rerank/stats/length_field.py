"""Each document's length in the cluster's own doc values: a `token_count` sub-field `<field>.len`,
what `serve --in-engine` scores with (rerank/in_engine.py).

`add` puts it in the mapping: the field's own analyzer, every token counted (a removed stop word
leaves no hole in the count, as the sidecar counts). Documents indexed from then on get it as they are
written; `fill` gives it to those written before by writing each again, unchanged, from its `_source`,
as `_update_by_query` with `conflicts=proceed` does (which the test clusters here lack): each write
only if the document is still the version read (`if_seq_no`), so a write or delete made meanwhile
wins, at a bounded rate, with progress. `missing` counts those still without one."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from bmx_rerank.errors import SearchError, bad_request
from bmx_rerank.rerank import in_engine
from bmx_rerank.stats.scan import close_scroll, index_settings
from bmx_rerank.stats.sweep import Progress
from bmx_rerank.upstream import Cluster, index_path

SCROLL = "2m"  # one batch's write fits in it: a scroll context lives this long between batches
MAX_BATCH = 10_000  # documents a scroll page and a `_bulk` hold: a bound on the command's memory


@dataclass(frozen=True)
class Filled:
    """What a fill did: documents written again, those a write or delete made meanwhile had changed
    (left as they are: written since, they have a length), and those refused for another reason."""

    written: int
    changed: int
    failed: int
    first_failure: str | None = None


async def add(cluster: Cluster, index: str, field: str, headers: Mapping[str, str]) -> bool:
    """Put `<field>.len` in the mapping of `index` (one index, its documents written again from
    `_source` by `fill`): True when added, False when it was there already. Refuses, with a 400, what
    `fill` could not write back unchanged."""
    path = f"/{index_path(index)}"
    mappings, settings = await asyncio.gather(
        cluster.request("GET", f"{path}/_mapping", None, headers, retried=True),
        index_settings(cluster, index, headers),
    )
    if len(mappings) != 1:
        raise bad_request(
            f"[bmx] [{index}] names {len(mappings)} indices: give a length field to one at a time"
        )
    ((name, found),) = mappings.items()
    mapping = found.get("mappings", {})
    if settings is None:
        raise SearchError(
            403,
            "security_exception",
            f"[bmx] [{name}]: its settings cannot be read (needs view_index_metadata)",
        )
    source = mapping.get("_source", {})
    if source.get("enabled") is False or source.get("includes") or source.get("excludes"):
        raise bad_request(
            f"[bmx] [{name}] keeps no whole _source: its documents cannot be written again unchanged"
        )
    for pipeline in ("default_pipeline", "final_pipeline"):
        if settings.get(f"index.{pipeline}") not in (None, "_none"):
            raise bad_request(
                f"[bmx] [{name}] has a {pipeline} [{settings[f'index.{pipeline}']}], which would change its "
                "documents as they are written again"
            )
    text = _field(mapping, field)
    if text is None or text.get("type") != "text":
        raise bad_request(f"[bmx] [{name}] maps no text field [{field}]")
    analyzer = in_engine.field_analyzer(text, settings)
    have = text.get("fields", {}).get(in_engine.SUFFIX)
    if have is not None:
        if have == in_engine.length_mapping(analyzer):
            return False
        raise bad_request(
            f"[bmx] [{name}] has a sub-field [{field}.{in_engine.SUFFIX}] that is not its length: "
            f"{orjson.dumps(have).decode()}"
        )
    fields = {**text.get("fields", {}), in_engine.SUFFIX: in_engine.length_mapping(analyzer)}
    body: dict[str, Any] = {**text, "fields": fields}
    for part in reversed(field.split(".")):
        body = {"properties": {part: body}}
    await cluster.request("PUT", f"{path}/_mapping", body, headers)
    return True


def _field(mapping: Mapping[str, Any], field: str) -> dict[str, Any] | None:
    """A field's own mapping, by its dotted path through objects."""
    node: Any = mapping
    for part in field.split("."):
        node = (node.get("properties") or {}).get(part) if isinstance(node, dict) else None
        if node is None:
            return None
    return node


def _lacking(field: str) -> dict[str, Any]:
    """Documents that hold `field` but no length."""
    length = f"{field}.{in_engine.SUFFIX}"
    return {"bool": {"filter": [{"exists": {"field": field}}], "must_not": [{"exists": {"field": length}}]}}


async def missing(cluster: Cluster, index: str, field: str, headers: Mapping[str, str]) -> int:
    """How many documents of `index` hold `field` but no length (as of the last refresh)."""
    path = f"/{index_path(index)}/_count"
    answer = await cluster.request("POST", path, {"query": _lacking(field)}, headers, retried=True)
    return int(answer["count"])


async def fill(
    cluster: Cluster,
    index: str,
    field: str,
    headers: Mapping[str, str],
    *,
    batch: int = 500,
    rate: float = 0,
    progress: Progress | None = None,
) -> Filled:
    """Write every document of `index` that lacks a length again, unchanged, `batch` at a time and at
    most `rate` a second (0: unbounded), reporting to `progress` (its total with the first batch, so a
    bar opens only where there is something to fill). Refreshes at the end, so `missing` then counts
    what is left."""
    if not 1 <= batch <= MAX_BATCH:
        raise bad_request(f"[bmx] batch must lie in [1, {MAX_BATCH}], got [{batch}]")
    path = f"/{index_path(index)}"
    total = await missing(cluster, index, field, headers)
    body = {"size": batch, "sort": ["_doc"], "seq_no_primary_term": True, "query": _lacking(field)}
    page = await cluster.request("POST", f"{path}/_search?scroll={SCROLL}", body, headers)
    scroll_id = page.get("_scroll_id")
    written = changed = failed = done = 0
    first_failure = None
    start = time.monotonic()
    try:
        while hits := page.get("hits", {}).get("hits", []):
            answer = await cluster.post_ndjson("/_bulk", _writes(hits), headers, "bulk_exception")
            for item in answer.get("items", []):
                result = next(iter(item.values()))
                if result.get("status", 500) < 300:
                    written += 1
                elif result.get("status") == 409:  # written or deleted since it was read: left so
                    changed += 1
                else:
                    failed += 1
                    first_failure = first_failure or orjson.dumps(result.get("error")).decode()[:300]
            if progress is not None:
                if done == 0:
                    progress.total = total
                progress.update(len(hits))
            done += len(hits)
            if rate > 0:  # no faster than `rate` documents a second, over the whole fill
                await asyncio.sleep(max(0.0, done / rate - (time.monotonic() - start)))
            page = await cluster.request(
                "POST", "/_search/scroll", {"scroll": SCROLL, "scroll_id": scroll_id}, headers
            )
            scroll_id = page.get("_scroll_id", scroll_id)
    finally:
        await close_scroll(cluster, scroll_id, headers)
    await cluster.request("POST", f"{path}/_refresh", None, headers)
    return Filled(written, changed, failed, first_failure)


def _writes(hits: list[dict[str, Any]]) -> list[bytes]:
    """Each hit's document written again as it was read, only if still that version."""
    lines = []
    for hit in hits:
        action = {"_index": hit["_index"], "_id": hit["_id"]}
        action["if_seq_no"], action["if_primary_term"] = hit["_seq_no"], hit["_primary_term"]
        if "_routing" in hit:
            action["routing"] = hit["_routing"]
        lines += [orjson.dumps({"index": action}), orjson.dumps(hit["_source"])]
    return lines
