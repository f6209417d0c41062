"""The proxy's HTTP/1.1 server: requests parsed by httptools (llhttp, Node's parser) on an
`asyncio.Protocol` a connection, each answered by the app's `handle`; its own protocol errors in
Elasticsearch's shape; client connections bounded (an idle keep-alive timeout, a header read timeout,
a cap on open connections that closes the oldest idle one to make room for a new one).

Why not aiohttp's server: an aiohttp hop cost a passthrough ~0.3 ms and half its CPU against a bare
asyncio relay (benchmarks/RESULTS.md, "where an aiohttp hop goes"); this one does what the proxy
needs of a server and nothing else: keep-alive, pipelining (answered in order), bodies streamed both
ways with flow control, `Expect: 100-continue`, HTTP/1.0 clients, TLS."""

from __future__ import annotations

import asyncio
import collections
import logging
import resource
import signal
import ssl
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import httptools
import orjson
from multidict import CIMultiDict, CIMultiDictProxy

from bmx_rerank import defaults
from bmx_rerank.errors import SearchError, bad_request
from bmx_rerank.metrics import Metrics
from bmx_rerank.proxy.config import ProxyState
from bmx_rerank.proxy.framing import MAX_FIELD, MAX_LINE
from bmx_rerank.proxy.http import Body, Request, Response, reason_of

log = logging.getLogger("bmx_rerank.proxy")


# File descriptors kept free for everything but client connections (the upstream pools, files, logs)
# when the cap on client connections is derived from the process's limit.
FD_RESERVE = 1024
# Seconds a connection must have been idle to be closed for a new one: a client's fresh connection,
# whose request is on its way but not read yet, looks idle too.
MIN_IDLE = 1.0
SCAN = 4096  # connections looked at, at most, for one that never served a request
# Connections the kernel queues for the proxy to accept (capped by net.core.somaxconn): past 128, a
# burst of new connections overflows into SYN cookies, and a client then holds a connection the proxy
# never accepted, which its cap can neither count nor close (2,000 idle clients at once: the proxy saw
# 1,374 of them with a backlog of 128)
BACKLOG = 4096
# Bytes of one request head at most (its line and every header together): llhttp holds a header's
# bytes until the header ends, so without a bound one endless header would grow without end. The
# cluster itself takes 8-16 KiB (http.max_header_size).
MAX_HEAD = 64 << 10
# Seconds `cleanup` waits for requests under way before it cuts their connections (aiohttp's wait).
SHUTDOWN_GRACE = 60.0
# Seconds a connection that ends while its client still sends a body nobody reads (a 413 answered from
# the length alone) goes on reading it, dropped: a client that sends its whole body before it reads gets
# the answer instead of a reset (aiohttp's lingering time).
LINGER = 10.0
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


@dataclass(frozen=True)
class ConnectionLimits:
    """Bounds on client connections (0: off). `max_connections` None: derived from the process's file
    descriptor limit, less `FD_RESERVE`."""

    idle_timeout: float = defaults.IDLE_TIMEOUT
    header_timeout: float = defaults.HEADER_TIMEOUT
    max_connections: int | None = None

    def cap(self) -> int:
        if self.max_connections is not None:
            return self.max_connections
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            return defaults.MAX_CONNECTIONS
        return max(64, min(defaults.MAX_CONNECTIONS, soft - FD_RESERVE))


def raise_fd_limit() -> int:
    """Raise this process's soft file-descriptor limit to its hard one (as Elasticsearch asks of its
    own nodes); the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft


class App(Protocol):
    """What the server runs: the proxy app (`proxy.app.ProxyApp`)."""

    state: ProxyState

    async def startup(self) -> None: ...
    async def cleanup(self) -> None: ...
    async def handle(self, request: Request) -> Response: ...


class LineTooLong(Exception):
    """A request line longer than MAX_LINE."""


class HeaderTooLong(Exception):
    """A header longer than MAX_FIELD, or a head longer than MAX_HEAD."""


def http_error(exc: BaseException) -> SearchError:
    """The Elasticsearch-shaped error for a request the server itself could not take."""
    if isinstance(exc, httptools.HttpParserInvalidMethodError):
        return SearchError(405, "method_not_allowed_exception", "unexpected http method")
    if isinstance(exc, LineTooLong):
        return SearchError(
            400, "too_long_http_line_exception", f"An HTTP line is larger than {MAX_LINE} bytes."
        )
    if isinstance(exc, HeaderTooLong):
        return SearchError(
            400, "too_long_http_header_exception", f"HTTP header is larger than {MAX_FIELD} bytes."
        )
    if "version" in str(exc).lower():
        return bad_request("Unexpected http protocol version")
    return SearchError(400, "bad_http_request_exception", f"malformed HTTP request ({exc})")


class _Connections:
    """The open client connections, least recently active first; closes the one idle longest when a new
    one would pass the cap (or the new one, when none is idle), and counts and logs what it closes. A
    busy client's keep-alive connection, idle for a moment between two requests, is never the first to
    go while connections sit idle for longer."""

    def __init__(self, limits: ConnectionLimits, metrics: Metrics | None) -> None:
        self.limits = limits
        self.cap = limits.cap()
        self.metrics = metrics
        self.open: OrderedDict[Connection, None] = OrderedDict()
        self._logged: dict[str, float] = {}
        self._unlogged: dict[str, int] = {}

    def opened(self, conn: Connection) -> bool:
        """Make room for `conn`; False when there is none (it is closed)."""
        if self.cap and len(self.open) >= self.cap:
            # First a connection that never sent a request (a hoarder's), then any idle one; each in
            # order of last activity: a client between two requests on a kept-alive connection is the
            # last to go.
            victim = self._victim()
            if victim is None:
                self.closed("cap_refused")
                return False
            self.closed("cap")
            victim.close_now()
        conn.last_active = time.monotonic()
        self.open[conn] = None
        self._gauge()
        return True

    def _victim(self) -> Connection | None:
        """The first idle connection that never served a request, else the first idle one, among those
        idle for `MIN_IDLE` at least; the scan stops at the first younger one (the order is by last
        activity) or after `SCAN` connections, so it stays short at any number of connections."""
        oldest = time.monotonic() - MIN_IDLE
        first = None
        for seen, conn in enumerate(self.open):
            if conn.last_active > oldest or (first is not None and seen >= SCAN):
                break
            if conn.idle():
                if not conn.served:
                    return conn
                first = first or conn
        return first

    def active(self, conn: Connection) -> None:
        conn.last_active = time.monotonic()
        if conn in self.open:
            self.open.move_to_end(conn)

    def lost(self, conn: Connection) -> None:
        if self.open.pop(conn, 0) is None:
            self._gauge()

    def closed(self, reason: str) -> None:
        """Count a connection the limits closed, and log it (at most once a second per reason, with
        how many since the last line: 20,000 idle connections must not flood the log)."""
        if self.metrics is not None:
            self.metrics.connections_closed.labels(reason).inc()
        now = time.monotonic()
        self._unlogged[reason] = self._unlogged.get(reason, 0) + 1
        if now - self._logged.get(reason, 0.0) >= 1.0:
            self._logged[reason] = now
            count = self._unlogged.pop(reason)
            log.info(
                "client connection closed",
                extra={"fields": {"reason": reason, "count": count, "open": len(self.open), "cap": self.cap}},
            )

    def _gauge(self) -> None:
        if self.metrics is not None:
            self.metrics.client_connections.set(len(self.open))


class Connection(asyncio.Protocol):
    """One client connection: its bytes parsed as they come, its requests answered one after another
    by a task that lives while requests are queued, its limits enforced."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.connections = server.connections
        self.limits = server.connections.limits
        self.loop = server.loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.queue: collections.deque[Request] = collections.deque()  # [0]: being answered
        self.task: asyncio.Task[None] | None = None
        self.receiving: Request | None = None  # the request whose body is coming in
        self.failure: SearchError | None = None  # a malformed request, answered after those before it
        self.closing = False  # nothing more is read: the connection ends after what is queued
        self.last_active = 0.0  # time.monotonic() of its last byte in or answer out
        self.served = 0  # requests answered
        self._in_head = False
        self._head_bytes = 0  # of the head under way: its line and headers as parsed
        self._head_fed = 0  # bytes fed to the parser since the head began, while it goes on
        self._url: list[bytes] = []
        self._url_size = 0
        self._headers: list[tuple[str, str]] = []
        self._paused: set[str] = set()  # why reading is paused: "body", "queued", "closing"
        self._writable: asyncio.Future[None] | None = None  # set while the client reads too slowly
        self._throttle: Callable[[bool], None] | None = None  # told when the client lags (a relay)
        # Each limit's timer is armed once and, when it fires early, armed again for what is left:
        # no timer is made or cancelled a request.
        self._idle_timer: asyncio.TimerHandle | None = None
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_began = 0.0  # time.monotonic() of the first byte of the head under way
        self._linger_timer: asyncio.TimerHandle | None = None

    # ---- the transport's calls --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if not self.connections.opened(self):
            self.close_now()
            return
        self._idle_later()

    def data_received(self, data: bytes) -> None:
        if self.closing and self.receiving is None:  # read on only to drop a body (`_end_after`)
            return
        self.connections.active(self)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # CONNECT or an Upgrade: that request is answered, then the connection ends (what follows
            # is not HTTP/1.1)
            self._stop_reading()
            if self.queue:
                self.queue[-1].keep_alive = False
        except httptools.HttpParserCallbackError as exc:  # a bound of ours, raised in a callback
            self._malformed(exc.__context__ or exc)
        except httptools.HttpParserError as exc:
            self._malformed(exc)
        else:
            if self._in_head:  # a header the parser holds until it ends counts too
                self._head_fed += len(data)
                if self._head_fed > MAX_HEAD:
                    self._malformed(HeaderTooLong())

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.connections.lost(self)
        self._cancel_idle()
        self._cancel_head_timer()
        self._cancel_linger()
        if self.receiving is not None:
            self.receiving.content.fail(ConnectionResetError("the client closed the connection"))
            self.receiving = None
        if self._writable is not None and not self._writable.done():
            self._writable.set_exception(ConnectionResetError("the client closed the connection"))

    def pause_writing(self) -> None:
        if self._writable is None or self._writable.done():
            self._writable = self.loop.create_future()
        if self._throttle is not None:
            self._throttle(True)

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._writable = None
        if self._throttle is not None:
            self._throttle(False)

    # ---- an answer relayed to this client as it comes (`h1.H1Response.pipe`) -----------------------

    def send(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def throttle(self, listener: Callable[[bool], None] | None) -> None:
        self._throttle = listener
        if listener is not None and self._writable is not None:
            listener(True)

    # ---- httptools' calls -------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.closing:
            return
        self._in_head = True
        self._head_bytes = self._head_fed = 0
        self._head_began = time.monotonic()
        if self._head_timer is None and self.limits.header_timeout > 0:
            self._head_timer = self.loop.call_later(self.limits.header_timeout, self._head_timed_out)

    def on_url(self, url: bytes) -> None:
        self._url_size += len(url)
        self._head_bytes += len(url)
        if self._url_size > MAX_LINE:
            raise LineTooLong()
        self._url.append(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_bytes += len(name) + len(value) + 4
        if len(name) > MAX_FIELD or len(value) > MAX_FIELD or self._head_bytes > MAX_HEAD:
            raise HeaderTooLong()
        self._headers.append(
            (name.decode("utf-8", "surrogateescape"), value.decode("utf-8", "surrogateescape"))
        )

    def on_headers_complete(self) -> None:
        self._in_head = False
        if self.closing:  # pipelined after a request that ends the connection: never answered
            return
        parser = self.parser
        major, _, minor = parser.get_http_version().partition(".")
        version = (int(major), int(minor or 0))
        headers = CIMultiDictProxy(CIMultiDict(self._headers))
        expects = version == (1, 1) and headers.get("Expect", "").lower() == "100-continue"
        request = Request(
            parser.get_method().decode("ascii"),
            b"".join(self._url).decode("utf-8", "surrogateescape"),
            version,
            headers,
            Body(self, expects=expects),
            parser.should_keep_alive(),
            self,
            self.server.app.state,
            time.monotonic(),
        )
        self._url, self._url_size, self._headers = [], 0, []
        self.receiving = request
        self.queue.append(request)
        if self.task is None:
            self.task = self.loop.create_task(self._serve())
        else:  # pipelined: read no further until the requests before it are answered
            self._pause("queued")

    def on_body(self, body: bytes) -> None:
        assert self.receiving is not None
        self.receiving.content.feed(body)

    def on_message_complete(self) -> None:
        if self.receiving is not None:
            body = self.receiving.content
            body.end()
            self.receiving = None
            if body.dropped:  # the body the connection lingered for is in: now it ends
                self.close_now()

    # ---- what a request's body asks of its connection ---------------------------------------------

    def pause_body(self) -> None:
        self._pause("body")

    def resume_body(self) -> None:
        self._resume("body")

    def continue_body(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(CONTINUE)

    # ---- answering ---------------------------------------------------------------------------------

    async def _serve(self) -> None:
        """Answer the queued requests in order; the connection's failure, if any, after them."""
        try:
            while self.queue:
                request = self.queue[0]
                try:
                    response = await self.server.app.handle(request)
                    keep = await self._answer(request, response)
                except Exception as exc:  # cut mid-answer, or a bug: nothing honest can follow
                    if not isinstance(exc, ConnectionError):
                        log.exception("answer failed", extra={"fields": {"error": exc.__class__.__name__}})
                    self.abort()
                    return
                self.queue.popleft()
                self.served += 1
                self.connections.active(self)
                if not keep:
                    self._end_after(request)
                    return
                if len(self.queue) <= 1:
                    self._resume("queued")
            if self.failure is not None:
                self._answer_failure()
        finally:
            self.task = None
            if not self.closing:
                self._idle_later()

    async def _answer(self, request: Request, response: Response) -> bool:
        """Write the answer; whether the connection stays open for the next request."""
        transport = self.transport
        assert transport is not None
        minor = 0 if request.version == (1, 0) else 1
        keep = (
            request.keep_alive
            and not response.close
            and not self.closing
            and request.version in ((1, 0), (1, 1))
            and request.content.complete  # an unread rest of a body is never read as a request
        )
        if response.sent is not None:  # relayed as the cluster sent it, framing and all
            return await response.sent and keep
        headers = response.headers
        empty = request.method == "HEAD" or response.status < 200 or response.status in (204, 304)
        chunks = response.chunks
        chunked = False
        if chunks is None:
            if response.status in (204, 304) or response.status < 200:
                headers.popall("Content-Length", None)
            elif request.method != "HEAD" or "Content-Length" not in headers:
                headers["Content-Length"] = str(len(response.body))
        elif "Content-Length" not in headers and not empty:
            if minor:
                headers["Transfer-Encoding"] = "chunked"
                chunked = True
            else:
                keep = False  # an HTTP/1.0 client reads such a body to the connection's end
        if not keep:
            headers["Connection"] = "close"
        elif minor == 0:
            headers["Connection"] = "keep-alive"
        head = _head(minor, response.status, response.reason, headers)
        if chunks is None:
            if not transport.is_closing():
                transport.write(head if empty else head + response.body)
            return keep
        try:
            if transport.is_closing():
                raise ConnectionResetError("the client closed the connection")
            transport.write(head)
            async for chunk in chunks:
                if empty or not chunk:
                    continue
                if transport.is_closing():
                    raise ConnectionResetError("the client closed the connection")
                transport.write(b"%x\r\n%b\r\n" % (len(chunk), chunk) if chunked else chunk)
                if self._writable is not None:
                    await self._writable
            if chunked:
                transport.write(b"0\r\n\r\n")
        finally:
            await chunks.aclose()
        return keep

    def _answer_failure(self) -> None:
        assert self.failure is not None
        response = Response(
            self.failure.status, orjson.dumps(self.failure.body()), content_type="application/json"
        )
        response.headers["Connection"] = "close"
        response.headers["Content-Length"] = str(len(response.body))
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(_head(1, response.status, None, response.headers) + response.body)
        self.close_now()

    def _malformed(self, exc: BaseException) -> None:
        """A request the parser could not take: answered in Elasticsearch's shape (after the requests
        before it), then the connection ends. A body cut by bad framing fails its request instead."""
        error = http_error(exc)
        log.info(
            "bad http request", extra={"fields": {"status": error.status, "error": exc.__class__.__name__}}
        )
        self._stop_reading()
        self._in_head = False
        self._cancel_head_timer()
        if self.receiving is not None:  # its handler reads the body, and answers the error
            self.receiving.content.fail(error)
            self.receiving.keep_alive = False
            self.receiving = None
            return
        self.failure = error
        if self.task is None:
            self._answer_failure()

    # ---- the limits ---------------------------------------------------------------------------------

    def idle(self) -> bool:
        """Waiting for a request, with none in progress or queued, nor any of its bytes received."""
        return self.task is None and not self.queue and not self._in_head and not self.closing

    def _end_after(self, request: Request) -> None:
        """End the connection after the answer to `request`: at once, or, while its client still sends
        a body nobody read, once that body is in (dropped) or `LINGER` seconds have passed."""
        if request is not self.receiving or self.transport is None or self.transport.is_closing():
            self.close_now()
            return
        self.closing = True
        request.content.drop()
        if self._paused:
            self._paused.clear()
            self.transport.resume_reading()
        self._linger_timer = self.loop.call_later(LINGER, self.close_now)

    def close_now(self) -> None:
        self.closing = True
        self._cancel_idle()
        self._cancel_linger()
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        self.closing = True
        if self.transport is not None:
            self.transport.abort()

    def _stop_reading(self) -> None:
        self.closing = True
        self._pause("closing")

    def _pause(self, why: str) -> None:
        if not self._paused and self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()
        self._paused.add(why)

    def _resume(self, why: str) -> None:
        if why in self._paused:
            self._paused.discard(why)
            if not self._paused and self.transport is not None and not self.transport.is_closing():
                self.transport.resume_reading()

    def _idle_later(self) -> None:
        timeout = self.limits.idle_timeout
        if timeout > 0 and self._idle_timer is None:
            self._idle_timer = self.loop.call_later(timeout, self._idle_timed_out)

    def _cancel_idle(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    def _idle_timed_out(self) -> None:
        self._idle_timer = None
        if self.closing:
            return
        timeout = self.limits.idle_timeout
        left = self.last_active + timeout - time.monotonic() if self.idle() else timeout
        if left > 0:  # active since it was armed: what is left of the timeout from then
            self._idle_timer = self.loop.call_later(left, self._idle_timed_out)
        else:
            self.connections.closed("idle")
            self.close_now()

    def _cancel_linger(self) -> None:
        if self._linger_timer is not None:
            self._linger_timer.cancel()
            self._linger_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self._in_head or self.closing:  # armed again when the next head begins
            return
        left = self._head_began + self.limits.header_timeout - time.monotonic()
        if left > 0:  # a later head than the one it was armed for
            self._head_timer = self.loop.call_later(left, self._head_timed_out)
        else:
            self.connections.closed("header_timeout")
            self.close_now()

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None


def _head(minor: int, status: int, reason: str | None, headers: CIMultiDict[str]) -> bytes:
    """An answer's status line and headers."""
    lines = [f"HTTP/1.{minor} {status} {reason_of(status) if reason is None else reason}"]
    for name, value in headers.items():
        if "\n" in value or "\r" in value:
            raise ValueError(f"a newline in the answer's header {name}")
        lines.append(f"{name}: {value}")
    lines.append("\r\n")
    return "\r\n".join(lines).encode("utf-8", "surrogateescape")


class Server:
    """The app served on one listening socket; `cleanup` stops it and the app."""

    def __init__(self, app: App, limits: ConnectionLimits) -> None:
        self.app = app
        self.loop = asyncio.get_running_loop()
        self.connections = _Connections(limits, app.state.metrics)
        self._listener: asyncio.AbstractServer | None = None

    async def listen(
        self, host: str, port: int, ssl_context: ssl.SSLContext | None, reuse_port: bool
    ) -> tuple[str, int]:
        self._listener = await self.loop.create_server(
            lambda: Connection(self),
            host,
            port,
            ssl=ssl_context,
            backlog=BACKLOG,
            reuse_port=reuse_port or None,
        )
        return self._listener.sockets[0].getsockname()[:2]

    async def cleanup(self, grace: float = SHUTDOWN_GRACE) -> None:
        """Stop listening, close the idle connections, give the requests under way `grace` seconds to
        be answered, cut what is left, then stop the app."""
        if self._listener is not None:
            self._listener.close()
        for conn in list(self.connections.open):
            if conn.task is None:
                conn.close_now()
            else:  # answered, then closed; a body under way is still read
                conn.closing = True
        busy = [c.task for c in self.connections.open if c.task is not None]
        if busy:
            await asyncio.wait(busy, timeout=grace)
        for conn in list(self.connections.open):
            conn.abort()
            if conn.task is not None:
                conn.task.cancel()
        if self._listener is not None:
            await self._listener.wait_closed()
        await self.app.cleanup()


async def start_server(
    app: App,
    host: str = "127.0.0.1",
    port: int = 0,
    ssl_context: ssl.SSLContext | None = None,
    reuse_port: bool = False,
    limits: ConnectionLimits | None = None,
) -> tuple[Server, str]:
    """Start `app` and serve it in this event loop (port 0: an ephemeral port); returns the server
    (`cleanup()` stops both) and the base URL (https with `ssl_context`, see `nodes.server_ssl`).

    Request bodies are never decompressed, so compressed bodies pass through untouched."""
    await app.startup()
    server = Server(app, limits or ConnectionLimits())
    try:
        bound_host, bound_port = await server.listen(host, port, ssl_context, reuse_port)
    except BaseException:
        await app.cleanup()
        raise
    return server, f"{'https' if ssl_context else 'http'}://{bound_host}:{bound_port}"


def serve_forever(
    app: App,
    host: str,
    port: int,
    ssl_context: ssl.SSLContext | None = None,
    reuse_port: bool = False,
    limits: ConnectionLimits | None = None,
) -> None:
    """Run the proxy until SIGINT or SIGTERM, then close its connections and sessions (`reuse_port`:
    several worker processes share the port)."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        server, _ = await start_server(
            app, host, port, ssl_context=ssl_context, reuse_port=reuse_port, limits=limits
        )
        try:
            await stop.wait()
        finally:
            await server.cleanup()

    asyncio.run(main())
