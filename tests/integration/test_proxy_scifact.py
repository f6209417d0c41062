"""On real text (1,000 SciFact documents), with a window covering every match, the proxy's ranking is
brute-force BMX over every document's term vectors: same documents, same scores, same order."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import aiohttp
import numpy as np
import pytest

from bmx_rerank import scoring
from bmx_rerank.rerank.rescore import candidate_features
from bmx_rerank.stats import build as stats_build
from bmx_rerank.stats.corpus import CorpusStats
from bmx_rerank.stats.source import FixedStats
from bmx_rerank.upstream import Cluster, DocRef
from tests.support.corpora import index_scifact
from tests.support.data import scifact_records
from tests.support.engine_client import EngineClient
from tests.support.proxy_thread import ProxyThread

N_DOCS = 1000
N_QUERIES = 8


async def _brute_force(base: str, index: str, ids: list[str], queries: list[str]):
    """Term vectors of every document, exact statistics from them, and each query's analyzed tokens."""
    async with aiohttp.ClientSession() as session:
        cluster = Cluster(session, base)
        docs = []
        for start in range(0, len(ids), 200):
            refs = [DocRef(index, i) for i in ids[start : start + 200]]
            docs += [d["body"] for d in await cluster.mtermvectors_fields(refs, ["body"])]
        tokens = [[t for t, _ in await cluster.analyze(index, "body", q)] for q in queries]
        built = await stats_build.build(cluster, index, "body", {})
    return docs, tokens, built


@pytest.fixture(scope="module")
def scifact(engine: EngineClient) -> Iterator[tuple]:
    index = f"bmxtest-proxy-{uuid.uuid4().hex[:10]}"
    corpus = scifact_records("corpus.jsonl", N_DOCS)
    index_scifact(engine, index, corpus, shards=2)
    queries = [q["text"] for q in scifact_records("queries.jsonl", N_QUERIES)]
    stats = FixedStats({})
    proxy = ProxyThread(engine.url, stats)
    ids = [d["_id"] for d in corpus]
    docs, tokens, built = proxy.run(_brute_force(engine.url, index, ids, queries))
    stats.table[(index, "body")] = built
    try:
        yield engine, index, proxy, docs, tokens, queries, built
    finally:
        proxy.close()
        engine.call("DELETE", f"/{index}")


def test_swept_statistics_equal_the_term_vectors(scifact):
    _, _, _, docs, _, _, built = scifact
    brute = CorpusStats.from_documents(d.tf for d in docs)
    assert (built.n_docs, built.total_length) == (brute.n_docs, brute.total_length)
    assert built.terms.tolist() == brute.terms.tolist()
    np.testing.assert_array_equal(built.df, brute.df)
    np.testing.assert_allclose(built.entropy, brute.entropy, rtol=1e-12)


@pytest.mark.parametrize("q", range(N_QUERIES))
@pytest.mark.parametrize("mode", ["bmx", "bm25"])
def test_ranking_equals_brute_force(scifact, q, mode):
    engine, index, proxy, docs, tokens, queries, _ = scifact
    brute_stats = CorpusStats.from_documents(d.tf for d in docs)
    vocab = list(dict.fromkeys(tokens[q]))
    query = scoring.Query(np.array([vocab.index(t) for t in tokens[q]], dtype=np.int64))
    want = scoring.score(
        brute_stats.term_stats(vocab), candidate_features(docs, vocab), [query], scoring.Request(mode=mode)
    )
    ids = [d.ref.id for d in docs]
    body = {
        "query": {"match": {"body": queries[q]}},
        "size": N_DOCS,
        "_source": False,
        "ext": {"bmx": {"field": "body", "window_size": N_DOCS, "mode": mode}},
    }
    answer = EngineClient(engine.kind, proxy.url).ok("POST", f"/{index}/_search", body)
    assert answer["_bmx"]["reranked"] is True
    hits = answer["hits"]["hits"]
    positive = {ids[i] for i in np.flatnonzero(want > 0)}
    assert {h["_id"] for h in hits} == positive
    by_id = dict(zip(ids, want, strict=True))
    got = np.array([h["_score"] for h in hits])
    np.testing.assert_allclose(got, [by_id[h["_id"]] for h in hits], rtol=1e-9)
    assert np.all(np.diff(got) <= 0), "ranked by descending score"
    np.testing.assert_allclose(got, np.sort(want[want > 0])[::-1], rtol=1e-9)
