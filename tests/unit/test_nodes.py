"""Several upstream nodes: parsing, round robin, failover only when a request cannot have done anything."""

from __future__ import annotations

import asyncio
import socket

import aiohttp
import pytest
from aiohttp import web
from yarl import URL

from bmx_rerank.nodes import FailoverSession, NodePool, may_resend, parse_nodes


def test_parse_nodes_repeated_and_comma_lists():
    assert parse_nodes(["http://a:9200/", "https://b:9200, https://c:9200"]) == (
        "http://a:9200",
        "https://b:9200",
        "https://c:9200",
    )
    for bad in (
        ["ftp://a"],
        ["a:9200"],
        ["http://u:p@a:9200"],
        ["http://a?x=1"],
        [""],
        ["http://a,http://a"],
    ):
        with pytest.raises(ValueError):
            parse_nodes(bad)


def test_round_robin_and_quarantine():
    now = [0.0]
    pool = NodePool(["http://a", "http://b", "http://c"], quarantine=5, clock=lambda: now[0])
    assert [pool.order()[0] for _ in range(4)] == ["http://a", "http://b", "http://c", "http://a"]
    pool.failed("http://c")  # next turn would start at b: c goes last while quarantined
    assert pool.order() == ["http://b", "http://a", "http://c"]
    assert pool.order() == ["http://a", "http://b", "http://c"]
    now[0] = 6.0
    assert pool.order() == ["http://a", "http://b", "http://c"]
    assert pool.order() == ["http://b", "http://c", "http://a"]  # c is back in its place


def test_may_resend_only_reads():
    u = URL
    assert may_resend("GET", u("/_cluster/health"), None)
    assert may_resend("POST", u("/idx/_search"), b"{}")
    assert may_resend("POST", u("/_msearch"), b"{}")
    assert may_resend("POST", u("/_mtermvectors"), b"{}")
    assert not may_resend("POST", u("/_search/scroll"), b"{}")  # moves the cursor
    assert not may_resend("POST", u("/idx/_doc"), b"{}")
    assert not may_resend("POST", u("/_bulk"), b"")
    assert not may_resend("PUT", u("/idx"), None)

    async def stream():
        yield b"{}"

    assert not may_resend("POST", u("/idx/_search"), stream())  # a stream cannot be sent twice


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Node:
    """A fake node that counts what it got; `drop` cuts every connection before answering."""

    def __init__(self, name: str, drop: bool = False) -> None:
        self.name, self.drop, self.seen = name, drop, []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.seen.append((request.method, request.path, await request.read()))
        if self.drop:
            assert request.transport is not None
            request.transport.close()
            await asyncio.sleep(0.1)
        return web.json_response({"node": self.name})

    async def start(self) -> tuple[web.AppRunner, str]:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return runner, f"http://127.0.0.1:{port}"


async def test_round_robin_and_failover_on_refused_connection():
    a, b = Node("a"), Node("b")
    (ra, ua), (rb, ub) = await a.start(), await b.start()
    dead = f"http://127.0.0.1:{_free_port()}"  # nothing listens: refused, never sent
    pool = NodePool([ua, dead, ub])
    session = FailoverSession(aiohttp.ClientSession(), pool)
    try:
        names = []
        for _ in range(6):
            # a write too: a refused connection never carried it
            async with session.post(f"{pool.base}/idx/_doc", data=b"{}") as resp:
                names.append((await resp.json())["node"])
        # the dead node's turns go to the next one; every request answered, each sent once
        assert names[:3] == ["a", "b", "b"] and set(names) == {"a", "b"}
        assert len(a.seen) + len(b.seen) == 6
    finally:
        await session.close()
        await ra.cleanup()
        await rb.cleanup()


async def test_dropped_write_is_not_resent_but_a_search_is():
    cut, ok = Node("cut", drop=True), Node("ok")
    (rc, uc), (ro, uo) = await cut.start(), await ok.start()
    pool = NodePool([uc, uo])
    session = FailoverSession(aiohttp.ClientSession(), pool)
    try:
        with pytest.raises((aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)):
            await session.post(f"{pool.base}/idx/_bulk", data=b'{"index":{}}\n{}\n')
        assert len(cut.seen) == 1 and ok.seen == []  # it reached a node: never sent again
        session.pool = pool = NodePool([uc, uo])  # `cut` first again
        resp = await session.post(f"{pool.base}/idx/_search", data=b"{}")
        assert (await resp.json())["node"] == "ok"  # a search is: cut on the first node, answered by the next
        assert len(cut.seen) == 2 and len(ok.seen) == 1
    finally:
        await session.close()
        await rc.cleanup()
        await ro.cleanup()


@pytest.mark.parametrize("nodes", [1, 2])
async def test_a_request_outside_the_cluster_is_refused_with_one_node_or_several(nodes):
    node = Node("only")
    runner, url = await node.start()
    pool = NodePool([url] * nodes)
    session = FailoverSession(aiohttp.ClientSession(), pool)
    try:
        with pytest.raises(ValueError, match="outside the upstream cluster"):
            await session.get("http://127.0.0.2:9/idx/_search")
        resp = await session.get(f"{pool.base}/idx/_search")
        assert (await resp.json())["node"] == "only" and len(node.seen) == 1
    finally:
        await session.close()
        await runner.cleanup()
