"""Snapshots of statistics stored in the cluster itself, so every sidecar replica shares one copy.

Layout of the store index (default `bmx-stats`, a hidden index: a plain name because Elasticsearch
deprecates new dot-prefixed names, hidden so `*` patterns and Kibana do not pick it up):
- `chunk` documents `{snapshot}|{seq}`: up to CHUNK_TERMS terms each, one zlib-compressed base64 blob of
  NUL-separated UTF-8 terms + int64 df + float64 raw entropy, so loading is a few `_mget`s and numpy
  `frombuffer`s, never a JSON array of a million numbers;
- `exact` documents `{snapshot}|x{seq}`: the same terms' exact entropy sums (integers in 2^-112
  units), read only by an incremental refresh so that it matches a rebuild bit for bit;
- `lengths` documents `{snapshot}|L{seq}`: the exact document lengths (`stats.lengths.DocLengths`),
  LENGTH_CHUNK documents each, zlib-compressed little-endian arrays (key, seq_no, primary term,
  length; then the dropped keys), loaded by the proxy with the statistics;
- a `meta` document `{snapshot}|meta` describing the snapshot (`SnapshotInfo`);
- a `pointer` document `ptr|{index}|{field}` naming the current snapshot (with its info).
Publishing writes chunks and meta under a fresh snapshot id and only then flips the pointer (a single
document write, atomic); a build that fails or is interrupted leaves the pointer, hence the last good
snapshot, untouched. The snapshot before the current one is kept so a replica loading it mid-flip can
finish; older ones are deleted after a flip.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any
from urllib.parse import quote

import numpy as np
import orjson

from bmx_rerank.errors import SearchError, UpstreamError
from bmx_rerank.stats.corpus import CorpusStats, ExactStats
from bmx_rerank.stats.errors import corrupt_snapshot
from bmx_rerank.stats.lengths import DocLengths
from bmx_rerank.stats.snapshot import (
    SnapshotInfo,
    decode_chunks,
    decode_length_chunk,
    decode_lengths,
    decode_units,
    encode_chunks,
    encode_lengths,
    encode_units,
    pointer_id,
)
from bmx_rerank.upstream import Cluster

log = logging.getLogger(__name__)

DEFAULT_STORE = os.environ.get("BMX_STATS_INDEX", "bmx-stats")
STORE_SETTINGS: dict[str, Any] = {
    "settings": {
        "index": {
            "hidden": True,
            "number_of_shards": 1,
            "auto_expand_replicas": "0-1",
        }
    },
    "mappings": {
        "dynamic": False,
        "properties": {
            "kind": {"type": "keyword"},
            "key": {"type": "keyword"},
            "snapshot": {"type": "keyword"},
            "seq": {"type": "integer"},
            "created_at": {"type": "date"},
            "data": {"type": "object", "enabled": False},
            "info": {"type": "object", "enabled": False},
        },
    },
}


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


# --- I/O ------------------------------------------------------------------------------------------


async def ensure_store(cluster: Cluster, headers: Mapping[str, str], store: str = DEFAULT_STORE) -> None:
    """Create the store index if missing. A 403 is left for the writes to report: a builder may be
    allowed to write to an existing store without being allowed to create indices."""
    try:
        await cluster.request("PUT", f"/{quote(store)}", STORE_SETTINGS, headers)
    except UpstreamError as exc:
        if exc.type != "resource_already_exists_exception" and exc.status != 403:
            raise


async def publish(
    cluster: Cluster,
    headers: Mapping[str, str],
    info: SnapshotInfo,
    stats: CorpusStats,
    store: str = DEFAULT_STORE,
    units: Sequence[int] | None = None,
    lengths: DocLengths | None = None,
) -> None:
    """Write a snapshot, then flip its pointer: readers see the old snapshot or the new, never a mix.

    `units` (the exact entropy sums, see `corpus.ExactStats`) go to separate `exact` documents that
    only an incremental refresh reads; `info.exact_units` must say whether they are given. `lengths`
    go to `lengths` documents; `info.length_docs` and `length_chunks` must describe them."""
    await ensure_store(cluster, headers, store)
    if info.exact_units != (units is not None):
        raise ValueError("info.exact_units must match whether units are given")
    length_chunks = encode_lengths(lengths) if lengths is not None else []
    if (info.length_docs, info.length_chunks) != (
        (len(lengths), len(length_chunks)) if lengths is not None else (None, 0)
    ):
        raise ValueError("info.length_docs and length_chunks must describe the length table given")
    per_chunk = max(1, -(-stats.vocabulary_size // info.n_chunks))
    chunks = encode_chunks(stats, per_chunk)
    if len(chunks) != info.n_chunks:
        raise ValueError(f"{info.n_chunks} chunks cannot hold {stats.vocabulary_size} terms evenly")
    created = now_iso()
    ops: list[tuple[str, str, dict[str, Any] | None]] = [
        (
            "index",
            f"{info.snapshot}|{c['seq']}",
            {
                "kind": "chunk",
                "key": info.key,
                "snapshot": info.snapshot,
                "seq": c["seq"],
                "created_at": created,
                "data": c,
            },
        )
        for c in chunks
    ]
    for c in encode_units(units, per_chunk) if units is not None else []:
        doc = {
            "kind": "exact",
            "key": info.key,
            "snapshot": info.snapshot,
            "seq": c["seq"],
            "created_at": created,
        }
        ops.append(("index", f"{info.snapshot}|x{c['seq']}", {**doc, "data": c}))
    for c in length_chunks:
        doc = {
            "kind": "lengths",
            "key": info.key,
            "snapshot": info.snapshot,
            "seq": c["seq"],
            "created_at": created,
        }
        ops.append(("index", f"{info.snapshot}|L{c['seq']}", {**doc, "data": c}))
    ops.append(
        (
            "index",
            f"{info.snapshot}|meta",
            {
                "kind": "meta",
                "key": info.key,
                "snapshot": info.snapshot,
                "created_at": created,
                "info": info.to_json(),
            },
        )
    )
    await _bulk(cluster, headers, store, ops)
    previous = await read_pointers(cluster, headers, [(info.index, info.field)], store)
    prev = previous.get((info.index, info.field))
    pointer = {
        "kind": "pointer",
        "key": info.key,
        "snapshot": info.snapshot,
        "previous": prev.snapshot if prev else None,
        "created_at": created,
        "info": info.to_json(),
    }
    url = f"/{quote(store)}/_doc/{quote(pointer_id(info.index, info.field), safe='')}?refresh=true"
    await cluster.request("PUT", url, pointer, headers)
    try:  # the snapshot is published: failing to tidy up older ones must not report the build failed
        await _collect_garbage(cluster, headers, store, info.key, {info.snapshot, pointer["previous"]})
    except SearchError as exc:
        log.warning(
            "old statistics snapshots not deleted (the next publish retries)",
            extra={"fields": {"key": info.key, "error": str(exc)}},
        )


async def read_pointers(
    cluster: Cluster,
    headers: Mapping[str, str],
    keys: Sequence[tuple[str, str]],
    store: str = DEFAULT_STORE,
) -> dict[tuple[str, str], SnapshotInfo]:
    """Current snapshot of each (index, field) that has one; a missing store means none has."""
    if not keys:
        return {}
    body = {"ids": [pointer_id(i, f) for i, f in keys]}
    try:
        answer = await cluster.request("POST", f"/{quote(store)}/_mget", body, headers)
    except UpstreamError as exc:
        if exc.type == "index_not_found_exception":
            return {}
        raise
    out = {}
    for key, doc in zip(keys, answer["docs"], strict=True):
        if doc.get("found"):
            out[key] = SnapshotInfo.from_json(doc["_source"]["info"])
    return out


async def load(
    cluster: Cluster,
    headers: Mapping[str, str],
    info: SnapshotInfo,
    store: str = DEFAULT_STORE,
    batch: int = 8,
) -> CorpusStats:
    """The statistics of a snapshot: its chunks fetched by id a few at a time, decoded with numpy."""
    chunks = await _fetch_data(cluster, headers, store, _chunk_ids(info, ""), batch)
    return decode_chunks(info, chunks)


async def load_exact(
    cluster: Cluster,
    headers: Mapping[str, str],
    info: SnapshotInfo,
    store: str = DEFAULT_STORE,
) -> ExactStats | None:
    """Statistics with their exact entropy sums, or None for a snapshot stored without them."""
    if not info.exact_units:
        return None
    stats, chunks = await asyncio.gather(
        load(cluster, headers, info, store),
        _fetch_data(cluster, headers, store, _chunk_ids(info, "x"), 8),
    )
    return ExactStats(stats, decode_units(info, chunks))


async def load_lengths(
    cluster: Cluster,
    headers: Mapping[str, str],
    info: SnapshotInfo,
    store: str = DEFAULT_STORE,
) -> DocLengths | None:
    """The snapshot's length table, or None for a snapshot stored without one."""
    if info.length_docs is None:
        return None
    ids = [f"{info.snapshot}|L{i}" for i in range(info.length_chunks)]
    return decode_lengths(info, await _fetch_data(cluster, headers, store, ids, 2))


async def length_chunks(
    cluster: Cluster,
    headers: Mapping[str, str],
    info: SnapshotInfo,
    store: str = DEFAULT_STORE,
    per_request: int = 2,
) -> AsyncIterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """The snapshot's length table chunk by chunk, in key order, as (keys, seq_nos, primary_terms,
    lengths, shard numbers; -1 where unknown): `per_request` chunks in memory at a time, whatever the table's size. Checked as
    `load_lengths` checks it (every chunk there, the meta's count, keys ascending across chunks)."""
    if info.length_docs is None:
        raise ValueError(f"snapshot {info.snapshot} has no length table")
    seen, last = 0, -1
    for start in range(0, info.length_chunks, per_request):
        ids = [f"{info.snapshot}|L{i}" for i in range(start, min(start + per_request, info.length_chunks))]
        chunks = sorted(await _fetch_data(cluster, headers, store, ids, per_request), key=lambda c: c["seq"])
        if [c["seq"] for c in chunks] != list(range(start, start + len(ids))):
            raise corrupt_snapshot(info.snapshot, f"length chunks {ids[0]}..{ids[-1]} not all found")
        for chunk in chunks:
            keys, seq, term, length, _, shards = decode_length_chunk(info, chunk)
            if keys.size and (int(keys[0]) <= last or not np.all(keys[1:] > keys[:-1])):
                raise corrupt_snapshot(info.snapshot, f"length chunk {chunk['seq']} out of key order")
            last = int(keys[-1]) if keys.size else last
            seen += keys.size
            yield keys, seq, term, length, shards
    if seen != info.length_docs:
        raise corrupt_snapshot(info.snapshot, f"{seen} lengths, meta says {info.length_docs}")


def _chunk_ids(info: SnapshotInfo, kind: str) -> list[str]:
    """Ids of a snapshot's `chunk` (kind "") or `exact` (kind "x") documents, in order."""
    return [f"{info.snapshot}|{kind}{i}" for i in range(info.n_chunks)]


async def _fetch_data(
    cluster: Cluster,
    headers: Mapping[str, str],
    store: str,
    ids: Sequence[str],
    batch: int,
) -> list[dict[str, Any]]:
    async def fetch(part: Sequence[str]) -> list[dict[str, Any]]:
        url = f"/{quote(store)}/_mget?_source=data"
        answer = await cluster.request("POST", url, {"ids": list(part)}, headers)
        return [d["_source"]["data"] for d in answer["docs"] if d.get("found")]

    parts = await asyncio.gather(*(fetch(ids[i : i + batch]) for i in range(0, len(ids), batch)))
    return [c for p in parts for c in p]


async def _bulk(
    cluster: Cluster,
    headers: Mapping[str, str],
    store: str,
    ops: Sequence[tuple[str, str, dict[str, Any] | None]],
    max_bytes: int = 16 << 20,
    refresh: bool = False,
) -> None:
    """Index or delete documents of the store in bulk requests of at most `max_bytes`; any item error
    fails the whole write (the caller has not flipped a pointer yet, so nothing half-done is visible)."""
    lines: list[bytes] = []
    size = 0

    async def flush() -> None:
        nonlocal lines, size
        if not lines:
            return
        url = f"/{quote(store)}/_bulk" + ("?refresh=true" if refresh else "")
        answer = await cluster.post_ndjson(url, lines, headers, "bmx_store_write_exception")
        if answer.get("errors"):
            first = next(i for i in answer["items"] if "error" in next(iter(i.values())))
            err = next(iter(first.values()))["error"]
            status = next(iter(first.values())).get("status", 500)
            raise UpstreamError(status, err.get("type", "bmx_store_write_exception"), err.get("reason", ""))
        lines, size = [], 0

    for verb, doc_id, source in ops:
        action = orjson.dumps({verb: {"_id": doc_id}})
        body = b"" if source is None else orjson.dumps(source)
        if size + len(body) > max_bytes:
            await flush()
        lines += [action, body] if source is not None else [action]
        size += len(action) + len(body)
    await flush()


async def _collect_garbage(
    cluster: Cluster,
    headers: Mapping[str, str],
    store: str,
    key: str,
    keep: set[str | None],
) -> None:
    """Delete this key's snapshots other than `keep`, if older than an hour (so a build still writing
    its chunks is never touched). Search + bulk delete: `_delete_by_query` lives in a module some
    distributions leave out."""
    cutoff = (datetime.now(timezone.utc) - timedelta(hours=1)).isoformat(timespec="seconds")
    query = {
        "bool": {
            "filter": [{"term": {"key": key}}, {"range": {"created_at": {"lt": cutoff}}}],
            "must_not": [
                {"terms": {"snapshot": sorted(k for k in keep if k)}},
                {"term": {"kind": "pointer"}},
            ],
        }
    }
    url = f"/{quote(store)}/_search"
    while True:
        body = {"size": 1000, "_source": False, "query": query}
        hits = (await cluster.request("POST", url, body, headers))["hits"]["hits"]
        if not hits:
            return
        await _bulk(cluster, headers, store, [("delete", h["_id"], None) for h in hits], refresh=True)
