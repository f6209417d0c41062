"""What the sidecar relies on, pinned down on real Elasticsearch and OpenSearch.

`_mtermvectors` gives exact per-document term frequencies, `_analyze` shows how a field's text is
tokenized, and `_count` / `_stats` count documents the way the statistics code assumes.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support.corpora import bulk
from tests.support.engine_client import EngineClient, MakeIndex

TEXT = "The quick fox saw the lazy fox and the FOX ran"
EXPECTED_TF = {"the": 3, "quick": 1, "fox": 3, "saw": 1, "lazy": 1, "and": 1, "ran": 1}
NO_STATS = {
    "term_statistics": False,
    "field_statistics": False,
    "positions": False,
    "offsets": False,
    "payloads": False,
}
STOP_ANALYSIS = {
    "analysis": {
        "filter": {"en_stop": {"type": "stop", "stopwords": "_english_"}},
        "analyzer": {
            "std_stop": {"type": "custom", "tokenizer": "standard", "filter": ["lowercase", "en_stop"]}
        },
    }
}


def _tokens(body: dict[str, Any]) -> list[str]:
    return [t["token"] for t in body["tokens"]]


def _has_analysis_common(engine: EngineClient) -> bool:
    nodes = engine.ok("GET", "/_nodes/_local/plugins")["nodes"]
    return any(m["name"] == "analysis-common" for node in nodes.values() for m in node["modules"])


# ------------------------------------------------------------------------------------------------
# _mtermvectors
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "term_vector", [None, "yes", "with_positions_offsets"], ids=["computed", "stored", "stored-pos"]
)
@pytest.mark.parametrize("style", ["query-string", "body-parameters"])
def test_mtermvectors_gives_exact_term_frequencies(
    engine: EngineClient, make_index: MakeIndex, term_vector: str | None, style: str
) -> None:
    """Same exact tf whether term vectors are stored or computed on the fly, and only tf when stats are off."""
    field: dict[str, Any] = {"type": "text"}
    if term_vector:
        field["term_vector"] = term_vector
    index = make_index(mappings={"properties": {"body": field}})
    # Not refreshed on purpose: term vectors are realtime, like GET.
    engine.ok("PUT", f"/{index}/_doc/1", {"body": TEXT})
    engine.ok("PUT", f"/{index}/_doc/2", {"body": "fox"})

    if style == "query-string":
        resp = engine.ok(
            "POST",
            f"/{index}/_mtermvectors",
            {"ids": ["1", "2", "nope"]},
            params={"fields": "body", **NO_STATS},
        )
    else:
        resp = engine.ok(
            "POST",
            f"/{index}/_mtermvectors",
            {"ids": ["1", "2", "nope"], "parameters": {"fields": ["body"], **NO_STATS}},
        )

    docs = {d["_id"]: d for d in resp["docs"]}
    assert [d["_id"] for d in resp["docs"]] == ["1", "2", "nope"]  # answers keep the request order
    assert docs["nope"]["found"] is False and "term_vectors" not in docs["nope"]
    for doc_id, expected in (("1", EXPECTED_TF), ("2", {"fox": 1})):
        assert docs[doc_id]["found"] is True
        body = docs[doc_id]["term_vectors"]["body"]
        assert "field_statistics" not in body
        assert {term: info["term_freq"] for term, info in body["terms"].items()} == expected
        for info in body["terms"].values():
            assert set(info) == {"term_freq"}  # no doc_freq/ttl, no tokens (positions/offsets)


def test_mtermvectors_sees_updates_before_refresh(engine: EngineClient, make_index: MakeIndex) -> None:
    """A re-indexed document's new tf shows immediately (realtime), with the new _version."""
    index = make_index(mappings={"properties": {"body": {"type": "text"}}})
    bulk(engine, index, {"1": {"body": "fox"}})
    engine.ok("PUT", f"/{index}/_doc/1", {"body": "fox fox dog"})
    doc = engine.ok("POST", f"/{index}/_mtermvectors", {"ids": ["1"]}, params={"fields": "body", **NO_STATS})[
        "docs"
    ][0]
    assert doc["_version"] == 2
    assert {t: i["term_freq"] for t, i in doc["term_vectors"]["body"]["terms"].items()} == {
        "fox": 2,
        "dog": 1,
    }


# ------------------------------------------------------------------------------------------------
# _analyze
# ------------------------------------------------------------------------------------------------


def test_analyze_field_uses_the_field_analyzer(engine: EngineClient, make_index: MakeIndex) -> None:
    """With one analyzer for index and search, `_analyze` on the field gives exactly the query terms."""
    index = make_index(
        settings=STOP_ANALYSIS,
        mappings={"properties": {"std": {"type": "text"}, "stop": {"type": "text", "analyzer": "std_stop"}}},
    )
    text = "The Running DOGS"
    assert _tokens(engine.ok("POST", f"/{index}/_analyze", {"field": "std", "text": text})) == [
        "the",
        "running",
        "dogs",
    ]
    assert _tokens(engine.ok("POST", f"/{index}/_analyze", {"field": "stop", "text": text})) == [
        "running",
        "dogs",
    ]
    explained = engine.ok(
        "POST", f"/{index}/_validate/query", {"query": {"match": {"stop": text}}}, {"explain": True}
    )
    assert explained["explanations"][0]["explanation"] == "stop:running stop:dogs"


def test_analyze_field_ignores_search_analyzer(engine: EngineClient, make_index: MakeIndex) -> None:
    """Pitfall: `_analyze` with `field` uses the INDEX analyzer even when `search_analyzer` differs.

    So tokens for a query must come from `_analyze` with the mapping's `search_analyzer` by name.
    """
    index = make_index(
        settings=STOP_ANALYSIS,
        mappings={
            "properties": {"a": {"type": "text", "analyzer": "standard", "search_analyzer": "std_stop"}}
        },
    )
    text = "The Running DOGS"
    by_field = _tokens(engine.ok("POST", f"/{index}/_analyze", {"field": "a", "text": text}))
    by_search_analyzer = _tokens(
        engine.ok("POST", f"/{index}/_analyze", {"analyzer": "std_stop", "text": text})
    )
    assert by_field == ["the", "running", "dogs"]
    assert by_search_analyzer == ["running", "dogs"]
    explained = engine.ok(
        "POST", f"/{index}/_validate/query", {"query": {"match": {"a": text}}}, {"explain": True}
    )
    assert explained["explanations"][0]["explanation"] == "a:running a:dogs"  # search uses std_stop


def test_token_count_and_scripts_with_term_statistics(engine: EngineClient, make_index: MakeIndex) -> None:
    """Our OpenSearch has mapper-extras and lang-painless (what in-engine scoring needs): a length from a
    `token_count` sub-field and a term's frequency in a `script_score`. The ES integ zip has neither."""
    length = {"type": "token_count", "analyzer": "standard", "enable_position_increments": False}
    mappings = {"properties": {"body": {"type": "text", "fields": {"len": length}}}}
    if engine.kind == "elasticsearch":
        resp = engine.call("PUT", "/bmx-test-no-token-count", {"mappings": mappings})
        assert resp.status == 400
        assert resp.body["error"]["type"] == "mapper_parsing_exception"
        assert "[token_count]" in resp.body["error"]["reason"]
        return
    index = make_index(mappings=mappings)
    engine.ok("PUT", f"/{index}/_doc/1", {"body": "the cat sat on the cat mat"}, params={"refresh": "true"})
    script = {
        "source": "termFreq('body', params.term) * 100 + doc['body.len'].value",
        "params": {"term": "cat"},
    }
    body = {"query": {"script_score": {"query": {"match_all": {}}, "script": script}}}
    hit = engine.ok("POST", f"/{index}/_search", body)["hits"]["hits"][0]
    assert hit["_score"] == 207.0  # tf 2, 7 tokens


def test_english_analyzer(engine: EngineClient, make_index: MakeIndex) -> None:
    """`english` stems where analysis-common is installed (our OpenSearch); the ES integ zip rejects it."""
    mappings = {"properties": {"body": {"type": "text", "analyzer": "english"}}}
    if not _has_analysis_common(engine):
        assert engine.kind == "elasticsearch", "the built-in OpenSearch should have analysis-common"
        resp = engine.call("PUT", "/bmx-test-no-english", {"mappings": mappings})
        assert resp.status == 400
        assert "analyzer [english] has not been configured" in json.dumps(resp.body)
        return
    index = make_index(mappings=mappings)
    tokens = _tokens(
        engine.ok("POST", f"/{index}/_analyze", {"field": "body", "text": "The running dogs jumped"})
    )
    assert tokens == ["run", "dog", "jump"]
    engine.ok("PUT", f"/{index}/_doc/1", {"body": "dogs dog running"})
    tf = engine.ok("POST", f"/{index}/_mtermvectors", {"ids": ["1"]}, params={"fields": "body", **NO_STATS})
    terms = tf["docs"][0]["term_vectors"]["body"]["terms"]
    assert {t: i["term_freq"] for t, i in terms.items()} == {"dog": 2, "run": 1}


# ------------------------------------------------------------------------------------------------
# _count vs _stats
# ------------------------------------------------------------------------------------------------


def _stats_docs(engine: EngineClient, index: str) -> dict[str, int]:
    docs = engine.ok("GET", f"/{index}/_stats/docs")["_all"]["primaries"]["docs"]
    return {"count": docs["count"], "deleted": docs["deleted"]}


def _count(engine: EngineClient, index: str) -> int:
    return engine.ok("GET", f"/{index}/_count")["count"]


def test_count_and_stats_after_delete(engine: EngineClient, make_index: MakeIndex) -> None:
    """`_stats` docs.count = live docs after refresh; docs.deleted also counts the delete tombstone.

    Both engines use soft deletes: deleting one document leaves the soft-deleted document AND a
    tombstone document, so docs.deleted is 2, and a force-merge keeps both (retention leases), so
    docs.deleted can never be used as "documents deleted by users". Before a refresh neither
    `_count` nor `_stats` sees the delete.
    """
    index = make_index(mappings={"properties": {"body": {"type": "text"}}})
    bulk(engine, index, {str(i): {"body": f"doc {i}"} for i in range(3)})
    assert _count(engine, index) == 3
    assert _stats_docs(engine, index) == {"count": 3, "deleted": 0}

    engine.ok("DELETE", f"/{index}/_doc/1")
    assert _count(engine, index) == 3  # near-real-time: not refreshed yet
    assert _stats_docs(engine, index) == {"count": 3, "deleted": 0}

    engine.ok("POST", f"/{index}/_refresh")
    assert _count(engine, index) == 2
    assert _stats_docs(engine, index) == {"count": 2, "deleted": 2}

    engine.ok("POST", f"/{index}/_forcemerge", params={"max_num_segments": 1})
    engine.ok("POST", f"/{index}/_refresh")
    assert _count(engine, index) == 2
    assert _stats_docs(engine, index) == {"count": 2, "deleted": 2}


def test_cluster_answers_plain_http_without_auth(engine: EngineClient) -> None:
    """The engines the fixtures give are single-node, unsecured and at least yellow."""
    health = engine.ok("GET", "/_cluster/health")
    assert health["status"] in ("yellow", "green")
    assert health["number_of_nodes"] >= 1
