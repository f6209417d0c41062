"""What a snapshot is (`SnapshotInfo`), and its statistics, exact sums and length table as the payloads
of the store's documents (the layout: `stats.store`). Pure: no I/O."""

from __future__ import annotations

import base64
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from bmx_rerank.stats.corpus import CorpusStats, terms_array
from bmx_rerank.stats.errors import StatisticsError, corrupt_snapshot
from bmx_rerank.stats.freshness import IndexMarks
from bmx_rerank.stats.lengths import UNKNOWN_SHARD, DocLengths

CHUNK_TERMS = 50_000
LENGTH_CHUNK = 250_000  # documents per `lengths` document: ~7 MB before compression
FORMAT = 1


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
    # every row of the length table has its shard number: it can be keyed by (shard, version) whatever
    # the index's shard count (`length_files.keyed_by_version`); False in snapshots before the column
    length_shards: bool = False
    # the routing shard count that placed every document of a table keyed by version on several shards
    # in its shard (`stats.routing`): a hit without its shard is then found from its `_id` or
    # `_routing`; None: not checked (snapshots before it, one shard), or some routing did not fit
    length_routing_shards: int | None = None

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


# --- snapshot <-> chunk documents -------------------------------------------------------------


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
    """A length table as compressed chunk payloads, in key order; the dropped keys ride on chunk 0,
    each chunk's shard numbers (int32) after them (`"shards": true`: chunks before it have none)."""
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
                np.ascontiguousarray(table.shard_nos[start:end], "<i4").tobytes(),
            ]
        )
        chunks.append(
            {
                "seq": seq,
                "n": n,
                "dropped": len(dropped),
                "shards": True,
                "blob": base64.b64encode(zlib.compress(blob, 1)).decode(),
            }
        )
    return chunks


def decode_length_chunk(
    info: SnapshotInfo, chunk: Mapping[str, Any]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One length chunk's (keys, seq_nos, primary_terms, lengths, dropped keys, shard numbers), checked
    for size; a chunk written before the shard column has every shard unknown (-1)."""
    blob = zlib.decompress(base64.b64decode(chunk["blob"]))
    n, d = int(chunk["n"]), int(chunk["dropped"])
    with_shards = chunk.get("shards") is True
    if len(blob) != 8 * (4 * n + d) + (4 * n if with_shards else 0):
        raise corrupt_snapshot(info.snapshot, f"length chunk {chunk['seq']} has {len(blob)} bytes")
    cols = [np.frombuffer(blob, dtype, n, 8 * n * i) for i, dtype in enumerate(("<u8", "<i8", "<i8", "<i8"))]
    dropped = np.frombuffer(blob, "<u8", d, 32 * n)
    shards = (
        np.frombuffer(blob, "<i4", n, 8 * (4 * n + d)) if with_shards else np.full(n, UNKNOWN_SHARD, np.int32)
    )
    return cols[0], cols[1], cols[2], cols[3], dropped, shards


def decode_lengths(info: SnapshotInfo, chunks: Sequence[Mapping[str, Any]]) -> DocLengths:
    """A length table back from its chunks (any order); checks it holds what the meta promises."""
    if len(chunks) != info.length_chunks:
        raise corrupt_snapshot(info.snapshot, f"{len(chunks)} of {info.length_chunks} length chunks found")
    cols: list[list[np.ndarray]] = [[], [], [], [], []]
    dropped = [np.zeros(0, np.uint64)]
    for chunk in sorted(chunks, key=lambda c: c["seq"]):
        keys, seq, term, length, gone, shards = decode_length_chunk(info, chunk)
        for i, column in enumerate((keys, seq, term, length, shards)):
            cols[i].append(column)
        dropped.append(gone)
    keys, seq, term, length, shards = (np.concatenate(c) if c else np.zeros(0) for c in cols)
    table = DocLengths(
        keys.astype(np.uint64),
        seq.astype(np.int64),
        term.astype(np.int64),
        length.astype(np.int64),
        np.concatenate(dropped).astype(np.uint64),
        shards.astype(np.int32),
    )
    if len(table) != info.length_docs or (len(table) > 1 and not np.all(table.keys[1:] > table.keys[:-1])):
        raise corrupt_snapshot(info.snapshot, f"{len(table)} lengths, meta says {info.length_docs}")
    return table
