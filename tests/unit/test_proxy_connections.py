"""Client connection limits: an idle connection is closed after `--idle-timeout`, a request head
trickling in is closed after `--header-timeout`, and past `--max-connections` the oldest idle connection
(the one idle longest) makes room for the new one, so a normal request is always answered; each counted in the metrics."""

from __future__ import annotations

import asyncio
import socket

import pytest

from bmx_rerank.proxy import start_server
from bmx_rerank.proxy.server import ConnectionLimits
from tests.support.fake_cluster import FakeCluster, proxy_app
from tests.support.serving import serve_app


@pytest.fixture
async def upstream():
    fake = FakeCluster()
    runner, url = await serve_app(fake.app())
    yield url
    await runner.cleanup()


async def proxy(upstream, **limits):
    app = proxy_app(upstream, ("docs",))
    runner, url = await start_server(app, limits=ConnectionLimits(**limits))
    host, port = url.removeprefix("http://").split(":")
    return runner, (host, int(port))


async def closed_by_peer(sock: socket.socket, within: float) -> bool:
    loop = asyncio.get_running_loop()
    sock.setblocking(False)
    try:
        return await asyncio.wait_for(loop.sock_recv(sock, 1), within) == b""
    except (asyncio.TimeoutError, ConnectionResetError):  # TimeoutError itself from Python 3.11 on
        return False


async def ask(sock: socket.socket) -> bytes:
    """A request on an open connection, read without blocking the loop the proxy runs on."""
    loop = asyncio.get_running_loop()
    sock.setblocking(False)
    await loop.sock_sendall(sock, b"GET /_bmx/health HTTP/1.1\r\nHost: x\r\n\r\n")
    return await asyncio.wait_for(loop.sock_recv(sock, 4096), 5)


async def get(addr, path="/_bmx/health") -> bytes:
    reader, writer = await asyncio.open_connection(*addr)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    data = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    return data


async def metrics(addr) -> str:
    return (await get(addr, "/_bmx/metrics")).decode()


async def test_an_idle_connection_is_closed_after_the_idle_timeout(upstream):
    runner, addr = await proxy(upstream, idle_timeout=0.3, header_timeout=0)
    try:
        with socket.create_connection(addr) as sock:
            assert await closed_by_peer(sock, 2.0)
        assert 'bmx_client_connections_closed_total{reason="idle"} 1.0' in await metrics(addr)
    finally:
        await runner.cleanup()


async def test_a_request_head_trickling_in_is_closed_after_the_header_timeout(upstream):
    runner, addr = await proxy(upstream, idle_timeout=60, header_timeout=0.3)
    try:
        with socket.create_connection(addr) as sock:
            sock.sendall(b"GET /_bmx/health HTTP/1.1\r\n")  # and the rest never comes
            assert await closed_by_peer(sock, 2.0)
        with socket.create_connection(addr) as sock:  # a connection that sent nothing is only idle
            assert not await closed_by_peer(sock, 0.6)
        assert b"200 OK" in await get(addr)
        assert 'bmx_client_connections_closed_total{reason="header_timeout"} 1.0' in await metrics(addr)
    finally:
        await runner.cleanup()


async def test_a_connection_asked_often_outlives_its_idle_and_header_timeouts(upstream):
    """The timeouts count from the last activity, not from when their timers were armed: requests every
    0.15 s keep a connection open through many idle (0.4 s) and header (0.3 s) timeouts; once it
    falls silent, it is closed as idle."""
    runner, addr = await proxy(upstream, idle_timeout=0.4, header_timeout=0.3)
    try:
        with socket.create_connection(addr) as sock:
            for _ in range(12):  # 1.8 s
                assert b"200 OK" in await ask(sock)
                await asyncio.sleep(0.15)
            assert await closed_by_peer(sock, 2.0)
        text = await metrics(addr)
        assert 'bmx_client_connections_closed_total{reason="idle"} 1.0' in text
        assert 'reason="header_timeout"' not in text
    finally:
        await runner.cleanup()


async def test_past_the_cap_the_oldest_idle_connection_makes_room(upstream):
    runner, addr = await proxy(upstream, idle_timeout=60, header_timeout=0, max_connections=5)
    socks = []
    try:
        for _ in range(5):
            socks.append(socket.create_connection(addr))
        await asyncio.sleep(1.1)  # idle long enough to be closed for a new one (MIN_IDLE)
        answered = asyncio.ensure_future(ask(socks[0]))  # the oldest, but active
        await asyncio.sleep(0.2)
        assert b"200 OK" in await get(addr), "a normal request is answered at the cap"
        assert await closed_by_peer(socks[1], 2.0), "the connection idle longest went"
        assert b"200 OK" in await answered, "not the one active a moment ago"
        text = await metrics(addr)
        assert 'bmx_client_connections_closed_total{reason="cap"}' in text
        assert "bmx_client_connections " in text
    finally:
        for sock in socks:
            sock.close()
        await runner.cleanup()


async def test_connections_younger_than_min_idle_are_not_closed_for_a_new_one(upstream):
    """A client's fresh connection, its request on the way, looks idle: it is not the victim; the
    newcomer is refused instead (counted), and the fresh ones are still served."""
    runner, addr = await proxy(upstream, idle_timeout=60, header_timeout=0, max_connections=2)
    try:
        first, second = socket.create_connection(addr), socket.create_connection(addr)
        await asyncio.sleep(0.1)
        with socket.create_connection(addr) as third:
            assert await closed_by_peer(third, 2.0)
        assert b"200 OK" in await ask(first)
        first.close()
        second.close()
        await asyncio.sleep(0.1)
        assert 'bmx_client_connections_closed_total{reason="cap_refused"} 1.0' in await metrics(addr)
    finally:
        await runner.cleanup()


async def test_a_burst_of_connections_waits_for_the_proxy_to_accept_it(upstream):
    """400 connections opened at once while the proxy's event loop is busy (this test holds it) all
    reach the proxy once it runs: with a backlog of 128 the kernel drops the rest into SYN cookies, and
    their clients hold connections the proxy never sees, so that its cap can neither count nor close
    them (`server.BACKLOG`)."""
    runner, addr = await proxy(upstream, idle_timeout=60, header_timeout=0, max_connections=1000)
    socks = []
    try:
        for _ in range(400):  # blocking: the proxy accepts none meanwhile
            socks.append(socket.create_connection(addr, timeout=5))
        await asyncio.sleep(0.5)
        text = await metrics(addr)  # one more connection: this request's
        open_now = next(line for line in text.splitlines() if line.startswith("bmx_client_connections "))
        assert float(open_now.split()[-1]) == 401, open_now
    finally:
        for sock in socks:
            sock.close()
        await runner.cleanup()
