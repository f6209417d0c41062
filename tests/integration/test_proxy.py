"""The proxy in front of real Elasticsearch and OpenSearch: exact scores, official clients, paging,
msearch, policies and failures. The proxy runs in-process, on an ephemeral port, in its own thread
(`tests.support.proxy_thread`) so the synchronous official clients can talk to it."""

from __future__ import annotations

import asyncio
import datetime
import http.client
import json
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from bmx_rerank.policy import parse_rules
from bmx_rerank.stats import build as stats_build
from bmx_rerank.stats.cache import StatsCache
from bmx_rerank.stats.corpus import CorpusStats
from bmx_rerank.stats.source import FixedStats
from bmx_rerank.upstream import Cluster
from tests.support.corpora import bulk, exact_stats
from tests.support.data import vectors
from tests.support.engine_client import EngineClient
from tests.support.proxy_thread import ProxyThread

VECTORS = vectors()
MAPPINGS = {"properties": {"body": {"type": "text", "analyzer": "standard"}, "tag": {"type": "keyword"}}}


@pytest.fixture(scope="module")
def small(engine: EngineClient) -> Iterator[tuple[EngineClient, str, ProxyThread, FixedStats]]:
    """bmx_small's corpus in a 3-shard index, exact statistics, and a proxy in front of the engine."""
    index = f"bmxtest-proxy-{uuid.uuid4().hex[:10]}"
    settings = {"number_of_shards": 3, "number_of_replicas": 0}
    engine.ok("PUT", f"/{index}", {"settings": settings, "mappings": MAPPINGS})
    docs = {
        str(i): {"body": " ".join(toks), "tag": "even" if i % 2 == 0 else "odd"}
        for i, toks in enumerate(VECTORS["corpus"])
    }
    bulk(engine, index, docs)
    stats = FixedStats({})
    proxy = ProxyThread(engine.url, stats, policies=parse_rules([f"{index}=body,window_size=30"]))
    stats.table[(index, "body")] = proxy.run(exact_stats(engine.url, index, "body"))
    try:
        yield engine, index, proxy, stats
    finally:
        proxy.close()
        engine.call("DELETE", f"/{index}")


def _via(engine: EngineClient, proxy: ProxyThread) -> EngineClient:
    return EngineClient(engine.kind, proxy.url)


def _case_ext(case: dict) -> tuple[dict, str]:
    """ext.bmx for a test-vector case, and the key of its expected scores."""
    ext: dict[str, Any] = {"field": "body", "query": " ".join(case["query"]), "window_size": 30}
    if case["kind"] == "bm25":
        ext.update(mode="bm25", k1=case["k1"], b=case["b"])
    for name in ("alpha", "beta"):
        if name in case:
            ext[name] = case[name]
    if case["kind"].startswith("wqa"):
        ext["augment"] = {"queries": [" ".join(q) for q in case["augmented"]], "weights": case["weights"]}
        ext["wqa_mode"] = case["kind"].split("_")[1]
    return ext, "scores"


CASES = [
    (i, key)
    for i, case in enumerate(VECTORS["cases"])
    for key in ("scores", "normalized_paper", "normalized_reference")
    if key in case
]


def test_statistics_of_the_indexed_corpus_match_the_vectors(small):
    _, index, _, stats = small
    corpus = stats.table[(index, "body")]
    assert corpus.n_docs == VECTORS["stats"]["n_docs"]
    assert corpus.avgdl == pytest.approx(VECTORS["stats"]["avgdl"], rel=1e-12)


@pytest.mark.parametrize(("case_index", "key"), CASES, ids=[f"case{i}-{k}" for i, k in CASES])
def test_every_vector_case_through_the_proxy(small, case_index, key):
    engine, index, proxy, _ = small
    case = VECTORS["cases"][case_index]
    ext, _ = _case_ext(case)
    if key != "scores":
        ext["normalize"] = key.split("_")[1]
    # The first stage is the client's own match query; ext.bmx.query is analyzed by the cluster.
    body = {"query": {"match": {"body": ext["query"]}}, "size": 30, "_source": False, "ext": {"bmx": ext}}
    answer = _via(engine, proxy).ok("POST", f"/{index}/_search", body)
    expected = case[key]
    assert answer["_bmx"]["reranked"] is True, answer["_bmx"]
    got = {int(h["_id"]): h["_score"] for h in answer["hits"]["hits"]}
    want_matched = {i for i, s in enumerate(expected) if s > 0}
    assert set(got) == want_matched, "the window holds every document with a positive score"
    for doc, score in got.items():
        assert score == pytest.approx(expected[doc], rel=1e-6)
    scores = [h["_score"] for h in answer["hits"]["hits"]]
    assert scores == sorted(scores, reverse=True)
    assert answer["_bmx"]["reranked"] is True and answer["_bmx"]["estimated"] is False
    assert answer["hits"]["max_score"] == pytest.approx(max(expected), rel=1e-6)


def test_pagination_inside_the_window(small):
    engine, index, proxy, _ = small
    client = _via(engine, proxy)
    ext = {"field": "body", "query": "t0 t3", "window_size": 30}
    full = client.ok("POST", f"/{index}/_search", {"size": 30, "ext": {"bmx": ext}})["hits"]["hits"]
    page = client.ok("POST", f"/{index}/_search", {"from": 10, "size": 5, "ext": {"bmx": ext}})["hits"][
        "hits"
    ]
    assert [h["_id"] for h in page] == [h["_id"] for h in full[10:15]]
    url_page = client.ok("POST", f"/{index}/_search", {"ext": {"bmx": ext}}, {"from": 3, "size": 2})["hits"][
        "hits"
    ]
    assert [h["_id"] for h in url_page] == [h["_id"] for h in full[3:5]]
    resp = client.call("POST", f"/{index}/_search", {"from": 25, "size": 10, "ext": {"bmx": ext}})
    assert resp.status == 400 and resp.body["error"]["type"] == "illegal_argument_exception"


def test_min_score_explain_aggregations_and_source(small):
    engine, index, proxy, _ = small
    expected = VECTORS["cases"][3]["scores"]  # query t30 t0
    ranked = sorted(expected, reverse=True)
    threshold = (ranked[4] + ranked[5]) / 2  # keeps exactly five hits
    ext = {"field": "body", "query": "t30 t0", "window_size": 30, "min_score": threshold, "explain": True}
    body = {
        "size": 30,
        "_source": ["tag"],
        "aggs": {"tags": {"terms": {"field": "tag"}}},
        "highlight": {"fields": {"body": {}}},
        "ext": {"bmx": ext},
    }
    answer = _via(engine, proxy).ok("POST", f"/{index}/_search", body)
    plain = {k: v for k, v in body.items() if k != "ext"}
    direct = engine.ok("POST", f"/{index}/_search", {**plain, "query": {"match": {"body": "t30 t0"}}})
    direct_hits = {h["_id"]: h for h in direct["hits"]["hits"]}
    assert answer["aggregations"] == direct["aggregations"]
    assert answer["hits"]["total"] == direct["hits"]["total"]
    hits = answer["hits"]["hits"]
    assert len(hits) == 5 and all(h["_score"] >= threshold for h in hits)
    assert {int(h["_id"]) for h in hits} == {i for i, s in enumerate(expected) if s >= threshold}
    assert answer["hits"]["max_score"] == pytest.approx(ranked[0], rel=1e-6)
    for hit in hits:
        assert set(hit["_source"]) == {"tag"} and "_seq_no" not in hit
        assert hit["_source"] == direct_hits[hit["_id"]]["_source"]
        assert (
            hit["highlight"] == direct_hits[hit["_id"]]["highlight"] and "<em>" in hit["highlight"]["body"][0]
        )
        assert sum(d["value"] for d in hit["_bmx_explanation"]["details"]) == pytest.approx(hit["_score"])


def test_msearch_through_the_proxy(small):
    engine, index, proxy, _ = small
    lines = [
        {"index": index},
        {"size": 3, "ext": {"bmx": {"field": "body", "query": "t12", "window_size": 30}}},
        {"index": index},
        {"size": 3, "query": {"term": {"tag": "odd"}}},
    ]
    ndjson = "".join(json.dumps(x) + "\n" for x in lines)
    answer = _via(engine, proxy).ok("POST", "/_msearch", ndjson)
    first, second = answer["responses"]
    expected = VECTORS["cases"][4]["scores"]
    top = sorted(range(30), key=lambda i: -expected[i])[:3]
    assert [int(h["_id"]) for h in first["hits"]["hits"]] == top
    assert first["_bmx"]["reranked"] is True and "_bmx" not in second
    assert all(int(h["_id"]) % 2 == 1 for h in second["hits"]["hits"])


def test_a_rerank_of_no_index_is_declined_and_answered_by_the_cluster(small):
    """Statistics are per index: `/_search`, and an `_msearch` item that names none, go without
    `ext.bmx` and say why; the cluster answers them over every index it has."""
    engine, index, proxy, _ = small
    body = {"size": 3, "query": {"ids": {"values": ["1", "2"]}}, "ext": {"bmx": {"field": "body"}}}
    got = _via(engine, proxy).call("POST", "/_search", body)
    assert got.status == 200 and got.headers["X-BMX-Rerank"] == "skipped; reason=no_index", got.body
    direct = engine.ok("POST", "/_search", {k: v for k, v in body.items() if k != "ext"})
    assert got.body["hits"]["total"] == direct["hits"]["total"]
    lines = [{}, body, {"index": index}, {**body, "ext": {"bmx": {"field": "body", "query": "t12"}}}]
    answer = _via(engine, proxy).ok("POST", "/_msearch", "".join(json.dumps(x) + "\n" for x in lines))
    unnamed, named = answer["responses"]
    assert unnamed["_bmx"]["reranked"] is False and unnamed["_bmx"]["skipped"] == "no_index"
    assert named["_bmx"]["reranked"] is True


def test_filter_path_applies_to_the_reranked_answer(small):
    """The window needs _index/_score/_seq_no, which `filter_path=hits.hits._id` drops: the proxy leaves
    filter_path out of the first stage and filters its own answer as the cluster would."""
    engine, index, proxy, _ = small
    client = _via(engine, proxy)
    ext = {"field": "body", "query": "t0 t3", "window_size": 30}
    full = client.ok("POST", f"/{index}/_search", {"size": 5, "ext": {"bmx": ext}})
    resp = client.call(
        "POST", f"/{index}/_search", {"size": 5, "ext": {"bmx": ext}}, {"filter_path": "hits.hits._id,took"}
    )
    assert resp.status == 200 and resp.headers["X-BMX-Rerank"] == "bmx"
    assert set(resp.body) == {"hits", "took"} and set(resp.body["hits"]) == {"hits"}
    assert resp.body["hits"]["hits"] == [{"_id": h["_id"]} for h in full["hits"]["hits"]]
    excluded = client.ok(
        "POST", f"/{index}/_search", {"size": 5, "ext": {"bmx": ext}}, {"filter_path": "-hits.hits._source"}
    )
    assert [h["_score"] for h in excluded["hits"]["hits"]] == [h["_score"] for h in full["hits"]["hits"]]
    assert all("_source" not in h for h in excluded["hits"]["hits"]) and excluded["_bmx"]["reranked"]
    lines = [{"index": index}, {"size": 2, "ext": {"bmx": ext}}, {"index": index}, {"size": 1}]
    ndjson = "".join(json.dumps(x) + "\n" for x in lines)
    answer = client.ok("POST", "/_msearch", ndjson, {"filter_path": "responses.hits.hits._id"})
    assert answer == {
        "responses": [
            {"hits": {"hits": [{"_id": h["_id"]} for h in full["hits"]["hits"][:2]]}},
            {
                "hits": {
                    "hits": [
                        {"_id": engine.ok("POST", f"/{index}/_search", {"size": 1})["hits"]["hits"][0]["_id"]}
                    ]
                }
            },
        ]
    }


def test_no_stored_fields_is_reranked_and_its_hits_show_what_the_clusters_show(small):
    """`stored_fields: _none_` (in the body or the URL) leaves each hit's `_id` out, which the window
    needs: the page is the same reranked page, its hits with the fields the cluster shows (no `_id`,
    `_routing` or `_source`; `docvalue_fields` and `_seq_no` as asked). With `_source` asked for too,
    the cluster's own refusal answers."""
    engine, index, proxy, _ = small
    client = _via(engine, proxy)
    ext = {"field": "body", "query": "t0 t3", "window_size": 30}
    extra = {"size": 5, "docvalue_fields": ["tag"], "seq_no_primary_term": True}
    full = client.ok("POST", f"/{index}/_search", {**extra, "ext": {"bmx": ext}})
    direct = engine.ok("POST", f"/{index}/_search", {**extra, "stored_fields": "_none_"})["hits"]["hits"]
    assert direct and all("_id" not in h for h in direct)
    for body, params in (
        ({"stored_fields": "_none_"}, {}),
        ({"stored_fields": ["_none_"]}, {}),
        ({}, {"stored_fields": "_none_"}),
    ):
        resp = client.call("POST", f"/{index}/_search", {**extra, **body, "ext": {"bmx": ext}}, params)
        assert resp.status == 200 and resp.headers["X-BMX-Rerank"] == "bmx", resp.body
        hits = resp.body["hits"]["hits"]
        assert [h["_score"] for h in hits] == [h["_score"] for h in full["hits"]["hits"]]
        assert [h["fields"] for h in hits] == [h["fields"] for h in full["hits"]["hits"]]
        assert all(set(h) == set(direct[0]) for h in hits), (hits[0], direct[0])
    # with `highlight` it goes as sent: Elasticsearch's hits carry `_id` then, OpenSearch's do not (the
    # cluster's own page, and why)
    lit = {**extra, "stored_fields": "_none_", "highlight": {"fields": {"body": {}}}}
    resp = client.call("POST", f"/{index}/_search", {**lit, "ext": {"bmx": ext}})
    direct = engine.ok("POST", f"/{index}/_search", lit)["hits"]["hits"]
    said = "bmx" if "_id" in direct[0] else "skipped; reason=stored_fields"
    assert resp.status == 200 and resp.headers["X-BMX-Rerank"] == said, (resp.headers, resp.body)
    shown = set(direct[0]) - {"highlight"}  # on the hits that match, which differ here
    assert all(set(h) - {"highlight"} == shown for h in resp.body["hits"]["hits"]), (resp.body, direct[0])
    asked = {**extra, "stored_fields": "_none_", "_source": True}
    resp, direct_resp = (c.call("POST", f"/{index}/_search", asked) for c in (client, engine))
    assert resp.status == direct_resp.status >= 400, (resp.body, direct_resp.body)  # OpenSearch says 500
    assert resp.body["error"] == direct_resp.body["error"]


@pytest.mark.parametrize(
    ("source", "field", "reranked"),
    [
        ({"enabled": False}, {}, False),
        ({"excludes": ["body"]}, {}, False),
        ({"enabled": False}, {"store": True}, True),  # term vectors made from the stored value
        ({"enabled": False}, {"term_vector": "yes"}, True),
    ],
)
def test_a_field_whose_term_vectors_cannot_be_read_is_declined(
    engine: EngineClient, source: dict, field: dict, reranked: bool
) -> None:
    """Without `_source` (or with it leaving the field out), and with neither `term_vector` nor `store`,
    the cluster gives no term vectors of the field: no hit's length could be read (the probes would
    give its frequencies, and a length of 0 a wrong score), so the search is declined, saying why.
    Where the field stores its value or its term vectors, it is reranked, as on an index that keeps
    `_source` (the same scores)."""
    docs = {str(i): {"body": " ".join(toks)} for i, toks in enumerate(VECTORS["corpus"])}
    names = {}
    for kind, mappings in (
        ("kept", MAPPINGS),
        ("other", {"_source": source, "properties": {"body": {"type": "text", **field}}}),
    ):
        names[kind] = f"bmxtest-vectors-{uuid.uuid4().hex[:10]}"
        settings = {"number_of_shards": 1, "number_of_replicas": 0}
        engine.ok("PUT", f"/{names[kind]}", {"settings": settings, "mappings": mappings})
        bulk(engine, names[kind], docs)
    stats = FixedStats({})
    proxy = ProxyThread(engine.url, stats)
    try:
        table = proxy.run(exact_stats(engine.url, names["kept"], "body"))
        stats.table[(names["kept"], "body")] = stats.table[(names["other"], "body")] = table
        ext = {"field": "body", "query": "t0 t3", "window_size": 30}
        kept, other = (
            _via(engine, proxy).call("POST", f"/{names[k]}/_search", {"size": 5, "ext": {"bmx": ext}})
            for k in ("kept", "other")
        )
        assert kept.headers["X-BMX-Rerank"] == "bmx"
        if reranked:
            assert other.headers["X-BMX-Rerank"] == "bmx", other.body
            assert [h["_score"] for h in other.body["hits"]["hits"]] == [
                h["_score"] for h in kept.body["hits"]["hits"]
            ]
        else:
            assert other.headers["X-BMX-Rerank"] == "skipped; reason=no_term_vectors", other.body
            plain = engine.ok(
                "POST", f"/{names['other']}/_search", {"size": 5, "query": {"match": {"body": "t0 t3"}}}
            )
            assert [h["_score"] for h in other.body["hits"]["hits"]] == [
                h["_score"] for h in plain["hits"]["hits"]
            ]
    finally:
        proxy.close()
        for name in names.values():
            engine.call("DELETE", f"/{name}")


@pytest.mark.parametrize("probes", [True, False])
def test_a_date_math_index_name_is_reranked_as_the_index_it_names(engine: EngineClient, probes: bool) -> None:
    """`<name-{now/d}>` (escaped in the URL as clients send it, its `/` too) names today's index: the
    search is reranked, with that index's statistics, as a search of the index by its own name is;
    with the first stage's probes and with term vectors."""
    day = datetime.datetime.now(datetime.timezone.utc).strftime("%Y.%m.%d")
    prefix = f"bmxtest-dm-{uuid.uuid4().hex[:6]}"
    index, store = f"{prefix}-{day}", f"{prefix}-store"
    engine.ok(
        "PUT",
        f"/{index}",
        {"settings": {"number_of_shards": 2, "number_of_replicas": 0}, "mappings": MAPPINGS},
    )
    bulk(engine, index, {str(i): {"body": " ".join(toks)} for i, toks in enumerate(VECTORS["corpus"])})
    named = urllib.parse.quote(f"<{prefix}-{{now/d}}>", safe="")
    asyncio.run(_built(engine.url, urllib.parse.unquote(named), store))
    proxy = ProxyThread(
        engine.url, lambda session, base: StatsCache(session, base, store=store), tf_probes=probes
    )
    try:
        body = {"size": 5, "ext": {"bmx": {"field": "body", "query": "t0 t3", "window_size": 30}}}
        by_math, by_name = (_via(engine, proxy).call("POST", f"/{n}/_search", body) for n in (named, index))
        assert by_math.status == by_name.status == 200, by_math.body
        assert by_math.headers["X-BMX-Rerank"] == by_name.headers["X-BMX-Rerank"] == "bmx"
        assert by_math.body["_bmx"]["estimated"] is False, by_math.body["_bmx"]
        assert [(h["_id"], h["_score"]) for h in by_math.body["hits"]["hits"]] == [
            (h["_id"], h["_score"]) for h in by_name.body["hits"]["hits"]
        ]
    finally:
        proxy.close()
        engine.call("DELETE", f"/{index}")
        engine.call("DELETE", f"/{store}")


async def _built(base: str, index_expr: str, store: str) -> None:
    async with aiohttp.ClientSession() as session:
        await stats_build.build_snapshots(Cluster(session, base), index_expr, "body", {}, store=store)


@pytest.mark.parametrize(
    ("query", "content_type"),
    [
        ("?format=yaml", "application/json"),
        ("?format=json&format=yaml", "application/json"),  # the cluster reads the last value
        ("", "application/yaml"),  # no Accept: the cluster answers in the body's own type
    ],
)
def test_yaml_answer_is_not_reranked_nor_widened(small, query, content_type):
    engine, index, proxy, _ = small
    body = {"size": 2, "ext": {"bmx": {"field": "body", "query": "t0", "window_size": 30}}}
    request = urllib.request.Request(
        f"{proxy.url}/{index}/_search{query}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": content_type},
    )
    with urllib.request.urlopen(request, timeout=60) as resp:
        assert resp.status == 200 and resp.headers["X-BMX-Rerank"] == "skipped; reason=format"
        text = resp.read().decode()
    assert text.startswith("---") and text.count("_id:") == 2, "the client's page, not the window"


def test_a_body_without_a_content_type_is_refused_as_the_cluster_refuses_it(small):
    """The cluster answers a body sent without `Content-Type` with a 406; so must the proxy, rerank
    asked or not (it never adds a type the client did not send)."""
    engine, index, proxy, _ = small
    asked = json.dumps({"size": 2, "ext": {"bmx": {"field": "body", "query": "t0"}}}).encode()
    answers = []
    for base, data in ((proxy.url, asked), (engine.url, b'{"size": 2}')):
        url = urllib.parse.urlsplit(base)
        connection = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
        connection.putrequest("POST", f"/{index}/_search")
        connection.putheader("Content-Length", str(len(data)))
        connection.endheaders(data)
        answer = connection.getresponse()
        answers.append((answer.status, answer.read()))
        connection.close()
    assert answers[0] == answers[1] and answers[0][0] == 406, answers


def test_a_repeated_parameter_is_read_as_the_cluster_reads_it_its_last_value(small):
    engine, index, proxy, _ = small
    body = {"ext": {"bmx": {"field": "body", "query": "t0", "window_size": 30}}}
    got = _via(engine, proxy).ok("POST", f"/{index}/_search?size=2&size=5&from=3&from=0", body)
    assert got["_bmx"]["reranked"] is True and len(got["hits"]["hits"]) == 5
    top = _via(engine, proxy).ok("POST", f"/{index}/_search?size=5", body)
    assert [h["_id"] for h in got["hits"]["hits"]] == [h["_id"] for h in top["hits"]["hits"]]


def test_policy_drop_in_needs_no_client_change(small):
    engine, index, proxy, _ = small
    body = {"query": {"match": {"body": "t1 t1 t7"}}, "size": 5}
    resp = _via(engine, proxy).call("POST", f"/{index}/_search", body)
    assert resp.headers.get("X-BMX-Rerank") == "bmx"
    expected = VECTORS["cases"][1]["scores"]
    assert [h["_score"] for h in resp.body["hits"]["hits"]] == pytest.approx(
        sorted(expected, reverse=True)[:5], rel=1e-6
    )
    other = _via(engine, proxy).call("POST", f"/{index}/_search", {"query": {"term": {"tag": "odd"}}})
    assert "X-BMX-Rerank" not in other.headers and "_bmx" not in other.body


def test_upstream_errors_pass_through(small):
    engine, index, proxy, _ = small
    client = _via(engine, proxy)
    missing = client.call(
        "POST", "/bmxtest-proxy-missing/_search", {"ext": {"bmx": {"field": "body", "query": "t0"}}}
    )
    direct = engine.call("POST", "/bmxtest-proxy-missing/_search", {})
    assert missing.status == direct.status == 404
    assert missing.body["error"]["type"] == direct.body["error"]["type"] == "index_not_found_exception"
    bad = client.call("POST", f"/{index}/_search", {"query": {"nope": {}}})
    assert bad.status == engine.call("POST", f"/{index}/_search", {"query": {"nope": {}}}).status == 400
    invalid = client.call("POST", f"/{index}/_search", {"ext": {"bmx": {"field": "body", "mode": "x"}}})
    assert invalid.status == 400 and invalid.body["error"]["type"] == "illegal_argument_exception"


def test_rerank_error_falls_back_with_a_marker(small):
    engine, index, proxy, _ = small
    body = {
        "size": 3,
        "query": {"match": {"body": "t0"}},
        "ext": {"bmx": {"field": "tag", "window_size": 30, "query": "t0"}},
    }
    resp = _via(engine, proxy).call("POST", f"/{index}/_search", body)
    assert resp.status == 200 and resp.headers["X-BMX-Rerank"] == "fallback"
    assert resp.body["_bmx"]["reranked"] is False and resp.body["_bmx"]["error"]["type"]
    direct = engine.ok("POST", f"/{index}/_search", {"size": 3, "query": {"match": {"body": "t0"}}})
    assert [h["_id"] for h in resp.body["hits"]["hits"]] == [h["_id"] for h in direct["hits"]["hits"]]


def test_estimated_statistics_are_marked(engine):
    """With the cluster-backed StatsCache and no snapshot, the marker says the statistics are estimated."""
    index = f"bmxtest-proxy-{uuid.uuid4().hex[:10]}"
    engine.ok(
        "PUT",
        f"/{index}",
        {"settings": {"number_of_shards": 1, "number_of_replicas": 0}, "mappings": MAPPINGS},
    )
    bulk(engine, index, {str(i): {"body": " ".join(t)} for i, t in enumerate(VECTORS["corpus"])})
    proxy = ProxyThread(engine.url, lambda session, base: StatsCache(session, base))
    try:
        resp = _via(engine, proxy).call(
            "POST", f"/{index}/_search", {"size": 5, "ext": {"bmx": {"field": "body", "query": "t0 t3"}}}
        )
        assert resp.status == 200, resp.body
        assert resp.headers["X-BMX-Rerank"] == "bmx", resp.body["_bmx"]["error"]
        assert resp.body["_bmx"]["estimated"] is True and resp.body["_bmx"]["built_at"] is None
    finally:
        proxy.close()
        engine.call("DELETE", f"/{index}")


def test_unrefreshed_updates_do_not_leak_into_scores(engine: EngineClient):
    """Term vectors are read from the refreshed index, like the hits: a pending update changes nothing
    until a refresh, and then (new _seq_no, so no stale cache entry) the new text counts."""
    index = f"bmxtest-proxy-{uuid.uuid4().hex[:10]}"
    settings = {"number_of_shards": 1, "number_of_replicas": 0, "refresh_interval": -1}
    engine.ok("PUT", f"/{index}", {"settings": settings, "mappings": MAPPINGS})
    bulk(engine, index, {"a": {"body": "t1 t2"}, "b": {"body": "t1 t3 t3"}})
    stats = FixedStats(
        {(index, "body"): CorpusStats.from_documents([{"t1": 1, "t2": 1}, {"t1": 1, "t3": 2}])}
    )
    proxy = ProxyThread(engine.url, stats, cache_bytes=0)  # no cache: every search reads term vectors
    body = {"size": 2, "ext": {"bmx": {"field": "body", "query": "t1", "explain": True}}}
    try:
        before = _via(engine, proxy).ok("POST", f"/{index}/_search", body)["hits"]["hits"]
        engine.ok("PUT", f"/{index}/_doc/a", {"body": "t1 t1 t1 t1 t1 t1 t1 t1"})  # not refreshed
        pending = _via(engine, proxy).ok("POST", f"/{index}/_search", body)["hits"]["hits"]
        assert [(h["_id"], h["_score"]) for h in pending] == [(h["_id"], h["_score"]) for h in before]
        engine.ok("POST", f"/{index}/_refresh")
        after = {
            h["_id"]: h["_score"]
            for h in _via(engine, proxy).ok("POST", f"/{index}/_search", body)["hits"]["hits"]
        }
        assert after["a"] != {h["_id"]: h["_score"] for h in before}["a"]
    finally:
        proxy.close()
        engine.call("DELETE", f"/{index}")
