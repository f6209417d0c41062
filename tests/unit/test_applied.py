"""Applied configurations on the request path: remembered per index for a TTL, read with the caller's
credentials, a failed read means "none" and is not remembered, never a search's own ext.bmx."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web

from bmx_rerank.applied import AppliedConfigs, config_id


@pytest.fixture
async def store():
    state = {"status": 200, "source": None, "calls": [], "auth": []}

    async def get(request: web.Request) -> web.Response:
        state["calls"].append(request.match_info["id"])
        state["auth"].append(request.headers.get("Authorization"))
        if state["status"] != 200:
            return web.json_response(
                {"error": {"type": "x", "reason": "no"}, "status": state["status"]}, status=state["status"]
            )
        if state["source"] is None:
            return web.json_response({"found": False}, status=404)
        return web.json_response({"found": True, "_source": state["source"]})

    app = web.Application()
    app.router.add_get("/bmx-stats/_doc/{id}", get)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    async with aiohttp.ClientSession() as session:
        state["session"], state["url"] = session, f"http://127.0.0.1:{port}"
        yield state
    await runner.cleanup()


def body() -> dict:
    return {"query": {"match": {"body": "x"}}}


async def test_a_configuration_is_read_with_the_callers_credentials_and_remembered(store):
    store["source"] = {"info": {"rerank": True, "bmx": {"field": "body", "window_size": 42}}}
    applied = AppliedConfigs(store["session"], store["url"], ttl=0.2)
    spec = await applied.policy("docs", body(), {"Authorization": "Basic abc"})
    assert spec is not None and (spec.field, spec.window_size) == ("body", 42)
    assert store["calls"] == [config_id("docs")] and store["auth"] == ["Basic abc"]
    await applied.policy("docs", body(), {})
    assert len(store["calls"]) == 1  # remembered
    store["source"] = {"info": {"rerank": False, "bmx": {}}}
    await asyncio.sleep(0.25)
    assert await applied.policy("docs", body(), {}) is None  # the engine won now: pass through
    assert len(store["calls"]) == 2


async def test_no_configuration_and_own_ext_bmx_and_patterns(store):
    applied = AppliedConfigs(store["session"], store["url"], ttl=5)
    assert await applied.policy("docs", body(), {}) is None  # 404: none
    assert await applied.policy("docs", {"ext": {"bmx": {"field": "body"}}, **body()}, {}) is None
    assert await applied.policy("docs-*", body(), {}) is None
    assert await applied.policy("a,b", body(), {}) is None
    assert await applied.policy(None, body(), {}) is None
    assert store["calls"] == [config_id("docs")]
    assert await AppliedConfigs(store["session"], store["url"], ttl=0).policy("docs", body(), {}) is None


async def test_a_failed_read_means_none_and_is_not_remembered(store):
    store["status"] = 403
    store["source"] = {"info": {"rerank": True, "bmx": {"field": "body"}}}
    applied = AppliedConfigs(store["session"], store["url"], ttl=60)
    assert await applied.policy("docs", body(), {"Authorization": "Basic nobody"}) is None
    store["status"] = 200
    spec = await applied.policy("docs", body(), {"Authorization": "Basic reader"})
    assert spec is not None and spec.field == "body"


async def test_an_unusable_stored_configuration_passes_through(store):
    store["source"] = {"info": {"rerank": True, "bmx": {"field": "body", "window_size": -3}}}
    applied = AppliedConfigs(store["session"], store["url"], ttl=60)
    assert await applied.policy("docs", body(), {}) is None


async def test_concurrent_searches_share_one_read(store):
    store["source"] = {"info": {"rerank": True, "bmx": {"field": "body"}}}
    applied = AppliedConfigs(store["session"], store["url"], ttl=60)
    got = await asyncio.gather(*(applied.policy("docs", body(), {}) for _ in range(20)))
    assert all(g is not None for g in got) and len(store["calls"]) == 1
