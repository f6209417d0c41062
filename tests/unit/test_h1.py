"""The proxy's own HTTP/1.1 client (bmx_rerank/h1.py) against small servers: answers framed every way
HTTP frames them, connections kept and reused only when an answer was read whole, and each failure
raised as the aiohttp exception the callers already map to 502/504 and failover."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import orjson
import pytest
from aiohttp import web
from yarl import URL

from bmx_rerank.h1 import HIGH_WATER, H1Session
from tests.support.net import free_port
from tests.support.serving import serve_app


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, list[str]]]:
    """An aiohttp app answering in each framing; the list logs each request's peer port (its connection)."""
    seen: list[str] = []

    async def echo(request: web.Request) -> web.StreamResponse:
        seen.append(request.transport.get_extra_info("peername")[1])  # type: ignore[union-attr]
        body = await request.read()
        kind = request.match_info["kind"]
        if kind == "chunked":
            resp = web.StreamResponse(headers={"Content-Type": "application/json"})
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            for piece in (b'{"a":', b" 1, ", b'"n": %d}' % len(body)):
                await resp.write(piece)
            await resp.write_eof()
            return resp
        if kind == "big":
            return web.Response(body=b"x" * (20 * HIGH_WATER))
        headers = {"X-Twice": "a", "Set-Cookie": "s=1"}
        resp = web.json_response(
            {"n": len(body), "host": request.host, "q": request.query_string}, status=201
        )
        resp.headers.extend(headers)
        resp.headers.add("X-Twice", "b")
        return resp

    app = web.Application()
    app.router.add_route("*", "/{kind}", echo)
    runner, url = await serve_app(app)
    yield url, seen
    await runner.cleanup()


@pytest.fixture
async def session() -> AsyncIterator[H1Session]:
    fallback = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=2))
    h1 = H1Session(fallback, limit=4, tls=None)
    yield h1
    await h1.close()


async def test_answers_in_every_framing_on_one_kept_connection(server, session) -> None:
    url, seen = server
    resp = await session.request("POST", URL(f"{url}/plain?a=%20b", encoded=True), data=b"12345")
    assert (resp.status, resp.reason, resp.content_type) == (201, "Created", "application/json")
    assert resp.headers.getall("X-Twice") == ["a", "b"] and resp.content_length == len(await resp.read())
    resp = await session.request("GET", URL(f"{url}/chunked"))
    assert await resp.read() == b'{"a": 1, "n": 0}' and resp.content_length is None
    resp = await session.request("POST", URL(f"{url}/big"), data=b"")
    got = 0
    async for chunk in resp.content.iter_any():  # read as it comes, the connection paused between
        got += len(chunk)
    assert got == 20 * HIGH_WATER
    assert len(set(seen)) == 1, "one connection, kept between answers read whole"


async def test_an_answer_left_unread_closes_its_connection(server, session) -> None:
    url, seen = server
    resp = await session.request("GET", URL(f"{url}/big"))
    resp.release()
    await (await session.request("GET", URL(f"{url}/plain"))).read()
    assert len(set(seen)) == 2, "the next request on a new connection"


async def test_the_session_puts_no_more_than_its_limit_under_way(server) -> None:
    url, _ = server
    h1 = H1Session(aiohttp.ClientSession(), limit=2, tls=None)
    try:
        held = [await h1.request("GET", URL(f"{url}/plain")) for _ in range(2)]
        third = asyncio.ensure_future(h1.request("GET", URL(f"{url}/plain")))
        await asyncio.sleep(0.05)
        assert not third.done(), "waits for a slot"
        held[0].release()
        assert (await asyncio.wait_for(third, 5)).status == 201
    finally:
        await h1.close()


async def _raw_server(
    handle: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
) -> tuple[asyncio.AbstractServer, str]:
    port = free_port()
    srv = await asyncio.start_server(handle, "127.0.0.1", port)
    return srv, f"http://127.0.0.1:{port}"


async def _read_head(reader: asyncio.StreamReader) -> None:
    await reader.readuntil(b"\r\n\r\n")


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (b"", aiohttp.ServerDisconnectedError),  # closed before answering: it may have been sent
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", aiohttp.ClientPayloadError),  # cut
        (b"SSH-2.0-OpenSSH\r\n\r\n", aiohttp.ClientPayloadError),  # not HTTP
    ],
)
async def test_a_broken_answer_is_the_aiohttp_error_callers_map(session, answer, error) -> None:
    async def handle(reader, writer) -> None:
        await _read_head(reader)
        writer.write(answer)
        await writer.drain()
        writer.close()

    srv, url = await _raw_server(handle)
    try:
        with pytest.raises(error):
            resp = await session.request("GET", URL(f"{url}/x"))
            await resp.read()
    finally:
        srv.close()


async def test_an_answer_without_a_length_ends_with_its_connection(session) -> None:
    async def handle(reader, writer) -> None:
        await _read_head(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of it")
        await writer.drain()
        writer.close()

    srv, url = await _raw_server(handle)
    try:
        resp = await session.request("GET", URL(f"{url}/x"))
        assert await resp.read() == b"all of it"
    finally:
        srv.close()


async def test_no_connection_is_reused_after_a_400_the_cluster_reads_no_more_after(session) -> None:
    """A request the cluster could not decode (a header too long) gets a 400 without `close`, and the
    connection answers nothing after it: the next request must go on a new one, not hang."""
    connections = 0

    async def handle(reader, writer) -> None:
        nonlocal connections
        connections += 1
        await _read_head(reader)
        if connections == 1:
            writer.write(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 2\r\n\r\n{}")
            await writer.drain()
            await asyncio.sleep(5)  # reads nothing more, closes nothing
            return
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()

    srv, url = await _raw_server(handle)
    try:
        first = await session.request("GET", URL(f"{url}/x"))
        assert first.status == 400 and await first.read() == b"{}"
        second = await asyncio.wait_for(session.request("GET", URL(f"{url}/x")), 2)
        assert second.status == 200 and await second.read() == b"ok" and connections == 2
    finally:
        srv.close()


async def test_refused_and_slow_are_the_errors_failover_and_504_read(session) -> None:
    with pytest.raises(aiohttp.ClientConnectorError):  # never connected: another node may take it
        await session.request("GET", URL(f"http://127.0.0.1:{free_port()}/x"))

    async def silent(reader, writer) -> None:
        await _read_head(reader)
        await asyncio.sleep(5)

    srv, url = await _raw_server(silent)
    try:
        with pytest.raises(asyncio.TimeoutError):
            await session.request("GET", URL(f"{url}/x"), timeout=aiohttp.ClientTimeout(total=0.2))
        with pytest.raises(aiohttp.ServerTimeoutError):
            await session.request("GET", URL(f"{url}/x"), timeout=aiohttp.ClientTimeout(sock_read=0.2))
    finally:
        srv.close()


async def test_what_it_does_not_do_goes_by_aiohttp(server, session, monkeypatch) -> None:
    url, _ = server
    sent: list[str] = []
    real = session.fallback.request

    async def counting(method, target, **kwargs):
        sent.append(method)
        return await real(method, target, **kwargs)

    monkeypatch.setattr(session.fallback, "request", counting)

    async def stream() -> AsyncIterator[bytes]:
        yield b"a"

    for method, kwargs in (
        ("HEAD", {}),
        ("POST", {"data": stream()}),
        ("POST", {"data": b"x", "headers": {"Expect": "100-continue"}}),
    ):
        resp = await session.request(method, URL(f"{url}/plain"), **kwargs)
        resp.release()
    assert sent == ["HEAD", "POST", "POST"]


async def test_a_small_answer_is_in_hand_at_once_a_large_one_is_streamed(server, session) -> None:
    url, seen = server
    resp = await session.request("GET", URL(f"{url}/plain"))
    whole = resp.in_hand()
    assert whole is not None and orjson.loads(whole)["n"] == 0
    resp = await session.request("GET", URL(f"{url}/big"))
    assert resp.in_hand() is None, "not all come yet: read as it comes"
    assert len(await resp.read()) == 20 * HIGH_WATER
    await (await session.request("GET", URL(f"{url}/plain"))).read()
    assert len(set(seen)) == 1, "each answer used whole: one connection throughout"
