"""The lean first stage (rerank/lean.py) on real engines: a window that reads no stored field, its page
fetched by version, answers exactly as the full first stage does.

Two proxies over the same statistics store: one as shipped (`auto` probes: lean where the index has
one shard), one that never probes (so never lean: the first stage reads every hit's `_id` and
`_source`, frequencies from `_mtermvectors`). Their answers are compared whole: ids, scores, `_source`
as the caller filtered it, `fields`, `_version`, `_seq_no`, totals and aggregations, page by page, with
documents updated and deleted (and refreshed) between searches; on 1 shard and on 3 shards (searched
shard by shard: rerank/shards.py)."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from bmx_rerank.rerank import shards as shards_module
from bmx_rerank.rerank.pipeline import Reranker
from bmx_rerank.stats import build as stats_build
from bmx_rerank.stats.cache import StatsCache
from bmx_rerank.upstream import Cluster
from tests.support.data import scifact_records
from tests.support.engine_client import EngineClient
from tests.support.proxy_thread import ProxyThread

pytestmark = pytest.mark.integration

DOCS = 300
QUERIES = 6


def _create(engine: EngineClient, index: str, shards: int, texts: dict[str, str]) -> None:
    settings = {"number_of_shards": shards, "number_of_replicas": 0}
    mappings = {
        "properties": {"body": {"type": "text"}, "n": {"type": "integer"}, "tag": {"type": "keyword"}}
    }
    engine.ok("PUT", f"/{index}", {"settings": settings, "mappings": mappings})
    lines = []
    for i, (doc_id, text) in enumerate(texts.items()):
        lines.append(json.dumps({"index": {"_index": index, "_id": doc_id}}))
        lines.append(json.dumps({"body": text, "n": i, "tag": f"t{i % 4}"}))
    assert not engine.ok("POST", "/_bulk", "\n".join(lines) + "\n", {"refresh": "true"})["errors"]


@pytest.fixture(params=[1, 3], ids=["1-shard", "3-shards"])
def pair(
    engine: EngineClient, request
) -> Iterator[tuple[EngineClient, str, ProxyThread, ProxyThread, list[str]]]:
    shards = request.param
    index = f"bmxtest-lean-{uuid.uuid4().hex[:10]}"
    store = f"bmxtest-lean-store-{uuid.uuid4().hex[:8]}"
    texts = {d["_id"]: f"{d.get('title', '')} {d['text']}" for d in scifact_records("corpus.jsonl", DOCS)}
    _create(engine, index, shards, texts)

    async def build(session: aiohttp.ClientSession) -> None:
        await stats_build.build_snapshots(Cluster(session, engine.url), index, "body", {}, store=store)

    asyncio.run(_with_session(build))

    def stats(session: aiohttp.ClientSession, base: str) -> StatsCache:
        return StatsCache(session, base, store=store, check_interval=3600.0)

    lean = ProxyThread(engine.url, stats)
    full = ProxyThread(engine.url, stats, tf_probes=False)
    try:
        yield engine, index, lean, full, [q["text"] for q in scifact_records("queries.jsonl", QUERIES)]
    finally:
        lean.close()
        full.close()
        engine.call("DELETE", f"/{index}")
        engine.call("DELETE", f"/{store}")


async def _with_session(fn: Any) -> Any:
    async with aiohttp.ClientSession() as session:
        return await fn(session)


def _post(url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(
        url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


def _shown(answer: dict[str, Any]) -> dict[str, Any]:
    """What a caller reads of an answer: everything but timings and the marker's own bookkeeping."""
    out = {k: v for k, v in answer.items() if k not in ("took", "_bmx")}
    hits = out["hits"]
    out["hits"] = {**hits, "hits": [{**h, "_score": round(h["_score"], 5)} for h in hits["hits"]]}
    if hits.get("max_score") is not None:
        out["hits"]["max_score"] = round(hits["max_score"], 5)
    return out


def _searches(text: str) -> list[tuple[str, dict[str, Any]]]:
    """The shapes a caller sends: pages, `_source` filtering (body and URL), `fields`, versions, aggs."""
    bmx = {"field": "body", "window_size": 60}
    query = {"match": {"body": text}}
    return [
        ("", {"query": query, "size": 10, "ext": {"bmx": bmx}}),
        ("", {"query": query, "from": 10, "size": 10, "ext": {"bmx": bmx}}),
        (
            "",
            {
                "query": {"bool": {"must": [query], "filter": [{"range": {"n": {"gte": 5}}}]}},
                "size": 7,
                "_source": ["n"],
                "fields": ["tag"],
                "version": True,
                "seq_no_primary_term": True,
                "aggs": {"tags": {"terms": {"field": "tag"}}},
                "track_total_hits": True,
                "ext": {"bmx": bmx},
            },
        ),
        ("?_source_excludes=body&version=true", {"query": query, "size": 5, "ext": {"bmx": bmx}}),
        ("", {"query": query, "size": 5, "_source": False, "ext": {"bmx": bmx}}),
        # a count bound the shards' counts pass together, not each alone (3 shards)
        (
            "?rest_total_hits_as_int=false",
            {"query": query, "size": 3, "track_total_hits": 40, "ext": {"bmx": bmx}},
        ),
        ("?preference=mine", {"query": query, "size": 4, "ext": {"bmx": bmx}}),  # the caller picks copies
        ("?rest_total_hits_as_int=true", {"query": query, "size": 3, "ext": {"bmx": bmx}}),
        (
            "",
            {
                "query": query,
                "size": 3,
                "track_total_hits": False,
                "post_filter": {"term": {"tag": "t1"}},
                "ext": {"bmx": bmx},
            },
        ),
        ("", {"query": query, "size": 3, "terminate_after": 40, "ext": {"bmx": bmx}}),
    ]


def _lean(params: str, body: dict[str, Any], shards: int) -> bool:
    """Whether the proxy as shipped answers this search lean: on several shards, not with aggregations
    (computed over every shard: they do not merge) nor the caller's own `preference`."""
    return shards == 1 or ("aggs" not in body and "preference" not in params)


def _compare(engine, index, lean: ProxyThread, full: ProxyThread, texts: list[str], shards: int) -> None:
    for text in texts:
        for params, body in _searches(text):
            a = _post(lean.url, f"/{index}/_search{params}", body)
            b = _post(full.url, f"/{index}/_search{params}", body)
            assert a["_bmx"]["reranked"] is True and b["_bmx"]["reranked"] is True, (a["_bmx"], b["_bmx"])
            assert b["_bmx"]["fetch"] == "window"
            assert a["_bmx"]["fetch"] == ("page" if _lean(params, body, shards) else "window"), a["_bmx"]
            assert _shown(a) == _shown(b)
            assert a["hits"]["hits"], "a page to compare"


def test_lean_answers_are_the_full_first_stages_through_updates_and_deletes(pair, monkeypatch) -> None:
    engine, index, lean, full, texts = pair
    shards = int(engine.ok("GET", f"/{index}/_settings")[index]["settings"]["index"]["number_of_shards"])
    real, page_msearches = Cluster.post_ndjson, []

    async def counting(self, path, lines, headers, error_type):
        answer = await real(self, path, lines, headers, error_type)
        if error_type == "bmx_page_exception":  # each item a success: no shard went again on its own
            page_msearches.append([item.get("status") for item in answer["responses"]])
        return answer

    monkeypatch.setattr(Cluster, "post_ndjson", counting)
    decoded, decode_search = [], shards_module.decode_search

    def typed(payload: bytes) -> Any:
        decoded.append(found := decode_search(payload))
        return found

    monkeypatch.setattr(shards_module, "decode_search", typed)
    _compare(engine, index, lean, full, texts, shards)
    # first sights over several shards: in one `_msearch` where it takes the probes' parameter
    # (Elasticsearch's does, OpenSearch's does not: one search a shard there)
    takes = lean.app.state.rerank.msearch_probes
    assert takes is (engine.kind == "elasticsearch") if shards > 1 else takes is None, takes
    # a page of documents from several shards: fetched in one `_msearch` (one search on one shard)
    assert len(page_msearches) > 0 if shards > 1 else page_msearches == [], page_msearches
    assert all(status == 200 for statuses in page_msearches for status in statuses), page_msearches
    # (pages of one window share it: some went whole already)
    before, typed_before = (
        _metric(lean.url, 'bmx_tf_windows_total{probes="seen",source="window"}'),
        len(decoded),
    )
    # The same windows again: each kept whole
    _compare(engine, index, lean, full, texts, shards)
    whole = _metric(lean.url, 'bmx_tf_windows_total{probes="seen",source="window"}')
    assert whole - before == len(texts) * len(_searches("")), "every window the second time"
    # a repeated window on one shard: its hits decoded as `Hit`s, but where the answer holds more
    # (aggregations, `terminated_early`: decoded whole)
    if shards == 1:
        again = decoded[typed_before:]
        assert len(again) == len(texts) * len(_searches("")), "each window the second time"
        assert all(d is not None for d in again), again
        assert sum(d[1] is not None for d in again) == len(texts) * (len(_searches("")) - 2), again
    else:
        assert decoded == [], "several shards: one `_msearch`, decoded by `shards.decode`"
    # a repeated window (no probes) over several shards: its shards' searches in one `_msearch`
    msearches = _metric(lean.url, 'bmx_upstream_seconds_count{call="msearch"}')
    assert msearches > 0 if shards > 1 else msearches == 0, msearches

    # Documents of the pages updated and deleted (refreshed) after the statistics' build: the lean
    # window names the updated and new ones by version for `_mtermvectors`; the deleted one is gone.
    assert _metric(lean.url, 'bmx_upstream_seconds_count{call="termvectors"}') == 0
    top = [h["_id"] for h in _post(full.url, f"/{index}/_search", _searches(texts[0])[0][1])["hits"]["hits"]]
    engine.ok("POST", f"/{index}/_update/{top[0]}", {"doc": {"body": f"{texts[0]} {texts[0]} more"}})
    engine.ok("DELETE", f"/{index}/_doc/{top[1]}")
    engine.ok("PUT", f"/{index}/_doc/new-one", {"body": texts[0], "n": 7, "tag": "t1"})
    engine.ok("POST", f"/{index}/_refresh")
    _compare(engine, index, lean, full, texts[:2], shards)
    assert _metric(lean.url, 'bmx_upstream_seconds_count{call="termvectors"}') > 0
    # the windows of the new versions are kept whole in turn: the same answers again
    _compare(engine, index, lean, full, texts[:2], shards)
    assert _metric(lean.url, 'bmx_tf_windows_total{probes="seen",source="window"}') > whole

    lean_shapes = sum(_lean(params, body, shards) for params, body in _searches(""))
    lean_windows = _metric(lean.url, 'bmx_lean_windows_total{outcome="lean"}')
    assert lean_windows == (2 * len(texts) + 2 * 2) * lean_shapes
    assert _metric(lean.url, 'bmx_lean_windows_total{outcome="lean_missed"}') == 0


def _metric(url: str, name: str) -> float:
    """A sample of the proxy's /metrics (0 when it has none yet)."""
    with urllib.request.urlopen(f"{url}/_bmx/metrics", timeout=10) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
    return 0.0


class _After:
    """The cluster as a first sight's search beside its first stage reaches it (`lean.beside`): each
    call waits for `then` (run in a thread) before it goes."""

    def __init__(self, cluster: Cluster, then: Any) -> None:
        self.cluster, self.then = cluster, then

    async def request(self, *args: Any, **kwargs: Any) -> Any:
        await asyncio.to_thread(self.then)
        return await self.cluster.request(*args, **kwargs)


def _count_page_reads(monkeypatch) -> tuple[list[int], list[int]]:
    """Counted as the proxy goes: the documents each fetch by version asks for a page (`lean.fetch`),
    and each search of a first sight's likely page beside its first stage (`lean.beside`)."""
    from bmx_rerank.rerank import lean as lean_module

    real, real_beside = lean_module.fetch, lean_module.beside
    pages: list[int] = []
    guesses: list[int] = []

    async def counting(*args: Any, page: bool, **kwargs: Any) -> Any:
        if page:
            pages.append(len(args[3]))
        return await real(*args, page=page, **kwargs)

    def counting_beside(cluster: Cluster, *args: Any, **kwargs: Any) -> Any:
        return real_beside(_After(cluster, lambda: guesses.append(1)), *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(lean_module, "fetch", counting)
    monkeypatch.setattr(lean_module, "beside", counting_beside)
    return pages, guesses


@pytest.mark.parametrize("pair", [1, 3], ids=["1-shard", "3-shards"], indirect=True)
def test_a_page_document_changed_before_the_page_fetch_sends_the_search_again_in_full(
    pair, monkeypatch
) -> None:
    """A page's document updated (and refreshed) after the lean first stage read it, before its page
    documents were read (by the search beside the first stage, made to wait for the first stage's
    answer): that version is gone, so the search goes again
    with the full first stage, and answers as it does."""
    from bmx_rerank.rerank import lean as lean_module

    engine, index, lean, full, texts = pair
    body = _searches(texts[0])[0][1]
    top = _post(full.url, f"/{index}/_search", body)["hits"]["hits"][0]["_id"]
    real_fetch, real_beside, real_check = lean_module.fetch, lean_module.beside, lean_module.check_hits
    changed: list[bool] = []
    answered = threading.Event()  # the first stage's answer is in

    def change() -> None:
        if not changed:
            engine.ok("POST", f"/{index}/_update/{top}", {"doc": {"n": 999}}, {"refresh": "true"})
            changed.append(True)

    async def changing_first(*args: Any, page: bool, **kwargs: Any) -> Any:
        if page:
            await asyncio.to_thread(change)
        return await real_fetch(*args, page=page, **kwargs)

    def checked(*args: Any) -> None:
        real_check(*args)
        answered.set()

    def changing_beside(cluster: Cluster, *args: Any, **kwargs: Any) -> Any:
        return real_beside(_After(cluster, lambda: answered.wait(30) and change()), *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(lean_module, "fetch", changing_first)
    monkeypatch.setattr(lean_module, "check_hits", checked)
    monkeypatch.setattr(lean_module, "beside", changing_beside)
    a = _post(lean.url, f"/{index}/_search", body)
    assert changed and a["_bmx"]["fetch"] == "window", a["_bmx"]
    assert _metric(lean.url, 'bmx_lean_windows_total{outcome="lean_missed"}') == 1
    assert _shown(a) == _shown(_post(full.url, f"/{index}/_search", body))
    assert any(h["_source"]["n"] == 999 for h in a["hits"]["hits"]), "the version the rerank scored"


@pytest.mark.parametrize("pair", [1], ids=["1-shard"], indirect=True)
def test_a_failed_search_beside_the_first_stage_leaves_the_page_to_the_fetch_after(pair, monkeypatch) -> None:
    """The search of a first sight's likely page beside its first stage fails (the cluster's 429, a
    timeout): the page is fetched after the window is scored, and the answer is the full first stage's."""
    from bmx_rerank.errors import SearchError
    from bmx_rerank.rerank import lean as lean_module

    engine, index, lean, full, texts = pair
    real_beside = lean_module.beside

    def busy() -> None:
        raise SearchError(429, "es_rejected_execution_exception", "rejected")

    def failing_beside(cluster: Cluster, *args: Any, **kwargs: Any) -> Any:
        return real_beside(_After(cluster, busy), *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(lean_module, "beside", failing_beside)
    body = _searches(texts[0])[0][1]
    a = _post(lean.url, f"/{index}/_search", body)
    assert a["_bmx"]["fetch"] == "page", a["_bmx"]
    assert _metric(lean.url, 'bmx_page_ahead_total{outcome="fetched_after"}') == 1
    assert _shown(a) == _shown(_post(full.url, f"/{index}/_search", body))


@pytest.mark.parametrize("pair", [1, 3], ids=["1-shard", "3-shards"], indirect=True)
def test_a_repeated_windows_page_comes_from_the_page_cache_per_caller(pair, monkeypatch) -> None:
    """The same search again: lean without probes (its frequencies kept), its page
    documents from the page cache (no page fetch, nor a guess), the answer unchanged; the cache holds
    the page's documents alone, not the others guessed; another caller (another `Authorization`)
    reads its own; a page showing `fields` (which follow the mapping) is never kept, and read again
    each time."""
    engine, index, lean, full, texts = pair
    pages, guesses = _count_page_reads(monkeypatch)

    def read() -> tuple[list[int], int]:
        return list(pages), len(guesses)

    body = _searches(texts[1])[0][1]
    first = _post(lean.url, f"/{index}/_search", body)
    assert first["_bmx"]["fetch"] == "page", first["_bmx"]
    # the first stage's top two pages asked for (and kept) beside the first stage (over several
    # shards, each hit's shard the one its `_id` routes to); then what of the page they missed
    assert guesses == [1] and sum(pages) < 10, (guesses, pages)
    assert len(lean.app.state.rerank.pages) == 10, "the page's documents alone kept, not the 20 guessed"
    fetched = read()
    again = _post(lean.url, f"/{index}/_search", body)
    assert _shown(again) == _shown(first) and read() == fetched, "the page from the cache: no fetch"
    # a repeated window: lean and unprobed, its frequencies from the cache (the window kept whole)
    assert (again["_bmx"]["fetch"], again["_bmx"]["tf"], again["_bmx"]["tf_probes"]) == (
        "page",
        "window",
        "seen",
    )
    other = urllib.request.Request(
        f"{lean.url}/{index}/_search",
        json.dumps(body).encode(),
        {"Content-Type": "application/json", "Authorization": "Basic b3RoZXI6Y2FsbGVy"},
        method="POST",
    )
    with urllib.request.urlopen(other, timeout=60) as resp:
        assert _shown(json.loads(resp.read())) == _shown(first)
    assert read() == (fetched[0] * 2, fetched[1] * 2), "another caller's page is its own"
    shaped = {**body, "fields": ["tag"]}
    assert _post(lean.url, f"/{index}/_search", shaped)["_bmx"]["fetch"] == "page"
    once = read()
    assert _post(lean.url, f"/{index}/_search", shaped)["_bmx"]["fetch"] == "page"
    # fields follow the mapping: not kept, the page read again (searched beside the first stage, as
    # a first sight's)
    assert read()[1] == once[1] + 1, (read(), once)


@pytest.mark.parametrize("pair", [1, 3], ids=["1-shard", "3-shards"], indirect=True)
def test_a_first_sights_likely_page_is_asked_for_ahead(pair, monkeypatch) -> None:
    """A first sight's top two pages are asked for ahead (beside its first stage): a page among them needs no fetch after it; with one page ahead
    (BMX moves some of BM25's top 10 out) what the guess missed is fetched after; a page larger than
    half the window is not guessed. Every answer is the full first stage's. Each search is a new
    caller's (none of its page documents kept)."""
    from bmx_rerank.rerank import lean as lean_module

    engine, index, lean, full, texts = pair
    callers = iter(range(1000))

    def search(body: dict[str, Any]) -> dict[str, Any]:
        user = base64.b64encode(f"caller-{next(callers)}:pw".encode()).decode()
        req = urllib.request.Request(
            f"{lean.url}/{index}/_search",
            json.dumps(body).encode(),
            {"Content-Type": "application/json", "Authorization": f"Basic {user}"},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=60) as resp:
            answer = json.loads(resp.read())
        assert answer["_bmx"]["fetch"] == "page", answer["_bmx"]
        assert _shown(answer) == _shown(_post(full.url, f"/{index}/_search", body))
        return answer

    def served(outcome: str) -> float:
        return _metric(lean.url, f'bmx_page_ahead_total{{outcome="{outcome}"}}')

    bmx = {"field": "body", "window_size": 60}
    guessed = []  # texts whose window of 60 had its page of 10 guessed
    for ahead, outcome in ((2, "covered"), (1, "fetched_after")):
        monkeypatch.setattr(lean_module, "AHEAD", ahead)
        before = {o: served(o) for o in ("covered", "fetched_after", "none")}
        for text in texts:
            none = served("none")
            search({"query": {"match": {"body": text}}, "size": 10, "ext": {"bmx": bmx}})
            if served("none") == none:
                guessed.append(text)
        counts = {o: served(o) - n for o, n in before.items()}
        # (a window of fewer than 40 hits guesses nothing: its top two pages are more than half of it)
        assert counts[outcome] > 0 and sum(counts.values()) == len(texts), counts
    monkeypatch.undo()  # two pages ahead, as shipped
    assert guessed, "some window held 40 hits"
    before = served("none")
    search({"query": {"match": {"body": guessed[0]}}, "size": 16, "ext": {"bmx": bmx}})  # 2 x 16 > 60 / 2
    assert served("none") == before + 1, "a page of more than a quarter of the window is not guessed"


@pytest.mark.parametrize("pair", [3], ids=["3-shards"], indirect=True)
def test_each_shard_is_asked_for_its_share_and_again_for_all_when_short(pair, monkeypatch) -> None:
    """A window over several shards asks each shard for its share of it (that of the last time, else
    an even one) and a margin, not the whole window; documents that move the window's split to one
    shard (a shard that sends all it was asked for, its last hit in the window) send the shards'
    searches again for the whole window, and an index whose even shares fell short has its first
    sights ask for the whole window. Every answer is the full first stage's."""
    engine, index, lean, full, texts = pair
    asked: list[Any] = []  # each shard's size, per search of the shards (None: the whole window)
    real = Reranker._search_shards

    async def recording(
        self: Any, window: Any, first_stage: Any, msearch: Any, headers: Any, sizes: Any
    ) -> Any:
        asked.append(sizes)
        return await real(self, window, first_stage, msearch, headers, sizes)

    monkeypatch.setattr(Reranker, "_search_shards", recording)

    def same(body: dict[str, Any]) -> dict[str, Any]:
        a = _post(lean.url, f"/{index}/_search", body)
        assert _shown(a) == _shown(_post(full.url, f"/{index}/_search", body))
        return a

    body = _searches(texts[2])[0][1]  # a window of 60
    for _ in range(3):
        same(body)
    # a first sight asks each shard for an even share and a margin; the repeats each
    # shard for its share of the last time and a margin
    assert asked[0] == [31, 31, 31] and asked[1] == asked[2] and sum(asked[1]) < 3 * 60, asked
    assert _metric(lean.url, 'bmx_lean_windows_total{outcome="shares_short"}') == 0
    # 30 documents that match the query better than any, all on one shard (one routing value)
    lines = []
    for i in range(30):
        lines.append(json.dumps({"index": {"_index": index, "_id": f"skew-{i}", "routing": "one"}}))
        lines.append(json.dumps({"body": f"{texts[2]} {texts[2]} {i}", "n": i, "tag": "t0"}))
    assert not engine.ok("POST", "/_bulk", "\n".join(lines) + "\n", {"refresh": "true"})["errors"]
    del asked[:]
    for _ in range(2):
        assert any(h["_id"].startswith("skew-") for h in same(body)["hits"]["hits"])
    # the first time its shares were short: asked again for the whole window; then the new split
    assert asked[0] is not None and asked[1] is None and asked[2] is not None and max(asked[2]) > 39, asked
    assert _metric(lean.url, 'bmx_lean_windows_total{outcome="shares_short"}') == 1
    # first sights of other windows there: their even shares short (30 of their hits on one shard),
    # asked again whole; once 8 of the index's last 32 first sights were, its first sights ask for the
    # whole window
    del asked[:]
    n = shards_module.UNEVEN_SHORTS
    sizes = range(31, 31 + n)  # (each asks each shard for fewer than 30: 19 to 22)
    for size in [*sizes, 39]:
        same({**body, "ext": {"bmx": {**body["ext"]["bmx"], "window_size": size}}})
    assert asked[: 2 * n : 2] == [shards_module.shard_sizes({"size": k}, None, 3) for k in sizes], asked
    assert all(max(a) < 30 for a in asked[: 2 * n : 2]), asked
    assert asked[1 : 2 * n : 2] == [None] * n and asked[2 * n :] == [None], asked
    assert _metric(lean.url, 'bmx_lean_windows_total{outcome="shares_short"}') == 1 + n
    assert _metric(lean.url, 'bmx_lean_windows_total{outcome="lean_missed"}') == 0


@pytest.mark.parametrize("routing", ["own routing values", "partitioned"])
def test_over_several_shards_a_first_sights_page_is_searched_beside_where_the_routing_is_known(
    engine: EngineClient, routing: str, monkeypatch
) -> None:
    """Over several shards a hit of the search beside a first stage is given the shard its `_routing`,
    else its `_id`, routes to. Half the documents carry a routing value of their own: the index's
    length table knows its routing, the page comes from the search beside, and the answer is the full
    first stage's. An index routed with `routing_partition_size` (a formula the build does not trust)
    searches nothing beside: the top two pages are fetched while the window is scored, as before."""
    index = f"bmxtest-lean-routed-{uuid.uuid4().hex[:10]}"
    store = f"bmxtest-lean-store-{uuid.uuid4().hex[:8]}"
    settings: dict[str, Any] = {"number_of_shards": 3, "number_of_replicas": 0}
    mappings: dict[str, Any] = {"properties": {"body": {"type": "text"}}}
    if routing == "partitioned":
        settings["routing_partition_size"] = 2
        mappings["_routing"] = {"required": True}
    engine.ok("PUT", f"/{index}", {"settings": settings, "mappings": mappings})
    texts = [f"{d.get('title', '')} {d['text']}" for d in scifact_records("corpus.jsonl", DOCS)]
    lines = []
    for i, text in enumerate(texts):
        action: dict[str, Any] = {"_index": index, "_id": f"d{i}"}
        if routing == "partitioned":
            action["routing"] = f"r{i % 20}"
        elif i % 2:
            action["routing"] = f"own-{i}"
        lines += [json.dumps({"index": action}), json.dumps({"body": text})]
    assert not engine.ok("POST", "/_bulk", "\n".join(lines) + "\n", {"refresh": "true"})["errors"]

    async def build(session: aiohttp.ClientSession) -> None:
        await stats_build.build_snapshots(Cluster(session, engine.url), index, "body", {}, store=store)

    asyncio.run(_with_session(build))

    def stats(session: aiohttp.ClientSession, base: str) -> StatsCache:
        return StatsCache(session, base, store=store, check_interval=3600.0)

    lean, full = ProxyThread(engine.url, stats), ProxyThread(engine.url, stats, tf_probes=False)
    pages, guesses = _count_page_reads(monkeypatch)
    try:
        routed_shown = 0
        for query in scifact_records("queries.jsonl", QUERIES):
            body = {"query": {"match": {"body": query["text"]}}, "size": 10}
            body["ext"] = {"bmx": {"field": "body", "window_size": 60}}
            del pages[:], guesses[:]
            a = _post(lean.url, f"/{index}/_search", body)
            assert a["_bmx"]["fetch"] == "page", a["_bmx"]
            assert _shown(a) == _shown(_post(full.url, f"/{index}/_search", body))
            routed_shown += sum("_routing" in h for h in a["hits"]["hits"])
            if len(a["hits"]["hits"]) < 10 or a["hits"]["total"]["value"] < 40:
                continue  # a window too small to guess its page in
            if routing == "partitioned":
                # (the top two pages but those kept from an earlier window's)
                assert guesses == [] and 0 < pages[0] <= 20 and sum(pages[1:]) < 10, (guesses, pages)
            else:
                assert guesses == [1] and sum(pages) < 10, (guesses, pages)
        assert routed_shown > 0, "pages held documents of their own routing"
        assert _metric(lean.url, 'bmx_lean_windows_total{outcome="lean_missed"}') == 0
    finally:
        lean.close()
        full.close()
        engine.call("DELETE", f"/{index}")
        engine.call("DELETE", f"/{store}")
