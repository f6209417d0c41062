"""A length table over several shards keyed by (shard, `_seq_no`, `_primary_term`), on real engines:
every row's shard is the one `preference=_shards:i` finds its document in, learned from the PIT's
`_shard_doc` sort value (Elasticsearch) or from one scroll a shard (OpenSearch, or any engine without a
PIT); the statistics cache maps the table keyed by version and answers each document's length from its
shard and version alone, no `_id`; an incremental refresh and a rebuild keep it so."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from bmx_rerank.stats import build as stats_build
from bmx_rerank.stats import scan, sliced
from bmx_rerank.stats import store as stats_store
from bmx_rerank.stats.cache import StatsCache
from bmx_rerank.stats.length_files import keyed_by_version
from bmx_rerank.stats.lengths import doc_key, optional
from bmx_rerank.stats.snapshot import SnapshotInfo
from bmx_rerank.stats.sweep import sweep_index
from bmx_rerank.upstream import Cluster
from tests.support.data import scifact_records
from tests.support.engine_client import EngineClient
from tests.support.reranked import TV, body_lengths

pytestmark = pytest.mark.integration

DOCS = 300
SHARDS = 3


def _bulk(engine: EngineClient, index: str, texts: dict[str, str]) -> None:
    lines = []
    for doc_id, text in texts.items():
        lines.append(json.dumps({"index": {"_index": index, "_id": doc_id}}))
        lines.append(json.dumps({"body": text}))
    assert not engine.ok("POST", "/_bulk", "\n".join(lines) + "\n", {"refresh": "true"})["errors"]


@pytest.fixture
def sharded(engine: EngineClient) -> Iterator[tuple[EngineClient, str, str, dict[str, str]]]:
    index = f"bmxtest-shardlen-{uuid.uuid4().hex[:10]}"
    store = f"bmxtest-shardlen-store-{uuid.uuid4().hex[:8]}"
    settings = {"number_of_shards": SHARDS, "number_of_replicas": 0}
    mappings = {"properties": {"body": {"type": "text", "analyzer": "standard"}}}
    engine.ok("PUT", f"/{index}", {"settings": settings, "mappings": mappings})
    texts = {d["_id"]: f"{d.get('title', '')} {d['text']}" for d in scifact_records("corpus.jsonl", DOCS)}
    _bulk(engine, index, texts)
    try:
        yield engine, index, store, texts
    finally:
        engine.call("DELETE", f"/{index}")
        engine.call("DELETE", f"/{store}")


def _run(url: str, coro_fn: Any) -> Any:
    async def main() -> Any:
        async with aiohttp.ClientSession() as session:
            return await coro_fn(Cluster(session, url))

    return asyncio.run(main())


def _per_shard(engine: EngineClient, index: str) -> list[list[dict[str, Any]]]:
    """Each shard's live documents, as `preference=_shards:i` finds them."""
    body = {"size": 10_000, "seq_no_primary_term": True, "_source": False}
    return [
        engine.ok("POST", f"/{index}/_search", body, {"preference": f"_shards:{i}"})["hits"]["hits"]
        for i in range(SHARDS)
    ]


def _check(engine: EngineClient, index: str, store: str, info: SnapshotInfo, n: int) -> None:
    """The stored rows' shards, the snapshot's keying, and the mapped table's answers without `_id`."""
    assert info.length_docs == n and info.length_shards and keyed_by_version(info)
    assert len(info.marks.shards) == SHARDS
    shards = _per_shard(engine, index)
    assert sum(map(len, shards)) == n and all(shards), "every shard holds documents"
    stored = _run(engine.url, lambda c: stats_store.load_lengths(c, {}, info, store))
    assert stored is not None and stored.shards_known
    shard_of = dict(zip(stored.keys.tolist(), stored.shard_nos.tolist(), strict=True))
    for i, hits in enumerate(shards):
        assert {shard_of[doc_key(h["_id"], None)] for h in hits} == {i}, f"rows of shard {i}"

    async def mapped(cluster: Cluster) -> Any:
        cache = StatsCache(cluster.session, cluster.base_url, store=store)
        await cache.get(index, "body", {})
        await cache.settled()  # the length file written
        return (await cache.get(index, "body", {})).lengths

    tables = _run(engine.url, mapped)
    assert tables is not None and index in tables
    table = tables[index]
    assert table.by_version and table.shards == SHARDS and len(table) == n
    want = body_lengths(engine, index, [h["_id"] for hits in shards for h in hits])
    for i, hits in enumerate(shards):
        got = optional(
            table.find(
                [""] * len(hits),  # no `_id`
                [None] * len(hits),
                [h["_seq_no"] for h in hits],
                [h["_primary_term"] for h in hits],
                [i] * len(hits),
            )
        )
        assert got == [want[h["_id"]] for h in hits], f"shard {i}"
        # without its shard no hit of a table of several shards is answered
        assert optional(table.find([""] * len(hits), [None] * len(hits), [h["_seq_no"] for h in hits],
                            [h["_primary_term"] for h in hits])) == [None] * len(hits)  # fmt: skip


@pytest.mark.parametrize("reader", ["native", "scroll"])
def test_a_table_of_several_shards_is_keyed_by_shard_and_version(sharded, reader, monkeypatch) -> None:
    engine, index, store, texts = sharded
    if reader == "scroll":

        async def no_pit(*_args: Any, **_kwargs: Any) -> None:
            return None

        monkeypatch.setattr(scan, "_open_pit", no_pit)  # one scroll a shard, on every engine
    (info,) = _run(engine.url, lambda c: stats_build.build_snapshots(c, index, "body", {}, store=store))
    _check(engine, index, store, info, len(texts))

    # appended documents: an incremental refresh, its new rows with their shards
    added = {f"new-{i}": f"appended document number {i} " * (i % 5 + 1) for i in range(30)}
    _bulk(engine, index, added)
    (outcome,) = _run(engine.url, lambda c: stats_build.refresh(c, index, "body", {}, store=store))
    assert outcome.action == "incremental" and outcome.snapshot is not None
    _check(engine, index, store, outcome.snapshot, len(texts) + len(added))

    # an updated document: a rebuild, still keyed by shard and version
    first = next(iter(texts))
    engine.ok("PUT", f"/{index}/_doc/{first}", {"body": "updated words only"}, {"refresh": "true"})
    (outcome,) = _run(engine.url, lambda c: stats_build.refresh(c, index, "body", {}, store=store))
    assert outcome.action == "rebuilt" and outcome.snapshot is not None
    _check(engine, index, store, outcome.snapshot, len(texts) + len(added))


def test_a_pit_whose_sort_values_name_no_shard_gives_no_shards(sharded, monkeypatch) -> None:
    """A cluster whose `_shard_doc` values do not hold the shard number as read here (checked once a
    shard against `preference=_shards:N`): no row gets a shard, and the table is not keyed by version.
    (An engine without such a PIT scrolls each shard: its rows have their shards all the same.)"""
    engine, index, store, texts = sharded
    real, read = scan._pit_shard, []

    def misread(hit: dict[str, Any]) -> int | None:
        read.append(1)
        shard = real(hit)
        return None if shard is None else (shard + 1) % SHARDS

    monkeypatch.setattr(scan, "_pit_shard", misread)
    (info,) = _run(engine.url, lambda c: stats_build.build_snapshots(c, index, "body", {}, store=store))
    assert info.length_docs == len(texts)
    assert keyed_by_version(info) == (not read), "misread sort values: no shards; scrolls: every shard"


def test_scan_shards_match_preference_with_slices(sharded) -> None:
    """Each `SweptRef`'s shard, from a PIT (where there is one) and from per-shard scrolls, in two
    slices: the slices hold every document once, each with its shard."""
    engine, index, _, texts = sharded
    shard_of = {h["_id"]: i for i, hits in enumerate(_per_shard(engine, index)) for h in hits}

    async def scanned(cluster: Cluster, scroll: bool) -> tuple[dict[str, int | None], list[int]]:
        out: dict[str, int | None] = {}
        totals: list[int] = []
        real = scan._open_pit
        if scroll:
            scan._open_pit = lambda *a, **k: asyncio.sleep(0)  # type: ignore[assignment]
        try:
            for part in ((0, 2), (1, 2)):
                async for page in scan.scan_ids(cluster, index, {}, 50, totals, part, versions=True):
                    for ref in page:
                        assert ref.id not in out
                        out[ref.id] = ref.shard  # type: ignore[attr-defined]
        finally:
            scan._open_pit = real  # type: ignore[assignment]
        return out, totals

    for scroll in (False, True):
        got, totals = _run(engine.url, lambda c, s=scroll: scanned(c, s))
        assert sum(totals) == len(texts), "each slice's total: its documents in every shard"
        # an OpenSearch PIT (where a version has one) does not say the shard: then none is known
        unknown = not scroll and engine.kind == "opensearch" and set(got.values()) == {None}
        assert got == shard_of or (unknown and set(got) == set(shard_of))


# --- a hit without its shard: its shard from its `_id` or `_routing` (stats.routing) -------------------


def _routed_index(
    engine: EngineClient, settings: dict[str, Any], routing: Any
) -> tuple[str, str, dict[str, tuple[str | None, str]]]:
    """A 3-shard index of `DOCS` documents (some ids beyond ASCII), each routed by `routing(i)` (None:
    by its `_id`); returns its name, a store name and {id: (routing, text)}."""
    index = f"bmxtest-shardroute-{uuid.uuid4().hex[:10]}"
    store = f"bmxtest-shardroute-store-{uuid.uuid4().hex[:8]}"
    body = {"settings": {"number_of_shards": SHARDS, "number_of_replicas": 0, **settings}}
    body["mappings"] = {"properties": {"body": {"type": "text", "analyzer": "standard"}}}
    if "routing_partition_size" in settings:
        body["mappings"]["_routing"] = {"required": True}  # a routing partition needs it
    engine.ok("PUT", f"/{index}", body)
    records = scifact_records("corpus.jsonl", DOCS)
    docs = {
        (d["_id"] if i % 5 else f"é{d['_id']}😀"): (routing(i), f"{d.get('title', '')} {d['text']}")
        for i, d in enumerate(records)
    }
    _bulk_routed(engine, index, docs)
    return index, store, docs


def _bulk_routed(engine: EngineClient, index: str, docs: dict[str, tuple[str | None, str]]) -> None:
    lines = []
    for doc_id, (routing, text) in docs.items():
        action = {"_index": index, "_id": doc_id, **({} if routing is None else {"routing": routing})}
        lines.append(json.dumps({"index": action}))
        lines.append(json.dumps({"body": text}))
    assert not engine.ok("POST", "/_bulk", "\n".join(lines) + "\n", {"refresh": "true"})["errors"]


def _mapped(engine: EngineClient, store: str, index: str) -> Any:
    async def mapped(cluster: Cluster) -> Any:
        cache = StatsCache(cluster.session, cluster.base_url, store=store)
        await cache.get(index, "body", {})
        await cache.settled()
        return (await cache.get(index, "body", {})).lengths

    tables = _run(engine.url, mapped)
    assert tables is not None and index in tables
    return tables[index]


def _by_id(engine: EngineClient, index: str, table: Any) -> tuple[list[int | None], list[int]]:
    """The mapped table's answers for every live document looked up by `_id`, `_routing` and version
    with no shard, and each document's real length."""
    hits = [h for part in _per_shard(engine, index) for h in part]
    docs = [
        {"_index": index, "_id": h["_id"], "fields": ["body"], **TV}
        | ({"routing": h["_routing"]} if "_routing" in h else {})
        for h in hits
    ]
    answer = engine.ok("POST", "/_mtermvectors", {"docs": docs})["docs"]
    want = [
        sum(v["term_freq"] for v in d.get("term_vectors", {}).get("body", {}).get("terms", {}).values())
        for d in answer
    ]
    got = optional(
        table.find(
            [h["_id"] for h in hits],
            [h.get("_routing") for h in hits],
            [h["_seq_no"] for h in hits],
            [h["_primary_term"] for h in hits],
        )
    )
    return got, want


def test_a_hit_without_its_shard_is_found_from_its_id_or_routing(engine: EngineClient) -> None:
    """Default routing, a tenth of the documents under a custom routing value: the build finds every
    document where its `_id` or `_routing` routes, records the routing shard count (768 for 3 shards),
    and the mapped table answers every document without its shard; slices agree, and an incremental
    refresh keeps it."""
    index, store, docs = _routed_index(engine, {}, lambda i: None if i % 10 else f"user{i % 4}")
    try:
        (info,) = _run(engine.url, lambda c: stats_build.build_snapshots(c, index, "body", {}, store=store))
        assert keyed_by_version(info) and info.length_routing_shards == 768
        table = _mapped(engine, store, index)
        assert table.routing_shards == 768
        got, want = _by_id(engine, index, table)
        assert got == want and len(got) == len(docs)

        # two slices: each checks its own documents, the merge needs both
        async def slices(cluster: Cluster) -> Any:
            parts = [
                sliced.partial(
                    index, "body", (i, 2), await sweep_index(cluster, index, "body", {}, part=(i, 2))
                )
                for i in range(2)
            ]
            parts = [sliced.Partial.from_json(json.loads(json.dumps(p.to_json()))) for p in parts]
            return sliced.merge(parts)

        merged = _run(engine.url, slices)
        assert merged.routing is not None and merged.routing.routing_shards == 768

        # appended documents, some routed: an incremental refresh keeps the routing
        added = {f"new-{i}": (None if i % 3 else "user1", f"appended document number {i}") for i in range(30)}
        _bulk_routed(engine, index, added)
        (outcome,) = _run(engine.url, lambda c: stats_build.refresh(c, index, "body", {}, store=store))
        assert outcome.action == "incremental" and outcome.snapshot is not None
        assert outcome.snapshot.length_routing_shards == 768
        got, want = _by_id(engine, index, _mapped(engine, store, index))
        assert got == want and len(got) == len(docs) + len(added)
    finally:
        engine.call("DELETE", f"/{index}")
        engine.call("DELETE", f"/{store}")


@pytest.mark.parametrize(
    "settings",
    [{"routing_partition_size": 2}, {"number_of_routing_shards": 6}],
    ids=["routing_partition", "routing_shards_6"],
)
def test_an_index_routed_otherwise_is_never_looked_up_in_a_wrong_shard(
    engine: EngineClient, settings: dict[str, Any]
) -> None:
    """A routing partition (every document routed; the `_id` shifts the hash, so most documents still
    fit the default formula: the settings rule it out), or a routing shard count of 6: the default
    formula misplaces documents and is not recorded; where the settings show the 6 (OpenSearch), the
    check proves it and it serves. Either way no hit looked up without its shard gets a wrong length."""
    partition = "routing_partition_size" in settings
    routing = (lambda i: f"user{i % 7}") if partition else (lambda i: None)
    index, store, docs = _routed_index(engine, settings, routing)
    try:
        (info,) = _run(engine.url, lambda c: stats_build.build_snapshots(c, index, "body", {}, store=store))
        assert keyed_by_version(info) and info.length_docs == len(docs)
        swept = _run(engine.url, lambda c: sweep_index(c, index, "body", {}))
        assert swept.routing is not None and swept.routing.evidence == (0 if partition else len(docs))
        if partition:  # every document routed, so no evidence; and the settings rule the formula out
            assert swept.routing.candidates == ()
        shows = engine.ok("GET", f"/{index}/_settings", None, {"flat_settings": "true"})[index]["settings"]
        expected = 6 if not partition and shows.get("index.number_of_routing_shards") == "6" else None
        assert info.length_routing_shards == expected
        table = _mapped(engine, store, index)
        assert table.routing_shards == expected
        got, want = _by_id(engine, index, table)
        assert got == (want if expected else [None] * len(want))
    finally:
        engine.call("DELETE", f"/{index}")
        engine.call("DELETE", f"/{store}")
