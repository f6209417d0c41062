"""The reading of a query (`query.understand`) checked against the cluster itself, on random queries.

For every query the rerank reads into a tree, the tree is written back as plain `match`, `bool` and
`dis_max` queries and both are scored by the cluster's own BM25. If the reading is right, every hit of
the original query scores what the written-back tree scores, up to one constant for all of them (a
`match_all` or a required `constant_score` left out): BMX then replaces each leaf's score and keeps the
ranking the query's structure makes. A clause read wrong (a boost, a tie_breaker, a constant that only
some hits get) shows as a difference that varies from hit to hit. Queries the rerank declines are
counted: most must be read.

Then the same queries go through the proxy in `mode: bm25`: exact BM25 over the whole corpus, which on
one shard of short documents (lengths below 24 are stored without loss) is the cluster's own BM25, up
to the same one constant, and to one factor where the cluster drops the classic form's (k1 + 1), as
OpenSearch 3 does. That checks the whole path (statistics, term frequencies, lengths, the tree folded
in numpy) against the engine, not against a second copy of the formula."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from bmx_rerank.rerank.query import Declined, Node, Text, understand
from bmx_rerank.stats.source import FixedStats
from tests.support.corpora import bulk, exact_stats
from tests.support.engine_client import EngineClient
from tests.support.proxy_thread import ProxyThread

WORDS = "alpha beta gamma delta epsilon zeta theta kappa".split()
FIELDS = ("title", "text")
QUERIES = 300


@pytest.fixture(scope="module")
def corpus(engine: EngineClient) -> Iterator[tuple[EngineClient, dict[int, str]]]:
    """60 short documents (exact norms: Lucene encodes lengths below 24 without loss), in an index of
    one shard and in one of three: by shard count, the index."""
    name = f"bmxtest-reading-{uuid.uuid4().hex[:10]}"
    indices = {1: name, 3: f"{name}-3"}
    rng = random.Random(5)
    docs = {
        str(i): {
            "title": " ".join(rng.choices(WORDS, k=rng.randint(1, 4))),
            "text": " ".join(rng.choices(WORDS, k=rng.randint(2, 12))),
            "n": i,
        }
        for i in range(60)
    }
    mappings = {"properties": {"title": {"type": "text"}, "text": {"type": "text"}, "n": {"type": "integer"}}}
    for shards, index in indices.items():
        settings = {"number_of_shards": shards, "number_of_replicas": 0}
        engine.ok("PUT", f"/{index}", {"settings": settings, "mappings": mappings})
        bulk(engine, index, docs)
    try:
        yield engine, indices
    finally:
        for index in indices.values():
            engine.call("DELETE", f"/{index}")


@pytest.fixture(scope="module")
def proxy(corpus: tuple[EngineClient, dict[int, str]]) -> Iterator[EngineClient]:
    """A proxy in front of the corpus, with its two fields' exact statistics in either index."""
    engine, indices = corpus
    stats = FixedStats({})
    proxy = ProxyThread(engine.url, stats)
    for index in indices.values():
        for field in FIELDS:
            stats.table[(index, field)] = proxy.run(exact_stats(engine.url, index, field))
    try:
        yield EngineClient(engine.kind, proxy.url)
    finally:
        proxy.close()


class Queries:
    """Random queries of the shapes users write, text clauses nested in `bool` and `dis_max`."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def words(self) -> str:
        return " ".join(self.rng.sample(WORDS, self.rng.randint(1, 3)))

    def boost(self, into: dict[str, Any]) -> dict[str, Any]:
        if self.rng.random() < 0.3:
            into["boost"] = self.rng.choice([0.5, 2, 3.5])
        return into

    def fields(self) -> list[str]:
        picked = self.rng.sample(FIELDS, self.rng.randint(1, 2))
        return [f"{f}^{self.rng.choice([2, 0.5])}" if self.rng.random() < 0.4 else f for f in picked]

    def text(self) -> dict[str, Any]:
        kind = self.rng.choice(["match", "match", "multi_match", "query_string", "simple_query_string"])
        if kind == "match":
            field = self.rng.choice(FIELDS)
            options = {"query": self.words(), "operator": self.rng.choice(["or", "or", "and"])}
            if self.rng.random() < 0.15:
                options["minimum_should_match"] = self.rng.choice([1, "2", "50%"])
            return {"match": {field: self.boost(options)}}
        body: dict[str, Any] = {"query": self.words(), "fields": self.fields()}
        if self.rng.random() < 0.25:  # every term asked for: of each field, or of the query
            body["default_operator" if "query_string" in kind else "operator"] = self.rng.choice(
                ["and", "AND"]
            )
        if kind != "simple_query_string":
            body["type"] = self.rng.choice(["best_fields", "most_fields"])
            if self.rng.random() < 0.5:
                body["tie_breaker"] = self.rng.choice([0.0, 0.3, 1.0])
        return {kind: self.boost(body)}

    def constant(self) -> dict[str, Any]:
        if self.rng.random() < 0.5:
            return {"match_all": self.boost({})}
        return {"constant_score": self.boost({"filter": {"range": {"n": {"gte": self.rng.randint(0, 59)}}}})}

    def query(self, depth: int = 0) -> dict[str, Any]:
        roll = self.rng.random()
        if depth >= 3 or roll < 0.35:
            return self.constant() if self.rng.random() < 0.12 else self.text()
        if roll < 0.55:
            queries = [self.query(depth + 1) for _ in range(self.rng.randint(1, 3))]
            return {"dis_max": self.boost({"queries": queries, "tie_breaker": self.rng.choice([0.0, 0.4])})}
        body: dict[str, Any] = {}
        for clause in ("must", "should", "filter", "must_not"):
            count = self.rng.choice([0, 0, 1, 2]) if clause != "must_not" else self.rng.choice([0, 0, 0, 1])
            if count:
                body[clause] = [self.query(depth + 1) for _ in range(count)]
        if not body.get("must") and not body.get("should"):
            body["should"] = [self.text()]
        if len(body.get("should", [])) > 1 and self.rng.random() < 0.3:
            body["minimum_should_match"] = self.rng.choice([1, 2])
        return {"bool": self.boost(body)}


def read_queries() -> Iterator[dict[str, Any]]:
    """The random queries `understand` reads (counted: most of them)."""
    read = 0
    for number in range(QUERIES):
        query = Queries(number).query()
        try:
            understand(query)
        except Declined:
            continue
        read += 1
        yield query
    assert read >= QUERIES * 2 // 5, read


def same_up_to_one_constant(got: dict[str, float], want: dict[str, float], why: Any) -> None:
    assert set(got) == set(want), why
    if not want:
        return
    shifts = [got[doc] - want[doc] for doc in want]
    scale = max(1.0, *map(abs, want.values()))
    assert max(shifts) - min(shifts) < 1e-5 * scale, (why, sorted(shifts))


def written(node: Node) -> dict[str, Any]:
    """A tree as the plain query the cluster scores the same way."""
    if isinstance(node, Text):
        return {"match": {node.field: {"query": node.text, "boost": node.boost}}}
    parts = [written(part) for part in node.parts]
    if node.how == "sum":
        return {"bool": {"should": parts, "boost": node.boost}}
    return {"dis_max": {"queries": parts, "tie_breaker": node.tie_breaker, "boost": node.boost}}


def scores(engine: EngineClient, index: str, query: dict[str, Any], params: Any = None) -> dict[str, float]:
    hits = engine.ok("POST", f"/{index}/_search", {"query": query, "size": 60}, params)["hits"]["hits"]
    return {hit["_id"]: hit["_score"] for hit in hits}


def test_every_query_read_scores_as_its_tree_up_to_one_constant(corpus):
    engine, indices = corpus
    index = indices[1]
    for query in read_queries():
        tree = understand(query)
        original = scores(engine, index, query)
        if not original:
            continue
        if tree is None:  # nothing scores text: every hit scores the same
            assert max(original.values()) - min(original.values()) < 1e-4, query
            continue
        # every hit of the query, scored by the tree (0 where no leaf matches it)
        ids = {"ids": {"values": list(original)}}
        rebuilt = scores(engine, index, {"bool": {"should": [written(tree)], "filter": [ids]}})
        same_up_to_one_constant(original, {doc: rebuilt.get(doc, 0.0) for doc in original}, (query, tree))


def classic_form(engine: EngineClient, proxy: EngineClient, index: str) -> float:
    """What the cluster's BM25 is to the classic form the proxy's `mode: bm25` scores: 1 where it keeps
    (k1 + 1) (Elasticsearch, OpenSearch 2), 1 / (k1 + 1) where it drops it as Lucene does (OpenSearch 3)."""
    query = {"match": {"text": "alpha"}}
    direct = scores(engine, index, query)
    ext = {"bmx": {"field": "text", "mode": "bm25", "window_size": 60}}
    answer = proxy.ok("POST", f"/{index}/_search", {"query": query, "size": 60, "ext": ext})
    ratio = direct[answer["hits"]["hits"][0]["_id"]] / answer["hits"]["hits"][0]["_score"]
    assert ratio == pytest.approx(1.0, rel=1e-5) or ratio == pytest.approx(1 / 2.2, rel=1e-5), ratio
    return ratio


@pytest.mark.parametrize("shards", [1, 3])
def test_every_query_read_is_the_clusters_bm25_through_the_proxy(corpus, proxy, shards):
    """Over three shards the cluster scores with global statistics under `dfs_query_then_fetch`."""
    engine, indices = corpus
    index, dfs = indices[shards], {"search_type": "dfs_query_then_fetch"}
    ext = {"bmx": {"fields": list(FIELDS), "mode": "bm25", "window_size": 60}}
    form = classic_form(engine, proxy, indices[1])
    reranked = 0
    for query in read_queries():
        if understand(query) is None:
            continue
        direct = scores(engine, index, query, dfs)
        answer = proxy.call("POST", f"/{index}/_search", {"query": query, "size": 60, "ext": ext}, params=dfs)
        assert answer.status == 200, answer.body
        marker = answer.headers.get("X-BMX-Rerank")
        if marker == "skipped; reason=no_text_match":  # hits that only a filter let through
            assert direct and max(direct.values()) == 0, (query, direct)
            continue
        assert marker == "bm25", (query, marker)
        got = {hit["_id"]: hit["_score"] * form for hit in answer.body["hits"]["hits"]}
        same_up_to_one_constant(got, direct, query)
        reranked += bool(direct)
    assert reranked >= QUERIES // 3, reranked
