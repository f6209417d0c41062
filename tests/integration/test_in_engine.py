"""`serve --in-engine` (rerank/in_engine.py) on real engines: where the engine scores a window, its
page is the sidecar's own to float32 (the same hits, in the same order, scores to 1e-6 relative);
where it cannot (no length sub-field, a document without a length, Elasticsearch), the
sidecar's rerank answers as it always did."""

from __future__ import annotations

import asyncio
import itertools
import json
import uuid
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
from click.testing import CliRunner

from bmx_rerank.cli import main as cli
from bmx_rerank.client import BMXClient
from bmx_rerank.rerank import in_engine
from bmx_rerank.rerank.pipeline import ENGINE_SIGHTS
from bmx_rerank.stats import length_field
from bmx_rerank.stats.source import FixedStats
from bmx_rerank.upstream import Cluster
from tests.integration.test_proxy_clients import official_client
from tests.support.corpora import SCIFACT_MAPPINGS, bulk, exact_stats, index_scifact
from tests.support.data import scifact_records
from tests.support.engine_client import EngineClient
from tests.support.proxy_thread import ProxyThread
from tests.support.reranked import search

pytestmark = pytest.mark.integration

DOCS, QUERIES = 600, 20
LENGTH = {"type": "token_count", "analyzer": "standard", "enable_position_increments": False}
WITH_LENGTH = {"properties": {"body": {"type": "text", "analyzer": "standard", "fields": {"len": LENGTH}}}}
WITHOUT = SCIFACT_MAPPINGS  # `body` with no length sub-field


def _index(engine: EngineClient, mappings: dict, shards: int = 1, docs: int = DOCS) -> str:
    index = f"bmxtest-inengine-{uuid.uuid4().hex[:10]}"
    index_scifact(engine, index, scifact_records("corpus.jsonl", docs), shards, mappings=mappings)
    return index


@pytest.fixture
def proxies(engine: EngineClient) -> Iterator[tuple[FixedStats, ProxyThread, ProxyThread]]:
    """The same statistics behind a proxy that scores in the engine where it can and one that never does."""
    stats = FixedStats({})
    scored, reference = ProxyThread(engine.url, stats, in_engine=True), ProxyThread(engine.url, stats)
    try:
        yield stats, scored, reference
    finally:
        scored.close()
        reference.close()


@pytest.fixture
def engine_only(engine: EngineClient, proxies) -> Iterator[ProxyThread]:
    """A proxy under `--in-engine` with no term-vector cache: nothing kept, every window the engine's."""
    stats, _, _ = proxies
    proxy = ProxyThread(engine.url, stats, in_engine=True, cache_bytes=0)
    try:
        yield proxy
    finally:
        proxy.close()


def _queries() -> list[str]:
    return [q["text"] for q in scifact_records("queries.jsonl", QUERIES)]


def _same_page(a: dict, b: dict) -> None:
    """The same hits in the same order, scores equal to 1e-6 relative (the engine scores in float32)."""
    ids = [h["_id"] for h in a["hits"]["hits"]]
    assert ids == [h["_id"] for h in b["hits"]["hits"]], (ids, b["hits"]["hits"])
    for x, y in zip(a["hits"]["hits"], b["hits"]["hits"], strict=True):
        assert abs(x["_score"] - y["_score"]) <= 1e-6 * max(1.0, abs(y["_score"])), (x, y)
    assert a["hits"]["total"] == b["hits"]["total"]
    assert set(a["hits"]["hits"][0]) == set(b["hits"]["hits"][0]) if ids else True, "the same hit fields"


def _outcomes(proxy: ProxyThread) -> dict[str, float]:
    counter = proxy.app.state.metrics.in_engine
    return {
        s.labels["outcome"]: s.value
        for m in counter.collect()
        for s in m.samples
        if s.name.endswith("_total")
    }


def _edges(proxy: ProxyThread) -> dict[str, float]:
    """Windows over several shards the engine scored, by where their page came from."""
    counter = proxy.app.state.metrics.in_engine_edges
    return {
        s.labels["page"]: s.value for m in counter.collect() for s in m.samples if s.name.endswith("_total")
    }


def _stats(proxy: ProxyThread, engine: EngineClient, stats: FixedStats, index: str) -> None:
    stats.table[(index, "body")] = proxy.run(exact_stats(engine.url, index, "body"))


def _first_pages(scored: ProxyThread, reference: ProxyThread, index: str, queries: int) -> list[dict]:
    """The first page of each of the first `queries` queries (window 40) through both proxies, alike;
    the markers of `scored`'s."""
    markers = []
    for text in _queries()[:queries]:
        extra = {"size": 10, "ext": {"bmx": {"field": "body", "window_size": 40}}}
        a, b = search(scored.url, index, text, extra), search(reference.url, index, text, extra)
        _same_page(a, b)
        markers.append(a["_bmx"])
    return markers


def test_a_window_scored_in_the_engine_is_the_sidecars_page(
    engine: EngineClient, proxies, engine_only: ProxyThread
) -> None:
    """OpenSearch with a length sub-field on one shard: every page (0-10 and 10-20 of a window of 40,
    a `match` and a `bool` with a filter) scored in the engine, and the sidecar's own to float32. With
    the term-vector cache on (as served by default), a window asked for more than ENGINE_SIGHTS times
    (its pages, or the same one again) goes the sidecar's way once, which keeps it, and is its warm
    rerank from then on: the pages still the sidecar's own. On Elasticsearch, which has no `termFreq`
    (and whose integ-test build has no `token_count`), every search is the sidecar's."""
    stats, kept, reference = proxies
    scored = engine_only
    mappings = WITH_LENGTH if engine.kind == "opensearch" else WITHOUT
    index = _index(engine, mappings)
    opensearch = engine.kind == "opensearch"
    try:
        _stats(scored, engine, stats, index)
        for text in _queries():
            for extra in (
                {"size": 10, "ext": {"bmx": {"field": "body", "window_size": 40}}},
                {"from": 10, "size": 10, "ext": {"bmx": {"field": "body", "window_size": 40}}},
                {
                    "query": {
                        "bool": {
                            "must": [{"match": {"body": text}}],
                            "filter": [{"exists": {"field": "body"}}],
                        }
                    },
                    "size": 10,
                    "aggs": {"n": {"value_count": {"field": "_seq_no"}}},
                    "ext": {"bmx": {"field": "body", "window_size": 40}},
                },
            ):
                b = search(reference.url, index, text, extra)
                assert b["_bmx"]["tf"] != "engine"
                for proxy in (scored, kept):
                    a = search(proxy.url, index, text, extra)
                    _same_page(a, b)
                    assert a.get("aggregations") == b.get("aggregations")
                    assert (a["_bmx"]["tf"] == "engine") == opensearch, a["_bmx"]
                    assert a["_bmx"]["mode"] == "bmx" and a["_bmx"]["reranked"] is True
                    assert a["_bmx"]["candidates"] == b["_bmx"]["candidates"] == 40
                    assert "_seq_no" not in a["hits"]["hits"][0], "the sidecar's own fields never show"
        # the caller's filter_path applies to the engine's answer as to the sidecar's
        text, extra = _queries()[0], {"size": 10, "ext": {"bmx": {"field": "body", "window_size": 40}}}
        body = {"query": {"match": {"body": text}}, **extra}
        path = f"/{index}/_search?filter_path=hits.hits._id,hits.hits._score"
        a, b = (EngineClient(engine.kind, proxy.url).ok("POST", path, body) for proxy in (scored, reference))
        assert list(a) == ["hits"] and list(a["hits"]["hits"][0]) == ["_id", "_score"], a
        assert [h["_id"] for h in a["hits"]["hits"]] == [h["_id"] for h in b["hits"]["hits"]]
        # the first page of the first query, asked for again: its window's third sight is the engine's,
        # the fourth the sidecar's, which keeps it, and the fifth the sidecar's warm rerank (no hit's
        # frequencies asked for again)
        sources = []
        for _ in range(3):
            a = search(kept.url, index, text, extra)
            _same_page(a, search(reference.url, index, text, extra))
            sources.append(a["_bmx"]["tf"])
        if opensearch:
            assert ENGINE_SIGHTS == 3 and sources[0] == "engine" and sources[2] == "window", sources
            assert sources[1] not in ("engine", "window"), sources
            assert _outcomes(scored) == {"scored": 3 * QUERIES + 1}, _outcomes(scored)
            assert _outcomes(kept) == {"scored": 3 * QUERIES + 1, "repeated": 1, "kept": 1}, _outcomes(kept)
            return
        assert _outcomes(scored) == {"no_length_field": 3 * QUERIES + 1}, _outcomes(scored)
        # told the index could be scored there, Elasticsearch refuses the script: the sidecar answers
        layouts = scored.app.state.rerank.layouts
        (key,) = layouts
        layouts[key] = in_engine.Layout(None)
        a, b = search(scored.url, index, text, extra), search(reference.url, index, text, extra)
        _same_page(a, b)
        assert _outcomes(scored)["refused"] == 1 and layouts[key].reason == "refused"
    finally:
        engine.call("DELETE", f"/{index}")


def test_what_the_engine_cannot_score_exactly_the_sidecar_does(engine: EngineClient, proxies) -> None:
    """A length sub-field added after the documents (those indexed before have no length: the script
    throws, the sidecar answers, and the index is not tried again for a while), over two shards (the
    window's edge searched first): every page the sidecar's."""
    stats, scored, reference = proxies
    opensearch = engine.kind == "opensearch"  # Elasticsearch's integ-test build has no `token_count`
    added = _index(engine, WITHOUT, shards=2, docs=300)
    if opensearch:
        engine.ok("PUT", f"/{added}/_mapping", WITH_LENGTH)
        engine.ok("POST", f"/{added}/_doc/new?refresh=true", {"body": "cancer cells grow in the lung"})
    try:
        _stats(scored, engine, stats, added)
        markers = _first_pages(scored, reference, added, 5)
        assert all(m["tf"] != "engine" for m in markers), markers
        outcomes = _outcomes(scored)
        assert outcomes == {"no_length" if opensearch else "no_length_field": 5}, outcomes
    finally:
        engine.call("DELETE", f"/{added}")


def test_a_shard_whose_documents_have_no_length_leaves_the_window_to_the_sidecar(
    engine: EngineClient, proxies, engine_only: ProxyThread
) -> None:
    """Documents without a length on one shard of three (indexed there, routed, before the length
    sub-field; as while `lengths add` fills an index shard by shard): the script throws on that shard
    alone, and the cluster answers with the other shards' hits and `_shards.failed`. No such partial
    page is the engine's: a search that reaches only shards whose documents all have a length is the
    engine's; one that reaches that shard, its first page beside the edge or its last after it, is the
    sidecar's whole page."""
    stats, _, reference = proxies
    scored = engine_only
    index = f"bmxtest-inengine-{uuid.uuid4().hex[:10]}"
    engine.ok("PUT", f"/{index}", {"settings": {"number_of_shards": 3, "number_of_replicas": 0}})
    engine.ok("PUT", f"/{index}/_mapping", WITHOUT)
    records = scifact_records("corpus.jsonl", DOCS)
    docs = {d["_id"]: {"body": f"{d.get('title', '')} {d['text']}"} for d in records}
    ids = list(docs)
    bulk(engine, index, {i: docs[i] for i in ids[:150]}, routing="before")
    if engine.kind == "opensearch":  # Elasticsearch's integ-test build has no `token_count`
        engine.ok("PUT", f"/{index}/_mapping", WITH_LENGTH)
    bulk(engine, index, {i: docs[i] for i in ids[150:]})
    try:
        _stats(scored, engine, stats, index)
        (shard,) = {
            s[0]["shard"] for s in engine.ok("GET", f"/{index}/_search_shards?routing=before")["shards"]
        }
        bmx = {"bmx": {"field": "body", "window_size": 40}}
        asks = [(f"preference=_shards:{(shard + 1) % 3}", {"size": 10, "ext": bmx})]
        asks += [("", {"size": 10, "ext": bmx}), ("", {"from": 30, "size": 10, "ext": bmx})]
        for text in _queries()[:4]:
            for ask, extra in asks:
                body = {"query": {"match": {"body": text}}, **extra}
                path = f"/{index}/_search?{ask}"
                a, b = (EngineClient(engine.kind, p.url).ok("POST", path, body) for p in (scored, reference))
                _same_page(a, b)
                assert a["_shards"] == b["_shards"], (a["_shards"], b["_shards"])
                healthy = bool(ask) and engine.kind == "opensearch" and text == _queries()[0]
                assert (a["_bmx"]["tf"] == "engine") == healthy, (ask, a["_bmx"])
        outcomes = _outcomes(scored)
        if engine.kind == "opensearch":  # after the first refusal the index is not tried for a while
            assert outcomes == {"scored": 1, "no_length": 11}, outcomes
        else:
            assert outcomes == {"no_length_field": 12}, outcomes
    finally:
        engine.call("DELETE", f"/{index}")


@pytest.mark.parametrize("shards", [1, 3])
def test_a_field_of_several_values_is_as_long_as_all_its_tokens(
    engine: EngineClient, proxies, engine_only: ProxyThread, shards: int
) -> None:
    """A text field given as an array (every other document here, one value empty) has a length in
    the sub-field for each value: the document's is their sum, as its norm and the sidecar's length
    count every token (the script once read the smallest value alone, and scored such documents as if
    they were short)."""
    stats, _, reference = proxies
    scored = engine_only
    opensearch = engine.kind == "opensearch"
    index = f"bmxtest-inengine-{uuid.uuid4().hex[:10]}"
    settings = {"number_of_shards": shards, "number_of_replicas": 0}
    engine.ok("PUT", f"/{index}", {"settings": settings, "mappings": WITH_LENGTH if opensearch else WITHOUT})
    records = scifact_records("corpus.jsonl", 400)
    parts = {d["_id"]: [d.get("title", ""), d["text"], ""] for d in records}
    bulk(engine, index, {i: {"body": p if n % 2 else " ".join(p)} for n, (i, p) in enumerate(parts.items())})
    try:
        _stats(scored, engine, stats, index)
        markers = _first_pages(scored, reference, index, 10)
        assert all((m["tf"] == "engine") == opensearch for m in markers), markers
        assert _outcomes(scored).get("scored", 0) >= (8 if opensearch else 0), _outcomes(scored)
    finally:
        engine.call("DELETE", f"/{index}")


@pytest.mark.parametrize("options", [{"index_options": "freqs", "norms": False}, {"index_options": "docs"}])
def test_a_field_without_positions_or_frequencies(
    engine: EngineClient, proxies, engine_only: ProxyThread, options: dict
) -> None:
    """A field indexed without positions (or norms) is scored in the engine as the sidecar scores it.
    One indexed without frequencies (`index_options: docs`) is not: the engine reads each as 1, the
    sidecar counts them in the text; its searches are the sidecar's (`no_frequencies`)."""
    stats, _, reference = proxies
    scored = engine_only
    opensearch = engine.kind == "opensearch"
    body = {
        "type": "text",
        "analyzer": "standard",
        **options,
        **({"fields": {"len": LENGTH}} if opensearch else {}),
    }
    index = _index(engine, {"properties": {"body": body}}, docs=300)
    try:
        _stats(scored, engine, stats, index)
        _first_pages(scored, reference, index, 6)
        frequencies = options["index_options"] != "docs"
        expected = ("scored" if frequencies else "no_frequencies") if opensearch else "no_length_field"
        assert _outcomes(scored) == {expected: 6}, _outcomes(scored)
    finally:
        engine.call("DELETE", f"/{index}")


def test_a_window_over_several_shards_is_scored_in_the_engine(
    engine: EngineClient, proxies, engine_only: ProxyThread
) -> None:
    """Over several shards a `rescore` window is each shard's. A search that reaches one shard (one
    `routing` value, `preference=_shards:N`) is one search; one that may reach several has its global
    window's edge searched first, and the script scores 0 below it. Either way each page is the
    sidecar's: the window's first and last pages, and a `bool` with a filter and aggregations. A window
    whose edge ties with the next hit (the cluster's tie-break draws it) is the sidecar's."""
    stats, _, reference = proxies
    scored = engine_only
    opensearch = engine.kind == "opensearch"
    index = _index(engine, WITH_LENGTH if opensearch else WITHOUT, shards=3)
    asks = ("routing=tenant-7", "preference=_shards:1", "preference=_shards:2|_local", "")
    bmx = {"bmx": {"field": "body", "window_size": 40}}
    try:
        _stats(scored, engine, stats, index)
        for text in _queries()[:8]:
            filtered = {
                "bool": {"must": [{"match": {"body": text}}], "filter": [{"exists": {"field": "body"}}]}
            }
            totals = {}
            for ask in asks:
                for extra in (
                    {"size": 10, "ext": bmx},
                    {"from": 30, "size": 10, "ext": bmx},  # the window's last page: its edge shows there
                    {
                        "query": filtered,
                        "size": 10,
                        "aggs": {"n": {"value_count": {"field": "_seq_no"}}},
                        "ext": bmx,
                    },
                ):
                    body = {"query": {"match": {"body": text}}, **extra}
                    path = f"/{index}/_search?{ask}"
                    before = _outcomes(scored).get("edge_tied", 0)
                    a, b = (
                        EngineClient(engine.kind, p.url).ok("POST", path, body) for p in (scored, reference)
                    )
                    _same_page(a, b)
                    assert a.get("aggregations") == b.get("aggregations")
                    # the edge ties with the next hit in some windows here (documents of one shard
                    # alike in length and frequencies): those are the sidecar's
                    tied = _outcomes(scored).get("edge_tied", 0) > before
                    assert not tied or ask == "", ask
                    assert (a["_bmx"]["tf"] == "engine") == (opensearch and not tied), (ask, a["_bmx"])
                    assert b["_bmx"]["tf"] != "engine"
                    totals[ask] = a["hits"]["total"]["value"]
            assert max(totals[ask] for ask in asks[:-1]) < totals[""] > 40, ("one shard's hits", totals)
        outcomes = _outcomes(scored)
        if not opensearch:
            assert outcomes == {"no_length_field": 96}, outcomes
            return
        assert outcomes["scored"] + outcomes.get("edge_tied", 0) == 96, outcomes
        assert outcomes["scored"] >= 3 * 3 * 8 + 12, ("most windows over 3 shards untied", outcomes)
        # unrouted: first pages asked for beside the edge (each shard's window held the page every
        # time at a window of 40 here), the window's last page after it
        edges = _edges(scored)
        assert edges["beside"] >= 12 and edges["after"] >= 6, edges
        assert edges["beside"] + edges["after"] == 24 - outcomes.get("edge_tied", 0), edges
        # a window of 10 over 3 shards: each shard's window often holds a hit below the global
        # window's edge that outranks it, so the search that keeps to the edge goes after
        small = {"bmx": {"field": "body", "window_size": 10}}
        for text in _queries()[:8]:
            body = {"query": {"match": {"body": text}}, "size": 10, "ext": small}
            a, b = (
                EngineClient(engine.kind, p.url).ok("POST", f"/{index}/_search", body)
                for p in (scored, reference)
            )
            _same_page(a, b)
            assert "matched_queries" not in a["hits"]["hits"][0], "the first stage's name never shows"
        more = _edges(scored)
        assert more["after"] > edges["after"] and sum(more.values()) - sum(edges.values()) <= 8, more
        # no statistics for the index: the edge's search, sent before the terms were read, is dropped
        # and the sidecar's rerank says what it says when it has none
        del stats.table[(index, "body")]
        text, extra = _queries()[0], {"size": 10, "ext": bmx}
        a, b = search(scored.url, index, text, extra), search(reference.url, index, text, extra)
        _same_page(a, b)
        assert a["_bmx"] == b["_bmx"] and _outcomes(scored)["unread"] == 1, (a["_bmx"], _outcomes(scored))
        # identical documents scored with the index's statistics tie at the window's edge
        twins = {f"twin-{i}": {"body": "lung cancer cells divide"} for i in range(60)}
        bulk(engine, index, twins)
        _stats(scored, engine, stats, index)
        body = {"query": {"match": {"body": "divide"}}, "size": 10, "ext": bmx}
        path = f"/{index}/_search?search_type=dfs_query_then_fetch"
        a, b = (EngineClient(engine.kind, p.url).ok("POST", path, body) for p in (scored, reference))
        _same_page(a, b)
        tied = outcomes.get("edge_tied", 0)
        assert a["_bmx"]["tf"] != "engine" and _outcomes(scored)["edge_tied"] == tied + 1, _outcomes(scored)
    finally:
        engine.call("DELETE", f"/{index}")


def test_searches_it_does_not_score_in_the_engine_say_why(engine: EngineClient, proxies) -> None:
    """BM25, a `combine`, an explanation and augmented queries are the sidecar's, counted by reason,
    read before any call to the engine."""
    stats, scored, reference = proxies
    index = _index(engine, WITH_LENGTH if engine.kind == "opensearch" else WITHOUT, docs=200)
    try:
        _stats(scored, engine, stats, index)
        text = _queries()[0]
        asks: list[dict[str, Any]] = [
            {"ext": {"bmx": {"field": "body", "mode": "bm25"}}},
            {"ext": {"bmx": {"field": "body", "combine": "linear"}}},
            {"ext": {"bmx": {"field": "body", "explain": True}}},
            {"ext": {"bmx": {"field": "body", "augment": {"queries": ["lung"]}}}},
        ]
        for extra in asks:
            a, b = search(scored.url, index, text, extra), search(reference.url, index, text, extra)
            assert a["_bmx"]["tf"] != "engine"
            _same_page(a, b)
        assert _outcomes(scored) == {"scoring": 1, "options": 2, "augment": 1}, _outcomes(scored)
        # no statistics for the index: the sidecar's rerank says what it says when it has none (another
        # query: the sidecar keeps the windows of those above, whatever their scoring, and would answer)
        del stats.table[(index, "body")]
        text, extra = _queries()[1], {"size": 10, "ext": {"bmx": {"field": "body"}}}
        a, b = search(scored.url, index, text, extra), search(reference.url, index, text, extra)
        _same_page(a, b)
        assert a["_bmx"] == b["_bmx"], (a["_bmx"], b["_bmx"])
        reason = "unread" if engine.kind == "opensearch" else "no_length_field"
        assert _outcomes(scored)[reason] == 1, _outcomes(scored)
    finally:
        engine.call("DELETE", f"/{index}")


def _sources(engine: EngineClient, index: str) -> dict[str, Any]:
    hits = engine.ok("POST", f"/{index}/_search", {"size": 1000, "query": {"match_all": {}}})["hits"]["hits"]
    return {h["_id"]: (h["_source"], h.get("_routing")) for h in hits}


def test_lengths_add_gives_every_document_written_before_its_length(engine: EngineClient, proxies) -> None:
    """`bmx-rerank lengths add` on an index written without the sub-field: mapped, every document
    (one routed its own way, one without the field) written again unchanged, none left without a
    length, and the engine then scores its windows. Run again, it has nothing to do. On Elasticsearch,
    whose test build has no `token_count`, one line says so and the mapping is unchanged."""
    stats, scored, reference = proxies
    index = _index(engine, WITHOUT, docs=300)
    engine.ok("PUT", f"/{index}/_doc/routed?routing=r7", {"body": "lung cancer screening trial"})
    engine.ok("PUT", f"/{index}/_doc/untitled?refresh=true", {"title": "no body at all"})
    before = _sources(engine, index)
    args = [
        "lengths",
        "add",
        index,
        "--field",
        "body",
        "--upstream",
        engine.url,
        "--batch",
        "64",
        "--rate",
        "0",
    ]
    try:
        run = CliRunner().invoke(cli, [*args, "--no-progress"])
        if engine.kind != "opensearch":
            assert run.exit_code == 1, run.output
            assert "token_count" in run.output and "Traceback" not in run.output, run.output
            assert "len" not in json.dumps(engine.ok("GET", f"/{index}/_mapping")), "the mapping unchanged"
            return
        assert run.exit_code == 0, run.output
        assert "body.len added; 301 documents written again, 0 changed" in run.output, run.output
        assert run.output.rstrip().endswith("0 without a length"), run.output
        assert _sources(engine, index) == before, "every document as it was, its routing too"
        again = CliRunner().invoke(cli, [*args, "--no-progress"])
        assert again.exit_code == 0 and "already mapped; 0 documents written again" in again.output, (
            again.output
        )
        check = CliRunner().invoke(
            cli, ["lengths", "check", index, "--field", "body", "--upstream", engine.url]
        )
        assert check.exit_code == 0 and f"{index}: 0 documents without a length" in check.output
        _stats(scored, engine, stats, index)
        for text in _queries()[:5]:
            extra = {"size": 10, "ext": {"bmx": {"field": "body", "window_size": 40}}}
            a, b = search(scored.url, index, text, extra), search(reference.url, index, text, extra)
            _same_page(a, b)
            assert a["_bmx"]["tf"] == "engine"
    finally:
        engine.call("DELETE", f"/{index}")


def test_lengths_add_reads_the_index_settings_as_the_engine_applies_them(
    engine: EngineClient, proxies
) -> None:
    """The settings `lengths add` and `--in-engine` read: an index with a default ingest pipeline is
    refused (a document written again would go through it), and on OpenSearch a field that names no
    analyzer gets a length counted by the index's own `default` analyzer, which the engine then scores
    with, the page the sidecar's own."""
    stats, scored, reference = proxies
    tag = uuid.uuid4().hex[:10]
    piped, defaulted, pipeline = f"bmxtest-piped-{tag}", f"bmxtest-defaulted-{tag}", f"bmxtest-p-{tag}"
    engine.ok("PUT", f"/_ingest/pipeline/{pipeline}", {"processors": []})
    try:
        engine.ok("PUT", f"/{piped}", {"settings": {"number_of_replicas": 0, "default_pipeline": pipeline}})
        engine.ok("PUT", f"/{piped}/_doc/1?refresh=true", {"body": "lung cancer"})
        run = CliRunner().invoke(
            cli, ["lengths", "add", piped, "--field", "body", "--upstream", engine.url, "--no-progress"]
        )
        assert run.exit_code == 1 and f"has a default_pipeline [{pipeline}]" in run.output, run.output
        assert "len" not in json.dumps(engine.ok("GET", f"/{piped}/_mapping")), "the mapping unchanged"
        if engine.kind != "opensearch":  # no `token_count` in Elasticsearch's test build
            return
        english = {"analysis": {"analyzer": {"default": {"type": "standard", "stopwords": "_english_"}}}}
        mappings = {"properties": {"body": {"type": "text"}}}
        index_scifact(
            engine, defaulted, scifact_records("corpus.jsonl", 300), mappings=mappings, settings=english
        )
        run = CliRunner().invoke(
            cli, ["lengths", "add", defaulted, "--field", "body", "--upstream", engine.url, "--no-progress"]
        )
        assert run.exit_code == 0, run.output
        mapped = engine.ok("GET", f"/{defaulted}/_mapping")[defaulted]["mappings"]["properties"]["body"]
        assert mapped["fields"]["len"] == in_engine.length_mapping("default"), mapped
        _stats(scored, engine, stats, defaulted)
        for text in _queries()[:5]:
            extra = {"size": 10, "ext": {"bmx": {"field": "body", "window_size": 40}}}
            a, b = search(scored.url, defaulted, text, extra), search(reference.url, defaulted, text, extra)
            _same_page(a, b)
            assert a["_bmx"]["tf"] == "engine", a["_bmx"]
    finally:
        engine.call("DELETE", f"/{piped},{defaulted}?ignore_unavailable=true")
        engine.call("DELETE", f"/_ingest/pipeline/{pipeline}")


def test_a_fill_leaves_what_was_written_or_deleted_meanwhile(engine: EngineClient) -> None:
    """Documents rewritten and deleted while a fill runs (after its first batch): the new versions
    stay, the deleted stay deleted, and each the fill had read before is counted as changed."""
    index = _index(engine, WITHOUT, docs=120)
    ids = sorted(_sources(engine, index))
    rewritten, deleted = ids[::24], ids[5::24]
    meddled: list[int] = []

    class Meanwhile:
        """The fill's progress: after its first batch, documents are rewritten and deleted."""

        total: float | None = None

        def update(self, n: float = 1) -> None:
            if not meddled:
                meddled.append(int(n))
                for doc in rewritten:
                    engine.ok("PUT", f"/{index}/_doc/{doc}", {"body": f"rewritten {doc}"})
                for doc in deleted:
                    engine.ok("DELETE", f"/{index}/_doc/{doc}")

    async def go() -> length_field.Filled:
        async with aiohttp.ClientSession() as session:
            return await length_field.fill(
                Cluster(session, engine.url), index, "body", {}, batch=20, progress=Meanwhile()
            )

    try:
        filled = asyncio.run(go())
        after = _sources(engine, index)
        assert meddled == [20] and filled.failed == 0
        assert filled.written + filled.changed == 120 and filled.changed >= 1, filled
        assert all(after[doc][0] == {"body": f"rewritten {doc}"} for doc in rewritten), "never put back"
        assert not set(deleted) & set(after), "never brought back"
    finally:
        engine.call("DELETE", f"/{index}")


def test_the_client_wrapper_scores_in_the_engine_too(engine: EngineClient, proxies) -> None:
    """`BMXClient(..., in_engine=True)` around the official client: on OpenSearch its windows are scored
    by the engine, on Elasticsearch by the sidecar, and every page is the sidecar's own."""
    stats, _, reference = proxies
    opensearch = engine.kind == "opensearch"
    index = _index(engine, WITH_LENGTH if opensearch else WITHOUT, docs=300)
    client = BMXClient(official_client(engine.kind, engine.url), in_engine=True, stats=lambda s, b: stats)
    try:
        _stats(reference, engine, stats, index)
        for text in _queries()[:5]:
            extra = {"size": 10, "ext": {"bmx": {"field": "body", "window_size": 40}}}
            body = {"query": {"match": {"body": text}}, **extra}
            answer = client.search(index=index, body=body)
            a = answer.body if hasattr(answer, "body") else answer
            _same_page(a, search(reference.url, index, text, extra))
            assert (a["_bmx"]["tf"] == "engine") == opensearch, a["_bmx"]
    finally:
        client.close()
        engine.call("DELETE", f"/{index}")


PARAMS = (
    "",
    "routing=a,b",
    "preference=_shards:0,1",
    "preference=_local",
    "search_type=dfs_query_then_fetch",
    "timeout=10s",
    "track_total_hits=false",
    "rest_total_hits_as_int=true",
    "typed_keys=true&seq_no_primary_term=true&version=true",
    "allow_partial_search_results=false",
    "terminate_after=50",
    "filter_path=hits.hits._id,hits.total",
    "stored_fields=_none_",
)
BODIES: tuple[dict[str, Any], ...] = (
    {"size": 10},
    {"from": 5, "size": 10},
    {"size": 0},
    {"size": 10, "post_filter": {"range": {"body.len": {"lte": 250}}}},
    {"size": 10, "track_total_hits": 20},
    {"size": 10, "terminate_after": 30},
    {"size": 10, "_source": ["body"], "highlight": {"fields": {"body": {}}}},
    {"size": 10, "timeout": "5s", "docvalue_fields": ["body.len"], "stored_fields": "_none_"},
    {"size": 10, "sort": ["_score"], "aggs": {"l": {"stats": {"field": "body.len"}}}},
    {"size": 10, "collapse": {"field": "body.len"}},
    {"size": 10, "script_fields": {"x": {"script": "doc['body.len'].value * 2"}}},
)


def _alike(a: Any, b: Any, at: str = "") -> None:
    """Two answers alike: the same keys and values, numbers to 1e-6 relative, but for `took`."""
    if isinstance(a, dict) and isinstance(b, dict):
        assert set(a) - {"took"} == set(b) - {"took"}, (at, sorted(a), sorted(b))
        for key in set(a) - {"took", "_bmx"}:
            _alike(a[key], b[key], f"{at}.{key}")
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), (at, a, b)
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _alike(x, y, f"{at}[{i}]")
    elif isinstance(a, float) or isinstance(b, float):
        assert abs(a - b) <= 1e-6 * max(1.0, abs(b)), (at, a, b)
    else:
        assert a == b, (at, a, b)


def test_every_search_option_is_answered_alike_by_the_engine_and_the_sidecar(
    engine: EngineClient, proxies, engine_only: ProxyThread
) -> None:
    """The options a search may carry, each query parameter with each body (routing to several shards,
    `dfs_query_then_fetch`, partial results, totals, `post_filter`, `terminate_after`, fields asked for,
    `stored_fields: _none_`, aggregations, `collapse`), on an index of three shards and on an alias of it
    with a filter: under `--in-engine` the answer is the sidecar's, whichever scored it (status, hits,
    scores to 1e-6, totals, aggregations, shards), and most were the engine's. A search the cluster
    refuses as sent is refused alike, and keeps no index from the engine."""
    stats, _, reference = proxies
    scored = engine_only
    opensearch = engine.kind == "opensearch"
    index = _index(engine, WITH_LENGTH if opensearch else WITHOUT, shards=3)
    alias = {
        "index": index,
        "alias": f"{index}-some",
        "filter": {"bool": {"must_not": {"match": {"body": "cells"}}}},
    }
    engine.ok("POST", "/_aliases", {"actions": [{"add": alias}]})
    bmx = {"bmx": {"field": "body", "window_size": 40}}
    text = _queries()[1]
    try:
        _stats(scored, engine, stats, index)
        stats.table[(alias["alias"], "body")] = stats.table[(index, "body")]
        names = (index, alias["alias"])
        for name, params, extra in itertools.product(names, PARAMS, BODIES):
            body = {"query": {"match": {"body": text}}, **extra, "ext": bmx}
            path = f"/{name}/_search?{params}"
            a, b = (EngineClient(engine.kind, p.url).call("POST", path, body) for p in (scored, reference))
            assert a.status == b.status, (path, extra, a.body, b.body)
            if a.status >= 400:  # a refusal's details may differ between two asks (which shard spoke)
                assert a.body["error"]["type"] == b.body["error"]["type"], (path, extra, a.body, b.body)
            else:
                _alike(a.body, b.body, f"{path} {extra}")
        outcomes = _outcomes(scored)
        if not opensearch:
            assert set(outcomes) <= {"no_length_field", "request"}, outcomes
            return
        assert outcomes.get("scored", 0) >= len(names) * len(PARAMS) * len(BODIES) // 2, outcomes
        assert set(outcomes) <= {"scored", "request", "edge_partial", "edge_tied", "search_refused"}, outcomes
        # an inexact total asked for as an integer, and `_source` with `stored_fields=_none_`
        assert outcomes["search_refused"] == 2 * len(names), outcomes
    finally:
        engine.call("DELETE", f"/{index}")
