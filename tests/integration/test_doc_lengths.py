"""Exact document lengths kept with the statistics (stats/lengths.py), on real engines, 3 shards.

A proxy taking term frequencies from the first stage's probes, with its term-vector and length caches
off, reranks first sights with no `_mtermvectors` at all and scores exactly as a proxy fetching term
vectors; a document changed after the build (updated, or deleted and indexed again under its id)
falls back to `_mtermvectors` for itself only; a re-created index of the same name uses no table."""

from __future__ import annotations

import asyncio
import json
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
from click.testing import CliRunner

from bmx_rerank.cli.stats import command as stats_cli
from bmx_rerank.rerank import tf_probe
from bmx_rerank.stats import build as stats_build
from bmx_rerank.stats import scan
from bmx_rerank.stats import store as stats_store
from bmx_rerank.stats.cache import StatsCache
from bmx_rerank.stats.lengths import optional
from bmx_rerank.stats.sweep import SweepOptions
from bmx_rerank.upstream import Cluster
from tests.support.data import scifact_records
from tests.support.engine_client import EngineClient
from tests.support.proxy_thread import ProxyThread
from tests.support.reranked import body_lengths
from tests.support.reranked import same as _same
from tests.support.reranked import scores as _scores
from tests.support.reranked import search as _answer

pytestmark = pytest.mark.integration

DOCS = 400
QUERIES = 12


def _create(engine: EngineClient, index: str, texts: dict[str, str]) -> None:
    settings = {"number_of_shards": 3, "number_of_replicas": 0}
    mappings = {"properties": {"body": {"type": "text", "analyzer": "standard"}}}
    engine.ok("PUT", f"/{index}", {"settings": settings, "mappings": mappings})
    lines = []
    for doc_id, text in texts.items():
        lines.append(json.dumps({"index": {"_index": index, "_id": doc_id}}))
        lines.append(json.dumps({"body": text} if text is not None else {"other": 1}))
    assert not engine.ok("POST", "/_bulk", "\n".join(lines) + "\n", {"refresh": "true"})["errors"]


@pytest.fixture
def corpus(engine: EngineClient) -> Iterator[tuple[EngineClient, str, str, dict[str, Any], list[str]]]:
    index = f"bmxtest-lengths-{uuid.uuid4().hex[:10]}"
    store = f"bmxtest-lengths-store-{uuid.uuid4().hex[:8]}"
    texts: dict[str, Any] = {
        d["_id"]: f"{d.get('title', '')} {d['text']}" for d in scifact_records("corpus.jsonl", DOCS)
    }
    texts["no-body"] = None  # length 0: recorded too
    texts["empty-body"] = ""
    _create(engine, index, texts)
    queries = [q["text"] for q in scifact_records("queries.jsonl", QUERIES)]
    try:
        yield engine, index, store, texts, queries
    finally:
        engine.call("DELETE", f"/{index}")
        engine.call("DELETE", f"/{store}")


def _run(coro_fn: Any) -> Any:
    async def main() -> Any:
        async with aiohttp.ClientSession() as session:
            return await coro_fn(session)

    return asyncio.run(main())


def _search(url: str, index: str, text: str) -> list[tuple[str, float]]:
    """A reranked search's (id, score) pairs, as test_tf_probe asks it."""
    return _scores(_answer(url, index, text))


def _termvector_calls(url: str) -> float:
    with urllib.request.urlopen(f"{url}/_bmx/metrics", timeout=10) as resp:
        text = resp.read().decode()
    for line in text.splitlines():
        if line.startswith('bmx_upstream_seconds_count{call="termvectors"}'):
            return float(line.split()[-1])
    return 0.0


def test_the_table_holds_every_documents_exact_length_via_pit_and_scroll(corpus, monkeypatch) -> None:
    engine, index, _, texts, _ = corpus
    (result,) = _run(lambda s: stats_build.sweep_all(Cluster(s, engine.url), index, "body", {})).values()
    assert result.lengths is not None and len(result.lengths) == len(texts)
    hits = engine.ok(
        "POST", f"/{index}/_search", {"size": 1000, "seq_no_primary_term": True, "_source": False}
    )["hits"]["hits"]
    assert len(hits) == len(texts)
    want = body_lengths(engine, index, [h["_id"] for h in hits])
    got = optional(
        result.lengths.find(
            [h["_id"] for h in hits],
            [None] * len(hits),
            [h["_seq_no"] for h in hits],
            [h["_primary_term"] for h in hits],
        )
    )
    assert got == [want[h["_id"]] for h in hits]
    assert want["no-body"] == want["empty-body"] == 0

    async def no_pit(*_args: Any, **_kwargs: Any) -> None:
        return None

    monkeypatch.setattr(scan, "_open_pit", no_pit)  # the scroll path
    (scrolled,) = _run(lambda s: stats_build.sweep_all(Cluster(s, engine.url), index, "body", {})).values()
    assert scrolled.lengths is not None and scrolled.lengths.same_as(result.lengths)
    (bounded,) = _run(
        lambda s: stats_build.sweep_all(
            Cluster(s, engine.url), index, "body", {}, SweepOptions(max_length_docs=len(texts) - 1)
        )
    ).values()
    assert bounded.lengths is None and "max-length-docs" in (bounded.lengths_skipped or "")


def test_first_sights_need_no_term_vectors_and_stay_exact_through_changes(corpus, monkeypatch) -> None:
    engine, index, store, texts, queries = corpus
    infos = _run(
        lambda s: stats_build.build_snapshots(Cluster(s, engine.url), index, "body", {}, store=store)
    )
    assert infos[0].length_docs == len(texts)

    now = [0.0]  # the statistics' clock: a view is re-checked only when the test moves it on
    caches: list[StatsCache] = []

    def stats(session: aiohttp.ClientSession, base: str) -> StatsCache:
        caches.append(StatsCache(session, base, store=store, check_interval=5.0, clock=lambda: now[0]))
        return caches[-1]

    fetched_docs: list[int] = []
    real = Cluster.mtermvectors_fields

    async def counting(cluster, docs, *args, **kwargs):  # type: ignore[no-untyped-def]
        fetched_docs.append(len(docs))
        return await real(cluster, docs, *args, **kwargs)

    monkeypatch.setattr(Cluster, "mtermvectors_fields", counting)
    probed = ProxyThread(engine.url, stats, tf_probes=True, cache_bytes=0)
    plain = ProxyThread(engine.url, stats, tf_probes=False, cache_bytes=0)
    try:
        probed.app.state.rerank.frequencies.lengths = tf_probe.LengthCache(
            0
        )  # as benchmarks/proxy_latency.py
        for text in queries:
            before = len(fetched_docs)
            reference = _search(plain.url, index, text)
            assert len(fetched_docs) > before, "the reference proxy reads term vectors"
            del fetched_docs[before:]
            _same(_search(probed.url, index, text), reference)
            # with an aggregation the window is not searched shard by shard: its hits carry no shard
            # and find theirs from their `_id` (stats/routing.py)
            aggs = {"aggs": {"n": {"terms": {"field": "_index"}}}}
            _same(_scores(_answer(probed.url, index, text, aggs)), reference)
        assert fetched_docs == [] and _termvector_calls(probed.url) == 0.0

        # A document updated (and refreshed) after the build: only it is fetched.
        text = queries[0]
        top = [i for i, _ in _search(plain.url, index, text)[:3]]
        fetched_docs.clear()
        body = {"body": f"{texts[top[1]]} {text} {text}"}
        engine.ok("PUT", f"/{index}/_doc/{top[1]}", body, {"refresh": "true"})
        reference = _search(plain.url, index, text)
        fetched_docs.clear()
        _same(_search(probed.url, index, text), reference)
        assert fetched_docs == [1], "only the updated document's term vectors"

        # Deleted, then indexed again under the same id with other text: again only it.
        engine.ok("DELETE", f"/{index}/_doc/{top[2]}", None, {"refresh": "true"})
        engine.ok("PUT", f"/{index}/_doc/{top[2]}", {"body": f"{text} brand new words"}, {"refresh": "true"})
        reference = _search(plain.url, index, text)
        fetched_docs.clear()
        _same(_search(probed.url, index, text), reference)
        changed = {top[1], top[2]} & {i for i, _ in reference}
        assert top[2] in changed and fetched_docs == [len(changed)], "only the two changed documents"

        # Re-created under the same name, each id with another document's text: the same ids in the
        # same order take the same _seq_no and _primary_term, so the old table would match them all.
        engine.ok("DELETE", f"/{index}")
        ids = list(texts)
        _create(engine, index, dict(zip(ids, [texts[i] for i in ids[1:] + ids[:1]], strict=True)))
        now[0] += 10.0  # past check_interval: the next search re-checks, meanwhile without tables
        _search(probed.url, index, queries[1])
        for cache in caches:
            probed.run(cache.settled())
        view = probed.run(caches[0].get(index, "body", {}))
        assert view.lengths is None and view.stale is True
        for text in queries[:4]:
            reference = _search(plain.url, index, text)
            fetched_docs.clear()
            _same(_search(probed.url, index, text), reference)
            assert sum(fetched_docs) > 0, "no table for the re-created index: term vectors"
    finally:
        probed.close()
        plain.close()


def test_stats_show_reports_the_table(corpus) -> None:
    engine, index, store, texts, _ = corpus
    _run(
        lambda s: stats_build.build_snapshots(
            Cluster(s, engine.url), index, "body", {}, store=store, options=SweepOptions(max_length_docs=None)
        )
    )
    report = _run(lambda s: stats_build.describe(Cluster(s, engine.url), index, "body", {}, store=store))
    assert report["freshness"][0]["length_docs"] is None and report["length_tables"] == {}
    assert report["freshness"][0]["lengths_skipped"] == "not requested"
    _run(lambda s: stats_build.build_snapshots(Cluster(s, engine.url), index, "body", {}, store=store))
    report = _run(lambda s: stats_build.describe(Cluster(s, engine.url), index, "body", {}, store=store))
    assert report["freshness"][0]["length_docs"] == len(texts) and report["length_tables"] == {
        index: len(texts)
    }
    pointers = _run(lambda s: stats_store.read_pointers(Cluster(s, engine.url), {}, [(index, "body")], store))
    assert pointers[(index, "body")].length_chunks == 1

    runner = CliRunner()
    common = [index, "--field", "body", "--upstream", engine.url, "--store", store]
    shown = runner.invoke(stats_cli, ["show", *common])
    assert shown.exit_code == 0 and f"{len(texts)} document lengths" in shown.output, shown.output
    built = runner.invoke(stats_cli, ["build", *common, "--no-progress", "--max-length-docs", "10"])
    assert built.exit_code == 0 and "no length table (more than 10 documents" in built.output, built.output
    shown = runner.invoke(stats_cli, ["show", *common])
    assert "no length table (more than 10 documents (--max-length-docs))" in shown.output, shown.output
    built = runner.invoke(stats_cli, ["build", *common, "--no-progress", "--no-lengths"])
    assert built.exit_code == 0 and "no length table (not requested)" in built.output, built.output
