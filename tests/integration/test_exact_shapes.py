"""Production query shapes reranked exactly: for each, the proxy's scores equal a brute-force BMX computed
here, document by document (tests/support/naive.py), from the same tokens and per-field statistics, to 1e-6.

Both engines, 3 shards. Statistics come from `bmx-rerank stats build INDEX --field title --field text`
(one snapshot per field) through the cluster-backed cache the server uses. The words are lowercase ASCII
separated by spaces, so the standard analyzer's tokens are the words themselves."""

from __future__ import annotations

import asyncio
import json
import random
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import aiohttp
import pytest
from click.testing import CliRunner

from bmx_rerank.cli.stats import command as stats_command
from bmx_rerank.identity import caller
from bmx_rerank.metrics import Metrics
from bmx_rerank.policy import parse_rules
from bmx_rerank.rerank.pipeline import Answer, Reranker
from bmx_rerank.rerank.plan import plan_search
from bmx_rerank.rerank.term_vector_cache import TermVectorCache, cache_key
from bmx_rerank.stats.cache import StatsCache
from bmx_rerank.stats.corpus import CorpusStats
from bmx_rerank.stats.source import FixedStats
from bmx_rerank.upstream import Cluster, request_json
from tests.support import naive
from tests.support.corpora import bulk
from tests.support.engine_client import EngineClient
from tests.support.naive import FIELDS, WORDS
from tests.support.naive import FieldsCorpus as Corpus
from tests.support.proxy_thread import ProxyThread

WINDOW = 60  # more than the corpus: the window is every match
TOLERANCE = 1e-6


@pytest.fixture(scope="module")
def exact(engine: EngineClient) -> Iterator[tuple[EngineClient, str, EngineClient, Corpus]]:
    index = f"bmxtest-exact-{uuid.uuid4().hex[:10]}"
    store = f"bmxtest-store-{uuid.uuid4().hex[:10]}"
    mappings = {
        "properties": {
            "title": {"type": "text"},
            "text": {"type": "text"},
            "tag": {"type": "keyword"},
            "n": {"type": "integer"},
            **({"v": {"type": "dense_vector", "dims": 2}} if engine.kind == "elasticsearch" else {}),
        }
    }
    settings = {"number_of_shards": 3, "number_of_replicas": 0}
    engine.ok("PUT", f"/{index}", {"settings": settings, "mappings": mappings})
    rng = random.Random(19)
    docs: dict[str, dict[str, Any]] = {}
    for i in range(40):
        docs[str(i)] = {
            "title": " ".join(rng.choices(WORDS, k=rng.randint(1, 4))),
            "text": " ".join(rng.choices(WORDS, k=rng.randint(3, 14))),
            "tag": "even" if i % 2 == 0 else "odd",
            "n": i,
        }
        if engine.kind == "elasticsearch":
            docs[str(i)]["v"] = [rng.random(), rng.random()]
    bulk(engine, index, docs)
    built = CliRunner().invoke(
        stats_command,
        ["build", index, "--field", "title", "--field", "text", "--upstream", engine.url]
        + ["--store", store, "--no-progress"],
    )
    assert built.exit_code == 0, built.output
    assert f"{index} [title]:" in built.output and f"{index} [text]:" in built.output
    common = ["--field", "title", "--field", "text", "--upstream", engine.url, "--store", store]
    shown = CliRunner().invoke(stats_command, ["show", index, *common, "--json"])
    reports = [json.loads(line) for line in shown.output.splitlines()]
    assert [(r["field"], r["estimated"]) for r in reports] == [("title", False), ("text", False)]
    refreshed = CliRunner().invoke(stats_command, ["refresh", index, *common, "--no-progress"])
    assert refreshed.output.count(": unchanged") == 2, refreshed.output
    proxy = ProxyThread(
        engine.url,
        lambda session, base: StatsCache(session, base, store=store),
        policies=parse_rules([f"{index}=title|text,window_size={WINDOW}"]),
    )
    try:
        yield engine, index, EngineClient(engine.kind, proxy.url), Corpus(docs)
    finally:
        proxy.close()
        engine.call("DELETE", f"/{index}")
        engine.call("DELETE", f"/{store}*")


def _scores(resp: Any) -> dict[str, float]:
    assert resp.status == 200, resp.body
    assert resp.headers.get("X-BMX-Rerank") == "bmx", resp.body.get("_bmx")
    return {h["_id"]: h["_score"] for h in resp.body["hits"]["hits"]}


def _check(
    engine: EngineClient,
    proxy: EngineClient,
    index: str,
    body: dict[str, Any],
    expected: Callable[[str], float],
    ext: dict[str, Any] | None = None,
) -> dict[str, float]:
    """Through the proxy (`ext.bmx` if given, else the policy): the cluster's own hits, each scored
    as `expected` says, to 1e-6."""
    sent = {**body, "size": WINDOW, **({"ext": {"bmx": {"window_size": WINDOW, **ext}}} if ext else {})}
    got = _scores(proxy.call("POST", f"/{index}/_search", sent))
    direct = engine.ok("POST", f"/{index}/_search", {**body, "size": WINDOW})
    assert set(got) == {h["_id"] for h in direct["hits"]["hits"]}, "the cluster decides what matches"
    assert len(got) > 3
    want = {i: expected(i) for i in got}
    assert got == pytest.approx(want, abs=TOLERANCE)
    assert all(s > 0 for s in got.values()), "a matched hit never scores 0"
    return got


Q = "alpha omega sigma"


def test_bool_with_a_filter_under_a_policy(exact):
    engine, index, proxy, corpus = exact
    body = {"query": {"bool": {"must": [{"match": {"text": Q}}], "filter": [{"term": {"tag": "odd"}}]}}}
    got = _check(engine, proxy, index, body, lambda i: corpus.bmx("text", i, Q))
    assert all(int(i) % 2 == 1 for i in got), "the filter stays with the first stage"


@pytest.mark.parametrize("tie_breaker", [0.0, 0.3])
def test_multi_match_best_fields_with_boosts(exact, tie_breaker):
    engine, index, proxy, corpus = exact
    mm = {"query": Q, "fields": ["title^2", "text"], "type": "best_fields", "tie_breaker": tie_breaker}

    def expected(i: str) -> float:
        parts = [2.0 * corpus.bmx("title", i, Q), corpus.bmx("text", i, Q)]
        return max(parts) + tie_breaker * (sum(parts) - max(parts))

    _check(engine, proxy, index, {"query": {"multi_match": mm}}, expected)  # the policy's two fields
    _check(engine, proxy, index, {"query": {"multi_match": mm}}, expected, {"fields": list(FIELDS)})


def test_multi_match_most_fields_with_boosts_and_field_weights(exact):
    engine, index, proxy, corpus = exact
    mm = {"query": Q, "fields": ["title^2", "text^0.5"], "type": "most_fields", "boost": 3}

    def expected(i: str) -> float:
        # ext.bmx.fields weights multiply every leaf on their field, on top of the query's boosts
        return 3 * (2.0 * 1.5 * corpus.bmx("title", i, Q) + 0.5 * corpus.bmx("text", i, Q))

    _check(engine, proxy, index, {"query": {"multi_match": mm}}, expected, {"fields": ["title^1.5", "text"]})


def test_a_new_window_is_probed_and_the_same_window_again_comes_from_the_cache(exact):
    """The snapshots carry length tables (`stats build` keeps them), so `auto` reads a new window's
    frequencies over both fields from the first stage's probes (no `_mtermvectors`), and the same window
    again from the cache (kept whole): both exact."""
    engine, index, proxy, corpus = exact
    text = "zeta theta lambda kappa"
    mm = {"query": text, "fields": ["title^2", "text"], "type": "most_fields"}
    ext = {"bmx": {"window_size": WINDOW, "fields": list(FIELDS)}}
    body = {"query": {"multi_match": mm}, "size": WINDOW, "ext": ext}
    markers = []
    for _ in range(2):
        resp = proxy.call("POST", f"/{index}/_search", body)
        got = _scores(resp)
        markers.append((resp.body["_bmx"]["tf"], resp.body["_bmx"]["tf_probes"]))
        want = {i: 2.0 * corpus.bmx("title", i, text) + corpus.bmx("text", i, text) for i in got}
        assert len(got) > 3 and got == pytest.approx(want, abs=TOLERANCE)
    assert markers == [("probes", None), ("window", "seen")]


def test_match_phrase_is_scored_on_its_terms(exact):
    engine, index, proxy, corpus = exact
    body = {"query": {"match_phrase": {"text": {"query": "alpha beta", "slop": 3}}}}
    _check(engine, proxy, index, body, lambda i: corpus.bmx("text", i, "alpha beta"), {"field": "text"})


def test_bool_of_two_fields_sums_its_clauses(exact):
    engine, index, proxy, corpus = exact
    body = {
        "query": {
            "bool": {
                "should": [
                    {"match": {"title": {"query": "gamma delta", "boost": 2}}},
                    {"match": {"text": "kappa"}},
                ],
                "must_not": {"range": {"n": {"lt": 4}}},
            }
        }
    }

    def expected(i: str) -> float:
        return 2 * corpus.bmx("title", i, "gamma delta") + corpus.bmx("text", i, "kappa")

    _check(engine, proxy, index, body, expected)


def test_query_string_of_plain_words_as_best_fields(exact):
    engine, index, proxy, corpus = exact
    body = {"query": {"query_string": {"query": Q, "fields": ["title^2", "text"]}}}

    def expected(i: str) -> float:
        return max(2.0 * corpus.bmx("title", i, Q), corpus.bmx("text", i, Q))

    _check(engine, proxy, index, body, expected, {"fields": list(FIELDS)})


def test_augmentations_merge_into_every_leaf_on_its_field(exact):
    """WQA with several fields: each leaf scores its text plus the weighted augmented queries, on its
    own field with that field's statistics (merged)."""
    engine, index, proxy, corpus = exact
    mm = {"query": "alpha", "fields": ["title^2", "text"], "type": "most_fields"}
    ext = {"fields": list(FIELDS), "augment": {"queries": ["omega", "kappa zeta"], "weights": [0.5, 0.25]}}
    tokens, weights = ["alpha", "omega", "kappa", "zeta"], [1.0, 0.5, 0.25, 0.25]

    def expected(i: str) -> float:
        def leaf(field: str) -> float:
            docs = list(corpus.tokens[field].values())
            return naive.bmx(docs, corpus.tokens[field][i], tokens, weights)

        return 2 * leaf("title") + leaf("text")

    sent = {"query": {"multi_match": mm}, "size": WINDOW, "ext": {"bmx": {"window_size": WINDOW, **ext}}}
    got = _scores(proxy.call("POST", f"/{index}/_search", sent))
    widened = {
        "bool": {
            "should": [
                {"multi_match": mm},
                *({"multi_match": {"query": q, "fields": list(FIELDS)}} for q in ext["augment"]["queries"]),
            ]
        }
    }
    direct = engine.ok("POST", f"/{index}/_search", {"query": widened, "size": WINDOW})["hits"]["hits"]
    assert set(got) == {h["_id"] for h in direct}, "the augmentations widen the first stage on both fields"
    assert got == pytest.approx({i: expected(i) for i in got}, abs=TOLERANCE)


def test_explain_shows_every_leaf_on_its_field(exact):
    engine, index, proxy, corpus = exact
    mm = {"query": Q, "fields": ["title^2", "text"], "type": "most_fields"}
    sent = {"query": {"multi_match": mm}, "size": 5}
    sent["ext"] = {"bmx": {"fields": list(FIELDS), "explain": True, "window_size": WINDOW}}
    resp = proxy.call("POST", f"/{index}/_search", sent)
    assert resp.body["_bmx"]["fields"] == ["title", "text"]
    for hit in resp.body["hits"]["hits"]:
        exp = hit["_bmx_explanation"]
        assert exp["description"] == "sum of" and exp["value"] == pytest.approx(hit["_score"])
        boosted, text = exp["details"]
        assert boosted["description"] == "boost 2 x" and boosted["details"][0]["field"] == "title"
        assert boosted["details"][0]["value"] == pytest.approx(corpus.bmx("title", hit["_id"], Q), abs=1e-9)
        assert text["field"] == "text" and text["value"] == pytest.approx(corpus.bmx("text", hit["_id"], Q))
        assert sum(d["value"] for d in text["details"]) == pytest.approx(text["value"])


def _hybrid_bodies(kind: str) -> list[dict[str, Any]]:
    """Searches that score beside their text: a term clause (both engines), a knn (Elasticsearch)."""
    match = {"match": {"text": "omega sigma"}}
    bodies = [{"query": {"bool": {"should": [match, {"term": {"tag": {"value": "odd", "boost": 5}}}]}}}]
    if kind == "elasticsearch":
        knn = {"field": "v", "query_vector": [0.3, 0.7], "k": 10, "num_candidates": 40}
        bodies.append({"query": match, "knn": knn})
    return bodies


@pytest.mark.parametrize("rank_constant", [60, 1])
def test_hybrid_rrf_fuses_the_two_rankings(exact, rank_constant):
    engine, index, proxy, corpus = exact
    for body in _hybrid_bodies(engine.kind):
        direct = engine.ok("POST", f"/{index}/_search", {**body, "size": WINDOW})["hits"]["hits"]
        first = [h["_id"] for h in direct]
        text = {i: corpus.bmx("text", i, "omega sigma") for i in first}
        matched = [i for i in first if corpus.holds("text", i, "omega sigma")]
        assert len(matched) < len(first), "some hits only the other scoring found"
        by_text = sorted(matched, key=lambda i: -text[i])  # stable: ties keep the window's order
        want = {i: 1 / (rank_constant + r) for r, i in enumerate(first, start=1)}
        for r, i in enumerate(by_text, start=1):
            want[i] += 1 / (rank_constant + r)
        ext = {"field": "text", "combine": "rrf", "rank_constant": rank_constant, "window_size": WINDOW}
        resp = proxy.call("POST", f"/{index}/_search", {**body, "size": WINDOW, "ext": {"bmx": ext}})
        got = _scores(resp)
        assert got == pytest.approx(want, abs=TOLERANCE)
        assert resp.body["_bmx"]["combine"] == "rrf"
        assert resp.body["_bmx"]["unmatched"] == len(first) - len(matched)


def test_hybrid_linear_mixes_min_max_normalized_scores(exact):
    engine, index, proxy, corpus = exact
    for body in _hybrid_bodies(engine.kind):
        direct = engine.ok("POST", f"/{index}/_search", {**body, "size": WINDOW})["hits"]["hits"]
        first = {h["_id"]: h["_score"] for h in direct}
        text = {i: corpus.bmx("text", i, "omega sigma") for i in first}

        def minmax(values: dict[str, float]) -> dict[str, float]:
            low, high = min(values.values()), max(values.values())
            return {i: (v - low) / (high - low) for i, v in values.items()}

        nf, nt = minmax(first), minmax(text)
        want = {i: 0.3 * nf[i] + 0.7 * nt[i] for i in first}
        ext = {"field": "text", "combine": "linear", "weight": 0.3, "window_size": WINDOW}
        resp = proxy.call("POST", f"/{index}/_search", {**body, "size": WINDOW, "ext": {"bmx": ext}})
        assert resp.headers["X-BMX-Rerank"] == "bmx"
        assert {h["_id"]: h["_score"] for h in resp.body["hits"]["hits"]} == pytest.approx(
            want, abs=TOLERANCE
        )


def test_replace_keeps_unmatched_hits_below_with_a_count(exact):
    engine, index, proxy, corpus = exact
    body = _hybrid_bodies(engine.kind)[0]
    ext = {"field": "text", "combine": "replace", "window_size": WINDOW}
    resp = proxy.call("POST", f"/{index}/_search", {**body, "size": WINDOW, "ext": {"bmx": ext}})
    hits = resp.body["hits"]["hits"]
    matched = [h for h in hits if corpus.holds("text", h["_id"], "omega sigma")]
    assert hits[: len(matched)] == matched, "every matched hit ranks above every unmatched one"
    assert resp.body["_bmx"]["unmatched"] == len(hits) - len(matched) > 0
    for h in matched:
        assert h["_score"] == pytest.approx(corpus.bmx("text", h["_id"], "omega sigma"), abs=TOLERANCE)


def test_pages_of_one_window_are_slices_of_it(exact):
    """Each page is reranked (marker), and is the slice of the whole window, ids and exact scores: a
    plain passthrough would fail both."""
    engine, index, proxy, corpus = exact
    body = {"query": {"multi_match": {"query": Q, "fields": ["title", "text"]}}}
    resp = proxy.call("POST", f"/{index}/_search", {**body, "size": 30})
    _scores(resp)  # reranked, marked
    whole = resp.body["hits"]["hits"]
    want = {h["_id"]: max(corpus.bmx("title", h["_id"], Q), corpus.bmx("text", h["_id"], Q)) for h in whole}
    assert {h["_id"]: h["_score"] for h in whole} == pytest.approx(want, abs=TOLERANCE)
    pages = []
    for start in (0, 10, 20):
        page = proxy.call("POST", f"/{index}/_search", {**body, "from": start, "size": 10})
        _scores(page)
        assert page.body["_bmx"]["reranked"] is True
        pages += page.body["hits"]["hits"]
    assert [(h["_id"], h["_score"]) for h in pages] == [(h["_id"], h["_score"]) for h in whole]
    assert all("_version" not in h for h in pages), "the window's version check stays internal"


def test_documents_deleted_or_updated_between_the_stages_are_dropped(engine: EngineClient):
    """The first stage answers; then one hit is deleted and one updated (and refreshed) before the term
    vectors are read: both are dropped and counted, and the updated one's new terms are not cached
    under the hit's `_seq_no`. The next search scores the updated document from its new text."""
    index = f"bmxtest-exact-{uuid.uuid4().hex[:10]}"
    settings = {"number_of_shards": 3, "number_of_replicas": 0}
    engine.ok(
        "PUT", f"/{index}", {"settings": settings, "mappings": {"properties": {"text": {"type": "text"}}}}
    )
    docs = {"a": "t1 t2", "b": "t1 t3 t3", "c": "t1 t1 t4", "d": "t2 t4"}
    bulk(engine, index, {i: {"text": t} for i, t in docs.items()})
    corpus = CorpusStats.from_documents([Counter(t.split()) for t in docs.values()])

    async def go() -> tuple[Any, Any, TermVectorCache]:
        cache = TermVectorCache()
        async with aiohttp.ClientSession() as session:
            reranker = Reranker(
                Cluster(session, engine.url), FixedStats({(index, "text"): corpus}), Metrics(), cache=cache
            )
            plan = plan_search({"query": {"match": {"text": "t1"}}, "ext": {"bmx": {"field": "text"}}}, {})
            answers: list[Any] = []

            async def first_stage(body, params, *, undecoded=False) -> Answer:
                assert params["preference"].startswith("bmx-") and body["version"] is True
                url = f"{engine.url}/{index}/_search?preference={params['preference']}"
                answers.append(await request_json(session, "POST", url, body))
                if len(answers) == 1:  # the window is in hand: change two of its documents
                    engine.ok("DELETE", f"/{index}/_doc/a")
                    engine.ok("PUT", f"/{index}/_doc/b", {"text": "t1 t1 t1 t5"})
                    engine.ok("POST", f"/{index}/_refresh")
                return Answer(200, answers[-1])

            stale = await reranker.rerank(index, plan, {}, first_stage)
            again = await reranker.rerank(index, plan, {}, first_stage)
            first = answers[0]
            return first, (stale, again), cache

    first, (stale, again), cache = asyncio.run(go())
    try:
        assert {h["_id"] for h in first["hits"]["hits"]} == {"a", "b", "c"}
        assert str(stale.marker) == "bmx" and stale.body["_bmx"]["dropped"] == 2
        assert [h["_id"] for h in stale.body["hits"]["hits"]] == ["c"]
        assert all("_version" not in h for h in stale.body["hits"]["hits"])
        old_b = next(h for h in first["hits"]["hits"] if h["_id"] == "b")
        old_c = next(h for h in first["hits"]["hits"] if h["_id"] == "c")
        assert cache.get(cache_key(old_c, "text", caller({}))) is not None, "an unchanged hit is cached"
        assert cache.get(cache_key(old_b, "text", caller({}))) is None, "no stale cache entry"
        assert again.body["_bmx"]["dropped"] == 0
        assert {h["_id"] for h in again.body["hits"]["hits"]} == {"b", "c"}
        new_b = next(h for h in again.body["hits"]["hits"] if h["_id"] == "b")
        assert new_b["_score"] != pytest.approx(0.0)
    finally:
        engine.call("DELETE", f"/{index}")


def test_quality_benchmark_small(engine: EngineClient):
    """The small version of benchmarks/quality.py --fields, so the benchmark keeps working: with the
    whole window reranked by the same formula, the proxy's exact multi-field BM25 ranks close to the
    engine's multi_match (only the statistics differ: one shard, so hardly)."""
    from benchmarks import quality as bench

    index, store = f"bmxtest-quality-{uuid.uuid4().hex[:10]}", f"bmxtest-store-{uuid.uuid4().hex[:10]}"
    argv = ["--upstream", engine.url, "--fields", "--docs", "400", "--queries", "8", "--window", "20"]
    try:
        out = asyncio.run(bench.run([*argv, "--index", index, "--store", store]))
    finally:
        engine.call("DELETE", f"/{index}")
        engine.call("DELETE", f"/{store}*")
    assert len(out) == 6 and all(0.0 <= v <= 1.0 for v in out.values())
    for kind in ("best_fields", "most_fields"):
        engine_bm25 = out[f"engine BM25 multi_match {kind}"]
        assert out[f"proxy BM25 multi-field, exact statistics {kind}"] == pytest.approx(engine_bm25, abs=0.05)
