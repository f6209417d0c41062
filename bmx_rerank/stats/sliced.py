"""Sweeping one index in slices: in parallel processes here, or on several machines, added up exactly.

One process is bound by decoding the term vectors (throughput: benchmarks/RESULTS.md), so a
100M-document index would take hours. A sliced point in time (`slice: {id, max}`) splits the index
into disjoint parts that together hold every document; each part is swept on its own (`sweep_index`
with `part`) into a `Partial`: the exact integer sums of its documents (corpus.ExactStats). Adding
integers does not depend on order or grouping, so the merged statistics are bit-for-bit those of one
process sweeping everything.

A `Partial` can be written to a JSON file (`--slice i/N --partial-out F` on each machine) and the
files merged later (`stats merge`): the check that every slice is there once, of the same index
state, is the merge's."""

from __future__ import annotations

import asyncio
import base64
import zlib
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from typing import Any

import aiohttp
import numpy as np

from bmx_rerank.stats.corpus import CorpusStats, ExactStats, terms_array, units_to_float
from bmx_rerank.stats.freshness import IndexMarks, same_state
from bmx_rerank.stats.lengths import MAX_LENGTH_DOCS, DocLengths
from bmx_rerank.stats.routing import RoutingCheck, combine
from bmx_rerank.stats.scan import Part
from bmx_rerank.stats.sweep import SweepOptions, SweepResult, sweep_index
from bmx_rerank.upstream import Cluster

FORMAT = "bmx-rerank-partial-1"


class MergeError(ValueError):
    """Partials that do not add up to one index's statistics (missing, repeated or foreign slices)."""


@dataclass(frozen=True)
class Partial:
    """One slice's exact sums and what they were counted from."""

    index: str
    field: str
    part: Part
    exact: ExactStats
    marks: IndexMarks
    live_docs: int
    exact_marks: bool
    seconds: float
    lengths: DocLengths | None = None  # this slice's length table (`stats.lengths`)
    lengths_skipped: str | None = None
    routing: RoutingCheck | None = None  # this slice's routing check (`stats.routing`); None: none made

    def to_json(self) -> dict[str, Any]:
        stats = self.exact.stats
        return {
            "format": FORMAT,
            "index": self.index,
            "field": self.field,
            "part": list(self.part),
            "n_docs": stats.n_docs,
            "total_length": stats.total_length,
            "terms": stats.terms.tolist(),
            "df": stats.df.tolist(),
            "units": [str(u) for u in self.exact.units],  # beyond 64 bits: decimal strings
            "marks": self.marks.to_json(),
            "live_docs": self.live_docs,
            "exact_marks": self.exact_marks,
            "seconds": self.seconds,
            "lengths": None if self.lengths is None else _lengths_json(self.lengths),
            "lengths_skipped": self.lengths_skipped,
            "routing": None if self.routing is None else self.routing.to_json(),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Partial:
        if data.get("format") != FORMAT:
            raise MergeError(f"not a statistics partial (format {data.get('format')!r}, expected {FORMAT})")
        units = [int(u) for u in data["units"]]
        stats = CorpusStats(
            int(data["n_docs"]),
            int(data["total_length"]),
            terms_array(data["terms"]),
            np.array(data["df"], dtype=np.int64),
            np.fromiter(map(units_to_float, units), np.float64, len(units)),
        )
        i, n = data["part"]
        return cls(
            str(data["index"]),
            str(data["field"]),
            (int(i), int(n)),
            ExactStats(stats, units),
            IndexMarks.from_json(data["marks"]),
            int(data["live_docs"]),
            bool(data["exact_marks"]),
            float(data["seconds"]),
            None if data.get("lengths") is None else _lengths_from_json(data["lengths"]),
            data.get("lengths_skipped", "not recorded"),
            None if data.get("routing") is None else RoutingCheck.from_json(data["routing"]),  # older: none
        )


def _lengths_json(table: DocLengths) -> dict[str, Any]:
    """A length table as compressed little-endian arrays (a JSON list of millions of numbers is not)."""
    arrays = (table.keys, table.seq_nos, table.primary_terms, table.lengths, table.dropped, table.shard_nos)
    raw = b"".join(np.ascontiguousarray(a, a.dtype.newbyteorder("<")).tobytes() for a in arrays)
    return {
        "n": len(table),
        "dropped": int(table.dropped.shape[0]),
        "shards": True,  # int32 shard numbers after the dropped keys (files before them have none)
        "blob": base64.b64encode(zlib.compress(raw, 1)).decode(),
    }


def _lengths_from_json(data: Mapping[str, Any]) -> DocLengths:
    raw = zlib.decompress(base64.b64decode(data["blob"]))
    n, d = int(data["n"]), int(data["dropped"])
    with_shards = data.get("shards") is True
    if len(raw) != 8 * (4 * n + d) + (4 * n if with_shards else 0):
        raise MergeError("a partial's length table is truncated")
    cols = [np.frombuffer(raw, t, n, 8 * n * i) for i, t in enumerate(("<u8", "<i8", "<i8", "<i8"))]
    dropped = np.frombuffer(raw, "<u8", d, 32 * n)
    shards = np.frombuffer(raw, "<i4", n, 8 * (4 * n + d)) if with_shards else None
    return DocLengths.from_keys(cols[0], cols[1], cols[2], cols[3], dropped, shards)


def partial(index: str, field: str, part: Part, result: SweepResult) -> Partial:
    return Partial(
        index,
        field,
        part,
        ExactStats(result.stats, result.units),
        result.marks,
        result.live_docs,
        result.exact_marks,
        result.seconds,
        result.lengths,
        result.lengths_skipped,
        result.routing,
    )


def merge(partials: Sequence[Partial], max_length_docs: int | None = MAX_LENGTH_DOCS) -> SweepResult:
    """The statistics of the whole index from all its slices, each exactly once.

    Exact only if every slice saw the same index state (`exact_marks` false otherwise, as a sweep
    during writes is: served, reported stale, rebuilt by the next refresh)."""
    if not partials:
        raise MergeError("no partials to merge")
    first = partials[0]
    n = first.part[1]
    for p in partials:
        if (p.index, p.field, p.part[1], p.marks.uuid) != (first.index, first.field, n, first.marks.uuid):
            raise MergeError(
                f"slice {p.part[0]}/{p.part[1]} of [{p.index}][{p.field}] does not belong with "
                f"slice {first.part[0]}/{n} of [{first.index}][{first.field}]"
            )
    ids = sorted(p.part[0] for p in partials)
    if ids != list(range(n)):
        raise MergeError(f"slices {ids} of {n}: each of 0..{n - 1} is needed exactly once")
    ordered = sorted(partials, key=lambda p: p.part[0])
    total = ordered[0].exact
    for p in ordered[1:]:
        total = total + p.exact
    exact = all(p.exact_marks and same_state(p.marks, first.marks) for p in ordered)
    lengths, skipped = _merged_lengths(ordered, max_length_docs)
    return SweepResult(
        total.stats,
        first.marks,
        sum(p.live_docs for p in ordered),
        exact,
        max(p.seconds for p in ordered),
        total.units,
        lengths,
        skipped,
        combine([p.routing for p in ordered]),  # a routing must place the documents of every slice
    )


def _merged_lengths(
    ordered: Sequence[Partial], max_length_docs: int | None
) -> tuple[DocLengths | None, str | None]:
    """The slices' length tables added up (the table of one sweep of everything), or None and why:
    a slice without one, or more than `max_length_docs` documents in all."""
    if max_length_docs is None:
        return None, "not requested"
    missing = next((p for p in ordered if p.lengths is None), None)
    if missing is not None:
        return None, missing.lengths_skipped or "a slice has no length table"
    if sum(len(p.lengths) for p in ordered if p.lengths is not None) > max_length_docs:
        return None, f"more than {max_length_docs} documents (--max-length-docs)"
    total = DocLengths.empty()
    for p in ordered:
        assert p.lengths is not None
        total = total + p.lengths
    return total, None


def sweep_part(
    base_url: str, index: str, field: str, headers: Mapping[str, str], part: Part, options: SweepOptions
) -> Partial:
    """One slice, swept in this process with its own event loop and connections."""

    async def run() -> SweepResult:
        async with aiohttp.ClientSession() as session:
            return await sweep_index(Cluster(session, base_url), index, field, headers, options, part=part)

    return partial(index, field, part, asyncio.run(run()))


async def sweep_sliced(
    base_url: str, index: str, field: str, headers: Mapping[str, str], options: SweepOptions
) -> SweepResult:
    """`index` swept in `options.slices` parallel processes, merged exactly."""
    slices = options.slices
    loop = asyncio.get_running_loop()
    with ProcessPoolExecutor(max_workers=slices, mp_context=get_context("spawn")) as pool:
        partials = await asyncio.gather(
            *(
                loop.run_in_executor(
                    pool, sweep_part, base_url, index, field, dict(headers), (i, slices), options
                )
                for i in range(slices)
            )
        )
    return merge(partials, options.max_length_docs)
