"""Sweeping an index: every live document's term frequencies in one field, folded into CorpusStats.

The imperative shell around `corpus.EntropyAccumulator`. Ids come from a scan (`stats.scan`: a point in
time, or a scroll); term frequencies from `_mtermvectors` in batches, a bounded number in flight while
the next page of ids is fetched.

Consistency: `_mtermvectors` reads the live index, not the PIT, so the sweep records the shards'
sequence numbers before it starts (after a refresh, so everything up to them is visible) and checks
them again at the end. If any write landed meanwhile, the snapshot is marked `exact_marks = False`:
it is still served, but it reports stale and the next refresh rebuilds it, which catches documents
written during the sweep.

Idempotent reads (term vectors, markers, counts) are retried on a dropped connection, never anything
after a cluster error.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, Protocol
from urllib.parse import quote

from bmx_rerank.errors import UpstreamError
from bmx_rerank.stats.corpus import CorpusStats, EntropyAccumulator
from bmx_rerank.stats.errors import field_missing, no_index, not_text_field
from bmx_rerank.stats.freshness import IndexMarks, parse_shard_stats, same_state
from bmx_rerank.stats.lengths import MAX_LENGTH_DOCS, DocLengths, LengthRecorder, doc_key
from bmx_rerank.stats.routing import RoutingCheck, routing_candidates
from bmx_rerank.stats.scan import Part, SweptRef, index_settings, scan_ids
from bmx_rerank.upstream import Cluster, DocRef, index_path

TEXT_TYPES = ("text", "match_only_text")


class Progress(Protocol):
    """What a sweep reports to (a tqdm bar fits): the expected total, then documents done."""

    total: float | None

    def update(self, n: float = 1) -> Any: ...


@dataclass(frozen=True)
class SweepOptions:
    """How a sweep reads: term vectors of `batch_size` documents per `_mtermvectors`, `concurrency`
    of them in flight (ids come in pages of both multiplied), each index in `slices` parallel
    processes (`stats.sliced`), and a length table of up to `max_length_docs` documents (None: none)."""

    batch_size: int = 200
    concurrency: int = 4
    slices: int = 1
    max_length_docs: int | None = MAX_LENGTH_DOCS


DEFAULT_SWEEP = SweepOptions()


@dataclass(frozen=True)
class SweepResult:
    """Statistics of one concrete index and what they were built from."""

    stats: CorpusStats
    marks: IndexMarks
    live_docs: int  # live documents swept, including those without a token in the field
    exact_marks: bool  # no write landed during the sweep: `marks` describe exactly what was counted
    seconds: float
    units: list[int]  # exact entropy sums behind stats.entropy (corpus.ExactStats)
    lengths: DocLengths | None = None  # each swept document version's length (`stats.lengths`)
    lengths_skipped: str | None = None  # why there is no table, when there is none
    # which routing placed every swept document in the shard the scan found it in (`stats.routing`)
    routing: RoutingCheck | None = None


async def resolve_text_field(
    cluster: Cluster,
    index_expr: str,
    field: str,
    headers: Mapping[str, str],
) -> list[str]:
    """Concrete indices behind a name, alias or pattern, after checking `field` is analyzed text in each.

    `_field_caps` needs only read privileges, so this works with the credentials a searcher has."""
    url = f"/{index_path(index_expr)}/_field_caps?fields={quote(field)}&include_unmapped=true"
    answer = await cluster.request("GET", url, None, headers, retried=True)
    indices = sorted(answer.get("indices") or [])
    if not indices:
        raise no_index(index_expr)
    caps = (answer.get("fields") or {}).get(field) or {}
    kinds = {k: v for k, v in caps.items() if k != "unmapped"}
    if not kinds:
        raise field_missing(field, index_expr)
    for kind, info in kinds.items():
        if kind not in TEXT_TYPES:
            where = ",".join(info.get("indices") or indices)
            raise not_text_field(field, where, kind)
    return indices


async def index_marks(cluster: Cluster, index_expr: str, headers: Mapping[str, str]) -> dict[str, IndexMarks]:
    """Sequence-number markers of every concrete index behind `index_expr` (needs `monitor`)."""
    url = (
        f"/{index_path(index_expr)}/_stats/docs?level=shards"
        "&filter_path=indices.*.uuid,indices.*.shards.*.routing.primary,indices.*.shards.*.seq_no"
    )
    return parse_shard_stats(await cluster.request("GET", url, None, headers, retried=True) or {})


async def refresh_index(cluster: Cluster, index: str, headers: Mapping[str, str]) -> bool:
    """Make every processed write searchable; False when the credentials may not (then we wait 1.5s,
    longer than the default refresh interval)."""
    try:
        await cluster.request("POST", f"/{index_path(index)}/_refresh", None, headers)
        return True
    except UpstreamError as exc:
        if exc.status != 403:
            raise
        await asyncio.sleep(1.5)
        return False


async def live_count(
    cluster: Cluster,
    index: str,
    headers: Mapping[str, str],
    query: Mapping[str, Any] | None = None,
    preference: str | None = None,
) -> int:
    """Top-level live documents (nested documents excluded, unlike `_stats` docs.count)."""
    url = f"/{index_path(index)}/_count" + (f"?preference={quote(preference)}" if preference else "")
    body = {"query": query} if query else None
    return int((await cluster.request("POST", url, body, headers, retried=True))["count"])


async def term_vectors(
    cluster: Cluster,
    refs: Sequence[DocRef],
    field: str,
    headers: Mapping[str, str],
    record: bool = False,
) -> Folded:
    """Terms and frequencies of each found document (documents deleted since the scan are skipped).

    Reads the `_mtermvectors` answer directly into flat lists: at sweep scale, building a
    `DocTerms` per document costs more than the cluster's own work. With `record`, also the length
    rows of the `SweptRef`s whose term vectors are of the scanned `_version` (a document changed in
    between is left out: it falls back to `_mtermvectors` at query time), with their shards."""
    docs = await cluster.fetch_vectors(refs, [field], headers)
    out = []
    keys: list[int] = []
    rest: list[tuple[int, int, int]] = []
    shards: list[int | None] = []
    for ref, doc in zip(refs, docs, strict=True):
        if not doc.found:
            continue
        terms = doc.terms(field)
        repeated = [(t, f) for t, v in terms.items() if (f := v.term_freq) > 1]
        length = len(terms) + sum(map(itemgetter(1), repeated)) - len(repeated)
        out.append((terms.keys(), repeated, length))
        if record and isinstance(ref, SweptRef) and ref.version is not None:
            if doc.version == ref.version and ref.seq_no is not None and ref.primary_term is not None:
                keys.append(doc_key(ref.id, ref.routing))
                rest.append((ref.seq_no, ref.primary_term, length))
                shards.append(ref.shard)
    return out, keys, rest, shards


# One batch's documents as (distinct terms, (term, tf > 1) pairs, length), and its length rows (keys,
# rest, shards).
Folded = tuple[
    list[tuple[Collection[str], list[tuple[str, int]], int]],
    list[int],
    list[tuple[int, int, int]],
    list[int | None],
]


async def fold_pages(
    cluster: Cluster,
    pages: AsyncIterator[list[DocRef]],
    field: str,
    headers: Mapping[str, str],
    acc: EntropyAccumulator,
    options: SweepOptions,
    *,
    progress: Progress | None = None,
    lengths: LengthRecorder | None = None,
    routing: RoutingCheck | None = None,
) -> None:
    """Term frequencies of every page's documents into `acc`, at most `options.concurrency` batches in flight;
    with `lengths`, the length of every document (pages of `SweptRef`) into it; with `routing`, every
    document's `_id`, `_routing` and the shard it was found in."""
    pending: set[asyncio.Task[Folded]] = set()

    def drain(done: set[asyncio.Task[Folded]]) -> None:
        for task in done:
            docs, keys, rest, shards = task.result()
            for terms, repeated, length in docs:
                acc.add_split(terms, repeated, length)
            if lengths is not None:
                lengths.add(keys, rest, shards)
        if progress is not None:
            progress.update(sum(len(t.result()[0]) for t in done))

    try:
        async for page in pages:
            if routing is not None:
                routing.add(
                    [r.id for r in page],
                    [r.routing for r in page],
                    [r.shard if isinstance(r, SweptRef) else None for r in page],
                )
            for start in range(0, len(page), options.batch_size):
                while len(pending) >= options.concurrency:
                    done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    pending -= done
                    drain(done)
                batch = page[start : start + options.batch_size]
                pending.add(
                    asyncio.ensure_future(term_vectors(cluster, batch, field, headers, lengths is not None))
                )
        if pending:
            done, _ = await asyncio.wait(pending)
            pending -= done
            drain(done)
    finally:
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)


async def sweep_index(
    cluster: Cluster,
    index: str,
    field: str,
    headers: Mapping[str, str],
    options: SweepOptions = DEFAULT_SWEEP,
    *,
    progress: Progress | None = None,
    part: Part | None = None,
) -> SweepResult:
    """Exact statistics of one concrete index (call `resolve_text_field` first to validate the field);
    with `part`, of one slice of it (see `scan_ids`; `stats.sliced` adds the slices up exactly).
    Also the length table of up to `options.max_length_docs` documents (None: no table)."""
    started = time.perf_counter()
    before = (await index_marks(cluster, index, headers)).get(index)
    if before is None:
        raise no_index(index)
    await refresh_index(cluster, index, headers)
    acc = EntropyAccumulator()
    recorder = None if options.max_length_docs is None else LengthRecorder(options.max_length_docs)
    routing = None
    if recorder is not None and len(before.shards) > 1:  # one shard needs no routing
        settings = await index_settings(cluster, index, headers)
        routing = RoutingCheck(len(before.shards), routing_candidates(settings, len(before.shards)))
    totals: list[int] = []

    async def pages() -> AsyncIterator[list[DocRef]]:
        counted = False
        async with aclosing(
            scan_ids(
                cluster,
                index,
                headers,
                options.batch_size * options.concurrency,
                totals,
                part,
                recorder is not None,
                len(before.shards) or None,
            )
        ) as ids:
            async for page in ids:
                if progress is not None and totals and not counted:  # several indices share one bar
                    progress.total = (progress.total or 0) + totals[0]
                    counted = True
                yield page

    async with aclosing(pages()) as paged:  # a failed sweep closes its PIT or scroll right away
        await fold_pages(
            cluster, paged, field, headers, acc, options, progress=progress, lengths=recorder, routing=routing
        )
    after = (await index_marks(cluster, index, headers)).get(index)
    exact = before.settled and after is not None and same_state(before, after)
    live = totals[0] if totals else acc.n_seen
    result = acc.finish_exact()
    return SweepResult(
        result.stats,
        before,
        live,
        exact and live == acc.n_seen,
        time.perf_counter() - started,
        result.units,
        *finish_lengths(recorder),
        routing,
    )


def finish_lengths(recorder: LengthRecorder | None) -> tuple[DocLengths | None, str | None]:
    """A sweep's length table, or None and why."""
    if recorder is None:
        return None, "not requested"
    table = recorder.finish()
    if table is None:
        return None, f"more than {recorder.limit} documents (--max-length-docs)"
    return table, None


async def marks_or_none(
    cluster: Cluster, index_expr: str, headers: Mapping[str, str]
) -> dict[str, IndexMarks] | None:
    """Markers, or None when the caller may not read index stats (freshness then reads as unknown)."""
    try:
        return await index_marks(cluster, index_expr, headers)
    except UpstreamError as exc:
        if exc.status in (401, 403):
            return None
        raise
