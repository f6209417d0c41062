"""StatsCache against a fake cluster: drift checks are rate-limited and shared, snapshots are loaded once
and reloaded when another sidecar publishes, the caller's credentials go on every call, and the
cluster's 403 comes back unchanged."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from bmx_rerank.errors import SearchError, UpstreamError
from bmx_rerank.stats.cache import StatsCache
from bmx_rerank.stats.corpus import CorpusStats
from bmx_rerank.stats.freshness import IndexMarks, ShardMark
from bmx_rerank.stats.lengths import DocLengths
from bmx_rerank.stats.snapshot import SnapshotInfo, encode_chunks, encode_lengths
from bmx_rerank.upstream import Cluster

TOKEN = "Basic c2VjcmV0"
OTHER = "Basic b3RoZXI="  # a second user allowed to read the index


class FakeCluster:
    """Just enough of `_field_caps`, `_stats` and the store's `_mget` for the cache."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.seq_no = 10
        self.snapshots: dict[str, tuple[SnapshotInfo, list[dict[str, Any]]]] = {}
        self.current: str | None = None
        self.auth: dict[str, list[str]] = {}  # Authorization header of each call, per endpoint
        self.uuid = "u1"
        self.lengths: dict[str, list[dict[str, Any]]] = {}

    def publish(
        self, name: str, docs: list[dict[str, int]], lengths: DocLengths | None = None
    ) -> CorpusStats:
        stats = CorpusStats.from_documents(docs)
        chunks = encode_chunks(stats, 2)
        self.lengths[name] = encode_lengths(lengths, 1) if lengths is not None else []
        marks = IndexMarks("idx", "u1", (ShardMark(0, self.seq_no, self.seq_no, self.seq_no),))
        info = SnapshotInfo(
            name,
            "idx",
            "body",
            stats.n_docs,
            stats.total_length,
            stats.vocabulary_size,
            len(chunks),
            stats.n_docs,
            marks,
            True,
            f"2026-01-01T00:00:0{len(self.snapshots)}+00:00",
            0.1,
            "build",
            length_docs=None if lengths is None else len(lengths),
            length_chunks=len(self.lengths[name]),
        )
        self.snapshots[name] = (info, chunks)
        self.current = name
        return stats

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/{expr}/_field_caps", self.field_caps)
        app.router.add_get("/{expr}/_stats/docs", self.stats)
        app.router.add_post("/{store}/_mget", self.mget)
        app.router.add_post("/{expr}/_count", self.count)
        app.router.add_post("/{index}/_termvectors", self.termvectors)
        app.router.add_post("/_msearch", self.msearch)
        return app

    def _auth(self, request: web.Request, what: str) -> None:
        self.calls[what] += 1
        self.auth.setdefault(what, []).append(request.headers.get("Authorization", ""))
        if request.headers.get("Authorization") not in (TOKEN, OTHER):
            body = {
                "error": {"type": "security_exception", "reason": "action [x] is unauthorized"},
                "status": 403,
            }
            raise web.HTTPForbidden(text=json.dumps(body), content_type="application/json")

    async def field_caps(self, request: web.Request) -> web.Response:
        self._auth(request, "field_caps")
        return web.json_response({"indices": ["idx"], "fields": {"body": {"text": {"type": "text"}}}})

    async def stats(self, request: web.Request) -> web.Response:
        self._auth(request, "stats")
        seq = {"max_seq_no": self.seq_no, "local_checkpoint": self.seq_no, "global_checkpoint": self.seq_no}
        shards = {"0": [{"routing": {"primary": True}, "seq_no": seq}]}
        return web.json_response({"indices": {"idx": {"uuid": self.uuid, "shards": shards}}})

    async def count(self, request: web.Request) -> web.Response:
        self._auth(request, "count")
        return web.json_response({"count": 10})

    async def termvectors(self, request: web.Request) -> web.Response:
        self._auth(request, "termvectors")
        terms = {t: {"doc_freq": 2, "ttf": 3} for t in (await request.json())["doc"]["body"].split()}
        fstats = {"doc_count": 10, "sum_ttf": 50}
        return web.json_response({"term_vectors": {"body": {"field_statistics": fstats, "terms": terms}}})

    async def msearch(self, request: web.Request) -> web.Response:
        self._auth(request, "msearch")
        n = len((await request.read()).splitlines()) // 2
        return web.json_response({"responses": [{"hits": {"total": {"value": 2}}}] * n})

    async def mget(self, request: web.Request) -> web.Response:
        self._auth(request, "mget")
        ids = (await request.json())["ids"]
        docs = []
        for doc_id in ids:
            if doc_id.startswith("ptr|"):
                found = self.current is not None
                info = self.snapshots[self.current][0].to_json() if found else None
                docs.append({"_id": doc_id, "found": found, "_source": {"info": info}})
            else:
                self.calls["chunk"] += 1
                snap, seq = doc_id.split("|")
                data = (
                    self.lengths[snap][int(seq[1:])]
                    if seq.startswith("L")
                    else self.snapshots[snap][1][int(seq)]
                )
                docs.append({"_id": doc_id, "found": True, "_source": {"data": data}})
        return web.json_response({"docs": docs})


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def cluster():
    fake = FakeCluster()
    server = TestServer(fake.app())
    await server.start_server()
    async with aiohttp.ClientSession() as session:
        yield fake, session, str(server.make_url("")).rstrip("/")
    await server.close()


async def test_checks_drift_at_most_every_interval_and_loads_each_snapshot_once(cluster):
    fake, session, url = cluster
    first = fake.publish("s1", [{"a": 1, "b": 2}, {"a": 3}, {"c": 1}])
    clock = Clock()
    cache = StatsCache(session, url, check_interval=5.0, clock=clock)
    headers = {"Authorization": TOKEN}
    assert cache.cached("idx", "body", headers) is None, "nothing in memory yet: only `get` loads"
    view = await cache.get("idx", "body", headers)
    assert view.corpus.same_as(first) and not view.estimated and not view.stale
    assert view.built_at == "2026-01-01T00:00:00+00:00"
    assert fake.calls["chunk"] == 2 and fake.calls["stats"] == 1
    assert cache.cached("idx", "body", headers) is view, "in memory and checked: at once"
    assert cache.cached("idx", "body", {"Authorization": "Basic b3RoZXI="}) is None, "another caller's"

    clock.now = 4.9
    fake.seq_no = 11  # a write: not noticed before the interval is over
    assert (await cache.get("idx", "body", headers)).stale is False
    assert fake.calls["stats"] == 1

    clock.now = 5.0
    assert cache.cached("idx", "body", headers) is None, "due for a check: `get` checks"
    view = await cache.get("idx", "body", headers)
    assert view.stale is True, "the first search past the interval is told of the write"
    assert fake.calls["stats"] == 2 and fake.calls["chunk"] == 2  # same snapshot: not reloaded

    second = fake.publish("s2", [{"a": 1}, {"d": 4}])  # another sidecar refreshed
    clock.now = 10.0
    view = await cache.get("idx", "body", headers)
    assert view.corpus.same_as(second) and view.stale is False and fake.calls["chunk"] == 3


async def test_length_tables_serve_only_the_index_they_were_built_from_while_confirmed(cluster):
    fake, session, url = cluster
    table = DocLengths.from_rows(["a", "b", "c"], [None, None, "r"], [3, 4, 5], [1, 1, 2], [7, 0, 9])
    fake.publish("s1", [{"a": 1}], lengths=table)
    clock = Clock()
    cache = StatsCache(session, url, check_interval=5.0, clock=clock)
    headers = {"Authorization": TOKEN}
    view = await cache.get("idx", "body", headers)
    assert view.lengths is not None and view.lengths["idx"].same_as(table)
    assert fake.calls["chunk"] == 1 + 3  # one term chunk, three length chunks (one entry each)

    clock.now = 5.0  # due for a re-check: it confirms the UUID, and the tables stay
    assert (await cache.get("idx", "body", headers)).lengths is not None

    fake.uuid = "u2"  # deleted and re-created under the same name: its _seq_no start again at 0
    clock.now = 10.0
    view = await cache.get("idx", "body", headers)
    assert view.lengths is None and view.stale is True and not view.corpus.same_as(CorpusStats.empty())

    fake.uuid = "u1"
    fake.publish("s2", [{"a": 1}])  # a snapshot without a table
    clock.now = 20.0
    view = await cache.get("idx", "body", headers)
    assert view.lengths is None and view.built_at == "2026-01-01T00:00:01+00:00"


async def test_concurrent_callers_share_one_check(cluster):
    import asyncio

    fake, session, url = cluster
    fake.publish("s1", [{"a": 1}])
    cache = StatsCache(session, url, clock=Clock())
    views = await asyncio.gather(*(cache.get("idx", "body", {"Authorization": TOKEN}) for _ in range(10)))
    assert all(v is views[0] for v in views)
    assert fake.calls["field_caps"] == 1 and fake.calls["chunk"] == 1


async def test_the_clusters_403_is_passed_on(cluster):
    fake, session, url = cluster
    fake.publish("s1", [{"a": 1}])
    with pytest.raises(UpstreamError) as err:
        await StatsCache(session, url).get("idx", "body", {"Authorization": "Basic bm9wZQ=="})
    assert err.value.status == 403 and err.value.type == "security_exception"
    assert b"unauthorized" in err.value.payload


async def test_an_unreachable_cluster_during_a_check_keeps_the_cached_view():
    fake = FakeCluster()
    stats = fake.publish("s1", [{"a": 1}, {"b": 2}])
    server = TestServer(fake.app())
    await server.start_server()
    url = str(server.make_url("")).rstrip("/")
    clock = Clock()
    async with aiohttp.ClientSession() as session:
        cache = StatsCache(session, url, clock=clock)
        first = await cache.get("idx", "body", {"Authorization": TOKEN})
        await server.close()  # the cluster goes away
        clock.now = 60.0
        again = await cache.get("idx", "body", {"Authorization": TOKEN})
        assert again is first and again.corpus.same_as(stats)
        with pytest.raises(SearchError) as err:  # nothing cached for this one: the 502 surfaces
            await cache.get("other", "body", {"Authorization": TOKEN})
        assert err.value.status == 502


async def test_ndjson_calls_to_an_unreachable_cluster_are_502s_not_aiohttp_errors():
    """Publishing (`_bulk`) and estimated-mode df (`_msearch`) post NDJSON outside `request_json`."""
    from bmx_rerank.stats import estimate
    from bmx_rerank.stats import store as stats_store

    dead = "http://127.0.0.1:1"
    async with aiohttp.ClientSession() as session:
        with pytest.raises(SearchError) as bulk:
            await stats_store._bulk(Cluster(session, dead), {}, "bmx-stats", [("delete", "x", None)])
        with pytest.raises(SearchError) as msearch:
            await estimate.estimate_terms(Cluster(session, dead), "idx", ["idx"], "body", ["a"], {})
    for err in (bulk.value, msearch.value):
        assert (err.status, err.type) == (502, "bmx_upstream_unreachable_exception")
    assert "/_bulk" in bulk.value.reason and "/_msearch" in msearch.value.reason


async def test_estimated_mode_numbers_are_never_shared_between_callers(cluster):
    """Estimated df/ttf are fetched under the caller's document-level security: each caller gets its own
    view, filled with its own credentials, never numbers another caller fetched."""
    fake, session, url = cluster  # nothing published: estimated mode
    cache = StatsCache(session, url, clock=Clock())
    first = await cache.get("idx", "body", {"Authorization": TOKEN})
    assert first.estimated
    await first.for_terms(["a"])
    second = await cache.get("idx", "body", {"Authorization": OTHER})
    assert fake.auth["field_caps"] == [TOKEN, OTHER], "the second caller resolves the indices itself"
    view = await second.for_terms(["a", "b"])
    assert fake.auth["msearch"] == [TOKEN, OTHER] and set(fake.auth["termvectors"]) == {TOKEN, OTHER}
    df, _ = view.corpus.lookup(["a", "b"])
    assert df.tolist() == [2, 2] and view.corpus.n_docs == 10
    again = await cache.get("idx", "body", {"Authorization": TOKEN, "X-Request-Id": "42"})
    assert again.corpus.lookup(["b"])[0].tolist() == [0], "the first caller never fetched [b]"
    assert fake.auth["field_caps"] == [TOKEN, OTHER], "a request id is not a new caller"


async def test_statistics_are_resolved_per_caller(cluster):
    """`logs-*` means the indices each caller may search: one caller's view never answers another."""
    fake, session, url = cluster
    fake.publish("s1", [{"a": 1}])
    cache = StatsCache(session, url, clock=Clock())
    await cache.get("idx", "body", {"Authorization": TOKEN})
    await cache.get("idx", "body", {"Authorization": TOKEN})
    await cache.get("idx", "body", {"Authorization": OTHER})
    assert fake.auth["field_caps"] == [TOKEN, OTHER]
    assert fake.calls["chunk"] == 1, (
        "the snapshot itself is loaded once, reached through each caller's pointer"
    )
    with pytest.raises(UpstreamError):  # a third caller without rights gets its 403, not the cached view
        await cache.get("idx", "body", {"Authorization": "Basic bm9wZQ=="})


class Hanging(FakeCluster):
    """`_field_caps` never answers once `hang` is set."""

    hang = False
    forbid = False

    async def field_caps(self, request: web.Request) -> web.Response:
        if self.forbid:
            body = {"error": {"type": "security_exception", "reason": "revoked"}, "status": 403}
            return web.json_response(body, status=403)
        if self.hang:
            await asyncio.sleep(3600)
        return await super().field_caps(request)


@pytest.fixture
async def hanging():
    fake = Hanging()
    server = TestServer(fake.app())
    await server.start_server()
    async with aiohttp.ClientSession() as session:
        yield fake, session, str(server.make_url("")).rstrip("/")
    await server.close()


async def test_a_hanging_field_caps_is_a_504_within_the_timeout(hanging):
    fake, session, url = hanging
    fake.publish("s1", [{"a": 1}])
    fake.hang = True
    cache = StatsCache(session, url, timeout=0.3)
    started = time.monotonic()
    results = await asyncio.gather(
        *(cache.get("idx", "body", {"Authorization": TOKEN}) for _ in range(5)), return_exceptions=True
    )
    assert time.monotonic() - started < 1.3
    assert all(isinstance(r, SearchError) and r.status == 504 for r in results)
    assert not cache._refreshing, "nothing left running"


async def test_a_check_that_hangs_serves_the_view_unconfirmed_marked_stale(hanging):
    """Searches wait for a due check at most `check_wait`; past it they are served the view they had,
    marked stale (it could not be confirmed) and without length tables, while the one check goes on."""
    fake, session, url = hanging
    stats = fake.publish("s1", [{"a": 1}])
    clock = Clock()
    cache = StatsCache(session, url, timeout=0.5, clock=clock)
    cache.check_wait = 0.05
    headers = {"Authorization": TOKEN}
    first = await cache.get("idx", "body", headers)
    assert not first.stale
    fake.hang = True
    clock.now = 100.0
    started = time.monotonic()
    views = await asyncio.gather(*(cache.get("idx", "body", headers) for _ in range(20)))
    assert time.monotonic() - started < 0.3, "every search waits for the same check, briefly"
    assert all(v.corpus.same_as(stats) and v.stale and v.lengths is None for v in views)
    assert len(cache._refreshing) == 1, "one check for every search"
    await cache.settled()  # it times out, and the cached view stays
    fake.hang = False
    view = await cache.get("idx", "body", headers)
    assert view.corpus.same_as(stats) and not view.stale, "checked again, and confirmed"


async def test_a_refused_check_drops_the_view(hanging):
    """Rights revoked between two checks: the next search asks again and gets the cluster's 403."""
    fake, session, url = hanging
    fake.publish("s1", [{"a": 1}])
    clock = Clock()
    cache = StatsCache(session, url, clock=clock)
    await cache.get("idx", "body", {"Authorization": TOKEN})
    clock.now = 10.0
    fake.forbid = True
    with pytest.raises(UpstreamError):
        await cache.get("idx", "body", {"Authorization": TOKEN})
    with pytest.raises(UpstreamError):  # the view is gone: asked again
        await cache.get("idx", "body", {"Authorization": TOKEN})


async def test_a_length_table_still_being_written_is_served_later(cluster):
    """A view does not wait for a large table to be written: it goes without (hits read term
    vectors) and a later check maps the file once it is there."""
    fake, session, url = cluster
    table = DocLengths.from_rows(["a", "b"], [None, None], [3, 4], [1, 1], [7, 0])
    fake.publish("s1", [{"a": 1}], lengths=table)
    clock = Clock()
    cache = StatsCache(session, url, check_interval=5.0, clock=clock)
    cache.length_wait = 0.0
    headers = {"Authorization": TOKEN}
    assert (await cache.get("idx", "body", headers)).lengths is None
    for _ in range(200):
        if not cache._building:
            break
        await asyncio.sleep(0.01)
    clock.now = 5.0
    await cache.get("idx", "body", headers)
    await cache.settled()
    view = await cache.get("idx", "body", headers)
    assert view.lengths is not None and view.lengths["idx"].same_as(table)
