"""HTTP/1.1 exchanges with the cluster on keep-alive connections of the proxy's own, at a fraction of
the CPU of aiohttp's client (benchmarks/RESULTS.md, "client relay": an aiohttp hop spends most of its
time in its client).

`H1Session` stands where an `aiohttp.ClientSession` stood, under `nodes.FailoverSession`: a request
whose body is in memory is written in one go on a pooled connection, and its answer is parsed by
httptools and read as it comes (reading paused while the caller lags). What it does not do goes by the
aiohttp session it wraps, as before: a body that is a stream, `HEAD` (an answer whose length announces
a body it does not carry), `Expect: 100-continue`. Its failures are aiohttp's own exceptions, which
every caller already turns into 502/504 and failover (`nodes`)."""

from __future__ import annotations

import asyncio
import collections
import ssl
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import aiohttp
import httptools
from aiohttp.client_reqrep import ConnectionKey
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

# Answer bytes buffered before the connection stops reading: a caller that relays a large answer to a
# slow client holds at most this much of it (aiohttp's own stream reader pauses at 2 x 64 KiB).
HIGH_WATER = 1 << 18
BODY_METHODS = frozenset(("POST", "PUT", "PATCH"))  # a request without a body still says Content-Length: 0
# Headers of an answer that say something of its connection other than its framing: an answer carrying
# one is not relayed as its bytes came (`H1Response.pipe`) but rebuilt without them.
UNRELAYED = frozenset(("keep-alive", "proxy-authenticate", "proxy-connection", "te", "trailer", "upgrade"))


class Client(Protocol):
    """Where an answer is relayed as it comes (`H1Response.pipe`): the proxy's client connection."""

    closing: bool  # it ends after this answer

    def send(self, data: bytes) -> None: ...
    def abort(self) -> None: ...
    def throttle(self, listener: Callable[[bool], None] | None) -> None:
        """`listener(True)` while the client reads slower than it is sent to, `(False)` once it caught
        up; None: no listener."""


class H1Session:
    """What `FailoverSession` uses of a `ClientSession` (`request`, `closed`, `close`), with at most
    `limit` exchanges under way (each on its own connection) and the idle connections kept per node."""

    def __init__(self, fallback: aiohttp.ClientSession, *, limit: int, tls: ssl.SSLContext | None) -> None:
        self.fallback = fallback
        self.tls = tls
        self._slots = asyncio.Semaphore(limit)
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        # the loop it runs on, asked once: before Python 3.12 each `get_running_loop()` is a getpid()
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def closed(self) -> bool:
        return self.fallback.closed

    async def close(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.transport.close()
        self._idle.clear()
        await self.fallback.close()

    async def request(self, method: str, url: URL, **kwargs: Any) -> Any:
        """The answer's head, its body to read (`H1Response`); by the wrapped session where the module
        doc says."""
        data = kwargs.get("data")
        headers = kwargs.get("headers")
        if not isinstance(headers, CIMultiDict):  # read here, never changed: the caller's own is kept
            headers = CIMultiDict(headers or {})
        if (
            (data is not None and not isinstance(data, (bytes, bytearray, str)))
            or method == "HEAD"
            or "Expect" in headers
            or url.scheme not in ("http", "https")
        ):
            return await self.fallback.request(method, url, **kwargs)
        body = data.encode() if isinstance(data, str) else bytes(data or b"")
        timeout = kwargs.get("timeout")
        if not isinstance(timeout, aiohttp.ClientTimeout):
            timeout = self.fallback.timeout
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        deadline = None if timeout.total is None else loop.time() + timeout.total
        await self._slots.acquire()
        conn = None
        try:
            conn = await self._connection(url, timeout, deadline)
            conn.send(_head(method, url, headers, body) + body)
            await conn.head_read(_left(deadline, loop), timeout.sock_read)
        except BaseException:  # failed, timed out or cancelled mid-exchange: that connection is done
            self._slots.release()
            if conn is not None:
                conn.active = False
                conn.transport.abort()
            raise
        return H1Response(conn, self, deadline, timeout.sock_read)

    async def _connection(
        self, url: URL, timeout: aiohttp.ClientTimeout, deadline: float | None
    ) -> _Connection:
        """An idle connection to the node, else a new one."""
        node = (url.scheme, url.host or "", url.explicit_port or url.port or 80)
        idle = self._idle.get(node)
        while idle:
            conn = idle.pop()
            if not conn.transport.is_closing():
                return conn
        loop = asyncio.get_running_loop()
        tls = (self.tls or ssl.create_default_context()) if url.scheme == "https" else None
        key = ConnectionKey(node[1], node[2], tls is not None, tls, None, None, None, None)
        bounds = (timeout.sock_connect, timeout.connect, _left(deadline, loop))
        limit = min((x for x in bounds if x is not None), default=None)
        connecting = loop.create_connection(
            lambda: _Connection(self, node),
            node[1],
            node[2],
            ssl=tls,
            server_hostname=node[1] if tls else None,
        )
        try:
            _, conn = await asyncio.wait_for(connecting, limit)
        except asyncio.TimeoutError as exc:
            raise aiohttp.ConnectionTimeoutError(f"Connection timeout to host {url.origin()}") from exc
        except ssl.SSLCertVerificationError as exc:
            raise aiohttp.ClientConnectorCertificateError(key, exc) from exc
        except ssl.SSLError as exc:
            raise aiohttp.ClientConnectorSSLError(key, exc) from exc
        except OSError as exc:
            raise aiohttp.ClientConnectorError(key, exc) from exc
        return conn

    def _done(self, conn: _Connection, reusable: bool) -> None:
        """An exchange over: its connection kept for the next one, or closed."""
        self._slots.release()
        conn.active = False
        if reusable and not conn.transport.is_closing():
            self._idle.setdefault(conn.node, []).append(conn)
        else:
            conn.transport.close()


class _Connection(asyncio.Protocol):
    """One connection to a node: the exchange under way parsed as its bytes come."""

    def __init__(self, session: H1Session, node: tuple[str, str, int]) -> None:
        self.session = session
        self.node = node
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        # its loop, asked once: before Python 3.12 each `get_running_loop()` is a getpid() system call
        self.loop = asyncio.get_running_loop()
        self.lost: BaseException | None = None
        self.paused = False
        self.active = False  # an exchange under way
        self.pipe: _Pipe | None = None  # where the answer under way is relayed as it comes

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def send(self, data: bytes) -> None:
        self.active = True
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.reason = ""
        self.raw_headers: list[tuple[str, str]] = []
        self.chunks: collections.deque[bytes] = collections.deque()
        self.buffered = 0
        self.complete = False
        self.keep_alive = False
        self.failed: BaseException | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.head_done = False
        # the answer's bytes as they came, while it may still be relayed so (`H1Response.pipe`)
        self.raw: list[bytes] | None = []
        self.raw_size = 0
        self.transport.write(data)

    # httptools' callbacks
    def on_status(self, reason: bytes) -> None:
        self.reason += reason.decode("latin-1")

    def on_header(self, name: bytes, value: bytes) -> None:
        self.raw_headers.append(
            (name.decode("utf-8", "surrogateescape"), value.decode("utf-8", "surrogateescape"))
        )

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.head_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        if self.pipe is not None:  # relayed as it came: the raw bytes went already
            return
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > HIGH_WATER and not self.paused:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        # Elasticsearch and OpenSearch answer a request they could not decode (a header or a line too
        # long) with a 400 and read nothing more on that connection, though they do not say `close`:
        # reused, it would hang whatever request came next. A 400 is rare: a new connection after each.
        self.keep_alive = self.parser.should_keep_alive() and self.status != 400
        if self.pipe is not None:
            self.pipe.finish()
        self._wake()

    # the transport's
    def data_received(self, data: bytes) -> None:
        if not self.active:  # bytes on an idle connection: nothing asked for them
            self.transport.abort()
            return
        if self.pipe is not None:
            self.pipe.relay(data)
        elif self.raw is not None:
            self.raw.append(data)
            self.raw_size += len(data)
            if self.raw_size > HIGH_WATER:  # too much to hold twice: read, not relayed as it came
                self.raw = None
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.failed = aiohttp.ClientPayloadError(f"the answer is not HTTP: {exc}")
            self.transport.abort()
            if self.pipe is not None:
                self.pipe.fail(self.failed)
            self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = exc or ConnectionResetError("closed")
        idle = self.session._idle.get(self.node)
        if idle and self in idle:
            idle.remove(self)
        if not hasattr(self, "parser") or self.complete:
            return
        if self.head_done and not _announced(self.raw_headers):  # it ends when its connection does
            self.complete = True
            if self.pipe is not None:
                self.pipe.finish()
        elif self.head_done:
            self.failed = self.failed or aiohttp.ClientPayloadError("Response payload is not completed")
        else:
            self.failed = self.failed or aiohttp.ServerDisconnectedError()
        if self.pipe is not None and self.failed is not None:
            self.pipe.fail(self.failed)
        self._wake()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def wait(self, left: float | None, sock_read: float | None) -> None:
        """Until the parser has more to say, the connection is lost, or a timeout (a timer on the
        waiter: `asyncio.wait_for` would wrap it in a task of its own each time)."""
        if self.failed is not None:
            raise self.failed
        loop = self.loop
        waiter = self.waiter = loop.create_future()
        limit = min((x for x in (left, sock_read) if x is not None), default=None)
        timer = None if limit is None else loop.call_later(limit, _expire, waiter)
        try:
            await waiter
        except asyncio.TimeoutError:
            self.transport.abort()
            if left is not None and left <= (sock_read or left):
                raise
            raise aiohttp.ServerTimeoutError("Timeout on reading data from socket") from None
        finally:
            self.waiter = None
            if timer is not None:
                timer.cancel()
        if self.failed is not None:
            raise self.failed

    async def head_read(self, left: float | None, sock_read: float | None) -> None:
        while not self.head_done:
            await self.wait(left, sock_read)


class H1Response:
    """An answer as the proxy reads aiohttp's: status, reason, headers, its body as it comes
    (`content.iter_any()`, `iter_chunked(n)`, `read()`), `release()` when done with it."""

    def __init__(
        self, conn: _Connection, session: H1Session, deadline: float | None, sock_read: float | None
    ):
        self._conn = conn
        self._session = session
        self._deadline = deadline
        self._sock_read = sock_read
        self._released = False
        self.status = conn.status
        self.reason = conn.reason
        self.headers = CIMultiDictProxy(CIMultiDict(conn.raw_headers))
        self.content = self  # `resp.content.iter_any()`, as aiohttp's

    @property
    def content_type(self) -> str:
        return self.headers.get("Content-Type", "application/octet-stream").split(";")[0].strip().lower()

    @property
    def content_length(self) -> int | None:
        value = self.headers.get("Content-Length")
        return int(value) if value is not None and value.isdigit() else None

    async def iter_any(self) -> AsyncIterator[bytes]:
        conn = self._conn
        loop = conn.loop
        try:
            while True:
                if conn.chunks:
                    chunk = conn.chunks.popleft()
                    conn.buffered -= len(chunk)
                    if conn.paused and conn.buffered <= HIGH_WATER // 4:
                        conn.paused = False
                        conn.transport.resume_reading()
                    yield chunk
                elif conn.complete:
                    return
                else:
                    await conn.wait(_left(self._deadline, loop), self._sock_read)
        finally:
            if conn.complete and not conn.chunks:
                self.release()

    def iter_chunked(self, n: int) -> AsyncIterator[bytes]:  # noqa: ARG002  # as they come, whatever n
        return self.iter_any()

    def in_hand(self) -> bytes | None:
        """The whole body when all of it has come already (then the answer is done with), else None: a
        small answer relayed in one write, not streamed."""
        conn = self._conn
        if not conn.complete or self._released:
            return None
        body = b"".join(conn.chunks)
        conn.chunks.clear()
        conn.buffered = 0
        self.release()
        return body

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.iter_any()])

    def pipeable(self, closing: bool = False) -> bool:
        """Whether the answer can be relayed as its bytes came (`pipe`): none of them read yet, not
        too many held, and its head says nothing of its connection but its framing and whether it
        closes (`closing`: the client's connection ends after it, which the relay adds, so the head
        must say nothing of its connection at all)."""
        conn = self._conn
        if conn.raw is None or self._released or conn.failed is not None:
            return False
        for name, value in conn.raw_headers:
            low = name.lower()
            if low in UNRELAYED or (
                low == "connection" and (closing or value.lower() not in ("close", "keep-alive"))
            ):
                return False
        return True

    def pipe(self, client: Client, extra: bytes = b"") -> asyncio.Future[bool]:
        """Relay the answer to `client` as it comes, its bytes as the cluster sent them (head, framing,
        body; `extra`: header lines put after its status line), each read written on at once, with no
        task between. The future is done once all of it went: whether the answer kept its connection
        open (it said nothing of closing); it fails where the answer broke midway (the client's
        connection is cut then: its head went already). Only where `pipeable`."""
        conn = self._conn
        assert conn.raw is not None
        data = b"".join(conn.raw)
        if extra:
            line = data.index(b"\r\n") + 2
            data = data[:line] + extra + data[line:]
        conn.raw = None
        conn.chunks.clear()
        conn.buffered = 0
        done = conn.loop.create_future()
        client.send(data)
        if conn.complete:
            self.release()
            done.set_result(conn.keep_alive)
            return done
        conn.pipe = _Pipe(conn, self, client, done, self._sock_read)
        if conn.paused:
            conn.paused = False
            conn.transport.resume_reading()
        return done

    def release(self) -> None:
        """Done with the answer: its connection goes back to the pool when the answer was read whole."""
        if not self._released:
            self._released = True
            conn = self._conn
            self._session._done(
                conn, conn.complete and conn.keep_alive and not conn.chunks and conn.lost is None
            )

    async def wait_for_close(self) -> None:
        self.release()


class _Pipe:
    """An answer under way relayed to a client as its bytes come (`H1Response.pipe`): reading paused
    while the client lags, cut when no byte comes for `sock_read` seconds."""

    def __init__(
        self,
        conn: _Connection,
        response: H1Response,
        client: Client,
        done: asyncio.Future[bool],
        sock_read: float | None,
    ) -> None:
        self.conn = conn
        self.response = response
        self.client = client
        self.done = done
        self.sock_read = sock_read
        self.last = conn.loop.time()
        self.slow = False  # reading paused while the client lags: no read is due meanwhile
        self.timer = None if sock_read is None else conn.loop.call_later(sock_read, self._idle)
        client.throttle(self._throttle)

    def relay(self, data: bytes) -> None:
        self.last = self.conn.loop.time()
        self.client.send(data)

    def finish(self) -> None:
        """All of it went: the connection goes back to its pool."""
        self._end()
        self.response.release()
        if not self.done.done():
            self.done.set_result(self.conn.keep_alive)

    def fail(self, exc: BaseException) -> None:
        """Broken midway: the client's connection is cut (its answer's head went already); the future
        fails with a `ConnectionResetError` from `exc`."""
        self._end()
        self.conn.transport.abort()
        self.response.release()
        self.client.abort()
        if not self.done.done():
            cut = ConnectionResetError("the answer broke midway")
            cut.__cause__ = exc
            self.done.set_exception(cut)

    def _end(self) -> None:
        self.conn.pipe = None
        self.client.throttle(None)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _throttle(self, slow: bool) -> None:
        self.slow = slow
        self.last = self.conn.loop.time()
        transport = self.conn.transport
        if transport.is_closing():
            return
        if slow:
            transport.pause_reading()
        else:
            transport.resume_reading()

    def _idle(self) -> None:
        assert self.sock_read is not None
        left = self.sock_read if self.slow else self.last + self.sock_read - self.conn.loop.time()
        if left > 0:  # read since the timer was armed, or waiting for the client
            self.timer = self.conn.loop.call_later(left, self._idle)
            return
        self.timer = None
        self.fail(aiohttp.ServerTimeoutError("Timeout on reading data from socket"))


def _head(method: str, url: URL, headers: CIMultiDict[str], body: bytes) -> bytes:
    """The request's head: its line, `Host`, the caller's headers, the body's length."""
    lines = [f"{method} {url.raw_path_qs} HTTP/1.1"]
    if "Host" not in headers:
        lines.append(f"Host: {url.host_port_subcomponent}")
    for name, value in headers.items():
        if name.lower() in ("content-length", "transfer-encoding"):
            continue
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
            raise ValueError("Newline or carriage return character detected in HTTP status message or header")
        lines.append(f"{name}: {value}")
    if body or method in BODY_METHODS:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogateescape")


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(asyncio.TimeoutError())


def _announced(headers: list[tuple[str, str]]) -> bool:
    """Whether an answer's head says where its body ends (a length, or chunks)."""
    return any(n.lower() in ("content-length", "transfer-encoding") for n, _ in headers)


def _left(deadline: float | None, loop: asyncio.AbstractEventLoop) -> float | None:
    return None if deadline is None else max(0.0, deadline - loop.time())
