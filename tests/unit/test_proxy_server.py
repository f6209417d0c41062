"""The proxy's own HTTP/1.1 server, on the wire: keep-alive and pipelining answered in order, HTTP/1.0
clients, `Expect: 100-continue`, bodies streamed both ways, heads past their bounds, CONNECT and
upgrades, a client that goes away mid-answer. Raw sockets against the proxy with a fake cluster
behind it."""

from __future__ import annotations

import asyncio
import hashlib
import json

import pytest

from bmx_rerank.proxy import server
from tests.support.fake_cluster import FakeCluster, run_proxy
from tests.support.serving import serve_app


@pytest.fixture
async def proxy():
    fake = FakeCluster()
    upstream_runner, upstream = await serve_app(fake.app())
    runner, url = await run_proxy(upstream)
    host, port = url.removeprefix("http://").split(":")
    yield runner, (host, int(port))
    await runner.cleanup()
    await upstream_runner.cleanup()


async def exchange(addr, data: bytes, *, until_closed: bool = True, timeout: float = 5.0) -> bytes:
    """Send `data`, read what comes back (until the proxy closes the connection, or a pause)."""
    reader, writer = await asyncio.open_connection(*addr)
    writer.write(data)
    await writer.drain()
    out = b""
    try:
        while chunk := await asyncio.wait_for(reader.read(1 << 16), timeout if until_closed else 0.5):
            out += chunk
    except asyncio.TimeoutError:
        if until_closed:
            raise
    finally:
        writer.close()
    return out


def answers(data: bytes) -> list[tuple[bytes, dict[str, str], bytes]]:
    """The answers in a byte stream: (status line, headers, body), bodies framed by their length or
    their chunks."""
    out = []
    while data:
        head, _, data = data.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (x.decode().partition(":") for x in lines[1:])}
        if "content-length" in headers:
            n = int(headers["content-length"])
            body, data = data[:n], data[n:]
        elif headers.get("transfer-encoding") == "chunked":
            body = b""
            while True:
                size_line, _, data = data.partition(b"\r\n")
                size = int(size_line, 16)
                body, data = body + data[:size], data[size + 2 :]
                if size == 0:
                    break
        else:
            body, data = data, b""
        out.append((lines[0], headers, body))
    return out


async def test_pipelined_requests_are_answered_in_order_on_one_connection(proxy):
    _, addr = proxy
    requests = b"".join(
        f"POST /echo/{i} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n{body}".encode()
        for i, body in enumerate(['{"n":0}', '{"n":1}', '{"n":2}'])
    )
    got = answers(await exchange(addr, requests + b"GET /_bmx/health HTTP/1.1\r\nConnection: close\r\n\r\n"))
    assert [json.loads(body) for _, _, body in got[:3]] == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert got[3][0] == b"HTTP/1.1 200 OK" and json.loads(got[3][2])["status"] == "ok"


async def test_an_http_1_0_client_gets_an_http_1_0_answer_and_its_connection_closed(proxy):
    _, addr = proxy
    got = answers(await exchange(addr, b"GET /_bmx/health HTTP/1.0\r\n\r\n"))
    assert len(got) == 1 and got[0][0] == b"HTTP/1.0 200 OK" and json.loads(got[0][2])["status"] == "ok"


async def test_an_http_1_0_keep_alive_connection_stays_open(proxy):
    _, addr = proxy
    ask = b"GET /_bmx/health HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"
    got = answers(await exchange(addr, ask + ask, until_closed=False))
    assert [status for status, _, _ in got] == [b"HTTP/1.0 200 OK"] * 2
    assert got[0][1]["connection"] == "keep-alive"


async def test_a_streamed_answer_goes_to_an_http_1_0_client_to_the_connections_end(proxy):
    _, addr = proxy
    raw = await exchange(addr, b"GET /source?chunks=2 HTTP/1.0\r\n\r\n")
    status, headers, body = answers(raw)[0]
    assert status.endswith(b"200 OK") and "transfer-encoding" not in headers and len(body) == 2 << 20


async def test_a_streamed_answer_goes_chunked_to_an_http_1_1_client(proxy):
    _, addr = proxy
    raw = await exchange(addr, b"GET /source?chunks=3 HTTP/1.1\r\nConnection: close\r\n\r\n")
    status, headers, body = answers(raw)[0]
    assert headers.get("transfer-encoding") == "chunked" and body == b"x" * (3 << 20)


async def test_expect_100_continue_is_answered_when_the_body_is_read(proxy):
    _, addr = proxy
    reader, writer = await asyncio.open_connection(*addr)
    body = b"y" * 100_000
    writer.write(
        b"POST /sink HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nConnection: close\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
    )
    await writer.drain()
    interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    writer.write(body)
    rest = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    status, _, answer = answers(rest)[0]
    assert status.endswith(b"200 OK")
    assert json.loads(answer) == {"bytes": len(body), "sha256": hashlib.sha256(body).hexdigest()}


async def test_a_chunked_request_body_streams_through_whole(proxy):
    _, addr = proxy
    parts = [b"a" * 70_000, b"b" * 5, b"c" * 300_000]
    chunked = b"".join(b"%x\r\n%b\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"
    raw = await exchange(
        addr, b"POST /sink HTTP/1.1\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n" + chunked
    )
    whole = b"".join(parts)
    assert json.loads(answers(raw)[0][2]) == {
        "bytes": len(whole),
        "sha256": hashlib.sha256(whole).hexdigest(),
    }


async def test_an_endless_header_is_cut_once_the_head_passes_its_bound(proxy):
    """llhttp keeps a header's bytes until it ends: one that never ends must not grow the proxy. The
    proxy answers the 400 and closes; a client still sending sees its connection reset."""
    _, addr = proxy
    reader, writer = await asyncio.open_connection(*addr)
    writer.write(b"GET / HTTP/1.1\r\nX-Endless: ")
    sent, cut = 0, False
    try:
        while sent < 64 * server.MAX_HEAD:
            writer.write(b"z" * 4096)
            await asyncio.wait_for(writer.drain(), 5)
            sent += 4096
            await asyncio.sleep(0)
    except ConnectionError:
        cut = True
    if not cut:  # every byte buffered by the kernels: the answer is there to read
        raw = await asyncio.wait_for(reader.read(), 5)
        assert answers(raw)[0][0] == b"HTTP/1.1 400 Bad Request"
    writer.close()
    assert cut or sent == 64 * server.MAX_HEAD


async def test_a_head_past_its_bound_is_answered_in_elasticsearch_shape(proxy):
    _, addr = proxy
    headers = b"".join(b"X-%d: %b\r\n" % (i, b"v" * 4000) for i in range(20))  # 80 KB, each under 8 KiB
    raw = await exchange(addr, b"GET / HTTP/1.1\r\n" + headers + b"\r\n")
    status, _, body = answers(raw)[0]
    assert status == b"HTTP/1.1 400 Bad Request"
    assert json.loads(body)["error"]["type"] == "too_long_http_header_exception"


async def test_connect_is_refused_in_elasticsearch_shape_and_the_connection_ends(proxy):
    """No tunnel: a 405 as the cluster answers, and the bytes after the head are never read as HTTP."""
    _, addr = proxy
    raw = await exchange(addr, b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\nsecret")
    (status, headers, body), *rest = answers(raw)
    assert status == b"HTTP/1.1 405 Method Not Allowed" and rest == [] and headers["connection"] == "close"
    assert json.loads(body)["error"]["type"] == "method_not_allowed_exception"


async def test_an_upgrade_request_is_answered_as_http_then_the_connection_ends(proxy):
    _, addr = proxy
    raw = await exchange(
        addr,
        b"GET /_bmx/health HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
        b"GET /_bmx/health HTTP/1.1\r\n\r\n",
    )
    got = answers(raw)
    assert len(got) == 1 and got[0][0] == b"HTTP/1.1 200 OK" and got[0][1]["connection"] == "close"


async def test_bad_framing_mid_body_answers_that_request_in_elasticsearch_shape(proxy):
    _, addr = proxy
    raw = await exchange(
        addr,
        b"POST /docs/_search HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\nzz\r\n",
    )
    status, headers, body = answers(raw)[0]
    assert status == b"HTTP/1.1 400 Bad Request" and headers["connection"] == "close"
    assert json.loads(body)["error"]["type"] == "bad_http_request_exception"


async def test_a_body_answered_before_it_is_read_is_read_off_so_the_client_gets_the_answer():
    """A 413 from the length alone ends the connection, but only once the client's body is in (read and
    dropped): a client that writes its whole body before it reads gets the 413, not a reset."""
    fake = FakeCluster()
    upstream_runner, upstream = await serve_app(fake.app())
    runner, url = await run_proxy(upstream, max_content_length=1 << 20)
    host, port = url.removeprefix("http://").split(":")
    try:
        body = b'{"pad":"' + b" " * (4 << 20) + b'"}'
        head = f"POST /docs/_search HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        raw = await exchange((host, int(port)), head.encode() + body)
        status, headers, answer = answers(raw)[0]
        assert status == b"HTTP/1.1 413 Request Entity Too Large" and headers["connection"] == "close"
        assert json.loads(answer)["error"]["type"] == "content_too_long_exception"
    finally:
        await runner.cleanup()
        await upstream_runner.cleanup()


async def test_a_client_gone_mid_answer_leaves_the_proxy_serving(proxy):
    _, addr = proxy
    reader, writer = await asyncio.open_connection(*addr)
    writer.write(b"GET /source?chunks=20 HTTP/1.1\r\n\r\n")
    await writer.drain()
    await reader.readexactly(1 << 16)  # some of it, then away
    writer.transport.abort()
    await asyncio.sleep(0.2)
    raw = await exchange(addr, b"GET /_bmx/health HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert answers(raw)[0][0] == b"HTTP/1.1 200 OK"


async def test_cleanup_waits_for_a_request_under_way(proxy):
    runner, addr = proxy
    reader, writer = await asyncio.open_connection(*addr)
    writer.write(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")  # the fake cluster answers in 1 s
    await writer.drain()
    await asyncio.sleep(0.2)
    cleaned = asyncio.ensure_future(runner.cleanup())
    raw = await asyncio.wait_for(reader.read(), 10)
    await cleaned
    status, headers, body = answers(raw)[0]
    assert status == b"HTTP/1.1 200 OK" and body == b"late" and headers["connection"] == "close"
    writer.close()


# ---- answers relayed as the cluster sent them ----


async def raw_cluster(answer):
    """A cluster that reads one request a connection and answers with `answer(writer)`."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            (int(x.split(b":")[1]) for x in head.split(b"\r\n") if x.lower().startswith(b"content-length")), 0
        )
        await reader.readexactly(length)
        await answer(writer)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def test_an_answer_is_relayed_as_the_cluster_sent_it_framing_and_all():
    wire = (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nX-Twice: a\r\nX-Twice: b\r\n"
        b'Transfer-Encoding: chunked\r\n\r\n3;ext=1\r\n{"a\r\n6\r\n":[1]}\r\n0\r\n\r\n'
    )

    async def answer(writer):
        writer.write(wire[:40])
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(wire[40:])
        await writer.drain()

    cluster, upstream = await raw_cluster(answer)
    runner, url = await run_proxy(upstream)
    host, port = url.removeprefix("http://").split(":")
    try:
        raw = await exchange(
            (host, int(port)), b"GET /x/_doc/1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        # the cluster's bytes, with the one line the proxy adds: it ends the connection
        assert raw == wire.replace(b"200 OK\r\n", b"200 OK\r\nConnection: close\r\n", 1)
    finally:
        await runner.cleanup()
        cluster.close()


async def test_an_answer_that_stalls_midway_is_cut_after_the_read_timeout():
    async def answer(writer):
        writer.write(b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{"a"')
        await writer.drain()
        await asyncio.sleep(30)

    cluster, upstream = await raw_cluster(answer)
    runner, url = await run_proxy(upstream, timeout=0.5)
    host, port = url.removeprefix("http://").split(":")
    try:
        started = asyncio.get_running_loop().time()
        raw = await exchange((host, int(port)), b"GET /x/_doc/1 HTTP/1.1\r\nHost: x\r\n\r\n")
        waited = asyncio.get_running_loop().time() - started
        assert raw.endswith(b'{"a"') and 0.4 < waited < 5, (raw, waited)  # its head went: only a cut is left
    finally:
        await runner.cleanup()
        cluster.close()


async def test_a_cluster_that_ends_its_connection_ends_the_clients_after_its_answer():
    async def answer(writer):
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\ncontent-length: 2\r\n\r\n{}")
        await writer.drain()
        writer.close()

    cluster, upstream = await raw_cluster(answer)
    runner, url = await run_proxy(upstream)
    host, port = url.removeprefix("http://").split(":")
    try:
        ask = b"GET /x/_doc/1 HTTP/1.1\r\nHost: x\r\n\r\n"
        raw = await exchange((host, int(port)), ask + ask)  # the second is never read
        assert raw == b"HTTP/1.1 200 OK\r\nConnection: close\r\ncontent-length: 2\r\n\r\n{}"
    finally:
        await runner.cleanup()
        cluster.close()
