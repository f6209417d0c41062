"""`/_bmx/ready`: the cluster answers and the statistics store is readable, else a 503 in ES shape;
and the JSON log lines keep stack traces but never headers."""

from __future__ import annotations

import io
import json
import logging

import aiohttp
import pytest
from aiohttp import web

from bmx_rerank.logs import ACCESS, json_log_handler, serve_logs
from bmx_rerank.proxy import ProxyConfig, make_app, start_server
from bmx_rerank.stats.cache import StatsCache
from tests.support.serving import serve_app

SEEN = web.AppKey("seen", list)


def store_app(status: int) -> web.Application:
    app = web.Application()
    seen: list[str] = []
    app[SEEN] = seen

    async def root(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization", ""))
        return web.json_response({"name": "fake"})

    async def store(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization", ""))
        return web.json_response({"status": status}, status=status)

    app.router.add_get("/", root)
    app.router.add_get("/bmx-stats/_search", store)
    return app


async def ready(upstream: str, headers=None) -> tuple[int, dict]:
    app = make_app(ProxyConfig(upstream=upstream, timeout=2.0), lambda s, b: StatsCache(s, b))
    runner, url = await start_server(app)
    try:
        async with aiohttp.ClientSession() as client, client.get(f"{url}/_bmx/ready", headers=headers) as r:
            return r.status, await r.json()
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(("store", "expected"), [(200, "ok"), (404, "absent (estimated mode)")])
async def test_ready_when_the_cluster_answers_and_the_store_is_readable_or_absent(store, expected):
    app = store_app(store)
    runner, upstream = await serve_app(app)
    try:
        status, body = await ready(upstream, {"Authorization": "Basic cHJvYmU="})
        assert status == 200 and body["checks"] == {"upstream": "ok", "statistics": expected}
        assert app[SEEN] == ["Basic cHJvYmU="] * 2, "the checks run with the probe's credentials"
    finally:
        await runner.cleanup()


async def test_not_ready_when_the_store_is_unreadable():
    runner, upstream = await serve_app(store_app(403))
    try:
        status, body = await ready(upstream)
        assert status == 503 and body["status"] == 503
        assert body["error"]["type"] == "bmx_not_ready_exception" == body["error"]["root_cause"][0]["type"]
        assert "statistics: status 403" in body["error"]["reason"]
    finally:
        await runner.cleanup()


async def test_not_ready_when_the_cluster_is_unreachable():
    status, body = await ready("http://127.0.0.1:1")
    assert status == 503 and body["checks"]["upstream"] == "bmx_upstream_unreachable_exception"
    assert "upstream" in body["error"]["reason"]


def test_json_logs_keep_stack_traces_and_flatten_fields():
    stream = io.StringIO()
    log = logging.getLogger("bmx_rerank.test_json_logs")
    log.addHandler(json_log_handler(stream))
    log.propagate = False
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("proxy error", extra={"fields": {"error": "ValueError", "status": 500}})
    entry = json.loads(stream.getvalue())
    assert entry["level"] == "error" and entry["msg"] == "proxy error" and entry["status"] == 500
    assert "Traceback" in entry["exc_info"] and "ValueError: boom" in entry["exc_info"]
    assert entry["ts"].endswith("Z") and entry["logger"] == "bmx_rerank.test_json_logs"


def test_the_line_a_request_has_every_lines_keys_and_follows_the_level():
    """Where `serve` set logging up, the line a request is written straight to its stream, shaped as
    every other line; at WARNING it is not written at all."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        for chosen, expected in (("INFO", 1), ("WARNING", 0)):
            stream = io.StringIO()
            serve_logs(chosen, stream)
            logging.getLogger("bmx_rerank.proxy").warning("other", extra={"fields": {"n": 1}})
            ACCESS.write({"method": "POST", "path": "/i/_search", "status": 200, "kind": "passthrough"})
            lines = [json.loads(line) for line in stream.getvalue().splitlines()]
            assert len(lines) == 1 + expected
            other, *access = lines
            assert other["msg"] == "other" and other["n"] == 1
            for entry in access:
                assert entry == {
                    "ts": entry["ts"],
                    "level": "info",
                    "logger": "bmx_rerank.proxy",
                    "msg": "request",
                    "method": "POST",
                    "path": "/i/_search",
                    "status": 200,
                    "kind": "passthrough",
                }
                assert (
                    entry["ts"][:4] == other["ts"][:4]
                    and entry["ts"].endswith("Z")
                    and len(entry["ts"]) == 20
                )
    finally:
        ACCESS.stream = None
        logging.basicConfig(handlers=handlers, level=level, force=True)


async def test_logs_never_carry_credentials_or_headers():
    from tests.support.fake_cluster import FakeCluster, run_proxy

    stream = io.StringIO()
    root = logging.getLogger()
    handler = json_log_handler(stream)
    root.addHandler(handler)
    old = root.level
    root.setLevel(logging.DEBUG)
    fake_runner, upstream = await serve_app(FakeCluster().app())
    runner, url = await run_proxy(upstream)
    try:
        secret = {"Authorization": "Basic c2VjcmV0LXBhc3M=", "Cookie": "sid=topsecret"}
        search = {"size": 2, "ext": {"bmx": {"field": "body", "query": "t3", "window_size": 5}}}
        async with aiohttp.ClientSession() as client:
            async with client.post(f"{url}/docs/_search", json=search, headers=secret) as r:
                assert r.status == 200
            async with client.post(f"{url}/missing/_search", json=search, headers=secret) as r:
                assert r.status == 404
    finally:
        await runner.cleanup()
        await fake_runner.cleanup()
        root.removeHandler(handler)
        root.setLevel(old)
    logged = stream.getvalue()
    assert {"/docs/_search", "/missing/_search"} <= {
        json.loads(line).get("path") for line in logged.splitlines()
    }
    for needle in ("c2VjcmV0", "topsecret", "Authorization", "Cookie"):
        assert needle not in logged
