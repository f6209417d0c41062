"""Building statistics: sweep, publish, refresh and describe snapshots (what `bmx-rerank stats` runs).

- `build` sweeps the live documents of an index expression and returns exact `CorpusStats`;
- `build_snapshots` / `refresh` do the same and publish snapshots to the store index (`store`);
- `freshness` says, per concrete index, what is stored and whether the index moved on since;
- `describe` is what `stats show --json` prints.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from bmx_rerank.stats import sliced
from bmx_rerank.stats import store as stats_store
from bmx_rerank.stats.cache import StatsCache
from bmx_rerank.stats.corpus import CorpusStats, EntropyAccumulator, sum_in_order
from bmx_rerank.stats.errors import empty_corpus
from bmx_rerank.stats.freshness import (
    Freshness,
    IndexMarks,
    appends_only,
    drifted,
    incremental_possible,
    judge,
    new_operations,
    same_state,
)
from bmx_rerank.stats.lengths import DocLengths, LengthRecorder
from bmx_rerank.stats.routing import RoutingCheck
from bmx_rerank.stats.scan import VERSIONS, swept_ref
from bmx_rerank.stats.snapshot import CHUNK_TERMS, LENGTH_CHUNK, SnapshotInfo
from bmx_rerank.stats.store import DEFAULT_STORE, now_iso
from bmx_rerank.stats.sweep import (
    DEFAULT_SWEEP,
    Progress,
    SweepOptions,
    SweepResult,
    finish_lengths,
    fold_pages,
    index_marks,
    live_count,
    marks_or_none,
    refresh_index,
    resolve_text_field,
    sweep_index,
)
from bmx_rerank.upstream import Cluster, DocRef

log = logging.getLogger(__name__)


# --- building -------------------------------------------------------------------------------------


async def build(
    cluster: Cluster,
    index: str,
    field: str,
    headers: Mapping[str, str],
    options: SweepOptions = DEFAULT_SWEEP,
    *,
    progress: Progress | None = None,
) -> CorpusStats:
    """Exact statistics of `field` over every live document of an index, alias or pattern (summed)."""
    return (await build_with_lengths(cluster, index, field, headers, options, progress=progress))[0]


async def build_with_lengths(
    cluster: Cluster,
    index: str,
    field: str,
    headers: Mapping[str, str],
    options: SweepOptions = DEFAULT_SWEEP,
    *,
    progress: Progress | None = None,
) -> tuple[CorpusStats, dict[str, DocLengths]]:
    """`build`'s statistics and, from the same sweep, each concrete index's document-length table
    (those a sweep kept: see `sweep_index`), as a `FixedStats` takes them."""
    return summed(await sweep_all(cluster, index, field, headers, options, progress=progress))


def summed(results: Mapping[str, SweepResult]) -> tuple[CorpusStats, dict[str, DocLengths]]:
    """The concrete indices' sweeps as one `CorpusStats` and each index's length table (those kept)."""
    tables = {name: r.lengths for name, r in results.items() if r.lengths is not None}
    return sum_in_order([r.stats for r in results.values()]), tables


async def sweep_all(
    cluster: Cluster,
    index_expr: str,
    field: str,
    headers: Mapping[str, str],
    options: SweepOptions = DEFAULT_SWEEP,
    *,
    progress: Progress | None = None,
    only: Sequence[str] | None = None,
    allow_empty: bool = False,
) -> dict[str, SweepResult]:
    """Sweep each concrete index behind `index_expr` (or those in `only`), one after the other; an
    error when none of them holds a token in the field, unless `allow_empty`."""
    indices = await resolve_text_field(cluster, index_expr, field, headers)
    out: dict[str, SweepResult] = {}
    for name in indices if only is None else [i for i in indices if i in only]:
        if options.slices > 1:  # parallel processes, merged exactly (stats.sliced)
            out[name] = await sliced.sweep_sliced(cluster.base_url, name, field, headers, options)
        else:
            out[name] = await sweep_index(cluster, name, field, headers, options, progress=progress)
    if not allow_empty and out and all(r.stats.n_docs == 0 for r in out.values()):
        # One empty index among others (a new daily index) is fine and gets an empty snapshot;
        # nothing to build from at all is an error.
        raise empty_corpus(",".join(out), field)
    return out


async def build_snapshots(
    cluster: Cluster,
    index_expr: str,
    field: str,
    headers: Mapping[str, str],
    options: SweepOptions = DEFAULT_SWEEP,
    *,
    store: str = DEFAULT_STORE,
    progress: Progress | None = None,
    only: Sequence[str] | None = None,
    allow_empty: bool = False,
) -> list[SnapshotInfo]:
    """Full sweep of every concrete index behind `index_expr`, each published as a new snapshot.

    Sweeps everything before publishing anything, so a failure leaves every pointer as it was."""
    results = await sweep_all(
        cluster, index_expr, field, headers, options, progress=progress, only=only, allow_empty=allow_empty
    )
    return [
        await publish_sweep(cluster, headers, name, field, result, store) for name, result in results.items()
    ]


async def publish_sweep(
    cluster: Cluster,
    headers: Mapping[str, str],
    index: str,
    field: str,
    result: SweepResult,
    store: str = DEFAULT_STORE,
) -> SnapshotInfo:
    """Publish one index's full sweep (one process's, or merged slices') as its new snapshot."""
    info = snapshot_info(
        index,
        field,
        result.stats,
        result.marks,
        result.live_docs,
        result.exact_marks,
        result.seconds,
        "build",
        exact_units=True,
        lengths=result.lengths,
        lengths_skipped=result.lengths_skipped,
        routing=result.routing,
    )
    if result.lengths_skipped and result.lengths_skipped != "not requested":
        log.warning("no length table", extra={"fields": {"index": index, "reason": result.lengths_skipped}})
    await stats_store.publish(cluster, headers, info, result.stats, store, result.units, result.lengths)
    return info


@dataclass(frozen=True)
class RefreshOutcome:
    """What `refresh` did for one concrete index."""

    index: str
    action: str  # "unchanged", "incremental", "rebuilt", "built"
    reason: str
    snapshot: SnapshotInfo | None
    new_documents: int = 0


async def refresh(
    cluster: Cluster,
    index_expr: str,
    field: str,
    headers: Mapping[str, str],
    options: SweepOptions = DEFAULT_SWEEP,
    *,
    store: str = DEFAULT_STORE,
    progress: Progress | None = None,
    force_rebuild: bool = False,
) -> list[RefreshOutcome]:
    """Bring each concrete index's snapshot up to date: nothing if unchanged, the appended documents
    alone if only appends happened since (proved from sequence numbers and live counts), else a full
    rebuild. Indices without a snapshot are built; an empty one among others gets an empty snapshot,
    as with `build_snapshots`."""
    indices = await resolve_text_field(cluster, index_expr, field, headers)
    pointers = await stats_store.read_pointers(cluster, headers, [(i, field) for i in indices], store)
    outcomes = []
    for name in indices:
        info = pointers.get((name, field))
        outcome = None
        if info is None:
            action, reason = "built", "no snapshot"
        elif force_rebuild:
            action, reason = "rebuilt", "rebuild requested"
        else:
            current = (await index_marks(cluster, name, headers)).get(name)
            if current is not None and info.exact_marks and not drifted(info.marks, current):
                outcomes.append(RefreshOutcome(name, "unchanged", "no write since the snapshot", info))
                continue
            if current is not None and info.exact_marks and incremental_possible(info.marks, current):
                outcome = await _try_incremental(cluster, name, field, headers, store, info, current, options)
            action, reason = "rebuilt", _rebuild_reason(info, current)
        if outcome is None:
            (new,) = await build_snapshots(
                cluster,
                name,
                field,
                headers,
                options,
                store=store,
                progress=progress,
                only=[name],
                allow_empty=len(indices) > 1,
            )
            outcome = RefreshOutcome(name, action, reason, new, new.live_docs)
        outcomes.append(outcome)
    return outcomes


def _rebuild_reason(info: SnapshotInfo, current: IndexMarks | None) -> str:
    if current is None:
        return "sequence numbers unavailable"
    if not info.exact_marks:
        return "writes landed during the last build"
    if info.marks.uuid != current.uuid:
        return "index was recreated"
    if not incremental_possible(info.marks, current):
        return "shard layout changed or writes in flight"
    return "updates or deletes since the snapshot"


async def _try_incremental(
    cluster: Cluster,
    name: str,
    field: str,
    headers: Mapping[str, str],
    store: str,
    info: SnapshotInfo,
    current: IndexMarks,
    options: SweepOptions,
) -> RefreshOutcome | None:
    """Add the documents appended since the snapshot; None when that would not be exact.

    The length table grows by the appended documents when the snapshot has one (and lengths are
    wanted): the table a rebuild would give. A snapshot without one stays without."""
    started = time.perf_counter()
    await refresh_index(cluster, name, headers)
    ops = new_operations(info.marks, current)
    refs: dict[int, list[DocRef]] = {}
    for shard, (lo, hi) in ops.items():
        refs[shard] = await _docs_in_seq_range(cluster, name, shard, lo, hi, headers)
    live_now = await live_count(cluster, name, headers)
    found = {shard: len(r) for shard, r in refs.items()}
    if not appends_only(ops, found, info.live_docs, live_now):
        return None
    acc = EntropyAccumulator()
    recorder = None
    if options.max_length_docs is not None and info.length_docs is not None:
        recorder = LengthRecorder(max(0, options.max_length_docs - info.length_docs))
    routing = None  # the snapshot's routing, kept only if every appended document fits it too
    if recorder is not None and info.length_routing_shards is not None:
        routing = RoutingCheck(len(info.marks.shards), [info.length_routing_shards], proven=True)

    async def pages() -> AsyncIterator[list[DocRef]]:
        for r in refs.values():
            yield r

    await fold_pages(cluster, pages(), field, headers, acc, options, lengths=recorder, routing=routing)
    after = (await index_marks(cluster, name, headers)).get(name)
    if after is None or not same_state(current, after) or acc.n_seen != sum(found.values()):
        return None  # a write raced the refresh: a rebuild is the safe answer
    old = await stats_store.load_exact(cluster, headers, info, store)
    if old is None:
        return None  # a snapshot without exact sums: rebuild rather than add rounded floats
    total = old + acc.finish_exact()  # integer sums, rounded once: bit-identical to a rebuild
    lengths, skipped = await _grown_lengths(cluster, headers, store, info, recorder, options.max_length_docs)
    new_info = snapshot_info(
        name,
        field,
        total.stats,
        current,
        live_now,
        True,
        time.perf_counter() - started,
        "refresh",
        exact_units=True,
        lengths=lengths,
        lengths_skipped=skipped,
        routing=routing,
    )
    await stats_store.publish(cluster, headers, new_info, total.stats, store, total.units, lengths)
    return RefreshOutcome(name, "incremental", "only appends since the snapshot", new_info, acc.n_seen)


async def _grown_lengths(
    cluster: Cluster,
    headers: Mapping[str, str],
    store: str,
    info: SnapshotInfo,
    recorder: LengthRecorder | None,
    max_length_docs: int | None,
) -> tuple[DocLengths | None, str | None]:
    """The snapshot's length table with the appended documents' rows, or None and why."""
    if max_length_docs is None:
        return None, "not requested"
    if recorder is None:
        return None, info.lengths_skipped or "not requested"
    added, skipped = finish_lengths(recorder)
    if added is None:
        return None, f"more than {max_length_docs} documents (--max-length-docs)"
    old = await stats_store.load_lengths(cluster, headers, info, store)
    if old is None:
        return None, info.lengths_skipped or "not requested"
    return old + added, skipped


async def _docs_in_seq_range(
    cluster: Cluster,
    index: str,
    shard: int,
    lo: int,
    hi: int,
    headers: Mapping[str, str],
    page: int = 1000,
) -> list[DocRef]:
    """Live documents of one shard whose `_seq_no` lies in (lo, hi], paged on `_seq_no`."""
    out: list[DocRef] = []
    after: list[Any] | None = None
    url = f"/{quote(index)}/_search?preference=_shards:{shard}"
    while True:
        body: dict[str, Any] = {
            "size": page,
            "_source": False,
            "query": {"range": {"_seq_no": {"gt": lo, "lte": hi}}},
            "sort": [{"_seq_no": "asc"}],
            "track_total_hits": False,
            **VERSIONS,
        }
        if after is not None:
            body["search_after"] = after
        hits = (await cluster.request("POST", url, body, headers))["hits"]["hits"]
        out.extend(swept_ref(h, shard) for h in hits)
        if len(hits) < page:
            return out
        after = hits[-1]["sort"]


def snapshot_info(
    name: str,
    field: str,
    stats: CorpusStats,
    marks: IndexMarks,
    live_docs: int,
    exact: bool,
    seconds: float,
    method: str,
    *,
    exact_units: bool = False,
    lengths: DocLengths | None = None,
    lengths_skipped: str | None = None,
    routing: RoutingCheck | None = None,
) -> SnapshotInfo:
    """Describe statistics about to be published under a fresh snapshot id (CHUNK_TERMS per chunk,
    LENGTH_CHUNK documents per length chunk). The table's routing shard count is recorded only where
    it serves: a table whose every row has its shard, on several shards, each placed by `routing`."""
    n_chunks = max(1, -(-stats.vocabulary_size // CHUNK_TERMS))
    shards_known = lengths is not None and lengths.shards_known
    return SnapshotInfo(
        uuid.uuid4().hex,
        name,
        field,
        stats.n_docs,
        stats.total_length,
        stats.vocabulary_size,
        n_chunks,
        live_docs,
        marks,
        exact,
        now_iso(),
        round(seconds, 3),
        method,
        exact_units,
        None if lengths is None else len(lengths),
        0 if lengths is None else max(1, -(-len(lengths) // LENGTH_CHUNK)),
        None if lengths is not None else lengths_skipped,
        shards_known,
        table_routing(lengths, marks, routing),
    )


def table_routing(lengths: DocLengths | None, marks: IndexMarks, routing: RoutingCheck | None) -> int | None:
    """The routing shard count a length table is served with (`SnapshotInfo.length_routing_shards`),
    only where it serves: a table whose every row has its shard, on several shards, each placed by
    `routing`; else None."""
    if lengths is None or not lengths.shards_known or routing is None:
        return None
    return routing.routing_shards if routing.shards == len(marks.shards) > 1 else None


# --- freshness ------------------------------------------------------------------------------------


async def freshness(
    cluster: Cluster,
    index_expr: str,
    field: str,
    headers: Mapping[str, str],
    *,
    store: str = DEFAULT_STORE,
) -> list[Freshness]:
    """Per concrete index: the stored snapshot and whether the index changed since (cheap: three calls)."""
    indices = await resolve_text_field(cluster, index_expr, field, headers)
    pointers, marks = await asyncio.gather(
        stats_store.read_pointers(cluster, headers, [(i, field) for i in indices], store),
        marks_or_none(cluster, index_expr, headers),
    )
    return [
        judge(name, field, pointers.get((name, field)), None if marks is None else marks.get(name))
        for name in indices
    ]


async def describe(
    cluster: Cluster,
    index_expr: str,
    field: str,
    headers: Mapping[str, str],
    terms: Sequence[str] = (),
    *,
    store: str = DEFAULT_STORE,
) -> dict[str, Any]:
    """What `stats show --json` prints: the summed statistics the proxy would use, their freshness per
    index, and df / raw entropy of `terms` (given in their indexed, analyzed form)."""
    view = await StatsCache(cluster.session, cluster.base_url, store=store).get(index_expr, field, headers)
    view = await view.for_terms(terms)
    fresh = await freshness(cluster, index_expr, field, headers, store=store)
    df, entropy = view.corpus.lookup(terms)
    return {
        "index": index_expr,
        "field": field,
        "n_docs": view.corpus.n_docs,
        "total_length": view.corpus.total_length,
        "avgdl": view.corpus.avgdl,
        # estimated mode holds only the terms asked about: its vocabulary size means nothing
        "vocabulary_size": None if view.estimated else view.corpus.vocabulary_size,
        "estimated": view.estimated,
        "stale": view.stale,
        "built_at": view.built_at,
        "freshness": [f.to_json() for f in fresh],
        # indices whose length table the proxy uses (same index UUID as at the build)
        "length_tables": {i: len(t) for i, t in sorted((view.lengths or {}).items())},
        "terms": {t: {"df": int(d), "entropy": float(e)} for t, d, e in zip(terms, df, entropy, strict=True)},
    }
