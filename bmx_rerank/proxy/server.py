"""Running the proxy: an aiohttp server whose own protocol errors answer in Elasticsearch's shape."""

from __future__ import annotations

import asyncio
import logging
import signal
import ssl

import orjson
from aiohttp import web, web_protocol, web_server
from aiohttp.http_exceptions import BadHttpMethod, LineTooLong

from bmx_rerank.errors import SearchError, timed_out
from bmx_rerank.proxy.framing import MAX_FIELD, MAX_LINE

log = logging.getLogger("bmx_rerank.proxy")


class _EsShapedErrors(web_protocol.RequestHandler):
    """The HTTP server's own rejections (a request line or header too long, an unknown or lowercase
    method, bad framing) in Elasticsearch's error shape instead of aiohttp's plain text."""

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
    def __call__(self) -> web_protocol.RequestHandler:
        return _EsShapedErrors(self, loop=self._loop, **self._kwargs)


class _Runner(web.AppRunner):
    """An AppRunner whose connections answer protocol errors in Elasticsearch's shape."""

    async def _make_server(self) -> web_server.Server:
        plain = await super()._make_server()
        # aiohttp builds its Server in Application._make_handler; this one only swaps the protocol.
        return _Server(
            plain.request_handler,
            request_factory=plain.request_factory,
            handler_cancellation=plain.handler_cancellation,
            loop=plain._loop,
            **plain._kwargs,
        )


async def start_server(
    app: web.Application,
    host: str = "127.0.0.1",
    port: int = 0,
    ssl_context: ssl.SSLContext | None = None,
    reuse_port: bool = False,
) -> tuple[web.AppRunner, str]:
    """Run `app` in this event loop (port 0: an ephemeral port); returns the runner and the base URL
    (https with `ssl_context`, see `nodes.server_ssl`).

    Request bodies are not decompressed by the server, so compressed bodies pass through untouched."""
    runner = _Runner(
        app, auto_decompress=False, access_log=None, max_line_size=MAX_LINE, max_field_size=MAX_FIELD
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=ssl_context, reuse_port=reuse_port or None)
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
) -> None:
    """Run the proxy until SIGINT or SIGTERM, then close its connections and sessions (`reuse_port`:
    several worker processes share the port)."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        runner, _ = await start_server(app, host, port, ssl_context=ssl_context, reuse_port=reuse_port)
        try:
            await stop.wait()
        finally:
            await runner.cleanup()

    asyncio.run(main())
