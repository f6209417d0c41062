"""Issue 9's multi_match under a single-field policy: `multi_match` over `["text^2", "title"]` with a policy
`INDEX=text` is reranked with every field the query scores, each on its own statistics and with its
boost, combined as the query type combines fields. Brute force to 1e-6, both engines, 3 shards.

Two statistics stores: one holds a `text` snapshot only (`title` then runs in the estimated mode, and the
expected `title` part is computed from the very estimated statistics the proxy's cache holds), the other
holds both snapshots (every part exact)."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner

from bmx_rerank.cli.stats import command as stats_command
from bmx_rerank.policy import parse_rules
from bmx_rerank.stats.cache import StatsCache
from bmx_rerank.stats.corpus import CorpusStats
from tests.support import naive
from tests.support.corpora import bulk
from tests.support.engine_client import EngineClient
from tests.support.naive import WORDS
from tests.support.naive import FieldsCorpus as Corpus
from tests.support.proxy_thread import ProxyThread

WINDOW = 60  # more than the corpus: the window is every match
TOLERANCE = 1e-6
Q = "alpha omega sigma"


class Side:
    """A proxy with the policy `INDEX=text` over one statistics store, and the cache it reads."""

    def __init__(self, engine: EngineClient, index: str, store: str) -> None:
        self.caches: list[StatsCache] = []

        def factory(session: Any, base: str) -> StatsCache:
            self.caches.append(StatsCache(session, base, store=store))
            return self.caches[-1]

        rules = parse_rules([f"{index}=text,window_size={WINDOW}"])
        self.thread = ProxyThread(engine.url, factory, policies=rules)
        self.client = EngineClient(engine.kind, self.thread.url)

    def stats(self, index: str, field: str, terms: list[str]) -> tuple[CorpusStats, bool]:
        """The statistics the proxy's cache serves for `field`, completed for `terms` as a rerank does."""

        async def get() -> Any:
            view = await self.caches[0].get(index, field, {})
            return await view.for_terms(terms)

        view = self.thread.run(get())
        return view.corpus, view.estimated


@pytest.fixture(scope="module")
def policy_fields(engine: EngineClient) -> Iterator[tuple[EngineClient, str, Corpus, Side, Side]]:
    index = f"bmxtest-polf-{uuid.uuid4().hex[:10]}"
    stores = [f"bmxtest-store-{uuid.uuid4().hex[:10]}" for _ in range(2)]
    mappings = {"properties": {"title": {"type": "text"}, "text": {"type": "text"}}}
    settings = {"number_of_shards": 3, "number_of_replicas": 0}
    engine.ok("PUT", f"/{index}", {"settings": settings, "mappings": mappings})
    rng = random.Random(9)
    docs = {
        str(i): {
            "title": " ".join(rng.choices(WORDS, k=rng.randint(1, 4))),
            "text": " ".join(rng.choices(WORDS, k=rng.randint(3, 14))),
        }
        for i in range(40)
    }
    bulk(engine, index, docs)
    sides: list[Side] = []
    try:
        for store, fields in zip(stores, (["text"], ["title", "text"]), strict=True):
            args = [a for f in fields for a in ("--field", f)]
            built = CliRunner().invoke(
                stats_command,
                ["build", index, *args, "--upstream", engine.url, "--store", store, "--no-progress"],
            )
            assert built.exit_code == 0, built.output
            sides.append(Side(engine, index, store))
        yield engine, index, Corpus(docs), sides[0], sides[1]
    finally:
        for side in sides:
            side.thread.close()
        engine.call("DELETE", f"/{index}")
        for store in stores:
            engine.call("DELETE", f"/{store}*")


def _as_naive(corpus: CorpusStats, terms: list[str]) -> tuple[int, float, dict, dict]:
    df, entropy = corpus.lookup(terms)
    by_term = dict(zip(terms, df.tolist(), strict=True)), dict(zip(terms, entropy.tolist(), strict=True))
    return corpus.n_docs, corpus.avgdl, *by_term


def _combine(kind: str, parts: list[float], tie_breaker: float | None) -> float:
    """As the cluster folds a multi_match's fields: the best plus tie_breaker times the rest, the
    tie_breaker 0 by default for best_fields, 1 (the sum) for most_fields; a given one stands for it."""
    tie = tie_breaker if tie_breaker is not None else (1.0 if kind == "most_fields" else 0.0)
    return max(parts) + tie * (sum(parts) - max(parts))


# None: no tie_breaker in the query. most_fields with 0.3 is a best-of, in the cluster as here.
MULTI_MATCH = [("best_fields", 0.0), ("best_fields", 0.3), ("most_fields", None), ("most_fields", 0.3)]


@pytest.mark.parametrize(("kind", "tie_breaker"), MULTI_MATCH)
@pytest.mark.parametrize("title_snapshot", [False, True], ids=["title-estimated", "title-exact"])
def test_multi_match_over_text_and_title_under_a_text_policy(
    policy_fields, kind, tie_breaker, title_snapshot
):
    engine, index, corpus, text_only, both = policy_fields
    side = both if title_snapshot else text_only
    mm = {"query": Q, "fields": ["text^2", "title"], "type": kind}
    if tie_breaker is not None:
        mm["tie_breaker"] = tie_breaker
    body = {"query": {"multi_match": mm}, "size": WINDOW}
    resp = side.client.call("POST", f"/{index}/_search", body)
    assert resp.status == 200, resp.body
    assert resp.headers.get("X-BMX-Rerank") == "bmx", resp.body.get("_bmx")
    marker = resp.body["_bmx"]
    assert marker["fields"] == ["text", "title"], "the query's other field is scored, not thrown away"
    assert marker["estimated"] is (not title_snapshot)
    assert marker["estimated_fields"] == ([] if title_snapshot else ["title"])
    got = {h["_id"]: h["_score"] for h in resp.body["hits"]["hits"]}
    direct = engine.ok("POST", f"/{index}/_search", body)["hits"]["hits"]
    assert set(got) == {h["_id"] for h in direct} and len(got) > 3, "the cluster decides what matches"

    terms = Q.split()
    title_stats, estimated = side.stats(index, "title", terms)
    assert estimated is (not title_snapshot)
    text_stats, text_estimated = side.stats(index, "text", terms)
    assert not text_estimated
    assert text_stats.n_docs == len(corpus.docs)
    title_naive = _as_naive(title_stats, terms)
    if title_snapshot:  # exact: the snapshot is the corpus's own statistics
        n, avgdl, df, ent = naive.corpus_stats(list(corpus.tokens["title"].values()))
        assert title_naive[:2] == pytest.approx((n, avgdl))
        assert title_naive[2] == {t: df[t] for t in terms}
        assert title_naive[3] == pytest.approx({t: ent.get(t, 0.0) for t in terms})

    def expected(i: str) -> float:
        text_part = corpus.bmx("text", i, Q)  # brute force over the indexed documents
        title_part = naive.bmx_from(title_naive, corpus.tokens["title"][i], terms)
        return _combine(kind, [2.0 * text_part, title_part], tie_breaker)

    assert got == pytest.approx({i: expected(i) for i in got}, abs=TOLERANCE)
    assert all(s > 0 for s in got.values())
    if title_snapshot:  # and fully independent of the proxy's statistics
        exact = {
            i: _combine(kind, [2.0 * corpus.bmx("text", i, Q), corpus.bmx("title", i, Q)], tie_breaker)
            for i in got
        }
        assert got == pytest.approx(exact, abs=TOLERANCE)


def test_a_query_on_none_of_the_policy_fields_passes_unmarked(policy_fields):
    engine, index, _, text_only, _ = policy_fields
    body = {"query": {"match": {"title": Q}}, "size": 5}
    resp = text_only.client.call("POST", f"/{index}/_search", body)
    assert resp.status == 200 and "X-BMX-Rerank" not in resp.headers and "_bmx" not in resp.body
    direct = engine.ok("POST", f"/{index}/_search", body)
    assert [h["_id"] for h in resp.body["hits"]["hits"]] == [h["_id"] for h in direct["hits"]["hits"]]
