"""Query tokens come from the field's search analyzer, which `_analyze` with `field` would ignore."""

from __future__ import annotations

import uuid
from collections import Counter

import numpy as np
import pytest

from bmx_rerank import scoring
from bmx_rerank.client import BMXClient
from bmx_rerank.stats.corpus import CorpusStats
from tests.support.clients import official_client
from tests.support.corpora import index_vectors
from tests.support.data import vectors
from tests.support.engine_client import EngineClient

CORPUS = vectors()["corpus"]


def _expected(query: list[str]) -> dict[str, float]:
    """BMX of every document for `query`, from the corpus tokens (no cluster involved)."""
    stats = CorpusStats.from_documents(Counter(d) for d in CORPUS)
    terms = sorted(set(query))
    tf = np.array([[Counter(d)[t] for t in terms] for d in CORPUS], dtype=float)
    cands = scoring.Candidates(tf, np.array([len(d) for d in CORPUS], dtype=float))
    q = scoring.Query([terms.index(t) for t in query])
    scores = scoring.score(stats.term_stats(terms), cands, [q])
    return {str(i): s for i, s in enumerate(scores) if s > 0}


@pytest.mark.parametrize("field", ["body", "body#1?x&y"])  # a name a URL must escape
def test_a_search_analyzer_decides_the_query_tokens(engine: EngineClient, field: str):
    index = f"bmx-test-analyzer-{uuid.uuid4().hex[:8]}"
    settings = {
        "number_of_shards": 2,
        "analysis": {
            "filter": {"drop_t3": {"type": "stop", "stopwords": ["t3"]}},
            "analyzer": {"no_t3": {"type": "custom", "tokenizer": "standard", "filter": ["drop_t3"]}},
        },
    }
    mappings = {"properties": {field: {"type": "text", "analyzer": "standard", "search_analyzer": "no_t3"}}}
    try:
        index_vectors(engine, index, settings, mappings, field)
        # `_analyze` with the field keeps t3: the index analyzer, not the one the match query used.
        field_tokens = engine.ok("POST", f"/{index}/_analyze", {"field": field, "text": "t0 t3"})["tokens"]
        assert [t["token"] for t in field_tokens] == ["t0", "t3"]

        body = {"size": 30, "query": {"match": {field: "t0 t3"}}, "ext": {"bmx": {"field": field}}}
        with BMXClient(official_client(engine.kind, engine.url, asynchronous=False)) as bmx:
            answer = bmx.search(index=index, body=body)
        got = {h["_id"]: h["_score"] for h in answer["hits"]["hits"]}
        want = _expected(["t0"])
        assert answer["_bmx"]["reranked"] is True
        assert set(got) == set(want)
        np.testing.assert_allclose([got[k] for k in sorted(got)], [want[k] for k in sorted(got)], rtol=1e-6)
        assert not np.allclose(
            [got[k] for k in sorted(got)], [_expected(["t0", "t3"]).get(k, 0) for k in sorted(got)]
        )
    finally:
        engine.call("DELETE", f"/{index}")


NO_T3 = {
    "filter": {"drop_t3": {"type": "stop", "stopwords": ["t3"]}},
    "analyzer": {"no_t3": {"type": "custom", "tokenizer": "standard", "filter": ["drop_t3"]}},
}


def _reranked(engine: EngineClient, index: str, query: dict) -> dict:
    body = {"size": 30, "query": query, "ext": {"bmx": {"field": "body"}}}
    with BMXClient(official_client(engine.kind, engine.url, asynchronous=False)) as bmx:
        return bmx.search(index=index, body=body)


def _assert_scored_with(answer: dict, query: list[str]) -> None:
    got = {h["_id"]: h["_score"] for h in answer["hits"]["hits"]}
    want = _expected(query)
    assert answer["_bmx"]["reranked"] is True
    assert set(got) == set(want)
    np.testing.assert_allclose([got[k] for k in sorted(got)], [want[k] for k in sorted(got)], rtol=1e-6)


def test_the_index_default_search_analyzer_decides_the_query_tokens(engine: EngineClient):
    """`analysis.analyzer.default_search` analyses a match query on a field that names no search
    analyzer; the field's mapping does not show it unless its defaults are asked for."""
    index = f"bmx-test-analyzer-{uuid.uuid4().hex[:8]}"
    settings = {
        "number_of_shards": 2,
        "analysis": {**NO_T3, "analyzer": {"default_search": NO_T3["analyzer"]["no_t3"]}},
    }
    try:
        index_vectors(engine, index, settings, {"properties": {"body": {"type": "text"}}})
        _assert_scored_with(_reranked(engine, index, {"match": {"body": "t0 t3"}}), ["t0"])
    finally:
        engine.call("DELETE", f"/{index}")


def test_a_field_analyzer_beside_default_search_is_resolved_as_the_cluster_does(engine: EngineClient):
    """A field naming its `analyzer` in an index with `default_search`: Elasticsearch searches it with
    the field's analyzer, OpenSearch with default_search. The rerank's tokens follow the cluster."""
    index = f"bmx-test-analyzer-{uuid.uuid4().hex[:8]}"
    settings = {
        "number_of_shards": 1,
        "analysis": {**NO_T3, "analyzer": {"default_search": NO_T3["analyzer"]["no_t3"]}},
    }
    mappings = {"properties": {"body": {"type": "text", "analyzer": "standard"}}}
    try:
        index_vectors(engine, index, settings, mappings)
        t3_matches = engine.ok("POST", f"/{index}/_count", {"query": {"match": {"body": "t3"}}})["count"]
        searched = ["t0", "t3"] if t3_matches else ["t0"]
        assert searched == (["t0", "t3"] if engine.kind == "elasticsearch" else ["t0"])
        _assert_scored_with(_reranked(engine, index, {"match": {"body": "t0 t3"}}), searched)
    finally:
        engine.call("DELETE", f"/{index}")


def test_a_phrase_on_a_field_with_its_own_quote_analyzer_is_declined(engine: EngineClient):
    """A phrase is analysed with `search_quote_analyzer`: where it differs from the search analyzer, a
    phrase's window is answered as the cluster ranks it, with the reason; a match is reranked."""
    index = f"bmx-test-analyzer-{uuid.uuid4().hex[:8]}"
    mappings = {"properties": {"body": {"type": "text", "search_quote_analyzer": "no_t3"}}}
    try:
        index_vectors(engine, index, {"number_of_shards": 1, "analysis": NO_T3}, mappings)
        phrase = _reranked(engine, index, {"match_phrase": {"body": {"query": "t0 t3", "slop": 50}}})
        assert phrase["_bmx"]["reranked"] is False
        assert phrase["_bmx"]["skipped"] == "search_quote_analyzer"
        _assert_scored_with(_reranked(engine, index, {"match": {"body": "t0 t3"}}), ["t0", "t3"])
    finally:
        engine.call("DELETE", f"/{index}")


def test_indices_that_analyse_a_field_differently_are_declined_together(engine: EngineClient):
    """One search over two indices whose search analyzers differ has no one set of query tokens: it is
    answered as the cluster ranks it, with the reason."""
    stem = f"bmx-test-analyzer-{uuid.uuid4().hex[:8]}"
    mappings = {"properties": {"body": {"type": "text"}}}
    try:
        index_vectors(engine, f"{stem}-a", {"number_of_shards": 1}, mappings)
        default_search = {"default_search": NO_T3["analyzer"]["no_t3"]}
        index_vectors(
            engine,
            f"{stem}-b",
            {"number_of_shards": 1, "analysis": {**NO_T3, "analyzer": default_search}},
            mappings,
        )
        answer = _reranked(engine, f"{stem}-*", {"match": {"body": "t0 t3"}})
        assert answer["_bmx"]["reranked"] is False and answer["_bmx"]["skipped"] == "analyzers_differ"
        assert len(answer["hits"]["hits"]) == 30
        _assert_scored_with(_reranked(engine, f"{stem}-a", {"match": {"body": "t0 t3"}}), ["t0", "t3"])
    finally:
        engine.call("DELETE", f"/{stem}-a,{stem}-b")
