"""Statistics built through a real cluster, on Elasticsearch and OpenSearch.

SciFact (5,183 documents, `title + " " + text`, standard analyzer) is indexed once per engine with 1
and with 3 primary shards. The reference is computed independently: each document's term vector
fetched alone with `_termvectors` (ids from the corpus file, not from a scan) and summed in plain
Python floats.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import aiohttp
import numpy as np
import orjson
import pytest
from click.testing import CliRunner

from bmx_rerank import scoring
from bmx_rerank.cli.stats import command as stats_cli
from bmx_rerank.errors import SearchError
from bmx_rerank.stats import build as stats_build
from bmx_rerank.stats import store as stats_store
from bmx_rerank.stats.cache import StatsCache
from bmx_rerank.stats.corpus import CorpusStats
from bmx_rerank.stats.errors import StatisticsError
from bmx_rerank.stats.freshness import IndexMarks
from bmx_rerank.stats.sweep import SweepOptions
from bmx_rerank.upstream import Cluster
from tests.support.corpora import bulk
from tests.support.data import SCIFACT
from tests.support.engine_client import EngineClient
from tests.support.proxy_thread import ProxyThread

CORPUS = SCIFACT / "corpus.jsonl"
FIELD = "body"
MAPPING = {"properties": {FIELD: {"type": "text", "analyzer": "standard"}, "tag": {"type": "keyword"}}}


def _docs() -> dict[str, str]:
    out = {}
    with CORPUS.open() as fh:
        for line in fh:
            d = json.loads(line)
            out[d["_id"]] = f"{d['title']} {d['text']}"
    return out


def _create(engine: EngineClient, name: str, shards: int) -> None:
    settings = {"number_of_shards": shards, "number_of_replicas": 0}
    engine.ok("PUT", f"/{name}", {"settings": settings, "mappings": MAPPING})


def _bulk(engine: EngineClient, index: str, docs: dict[str, str]) -> None:
    bulk(engine, index, {i: {FIELD: text, "tag": "x"} for i, text in docs.items()}, chunk=1000)


@pytest.fixture(scope="module")
def scifact(engine: EngineClient) -> Iterator[dict[str, Any]]:
    """SciFact indexed with 1 and 3 shards on the current engine; a private store index; cleanup."""
    tag = uuid.uuid4().hex[:8]
    names = {1: f"bmxtest-stats-scifact1-{tag}", 3: f"bmxtest-stats-scifact3-{tag}"}
    docs = _docs()
    for shards, name in names.items():
        _create(engine, name, shards)
        _bulk(engine, name, docs)
    store = f"bmxtest-stats-store-{tag}"
    yield {"names": names, "docs": docs, "store": store, "tag": tag}
    for name in [*names.values(), store]:
        engine.call("DELETE", f"/{name}")


@pytest.fixture
def small_index(engine: EngineClient, scifact: dict[str, Any]) -> Iterator[str]:
    """A fresh 2-shard index with the first 400 SciFact documents, for writes."""
    name = f"bmxtest-stats-small-{uuid.uuid4().hex[:8]}"
    _create(engine, name, 2)
    _bulk(engine, name, dict(list(scifact["docs"].items())[:400]))
    yield name
    engine.call("DELETE", f"/{name}")


def run(coro_fn: Any) -> Any:
    async def main() -> Any:
        async with aiohttp.ClientSession() as session:
            return await coro_fn(session)

    return asyncio.run(main())


def reference_stats(engine: EngineClient, index: str, ids: list[str]) -> dict[str, Any]:
    """Independent statistics: one `_termvectors` call per document, plain Python sums."""
    params = {"fields": FIELD, "positions": "false", "offsets": "false", "term_statistics": "false"}

    def one(doc_id: str) -> dict[str, int]:
        body = engine.ok("GET", f"/{index}/_termvectors/{doc_id}", params=params)
        terms = body.get("term_vectors", {}).get(FIELD, {}).get("terms", {})
        return {t: v["term_freq"] for t, v in terms.items()}

    with ThreadPoolExecutor(4) as pool:
        vectors = list(pool.map(one, ids))
    df: dict[str, int] = {}
    ent: dict[str, float] = {}
    n = total = 0
    for tf in vectors:
        if not tf:
            continue
        n += 1
        total += sum(tf.values())
        for term, f in tf.items():
            p = 1.0 / (1.0 + math.exp(-f))
            df[term] = df.get(term, 0) + 1
            ent[term] = ent.get(term, 0.0) - p * math.log(p)
    return {"n": n, "total": total, "df": df, "entropy": ent}


def assert_matches_reference(stats: CorpusStats, ref: dict[str, Any]) -> None:
    assert stats.n_docs == ref["n"]
    assert stats.total_length == ref["total"]
    terms = sorted(ref["df"])
    assert stats.terms.tolist() == terms
    np.testing.assert_array_equal(stats.df, [ref["df"][t] for t in terms])
    np.testing.assert_allclose(stats.entropy, [ref["entropy"][t] for t in terms], rtol=1e-12)


def test_sweep_equals_independent_term_vectors_and_is_shard_independent(
    engine: EngineClient, scifact: dict[str, Any]
) -> None:
    one, three = scifact["names"][1], scifact["names"][3]
    stats1 = run(
        lambda s: stats_build.build(
            Cluster(s, engine.url), one, FIELD, {}, SweepOptions(batch_size=100, concurrency=3)
        )
    )
    stats3 = run(
        lambda s: stats_build.build(
            Cluster(s, engine.url), three, FIELD, {}, SweepOptions(batch_size=100, concurrency=3)
        )
    )
    assert stats1.n_docs == 5183
    assert_matches_reference(stats1, reference_stats(engine, one, list(scifact["docs"])))
    assert stats1.same_as(stats3), "1 and 3 shards must give bit-identical statistics"
    # ... hence bit-identical BMX scores: score a few candidates with each.
    words = ["cell", "protein", "cancer", "cell", "zzzunseen"]
    tf = np.array([[3, 0, 1, 3, 0], [0, 2, 0, 0, 0], [1, 1, 1, 1, 0]], dtype=float)
    cands = scoring.Candidates(tf, np.array([120.0, 80.0, 200.0]))
    query = [scoring.Query(np.arange(len(words)))]
    s1 = scoring.score(stats1.term_stats(words), cands, query)
    s3 = scoring.score(stats3.term_stats(words), cands, query)
    assert np.all(s1 > 0) and np.array_equal(s1, s3)


def test_pattern_sums_its_indices_and_cli_show_reports_terms(
    engine: EngineClient, scifact: dict[str, Any]
) -> None:
    store, tag = scifact["store"], scifact["tag"]
    pattern = f"bmxtest-stats-scifact*-{tag}"
    runner = CliRunner()
    built = runner.invoke(
        stats_cli,
        ["build", pattern, "--field", FIELD, "--upstream", engine.url, "--store", store, "--no-progress"],
    )
    assert built.exit_code == 0, built.output
    assert built.output.count("5183 docs") == 2
    shown = runner.invoke(
        stats_cli,
        [
            "show",
            pattern,
            "--field",
            FIELD,
            "--upstream",
            engine.url,
            "--store",
            store,
            "--json",
            "--terms",
            "cell,protein,zzzunseen",
        ],
    )
    assert shown.exit_code == 0, shown.output
    report = orjson.loads(shown.output)
    single = run(lambda s: stats_build.build(Cluster(s, engine.url), scifact["names"][1], FIELD, {}))
    assert report["n_docs"] == 2 * 5183 and not report["estimated"] and report["stale"] is False
    assert report["vocabulary_size"] == single.vocabulary_size
    assert math.isclose(report["avgdl"], single.avgdl)
    df, ent = single.lookup(["cell", "protein"])
    assert report["terms"]["cell"] == {"df": 2 * int(df[0]), "entropy": pytest.approx(2 * ent[0], rel=1e-12)}
    assert report["terms"]["protein"]["df"] == 2 * int(df[1])
    assert report["terms"]["zzzunseen"] == {"df": 0, "entropy": 0.0}
    assert {f["reason"] for f in report["freshness"]} == {"up to date"}

    alias = f"bmxtest-stats-alias-{tag}"
    actions = [{"add": {"index": name, "alias": alias}} for name in scifact["names"].values()]
    engine.ok("POST", "/_aliases", {"actions": actions})
    try:
        via_alias = run(lambda s: StatsCache(s, engine.url, store=store).get(alias, FIELD, {}))
        via_pattern = run(lambda s: StatsCache(s, engine.url, store=store).get(pattern, FIELD, {}))
        assert via_alias.corpus.same_as(via_pattern.corpus) and via_alias.corpus.same_as(single + single)
        assert not via_alias.estimated and not via_alias.stale
    finally:
        engine.call("POST", "/_aliases", {"actions": [{"remove": a["add"]} for a in actions]})


def test_refresh_after_appends_updates_and_deletes_equals_rebuild(
    engine: EngineClient, scifact: dict[str, Any], small_index: str
) -> None:
    store = scifact["store"]
    docs = list(scifact["docs"].items())

    def snapshot_now(session: aiohttp.ClientSession) -> Any:
        return StatsCache(session, engine.url, store=store).get(small_index, FIELD, {})

    run(lambda s: stats_build.build_snapshots(Cluster(s, engine.url), small_index, FIELD, {}, store=store))
    assert run(snapshot_now).stale is False

    _bulk(engine, small_index, dict(docs[400:450]))  # appends only
    view = run(snapshot_now)
    assert view.stale is True
    (out,) = run(lambda s: stats_build.refresh(Cluster(s, engine.url), small_index, FIELD, {}, store=store))
    assert (out.action, out.new_documents) == ("incremental", 50)
    fresh = run(snapshot_now)
    rebuilt = run(lambda s: stats_build.build(Cluster(s, engine.url), small_index, FIELD, {}))
    assert fresh.stale is False and fresh.corpus.n_docs == 450
    assert fresh.corpus.same_as(rebuilt), "incremental refresh must match a rebuild bit for bit"
    (swept,) = run(lambda s: stats_build.sweep_all(Cluster(s, engine.url), small_index, FIELD, {})).values()
    assert fresh.lengths is not None and swept.lengths is not None and len(swept.lengths) == 450
    assert fresh.lengths[small_index].same_as(swept.lengths), "refreshed length table == a rebuild's"

    _bulk(engine, small_index, {docs[0][0]: "completely new words here", docs[460][0]: docs[460][1]})
    engine.ok("DELETE", f"/{small_index}/_doc/{docs[1][0]}", params={"refresh": "true"})
    (out,) = run(lambda s: stats_build.refresh(Cluster(s, engine.url), small_index, FIELD, {}, store=store))
    assert out.action == "rebuilt" and out.reason == "updates or deletes since the snapshot"
    fresh = run(snapshot_now)
    rebuilt = run(lambda s: stats_build.build(Cluster(s, engine.url), small_index, FIELD, {}))
    assert fresh.corpus.same_as(rebuilt) and fresh.corpus.n_docs == 450
    (swept,) = run(lambda s: stats_build.sweep_all(Cluster(s, engine.url), small_index, FIELD, {})).values()
    assert fresh.lengths is not None and swept.lengths is not None
    assert fresh.lengths[small_index].same_as(swept.lengths)
    (out,) = run(lambda s: stats_build.refresh(Cluster(s, engine.url), small_index, FIELD, {}, store=store))
    assert out.action == "unchanged"


def test_refresh_of_a_pattern_builds_an_empty_new_index_like_build_does(
    engine: EngineClient, scifact: dict[str, Any], small_index: str
) -> None:
    """A new daily index behind a pattern, with no token yet, gets an empty snapshot on refresh too.

    Its two documents have the field but no token in it: live, yet not part of BMX's N."""
    store = scifact["store"]
    empty = f"{small_index}-new"
    _create(engine, empty, 1)
    _bulk(engine, empty, {"blank": "", "punctuation": "!!! ..."})
    try:
        run(
            lambda s: stats_build.build_snapshots(Cluster(s, engine.url), small_index, FIELD, {}, store=store)
        )
        outs = run(
            lambda s: stats_build.refresh(Cluster(s, engine.url), f"{small_index}*", FIELD, {}, store=store)
        )
        got = {o.index: (o.action, o.snapshot.n_docs, o.snapshot.live_docs) for o in outs if o.snapshot}
        assert got == {small_index: ("unchanged", 400, 400), empty: ("built", 0, 2)}
        args = ["refresh", f"{small_index}*", "--field", FIELD, "--upstream", engine.url, "--store", store]
        again = CliRunner().invoke(stats_cli, [*args, "--no-progress"])
        assert again.exit_code == 0, again.output
        assert again.output.count(": unchanged (no write since the snapshot), snapshot ") == 2
    finally:
        engine.call("DELETE", f"/{empty}")


def test_failed_build_keeps_the_last_good_snapshot(
    engine: EngineClient, scifact: dict[str, Any], small_index: str
) -> None:
    store = scifact["store"]
    (good,) = run(
        lambda s: stats_build.build_snapshots(Cluster(s, engine.url), small_index, FIELD, {}, store=store)
    )
    _bulk(engine, small_index, dict(list(scifact["docs"].items())[400:420]))

    class Dies:
        total = None

        def update(self, n: float = 1) -> None:
            raise SearchError(502, "bmx_upstream_unreachable_exception", "cluster went away")

    def open_contexts() -> int:
        return engine.ok("GET", f"/{small_index}/_stats/search")["_all"]["total"]["search"]["open_contexts"]

    async def fail(session: aiohttp.ClientSession) -> int:
        with pytest.raises(SearchError, match="went away"):
            await stats_build.build_snapshots(
                Cluster(session, engine.url),
                small_index,
                FIELD,
                {},
                store=store,
                progress=Dies(),
                options=SweepOptions(batch_size=50),
            )
        return open_contexts()  # no await since the failure: nothing closed it behind our back

    # The sweep failed with pages left to read (50-document pages), and closed its PIT
    # (Elasticsearch) or scroll (OpenSearch) before giving up.
    assert run(fail) == 0
    view = run(lambda s: StatsCache(s, engine.url, store=store).get(small_index, FIELD, {}))
    assert view.built_at == good.built_at and view.corpus.n_docs == good.n_docs and view.stale is True


def test_estimated_mode_without_snapshot(engine: EngineClient, scifact: dict[str, Any]) -> None:
    name = scifact["names"][3]
    store = f"bmxtest-stats-nostore-{scifact['tag']}"  # never created: no snapshot anywhere

    async def go(session: aiohttp.ClientSession) -> Any:
        view = await StatsCache(session, engine.url, store=store).get(name, FIELD, {})
        return view, await view.for_terms(["cell", "protein", "zzzunseen"])

    bare, view = run(go)
    exact = run(lambda s: stats_build.build(Cluster(s, engine.url), name, FIELD, {}))
    assert bare.estimated and view.estimated and view.built_at is None
    assert view.corpus.n_docs == exact.n_docs  # exact: a count over all shards
    assert abs(view.corpus.avgdl - exact.avgdl) / exact.avgdl < 0.2  # one shard's average
    df, ent = view.corpus.lookup(["cell", "protein", "zzzunseen"])
    edf, eent = exact.lookup(["cell", "protein"])
    np.testing.assert_array_equal(df[:2], edf)  # df: exact, from counts
    assert df[2] == 0
    np.testing.assert_allclose(ent[:2], eent, rtol=0.25)


def test_bad_input_gives_clear_errors(engine: EngineClient, scifact: dict[str, Any]) -> None:
    name = scifact["names"][1]
    cases = [
        (f"bmxtest-stats-missing-{scifact['tag']}", FIELD, 404, "index_not_found_exception"),
        (name, "tag", 400, "bmx_field_not_text_exception"),
        (name, "nope", 400, "bmx_field_not_found_exception"),
    ]
    for index, field, status, kind in cases:
        with pytest.raises(SearchError) as err:
            run(lambda s, i=index, f=field: stats_build.build(Cluster(s, engine.url), i, f, {}))
        assert (err.value.status, err.value.type) == (status, kind)

    empty = f"bmxtest-stats-empty-{scifact['tag']}"
    _create(engine, empty, 1)
    try:
        with pytest.raises(StatisticsError) as err:
            run(lambda s: stats_build.build(Cluster(s, engine.url), empty, FIELD, {}))
        assert err.value.type == "bmx_empty_corpus_exception"
        result = CliRunner().invoke(
            stats_cli, ["build", empty, "--field", FIELD, "--upstream", engine.url, "--no-progress"]
        )
        assert result.exit_code == 1
        assert result.output.strip().count("\n") == 0 and "bmx_empty_corpus_exception" in result.output
        assert "Traceback" not in result.output
        # ... but an empty index among others gets an empty snapshot and adds nothing.
        both = f"{empty},{name}"
        infos = run(
            lambda s: stats_build.build_snapshots(
                Cluster(s, engine.url), both, FIELD, {}, store=scifact["store"]
            )
        )
        assert sorted((i.index, i.n_docs) for i in infos) == sorted([(empty, 0), (name, 5183)])
        view = run(lambda s: StatsCache(s, engine.url, store=scifact["store"]).get(both, FIELD, {}))
        assert view.corpus.n_docs == 5183 and not view.estimated
    finally:
        engine.call("DELETE", f"/{empty}")


def test_cli_reports_an_unreachable_cluster_in_one_line() -> None:
    result = CliRunner().invoke(
        stats_cli,
        ["show", "x", "--field", FIELD, "--upstream", "http://u:secret@127.0.0.1:1", "--json"],
    )
    assert result.exit_code == 1
    assert "bmx_upstream_unreachable_exception" in result.output and "secret" not in result.output


def test_store_roundtrip_through_the_cluster(engine: EngineClient, scifact: dict[str, Any]) -> None:
    """Several chunks: the vocabulary comes back term for term, number for number."""
    store = scifact["store"]
    stats = run(lambda s: stats_build.build(Cluster(s, engine.url), scifact["names"][1], FIELD, {}))
    marks = IndexMarks("bmxtest-stats-fake", "u", ())
    info = stats_build.snapshot_info(
        "bmxtest-stats-fake", FIELD, stats, marks, stats.n_docs, True, 0.0, "build"
    )
    info = stats_store.SnapshotInfo(**{**info.__dict__, "n_chunks": -(-stats.vocabulary_size // 5000)})

    async def go(session: aiohttp.ClientSession) -> CorpusStats:
        await stats_store.publish(Cluster(session, engine.url), {}, info, stats, store)
        (got,) = (
            await stats_store.read_pointers(Cluster(session, engine.url), {}, [(info.index, FIELD)], store)
        ).values()
        return await stats_store.load(Cluster(session, engine.url), {}, got, store)

    assert info.n_chunks > 3
    assert run(go).same_as(stats)


def test_a_publish_whose_cleanup_fails_is_still_a_success(
    engine: EngineClient, scifact: dict[str, Any], small_index: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deleting older snapshots comes after the pointer flip: its failure must not fail the build."""
    store = scifact["store"]

    async def cleanup_fails(*_args: Any) -> None:
        raise SearchError(502, "bmx_upstream_unreachable_exception", "gone during cleanup")

    monkeypatch.setattr(stats_store, "_collect_garbage", cleanup_fails)
    (info,) = run(
        lambda s: stats_build.build_snapshots(Cluster(s, engine.url), small_index, FIELD, {}, store=store)
    )
    (current,) = run(
        lambda s: stats_store.read_pointers(Cluster(s, engine.url), {}, [(small_index, FIELD)], store)
    ).values()
    assert current.snapshot == info.snapshot and current.n_docs == 400


def test_writes_during_a_sweep_are_caught_by_the_next_refresh(
    engine: EngineClient, scifact: dict[str, Any], small_index: str
) -> None:
    store = scifact["store"]
    extra = dict(list(scifact["docs"].items())[500:503])

    class WritesOnce:
        total = None
        done = False

        def update(self, n: float = 1) -> None:
            if not self.done:
                self.done = True
                _bulk(engine, small_index, extra)

    (info,) = run(
        lambda s: stats_build.build_snapshots(
            Cluster(s, engine.url),
            small_index,
            FIELD,
            {},
            store=store,
            progress=WritesOnce(),
            options=SweepOptions(batch_size=50),
        )
    )
    assert info.exact_marks is False
    (fresh,) = run(
        lambda s: stats_build.freshness(Cluster(s, engine.url), small_index, FIELD, {}, store=store)
    )
    assert fresh.stale is True
    (out,) = run(lambda s: stats_build.refresh(Cluster(s, engine.url), small_index, FIELD, {}, store=store))
    assert out.action == "rebuilt" and out.snapshot is not None and out.snapshot.n_docs == 403


def test_cluster_going_away_mid_sweep_is_a_502_and_keeps_the_snapshot(
    engine: EngineClient, scifact: dict[str, Any], small_index: str
) -> None:
    """A forwarding proxy in front of the engine drops every connection after two term-vector batches."""
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    store = scifact["store"]
    (good,) = run(
        lambda s: stats_build.build_snapshots(Cluster(s, engine.url), small_index, FIELD, {}, store=store)
    )
    seen = {"mtv": 0}

    async def go(session: aiohttp.ClientSession) -> SearchError:
        async def forward(request: web.Request) -> web.StreamResponse:
            if request.path == "/_mtermvectors":
                seen["mtv"] += 1
                if seen["mtv"] > 2:
                    assert request.transport is not None
                    request.transport.abort()  # the cluster is gone
                    raise web.HTTPServiceUnavailable()
            async with session.request(
                request.method,
                f"{engine.url}{request.path_qs}",
                data=await request.read(),
                headers={"Content-Type": request.headers.get("Content-Type", "application/json")},
            ) as resp:
                return web.Response(
                    body=await resp.read(), status=resp.status, content_type="application/json"
                )

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", forward)
        server = TestServer(app)
        await server.start_server()
        try:
            url = str(server.make_url("")).rstrip("/")
            with pytest.raises(SearchError) as err:
                await stats_build.build_snapshots(
                    Cluster(session, url),
                    small_index,
                    FIELD,
                    {},
                    store=store,
                    options=SweepOptions(batch_size=50, concurrency=1),
                )
            return err.value
        finally:
            await server.close()

    error = run(go)
    assert (error.status, error.type) == (502, "bmx_upstream_unreachable_exception")
    assert "_mtermvectors" in error.reason
    view = run(lambda s: StatsCache(s, engine.url, store=store).get(small_index, FIELD, {}))
    assert view.built_at == good.built_at and view.corpus.n_docs == good.n_docs


def test_the_first_search_after_a_quiet_spell_is_told_of_the_writes_made_in_it(engine: EngineClient) -> None:
    """The marker's `stale: false` is never a guess: a search past `check_interval` waits for the one
    check of its statistics (a few milliseconds), so the first search after writes made while nobody
    searched says `stale: true`, and so does every one after it until a refresh."""
    index, store = f"bmxtest-stats-quiet-{uuid.uuid4().hex[:8]}", f"bmxtest-store-{uuid.uuid4().hex[:8]}"
    _create(engine, index, 1)
    _bulk(engine, index, {str(i): f"alpha beta {'gamma ' * (i % 3)}" for i in range(20)})
    run(lambda s: stats_build.build_snapshots(Cluster(s, engine.url), index, FIELD, {}, store=store))
    proxy = ProxyThread(
        engine.url, lambda session, base: StatsCache(session, base, store=store, check_interval=0.5)
    )
    client = EngineClient(engine.kind, proxy.url)
    body = {"query": {"match": {FIELD: "alpha"}}, "ext": {"bmx": {"field": FIELD, "window_size": 30}}}
    try:
        first = client.ok("POST", f"/{index}/_search", body)["_bmx"]
        assert first["reranked"] and first["stale"] is False and not first["estimated"]
        _bulk(engine, index, {f"n{i}": "alpha alpha alpha delta" for i in range(20)})
        time.sleep(0.8)  # past check_interval, nobody searching
        assert client.ok("POST", f"/{index}/_search", body)["_bmx"]["stale"] is True
        assert client.ok("POST", f"/{index}/_search", body)["_bmx"]["stale"] is True
    finally:
        proxy.close()
        engine.call("DELETE", f"/{index}")
        engine.call("DELETE", f"/{store}")


def test_a_field_empty_in_every_document_leaves_the_other_fields_their_statistics(
    engine: EngineClient,
) -> None:
    """BEIR Quora's titles are all empty: `stats build --field title --field body` says so for the title
    (exit 1) and still builds the body's snapshot."""
    index, store = f"bmxtest-stats-notitle-{uuid.uuid4().hex[:8]}", f"bmxtest-store-{uuid.uuid4().hex[:8]}"
    engine.ok(
        "PUT", f"/{index}", {"mappings": {"properties": {"title": {"type": "text"}, FIELD: {"type": "text"}}}}
    )
    bulk(engine, index, {str(i): {"title": "", FIELD: f"alpha beta {i}"} for i in range(10)})
    try:
        args = ["build", index, "--field", "title", "--field", FIELD, "--upstream", engine.url]
        result = CliRunner().invoke(stats_cli, [*args, "--store", store, "--no-progress"])
        assert result.exit_code == 1, result.output
        assert "bmx_empty_corpus_exception" in result.output and "empty or missing in every" in result.output
        assert f"{index} [{FIELD}]: 10 docs" in result.output, "the next field is built all the same"
        view = run(lambda s: StatsCache(s, engine.url, store=store).get(index, FIELD, {}))
        assert view.corpus.n_docs == 10 and not view.estimated
    finally:
        engine.call("DELETE", f"/{index}")
        engine.call("DELETE", f"/{store}")
