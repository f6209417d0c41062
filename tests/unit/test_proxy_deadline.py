"""One deadline per reranked search, against a fake cluster that answers every call slowly: the
search ends by `--deadline`, lowered by `ext.bmx.deadline` and the search's own `timeout`; with the
first stage in hand it answers with it (marked `skipped; reason=deadline`), else a 504."""

from __future__ import annotations

import asyncio
import gc
import json
import time

import aiohttp
import pytest
from aiohttp import web

from bmx_rerank.deadline import Deadline, budget, request_budget, time_value, within
from bmx_rerank.errors import timed_out
from bmx_rerank.rerank.window import drop
from tests.support.fake_cluster import FakeCluster, run_proxy
from tests.support.serving import serve_app


class Slow(FakeCluster):
    """Every call answered after `delay` seconds."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay

    def app(self) -> web.Application:
        inner = super().app()

        @web.middleware
        async def slow(request: web.Request, handler):
            await asyncio.sleep(self.delay)
            return await handler(request)

        inner.middlewares.append(slow)
        return inner


@pytest.fixture
async def slow():
    fake = Slow(0.4)
    runner, url = await serve_app(fake.app())
    yield fake, url
    await runner.cleanup()


def search(**bmx):
    return {"size": 3, "query": {"match": {"body": "t3"}}, "ext": {"bmx": {"field": "body", **bmx}}}


async def timed(url, body, params=""):
    async with aiohttp.ClientSession() as client:
        start = time.perf_counter()
        async with client.post(f"{url}/docs/_search{params}", json=body) as resp:
            return resp.status, dict(resp.headers), await resp.json(), time.perf_counter() - start


def test_time_values_and_budgets():
    assert time_value("500ms") == 0.5 and time_value("2s") == 2 and time_value("1m") == 60
    assert time_value(250) == 0.25 and time_value("soon") is None and time_value(-1) is None
    assert request_budget(0) is None and request_budget(0, None) is None
    assert request_budget(10, 2.0, None).seconds == 2.0 and request_budget(1, 5.0).seconds == 1
    assert budget(7.0) == 7.0
    with within(Deadline.after(0.5)):
        assert 0.4 < budget(7.0) <= 0.5 and budget(0.1) == 0.1 and budget(None) <= 0.5


async def test_past_the_deadline_with_the_first_stage_in_hand_it_is_the_answer(slow):
    fake, upstream = slow
    runner, url = await run_proxy(upstream, timeout=5.0, deadline=0.6, tf_probes="off")
    try:
        status, headers, body, seconds = await timed(url, search())
        assert seconds < 0.6 + 0.3, seconds
        assert status == 200 and headers["X-BMX-Rerank"] == "skipped; reason=deadline", body
        assert body["_bmx"]["skipped"] == "deadline" and len(body["hits"]["hits"]) == 3
        assert "bmx_probe" not in str(body)
        async with aiohttp.ClientSession() as client, client.get(f"{url}/_bmx/metrics") as resp:
            assert 'bmx_reranks_total{outcome="deadline"} 1.0' in await resp.text()
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(
    ("config", "bmx", "params"),
    [
        ({"deadline": 0.2}, {}, ""),
        ({"deadline": 60}, {"deadline": 0.2}, ""),
        ({"deadline": 60}, {}, "?timeout=200ms"),
    ],
    ids=["--deadline", "ext.bmx.deadline", "timeout"],
)
async def test_past_the_deadline_before_the_first_stage_is_a_504(slow, config, bmx, params):
    fake, upstream = slow
    runner, url = await run_proxy(upstream, timeout=5.0, **config)
    try:
        status, _, body, seconds = await timed(url, search(**bmx), params)
        assert seconds < 0.2 + 0.3, seconds
        assert status == 504 and body["error"]["type"] == "bmx_upstream_timeout_exception", body
        assert "deadline" in body["error"]["reason"]
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("path", ["/docs/_search", "/_msearch"])
async def test_a_deadline_timer_that_fires_before_the_clock_reaches_it_is_the_deadlines_504(
    slow, monkeypatch, path
):
    """uvloop's loop clock runs in whole milliseconds: its timer may fire a little before
    `time.monotonic()` reaches the deadline. That is still the deadline, never a 500."""
    fake, upstream = slow
    monkeypatch.setattr(Deadline, "expired", lambda self: False)
    runner, url = await run_proxy(upstream, timeout=5.0, deadline=0.2)
    try:
        async with aiohttp.ClientSession() as client:
            if path == "/_msearch":
                lines = '{"index": "docs"}\n' + json.dumps(search()) + "\n"
                request = client.post(
                    f"{url}{path}", data=lines, headers={"Content-Type": "application/x-ndjson"}
                )
            else:
                request = client.post(f"{url}{path}", json=search())
            async with request as resp:
                status, body = resp.status, await resp.json()
        assert status == 504 and body["error"]["type"] == "bmx_upstream_timeout_exception", body
    finally:
        await runner.cleanup()


async def test_ext_bmx_deadline_out_of_bounds_is_a_400(slow):
    fake, upstream = slow
    runner, url = await run_proxy(upstream)
    try:
        for value in (0, -1, 1e9, "1s"):
            status, _, body, _ = await timed(url, search(deadline=value))
            assert status == 400 and "[deadline]" in body["error"]["reason"], body
    finally:
        await runner.cleanup()


async def test_within_the_deadline_it_reranks(slow):
    fake, upstream = slow
    runner, url = await run_proxy(upstream, timeout=5.0, deadline=10.0)
    try:
        status, headers, body, _ = await timed(url, search())
        assert status == 200 and headers["X-BMX-Rerank"] == "bmx", body
    finally:
        await runner.cleanup()


async def test_an_msearch_past_its_deadline_answers_its_items_marked(slow):
    fake, upstream = slow
    runner, url = await run_proxy(
        upstream, timeout=5.0, deadline=1.0
    )  # planning reads the applied configuration: 0.4 s of it
    lines = [{"index": "docs"}, search(), {"index": "docs"}, {"query": {"match_all": {}}, "size": 2}]
    data = "".join(__import__("json").dumps(x) + "\n" for x in lines)
    try:
        async with aiohttp.ClientSession() as client:
            start = time.perf_counter()
            async with client.post(
                f"{url}/docs/_msearch", data=data, headers={"Content-Type": "application/x-ndjson"}
            ) as resp:
                body = await resp.json()
                seconds = time.perf_counter() - start
        assert seconds < 1.0 + 0.3, seconds
        assert resp.status == 200, body
        first, second = body["responses"]
        assert first["_bmx"]["skipped"] == "deadline" and len(first["hits"]["hits"]) == 3
        assert "_bmx" not in second and len(second["hits"]["hits"]) == 2
    finally:
        await runner.cleanup()


async def test_a_dropped_call_that_ends_with_its_own_failure_is_not_reported_as_never_retrieved():
    """A call cancelled by `Window.close` may still end with its own failure (a timeout of the same
    deadline raised as the cancel arrives): it is retrieved, so asyncio logs nothing."""
    reported = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _, context: reported.append(context))

    async def stubborn() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            raise timed_out("the same deadline") from None

    task = asyncio.ensure_future(stubborn())
    await asyncio.sleep(0)
    drop(task)
    await asyncio.sleep(0.01)
    assert task.done() and not task.cancelled()
    del task
    gc.collect()
    await asyncio.sleep(0)
    assert reported == []
