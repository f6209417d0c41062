"""`bmx-rerank eval --apply` on a SciFact subset, and the applied configuration in use: a running proxy
and the client wrapper rerank plain searches with it (or pass them through when the engine won), pick a
new one up without a restart, and a request's own `ext.bmx` or a command-line policy still wins."""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from collections.abc import Iterator

import aiohttp
import pytest
from click.testing import CliRunner

from bmx_rerank.applied import delete_config, read_config, write_config
from bmx_rerank.cli import main
from bmx_rerank.client import BMXClient
from bmx_rerank.evaluation.data import read_qrels, read_queries
from bmx_rerank.policy import parse_rule
from bmx_rerank.stats.build import build_snapshots
from bmx_rerank.stats.source import statistics_source
from bmx_rerank.upstream import Cluster
from tests.support.corpora import bulk
from tests.support.data import SCIFACT
from tests.support.engine_client import EngineClient
from tests.support.proxy_thread import ProxyThread

N_QUERIES = 20
N_OTHER_DOCS = 400
TTL = 0.3


def _official(kind: str, url: str):
    if kind == "elasticsearch":
        from elasticsearch import Elasticsearch

        return Elasticsearch(url)
    from opensearchpy import OpenSearch

    return OpenSearch(url)


def _once(coro):
    return asyncio.run(coro)


async def _session_call(fn, url, *args, **kwargs):
    async with aiohttp.ClientSession() as session:
        return await fn(Cluster(session, url), *args, **kwargs)


@pytest.fixture(scope="module")
def subset(engine: EngineClient, tmp_path_factory) -> Iterator[tuple[EngineClient, str, str, str]]:
    """N_QUERIES judged SciFact queries, their relevant documents and N_OTHER_DOCS others, indexed with
    exact statistics; the queries and qrels files written for `eval`."""
    queries = read_queries(SCIFACT / "queries.jsonl")
    qrels = read_qrels(SCIFACT / "qrels" / "test.tsv")
    picked = sorted(random.Random(7).sample(sorted(qrels), N_QUERIES))
    wanted = {d for q in picked for d in qrels[q]}
    docs, others = {}, 0
    with open(SCIFACT / "corpus.jsonl") as fh:
        for line in fh:
            d = json.loads(line)
            if d["_id"] in wanted or others < N_OTHER_DOCS:
                others += d["_id"] not in wanted
                docs[d["_id"]] = {"text": f"{d.get('title', '')} {d['text']}"}
    index = f"bmxtest-eval-{uuid.uuid4().hex[:10]}"
    settings = {"number_of_shards": 1, "number_of_replicas": 0}
    engine.ok(
        "PUT", f"/{index}", {"settings": settings, "mappings": {"properties": {"text": {"type": "text"}}}}
    )
    bulk(engine, index, docs)
    _once(_session_call(build_snapshots, engine.url, index, "text", {}))
    folder = tmp_path_factory.mktemp("judged")
    qfile, rfile = folder / "queries.jsonl", folder / "qrels.tsv"
    qfile.write_text("".join(json.dumps({"_id": q, "text": queries[q]}) + "\n" for q in picked))
    rfile.write_text(
        "query-id\tcorpus-id\tscore\n"
        + "".join(f"{q}\t{d}\t{g}\n" for q in picked for d, g in qrels[q].items())
    )
    try:
        yield engine, index, str(qfile), str(rfile)
    finally:
        _once(_session_call(delete_config, engine.url, index))
        engine.call("DELETE", f"/{index}")


def _search(url: str, index: str, body: dict) -> dict:
    return EngineClient("?", url).ok("POST", f"/{index}/_search", body)


def _plain(text: str = "cancer cells treatment") -> dict:
    return {"size": 5, "query": {"match": {"text": text}}}


def test_eval_apply_stores_the_winner_with_its_evidence_and_the_proxy_serves_it(subset):
    engine, index, qfile, rfile = subset
    args = [
        "eval", index, "--field", "text", "--queries", qfile, "--qrels", rfile, "--upstream", engine.url,
        "--window", "50", "--alpha", "1.0", "--beta", "0.1", "--folds", "3", "--confidence", "0.8",
        "--json", "--apply",
    ]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    names = [c["name"] for c in report["configurations"]]
    # 20 judged queries: the grid shrinks to 2 configurations besides the engine, the plainest first.
    assert names == ["engine", "bm25", "bmx"]
    assert report["selection"]["compared"] == 3 and report["selection"]["grid"] == 9
    assert report["queries"] == N_QUERIES
    assert all(c["fallbacks"] == 0 for c in report["configurations"])
    chosen = report["selection"]["chosen"]
    by_name = {c["name"]: c for c in report["configurations"]}
    sel = report["selection"]
    gate = sel["gate"]
    assert by_name[sel["best"]]["nDCG@10"] == max(c["nDCG@10"] for c in report["configurations"])
    # The best one only when the interval of its gain on new queries lies above zero; else the engine.
    assert gate["low"] <= gate["expected"] <= gate["high"] and gate["confidence"] == 0.8
    assert chosen == (sel["best"] if gate["low"] > 0 else "engine")
    assert sel["decision"].startswith("applied" if chosen != "engine" else "engine kept")
    assert set(report["per_query"]) == set(by_name) and len(report["per_query"]["bmx"]) == N_QUERIES
    for hurt in gate["hurt"]:
        assert hurt["change"] < 0 and hurt["text"] and hurt["query"] in report["per_query"]["bmx"]

    stored = _once(_session_call(read_config, engine.url, index))
    assert stored["evidence"]["chosen"] == chosen and stored["evidence"]["queries"] == N_QUERIES
    assert stored["evidence"]["cross_validated"] == pytest.approx(report["selection"]["cross_validated"])
    assert stored["evidence"]["gate"] == gate and stored["evidence"]["decision"] == sel["decision"]
    assert stored["rerank"] == (chosen != "engine")
    shown = CliRunner().invoke(main, ["applied", index, "--upstream", engine.url])
    assert shown.exit_code == 0, shown.output
    assert "evaluated" in shown.output and "% interval" in shown.output
    assert f"decision: {sel['decision']}" in shown.output

    proxy = ProxyThread(engine.url, statistics_source(60.0), applied_ttl=TTL)
    try:
        answer = _search(proxy.url, index, _plain())
    finally:
        proxy.close()
    if chosen == "engine":
        assert "_bmx" not in answer
    else:
        assert answer["_bmx"]["reranked"] is True
        assert answer["_bmx"]["window_size"] == report["selection"]["chosen_ext_bmx"]["window_size"]
        assert answer["_bmx"]["mode"] == report["selection"]["chosen_ext_bmx"]["mode"]


def test_a_running_proxy_picks_up_applied_configurations_and_precedence_holds(subset):
    engine, index, _, _ = subset
    applied = {"field": "text", "mode": "bm25", "window_size": 37}
    _once(_session_call(write_config, engine.url, index, applied, {"test": True}))
    proxy = ProxyThread(engine.url, statistics_source(60.0), applied_ttl=TTL)
    policy = ProxyThread(
        engine.url,
        statistics_source(60.0),
        applied_ttl=TTL,
        policies=[parse_rule(f"{index}=text,window_size=11")],
    )
    try:
        got = _search(proxy.url, index, _plain())
        assert got["_bmx"]["reranked"] is True
        assert (got["_bmx"]["mode"], got["_bmx"]["window_size"]) == ("bm25", 37)

        own = _search(proxy.url, index, {**_plain(), "ext": {"bmx": {"field": "text", "window_size": 23}}})
        assert (own["_bmx"]["mode"], own["_bmx"]["window_size"]) == ("bmx", 23)  # the request's own wins

        assert _search(policy.url, index, _plain())["_bmx"]["window_size"] == 11  # --policy wins

        direct = _search(engine.url, index, _plain())
        # The engine's ranking won: searches pass through untouched, picked up without a restart.
        _once(_session_call(write_config, engine.url, index, None, {"test": True}))
        time.sleep(TTL + 0.1)
        passed = _search(proxy.url, index, _plain())
        assert "_bmx" not in passed
        assert [h["_id"] for h in passed["hits"]["hits"]] == [h["_id"] for h in direct["hits"]["hits"]]

        # A new winner, again without a restart.
        _once(_session_call(write_config, engine.url, index, {**applied, "window_size": 41}, {"test": True}))
        time.sleep(TTL + 0.1)
        assert _search(proxy.url, index, _plain())["_bmx"]["window_size"] == 41
    finally:
        proxy.close()
        policy.close()


def test_the_client_wrapper_uses_the_applied_configuration(subset):
    engine, index, _, _ = subset
    _once(
        _session_call(
            write_config, engine.url, index, {"field": "text", "mode": "bm25", "window_size": 29}, {}
        )
    )
    with BMXClient(_official(engine.kind, engine.url)) as client:
        got = dict(getattr(r := client.search(index=index, body=_plain()), "body", r))
        assert (got["_bmx"]["mode"], got["_bmx"]["window_size"]) == ("bm25", 29)
        own = client.search(
            index=index, body={**_plain(), "ext": {"bmx": {"field": "text", "window_size": 17}}}
        )
        own = dict(getattr(own, "body", own))
        assert (own["_bmx"]["mode"], own["_bmx"]["window_size"]) == ("bmx", 17)
    _once(_session_call(write_config, engine.url, index, None, {}))
    with BMXClient(_official(engine.kind, engine.url)) as client:
        plain = client.search(index=index, body=_plain())
        assert "_bmx" not in dict(getattr(plain, "body", plain))


def test_prf_expands_from_the_window_without_widening(subset):
    engine, index, _, _ = subset
    proxy = ProxyThread(engine.url, statistics_source(60.0), applied_ttl=0)
    try:
        body = {"size": 10, "query": {"match": {"text": "vitamin D deficiency"}}}
        plain = _search(proxy.url, index, {**body, "ext": {"bmx": {"field": "text"}}})
        prf = {"field": "text", "augment": {"provider": "prf", "docs": 5, "terms": 4, "weight": 0.5}}
        got = _search(proxy.url, index, {**body, "ext": {"bmx": prf}})
    finally:
        proxy.close()
    terms = got["_bmx"]["augment"]["terms"]
    assert got["_bmx"]["reranked"] is True and got["_bmx"]["augment"]["provider"] == "prf"
    assert 0 < len(terms) <= 4 and not {"vitamin", "d", "deficiency"} & set(terms)
    # Same window (no widening): the same candidates, scored with the expansion terms on top.
    assert got["hits"]["total"] == plain["hits"]["total"]
    scores = {h["_id"]: h["_score"] for h in plain["hits"]["hits"]}
    assert any(h["_score"] > scores.get(h["_id"], 0.0) for h in got["hits"]["hits"])


def test_eval_reads_the_store_it_is_told_and_says_when_statistics_were_estimated(subset):
    """`--stats-index` names where the snapshots are (as `serve --stats-index`); a store without them
    gives estimated statistics, and the report says so instead of measuring them silently. A field the
    index does not have is an error, not a report of zeros."""
    engine, index, qfile, rfile = subset
    base = ["eval", index, "--queries", qfile, "--qrels", rfile, "--upstream", engine.url, "--window", "50"]
    base += ["--no-prf", "--fuse", "0", "--limit", "6", "--json"]
    empty = f"bmxtest-store-{uuid.uuid4().hex[:8]}"
    try:
        result = CliRunner().invoke(main, [*base, "--field", "text", "--stats-index", empty])
        assert result.exit_code == 0, result.output
        notes = json.loads(result.stdout)["notes"]
        assert any("estimated statistics" in n and empty in n for n in notes), notes
        result = CliRunner().invoke(main, [*base, "--field", "text"])
        assert result.exit_code == 0, result.output
        assert not any("estimated" in n for n in json.loads(result.stdout)["notes"])
        result = CliRunner().invoke(main, [*base, "--field", "nosuchfield"])
        assert result.exit_code != 0 and "has no field [nosuchfield]" in result.output, result.output
    finally:
        engine.call("DELETE", f"/{empty}")


def test_applied_configurations_are_read_from_the_store_the_proxy_and_the_wrapper_are_given(subset):
    """`serve --stats-index S` (and the wrapper's `store=S`) keep statistics in S: what `eval --apply
    --stats-index S` stores there is what they serve, not what `bmx-stats` holds."""
    engine, index, _, _ = subset
    store = f"bmxtest-store-{uuid.uuid4().hex[:8]}"
    applied = {"field": "text", "mode": "bm25", "window_size": 29}
    _once(_session_call(write_config, engine.url, index, applied, {"test": True}, store=store))
    proxy = ProxyThread(engine.url, statistics_source(60.0), applied_ttl=TTL, stats_index=store)
    try:
        got = _search(proxy.url, index, _plain())
        assert (got["_bmx"]["mode"], got["_bmx"]["window_size"]) == ("bm25", 29), got.get("_bmx")
        with BMXClient(_official(engine.kind, engine.url), store=store) as bmx:
            got = bmx.search(index=index, body=_plain())
            assert (got["_bmx"]["mode"], got["_bmx"]["window_size"]) == ("bm25", 29), got.get("_bmx")
    finally:
        proxy.close()
        engine.call("DELETE", f"/{store}")
