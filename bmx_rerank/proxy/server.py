"""Running the proxy: an aiohttp server whose own protocol errors answer in Elasticsearch's shape, and
whose client connections are bounded: an idle keep-alive timeout, a header read timeout, and a cap on
open connections that closes the oldest idle one to make room for a new one."""

from __future__ import annotations

import asyncio
import logging
import resource
import signal
import ssl
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web, web_protocol, web_server
from aiohttp.http_exceptions import BadHttpMethod, LineTooLong

from bmx_rerank import defaults
from bmx_rerank.errors import SearchError, timed_out
from bmx_rerank.metrics import Metrics
from bmx_rerank.proxy.framing import MAX_FIELD, MAX_LINE

log = logging.getLogger("bmx_rerank.proxy")


# File descriptors kept free for everything but client connections (the upstream pools, files, logs)
# when the cap on client connections is derived from the process's limit.
FD_RESERVE = 1024
# Seconds a connection must have been idle to be closed for a new one: a client's fresh connection,
# whose request is on its way but not read yet, looks idle too.
MIN_IDLE = 1.0
SCAN = 4096  # connections looked at, at most, for one that never served a request
# Connections the kernel queues for the proxy to accept (capped by net.core.somaxconn): past aiohttp's
# 128, a burst of new connections overflows into SYN cookies, and a client then holds a connection the
# proxy never accepted, which its cap can neither count nor close (2,000 idle clients at once: the
# proxy saw 1,374 of them)
BACKLOG = 4096


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


class _Connections:
    """The open client connections, least recently active first; closes the one idle longest when a new
    one would pass the cap (or the new one, when none is idle), and counts and logs what it closes. A
    busy client's keep-alive connection, idle for a moment between two requests, is never the first to
    go while connections sit idle for longer."""

    def __init__(self, limits: ConnectionLimits, metrics: Metrics | None) -> None:
        self.limits = limits
        self.cap = limits.cap()
        self.metrics = metrics
        self.open: OrderedDict[_EsShapedErrors, None] = OrderedDict()
        self._logged: dict[str, float] = {}
        self._unlogged: dict[str, int] = {}

    def opened(self, handler: _EsShapedErrors) -> bool:
        """Make room for `handler`; False when there is none (it is closed)."""
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
        handler.last_active = time.monotonic()
        self.open[handler] = None
        self._gauge()
        return True

    def _victim(self) -> _EsShapedErrors | None:
        """The first idle connection that never served a request, else the first idle one, among those
        idle for `MIN_IDLE` at least; the scan stops at the first younger one (the order is by last
        activity) or after `SCAN` connections, so it stays short at any number of connections."""
        oldest = time.monotonic() - MIN_IDLE
        first = None
        for seen, handler in enumerate(self.open):
            if handler.last_active > oldest or (first is not None and seen >= SCAN):
                break
            if handler.idle():
                if not handler.served():
                    return handler
                first = first or handler
        return first

    def active(self, handler: _EsShapedErrors) -> None:
        handler.last_active = time.monotonic()
        if handler in self.open:
            self.open.move_to_end(handler)

    def lost(self, handler: _EsShapedErrors) -> None:
        if self.open.pop(handler, 0) is None:
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


class _EsShapedErrors(web_protocol.RequestHandler):
    """The HTTP server's own rejections (a request line or header too long, an unknown or lowercase
    method, bad framing) in Elasticsearch's error shape instead of aiohttp's plain text; and the
    connection limits (`_Connections`): the idle keep-alive timeout (aiohttp's, counted here), a
    header read timeout from a request's first byte to its last header."""

    _bmx_connections: _Connections
    _bmx_head_timer: asyncio.TimerHandle | None = None
    last_active = 0.0  # time.monotonic() of its last byte in or answer out

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if not self._bmx_connections.opened(self):
            self.close_now()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._bmx_connections.lost(self)
        self._cancel_head_timer()
        super().connection_lost(exc)

    def idle(self) -> bool:
        """Waiting for a request, with none in progress or queued, nor any of its bytes received."""
        return (
            not self._request_in_progress
            and not self._messages
            and self._bmx_head_timer is None
            and self._waiter is not None
        )

    def served(self) -> bool:
        return self._request_count > 0

    async def finish_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().finish_response(*args, **kwargs)
        finally:
            self._bmx_connections.active(self)  # an answer just went out: active until now

    def close_now(self) -> None:
        self.force_close()
        if self.transport is not None:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        count = self._request_count
        self._bmx_connections.active(self)
        super().data_received(data)
        if self._request_count != count or self._request_in_progress:
            self._cancel_head_timer()  # a whole request head arrived (or a body is being read)
        elif data and self._bmx_head_timer is None:
            timeout = self._bmx_connections.limits.header_timeout
            if timeout > 0:  # a request head begins: it must be complete within the timeout
                self._bmx_head_timer = self._loop.call_later(timeout, self._head_timed_out)

    def _head_timed_out(self) -> None:
        self._bmx_head_timer = None
        if not self._request_in_progress and not self._messages and not self._force_close:
            self._bmx_connections.closed("header_timeout")
            self.close_now()

    def _cancel_head_timer(self) -> None:
        if self._bmx_head_timer is not None:
            self._bmx_head_timer.cancel()
            self._bmx_head_timer = None

    def _process_keepalive(self) -> None:
        open_before = not self._force_close
        super()._process_keepalive()
        if open_before and self._force_close:
            self._bmx_connections.closed("idle")

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        log.info("bad http request", extra={"fields": {"status": status, "error": exc.__class__.__name__}})
        if request.writer.output_size > 0:
            raise ConnectionError("the answer is under way: no error answer can follow")
        err = http_error(status, exc)
        resp = web.Response(status=err.status, body=orjson.dumps(err.body()), content_type="application/json")
        resp.force_close()
        return resp


def http_error(status: int, exc: BaseException | None) -> SearchError:
    """The Elasticsearch-shaped error for a request the HTTP server itself could not take."""
    if isinstance(exc, BadHttpMethod):
        return SearchError(405, "method_not_allowed_exception", "unexpected http method")
    if isinstance(exc, LineTooLong):
        if len(exc.args) > 1 and exc.args[1] == MAX_LINE:
            return SearchError(
                400, "too_long_http_line_exception", f"An HTTP line is larger than {MAX_LINE} bytes."
            )
        return SearchError(
            400, "too_long_http_header_exception", f"HTTP header is larger than {MAX_FIELD} bytes."
        )
    if status == 504:
        return timed_out("the request took too long")
    if status >= 500:
        return SearchError(500, "bmx_proxy_exception", "the rerank proxy failed to handle the request")
    return SearchError(
        status, "bad_http_request_exception", f"malformed HTTP request ({exc.__class__.__name__})"
    )


class _Server(web_server.Server):
    bmx_connections: _Connections

    def __call__(self) -> web_protocol.RequestHandler:
        handler = _EsShapedErrors(self, loop=self._loop, **self._kwargs)
        handler._bmx_connections = self.bmx_connections
        return handler


class _Runner(web.AppRunner):
    """An AppRunner whose connections answer protocol errors in Elasticsearch's shape, within the
    connection limits."""

    def __init__(self, app: web.Application, limits: ConnectionLimits, **kwargs: Any) -> None:
        super().__init__(app, keepalive_timeout=limits.idle_timeout, **kwargs)
        self.limits = limits

    async def _make_server(self) -> web_server.Server:
        plain = await super()._make_server()
        # aiohttp builds its Server in Application._make_handler; this one only swaps the protocol.
        server = _Server(
            plain.request_handler,
            request_factory=plain.request_factory,
            handler_cancellation=plain.handler_cancellation,
            loop=plain._loop,
            **plain._kwargs,
        )
        server.bmx_connections = _Connections(self.limits, _metrics_of(self.app))
        return server


def _metrics_of(app: Any) -> Metrics | None:
    from bmx_rerank.proxy.config import STATE

    state = app.get(STATE) if isinstance(app, web.Application) else None
    return state.metrics if state is not None else None


async def start_server(
    app: web.Application,
    host: str = "127.0.0.1",
    port: int = 0,
    ssl_context: ssl.SSLContext | None = None,
    reuse_port: bool = False,
    limits: ConnectionLimits | None = None,
) -> tuple[web.AppRunner, str]:
    """Run `app` in this event loop (port 0: an ephemeral port); returns the runner and the base URL
    (https with `ssl_context`, see `nodes.server_ssl`).

    Request bodies are not decompressed by the server, so compressed bodies pass through untouched."""
    runner = _Runner(
        app,
        limits or ConnectionLimits(),
        auto_decompress=False,
        access_log=None,
        max_line_size=MAX_LINE,
        max_field_size=MAX_FIELD,
    )
    await runner.setup()
    site = web.TCPSite(
        runner, host, port, ssl_context=ssl_context, backlog=BACKLOG, reuse_port=reuse_port or None
    )
    await site.start()
    sock = site._server.sockets[0]  # type: ignore[union-attr]
    bound_host, bound_port = sock.getsockname()[:2]
    return runner, f"{'https' if ssl_context else 'http'}://{bound_host}:{bound_port}"


def serve_forever(
    app: web.Application,
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
        runner, _ = await start_server(
            app, host, port, ssl_context=ssl_context, reuse_port=reuse_port, limits=limits
        )
        try:
            await stop.wait()
        finally:
            await runner.cleanup()

    asyncio.run(main())
