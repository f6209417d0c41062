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
import base64
import logging
import os
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta, timezone
from typing import Any
from urllib.parse import quote

import numpy as np
import orjson

from bmx_rerank.errors import SearchError, UpstreamError
from bmx_rerank.stats.corpus import CorpusStats, ExactStats, terms_array
from bmx_rerank.stats.errors import StatisticsError, corrupt_snapshot
from bmx_rerank.stats.freshness import IndexMarks
from bmx_rerank.stats.lengths import DocLengths
from bmx_rerank.upstream import Cluster

log = logging.getLogger(__name__)

DEFAULT_STORE = os.environ.get("BMX_STATS_INDEX", "bmx-stats")
CHUNK_TERMS = 50_000
LENGTH_CHUNK = 250_000  # documents per `lengths` document: ~7 MB before compression
FORMAT = 1

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


@dataclass(frozen=True)
class SnapshotInfo:
    """What a snapshot holds and what it was built from."""

    snapshot: str
    index: str
    field: str
    n_docs: int
    total_length: int
    vocabulary_size: int
    n_chunks: int
    live_docs: int  # live documents counted, including those without a token in the field
    marks: IndexMarks
    exact_marks: bool  # marks describe exactly the documents counted (no write during the build)
    built_at: str  # ISO 8601, UTC
    build_seconds: float
    method: str  # "build" or "refresh"
    exact_units: bool = False  # exact entropy sums stored beside the floats (`exact` documents)
    length_docs: int | None = None  # documents in the length table (`lengths` documents); None: none
    length_chunks: int = 0
    lengths_skipped: str | None = None  # why there is no length table

    @property
    def key(self) -> str:
        return store_key(self.index, self.field)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["marks"] = self.marks.to_json()
        data["format"] = FORMAT
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SnapshotInfo:
        fields = {k: data[k] for k in cls.__dataclass_fields__ if k != "marks" and k in data}
        return cls(**fields, marks=IndexMarks.from_json(data["marks"]))


def store_key(index: str, field: str) -> str:
    return f"{index}|{field}"


def pointer_id(index: str, field: str) -> str:
    return f"ptr|{store_key(index, field)}"


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


# --- pure: snapshot <-> chunk documents -------------------------------------------------------------


def encode_chunks(stats: CorpusStats, chunk_terms: int = CHUNK_TERMS) -> list[dict[str, Any]]:
    """The vocabulary as compact chunk payloads, in term order."""
    chunks = []
    terms = stats.terms.tolist()
    for seq, start in enumerate(range(0, max(len(terms), 1), chunk_terms)):
        part = terms[start : start + chunk_terms]
        if any("\x00" in t for t in part):
            raise StatisticsError(400, "bmx_unsupported_term_exception", "a term contains a NUL character")
        blob = b"".join(
            [
                len(part).to_bytes(8, "little"),
                np.ascontiguousarray(stats.df[start : start + chunk_terms], "<i8").tobytes(),
                np.ascontiguousarray(stats.entropy[start : start + chunk_terms], "<f8").tobytes(),
                "\x00".join(part).encode("utf-8"),
            ]
        )
        chunks.append({"seq": seq, "n": len(part), "blob": base64.b64encode(zlib.compress(blob, 1)).decode()})
    return chunks


def decode_chunks(info: SnapshotInfo, chunks: Sequence[Mapping[str, Any]]) -> CorpusStats:
    """Statistics back from chunk payloads (any order); checks they add up to what the meta promises."""
    if len(chunks) != info.n_chunks:
        raise corrupt_snapshot(info.snapshot, f"{len(chunks)} of {info.n_chunks} chunks found")
    terms: list[str] = []
    dfs, ents = [], []
    for chunk in sorted(chunks, key=lambda c: c["seq"]):
        blob = zlib.decompress(base64.b64decode(chunk["blob"]))
        n = int.from_bytes(blob[:8], "little")
        dfs.append(np.frombuffer(blob, "<i8", n, 8))
        ents.append(np.frombuffer(blob, "<f8", n, 8 + 8 * n))
        text = blob[8 + 16 * n :].decode("utf-8")
        if n:
            terms.extend(text.split("\x00"))
    stats = CorpusStats(
        info.n_docs,
        info.total_length,
        terms_array(terms),
        np.concatenate(dfs).astype(np.int64) if dfs else np.zeros(0, np.int64),
        np.concatenate(ents).astype(np.float64) if ents else np.zeros(0),
    )
    if stats.vocabulary_size != info.vocabulary_size:
        raise corrupt_snapshot(
            info.snapshot, f"{stats.vocabulary_size} terms, meta says {info.vocabulary_size}"
        )
    return stats


def encode_units(units: Sequence[int], per_chunk: int) -> list[dict[str, Any]]:
    """Exact entropy sums (non-negative integers of any size) as fixed-width little-endian chunks."""
    chunks = []
    for seq, start in enumerate(range(0, max(len(units), 1), per_chunk)):
        part = units[start : start + per_chunk]
        width = max(1, -(-max((u.bit_length() for u in part), default=1) // 8))
        raw = b"".join(u.to_bytes(width, "little") for u in part)
        chunks.append(
            {
                "seq": seq,
                "n": len(part),
                "width": width,
                "blob": base64.b64encode(zlib.compress(raw, 1)).decode(),
            }
        )
    return chunks


def decode_units(info: SnapshotInfo, chunks: Sequence[Mapping[str, Any]]) -> list[int]:
    if len(chunks) != info.n_chunks:
        raise corrupt_snapshot(info.snapshot, f"{len(chunks)} of {info.n_chunks} exact chunks found")
    units: list[int] = []
    for chunk in sorted(chunks, key=lambda c: c["seq"]):
        raw = zlib.decompress(base64.b64decode(chunk["blob"]))
        w = chunk["width"]
        units.extend(int.from_bytes(raw[i : i + w], "little") for i in range(0, chunk["n"] * w, w))
    if len(units) != info.vocabulary_size:
        raise corrupt_snapshot(info.snapshot, f"{len(units)} exact sums, meta says {info.vocabulary_size}")
    return units


def encode_lengths(table: DocLengths, per_chunk: int = LENGTH_CHUNK) -> list[dict[str, Any]]:
    """A length table as compressed chunk payloads, in key order; the dropped keys ride on chunk 0."""
    chunks = []
    for seq, start in enumerate(range(0, max(len(table), 1), per_chunk)):
        end = start + per_chunk
        dropped = table.dropped if seq == 0 else table.dropped[:0]
        n = min(len(table), end) - start
        blob = b"".join(
            [
                np.ascontiguousarray(table.keys[start:end], "<u8").tobytes(),
                np.ascontiguousarray(table.seq_nos[start:end], "<i8").tobytes(),
                np.ascontiguousarray(table.primary_terms[start:end], "<i8").tobytes(),
                np.ascontiguousarray(table.lengths[start:end], "<i8").tobytes(),
                np.ascontiguousarray(dropped, "<u8").tobytes(),
            ]
        )
        chunks.append(
            {
                "seq": seq,
                "n": n,
                "dropped": len(dropped),
                "blob": base64.b64encode(zlib.compress(blob, 1)).decode(),
            }
        )
    return chunks


def decode_lengths(info: SnapshotInfo, chunks: Sequence[Mapping[str, Any]]) -> DocLengths:
    """A length table back from its chunks (any order); checks it holds what the meta promises."""
    if len(chunks) != info.length_chunks:
        raise corrupt_snapshot(info.snapshot, f"{len(chunks)} of {info.length_chunks} length chunks found")
    cols: list[list[np.ndarray]] = [[], [], [], []]
    dropped = [np.zeros(0, np.uint64)]
    for chunk in sorted(chunks, key=lambda c: c["seq"]):
        blob = zlib.decompress(base64.b64decode(chunk["blob"]))
        n, d = int(chunk["n"]), int(chunk["dropped"])
        if len(blob) != 8 * (4 * n + d):
            raise corrupt_snapshot(info.snapshot, f"length chunk {chunk['seq']} has {len(blob)} bytes")
        for i, dtype in enumerate(("<u8", "<i8", "<i8", "<i8")):
            cols[i].append(np.frombuffer(blob, dtype, n, 8 * n * i))
        dropped.append(np.frombuffer(blob, "<u8", d, 32 * n))
    keys, seq, term, length = (np.concatenate(c) if c else np.zeros(0) for c in cols)
    table = DocLengths(
        keys.astype(np.uint64),
        seq.astype(np.int64),
        term.astype(np.int64),
        length.astype(np.int64),
        np.concatenate(dropped).astype(np.uint64),
    )
    if len(table) != info.length_docs or (len(table) > 1 and not np.all(table.keys[1:] > table.keys[:-1])):
        raise corrupt_snapshot(info.snapshot, f"{len(table)} lengths, meta says {info.length_docs}")
    return table


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
