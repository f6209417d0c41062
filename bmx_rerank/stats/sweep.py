"""Sweeping an index: every live document's term frequencies in one field, folded into CorpusStats.

The imperative shell around `corpus.EntropyAccumulator`. Ids come from a point-in-time scan
(`search_after` on `_shard_doc`), or a scroll where the cluster has no usable PIT; term frequencies
from `_mtermvectors` in batches, a bounded number in flight while the next page of ids is fetched.

Consistency: `_mtermvectors` reads the live index, not the PIT, so the sweep records the shards'
sequence numbers before it starts (after a refresh, so everything up to them is visible) and checks
them again at the end. If any write landed meanwhile, the snapshot is marked `exact_marks = False`:
it is still served, but it reports stale and the next refresh rebuilds it, which catches documents
written during the sweep.

Idempotent reads (PIT pages, term vectors, markers, counts) are retried on a dropped connection;
scroll pages are not (a retried scroll call would skip a page), nor is anything after a cluster error.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from operator import itemgetter
from typing import Any, Protocol
from urllib.parse import quote

import aiohttp

from bmx_rerank.errors import SearchError, UpstreamError
from bmx_rerank.stats.corpus import CorpusStats, EntropyAccumulator
from bmx_rerank.stats.errors import field_missing, no_index, not_text_field
from bmx_rerank.stats.freshness import IndexMarks, parse_shard_stats, same_state
from bmx_rerank.stats.lengths import MAX_LENGTH_DOCS, DocLengths, LengthRecorder, doc_key
from bmx_rerank.upstream import Cluster, DocRef

KEEP_ALIVE = "5m"
Part = tuple[int, int]  # (slice id, number of slices)
TEXT_TYPES = ("text", "match_only_text")
VERSIONS = {"seq_no_primary_term": True, "version": True}  # what a scan needs for the length table


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


@dataclass(frozen=True)
class SweptRef(DocRef):
    """A scanned document with the version the scan saw: its length is recorded only if the term
    vectors read afterwards are of that same `_version`."""

    seq_no: int | None = dataclass_field(default=None, compare=False)
    primary_term: int | None = dataclass_field(default=None, compare=False)
    version: int | None = dataclass_field(default=None, compare=False)


async def resolve_text_field(
    cluster: Cluster,
    index_expr: str,
    field: str,
    headers: Mapping[str, str],
) -> list[str]:
    """Concrete indices behind a name, alias or pattern, after checking `field` is analyzed text in each.

    `_field_caps` needs only read privileges, so this works with the credentials a searcher has."""
    url = f"/{_enc(index_expr)}/_field_caps?fields={quote(field)}&include_unmapped=true"
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
        f"/{_enc(index_expr)}/_stats/docs?level=shards"
        "&filter_path=indices.*.uuid,indices.*.shards.*.routing.primary,indices.*.shards.*.seq_no"
    )
    return parse_shard_stats(await cluster.request("GET", url, None, headers, retried=True) or {})


async def refresh_index(cluster: Cluster, index: str, headers: Mapping[str, str]) -> bool:
    """Make every processed write searchable; False when the credentials may not (then we wait 1.5s,
    longer than the default refresh interval)."""
    try:
        await cluster.request("POST", f"/{_enc(index)}/_refresh", None, headers)
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
    url = f"/{_enc(index)}/_count" + (f"?preference={quote(preference)}" if preference else "")
    body = {"query": query} if query else None
    return int((await cluster.request("POST", url, body, headers, retried=True))["count"])


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
    between is left out: it falls back to `_mtermvectors` at query time)."""
    docs = await cluster.fetch_vectors(refs, [field], headers)
    out = []
    keys: list[int] = []
    rest: list[tuple[int, int, int]] = []
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
    return out, keys, rest


# One batch's documents as (distinct terms, (term, tf > 1) pairs, length), and its length rows (keys, rest).
Folded = tuple[
    list[tuple[Collection[str], list[tuple[str, int]], int]], list[int], list[tuple[int, int, int]]
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
) -> None:
    """Term frequencies of every page's documents into `acc`, at most `options.concurrency` batches in flight;
    with `lengths`, the length of every document (pages of `SweptRef`) into it."""
    pending: set[asyncio.Task[Folded]] = set()

    def drain(done: set[asyncio.Task[Folded]]) -> None:
        for task in done:
            docs, keys, rest = task.result()
            for terms, repeated, length in docs:
                acc.add_split(terms, repeated, length)
            if lengths is not None:
                lengths.add(keys, rest)
        if progress is not None:
            progress.update(sum(len(t.result()[0]) for t in done))

    try:
        async for page in pages:
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
            )
        ) as ids:
            async for page in ids:
                if progress is not None and totals and not counted:  # several indices share one bar
                    progress.total = (progress.total or 0) + totals[0]
                    counted = True
                yield page

    async with aclosing(pages()) as paged:  # a failed sweep closes its PIT or scroll right away
        await fold_pages(cluster, paged, field, headers, acc, options, progress=progress, lengths=recorder)
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
    )


def finish_lengths(recorder: LengthRecorder | None) -> tuple[DocLengths | None, str | None]:
    """A sweep's length table, or None and why."""
    if recorder is None:
        return None, "not requested"
    table = recorder.finish()
    if table is None:
        return None, f"more than {recorder.limit} documents (--max-length-docs)"
    return table, None


async def _open_pit(
    cluster: Cluster,
    index: str,
    headers: Mapping[str, str],
    part: Part | None = None,
) -> tuple[str, str] | None:
    """(flavor, pit id), or None when the cluster offers no PIT that `_shard_doc` can page through."""
    try:
        answer = await cluster.request("POST", f"/{_enc(index)}/_pit?keep_alive={KEEP_ALIVE}", None, headers)
        return ("es", answer["id"])
    except UpstreamError as exc:
        if exc.type == "index_not_found_exception" or exc.status == 403:
            raise
    try:
        answer = await cluster.request(
            "POST",
            f"/{_enc(index)}/_search/point_in_time?keep_alive={KEEP_ALIVE}",
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
    answer = await cluster.request("POST", f"/{_enc(index)}/_search?scroll={KEEP_ALIVE}", body, headers)
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


def _enc(index_expr: str) -> str:
    """An index expression as a path segment (commas and wildcards kept, as the cluster expects)."""
    return quote(index_expr, safe=",*-_.:")


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
