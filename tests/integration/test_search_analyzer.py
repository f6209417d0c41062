"""Query tokens come from the field's search analyzer, which `_analyze` with `field` would ignore."""

from __future__ import annotations

import uuid
from collections import Counter

import numpy as np

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


def test_a_search_analyzer_decides_the_query_tokens(engine: EngineClient):
    index = f"bmx-test-analyzer-{uuid.uuid4().hex[:8]}"
    settings = {
        "number_of_shards": 2,
        "analysis": {
            "filter": {"drop_t3": {"type": "stop", "stopwords": ["t3"]}},
            "analyzer": {"no_t3": {"type": "custom", "tokenizer": "standard", "filter": ["drop_t3"]}},
        },
    }
    mappings = {"properties": {"body": {"type": "text", "analyzer": "standard", "search_analyzer": "no_t3"}}}
    try:
        index_vectors(engine, index, settings, mappings)
        # `_analyze` with the field keeps t3: the index analyzer, not the one the match query used.
        field_tokens = engine.ok("POST", f"/{index}/_analyze", {"field": "body", "text": "t0 t3"})["tokens"]
        assert [t["token"] for t in field_tokens] == ["t0", "t3"]

        body = {"size": 30, "query": {"match": {"body": "t0 t3"}}, "ext": {"bmx": {"field": "body"}}}
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
