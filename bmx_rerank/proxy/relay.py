"""Calls to the cluster on a client's behalf: streamed byte for byte (passthrough), or buffered (a
rerank's first stage). A call that gets no usable answer is a 502 or 504 in the cluster's error shape."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import logging
import re
import time
import zlib
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import aiohttp
from multidict import CIMultiDict
from yarl import URL

from bmx_rerank.deadline import budget, current
from bmx_rerank.errors import bad_request, timed_out, unreachable
from bmx_rerank.h1 import H1Response
from bmx_rerank.proxy.framing import SKIP_AUTO, client_headers, end_to_end_headers, json_headers
from bmx_rerank.proxy.http import Request, Response
from bmx_rerank.proxy.memory import charge

# "json" in a content type (`application/json`, `application/vnd.elasticsearch+json; compatible-with=8`)
NDJSON = re.compile(r"(?<=[/+])json\b")

log = logging.getLogger("bmx_rerank.proxy")


async def forward(
    request: Request,
    data: Any,
    *,
    headers: CIMultiDict[str] | None = None,
    extra: Mapping[str, str] | None = None,
) -> Response:
    """Send the request upstream and stream the answer back byte for byte: relayed as the cluster sent it
    where it can be (`H1Response.pipe`), else rebuilt without its hop-by-hop headers (in one go when it
    is all in hand at once)."""
    state = request.state
    hdrs = headers if headers is not None else client_headers(request)
    if isinstance(data, (bytes, bytearray)):
        hdrs.popall("Content-Length", None)
    target = URL(state.base + request.raw_path, encoded=True)
    start = time.perf_counter()
    with upstream_failures(request):
        upstream = await state.upstream.request(
            request.method,
            target,
            data=data,
            headers=hdrs,
            skip_auto_headers=SKIP_AUTO,
            allow_redirects=False,
            compress=None,
            timeout=state.relay_timeout,
        )
    state.metrics.upstream("passthrough", time.perf_counter() - start)
    closing = not request.keep_alive or request.client.closing  # the relay says so, as the server would
    if request.version == (1, 1) and isinstance(upstream, H1Response) and upstream.pipeable(closing):
        # as the cluster sent it, each read written on at once (no answer rebuilt, no task between)
        lines = {**(extra or {}), **({"Connection": "close"} if closing else {})}
        head = "".join(f"{name}: {value}\r\n" for name, value in lines.items())
        sent = upstream.pipe(request.client, head.encode("utf-8", "surrogateescape"))
        sent.add_done_callback(_broken_midway)
        return Response(upstream.status, reason=upstream.reason, sent=sent)
    out = end_to_end_headers(upstream.headers)
    for name, value in (extra or {}).items():
        out[name] = value
    # an answer all in hand already (most are: one read of the socket) goes in one write
    whole = upstream.in_hand() if isinstance(upstream, H1Response) else None
    if whole is None and request.method == "HEAD":  # its length is the GET's: no body follows
        upstream.release()
        whole = b""
    if whole is not None:
        return Response(upstream.status, whole, headers=out, reason=upstream.reason)
    return Response(upstream.status, headers=out, reason=upstream.reason, chunks=Relayed(upstream))


def _broken_midway(sent: asyncio.Future[bool]) -> None:
    if not sent.cancelled() and (cut := sent.exception()) is not None:
        error = (cut.__cause__ or cut).__class__.__name__
        log.warning("upstream broke mid-body", extra={"fields": {"error": error}})


class Relayed:
    """An upstream answer's body as it comes, its connection released when read or closed."""

    def __init__(self, upstream: Any) -> None:
        self.upstream = upstream

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self.upstream.content.iter_any():
                yield chunk
        except (asyncio.TimeoutError, aiohttp.ClientError) as exc:
            # The head is gone already: the only honest signal left is to cut the connection.
            log.warning("upstream broke mid-body", extra={"fields": {"error": exc.__class__.__name__}})
            raise ConnectionResetError("upstream broke mid-body") from exc

    async def aclose(self) -> None:
        self.upstream.release()


async def call(
    request: Request, params: Mapping[str, str], body: bytes, name: str, *, msearch: bool = False
) -> tuple[int, CIMultiDict[str], bytes]:
    """One buffered call to the request's own path (`msearch`: a POST to `/_msearch`, its body NDJSON)
    with `params`, the client's headers (identity encoding) and a body the proxy wrote; the answer
    inflated when the cluster compressed it."""
    state = request.state
    # the path as the client wrote it (a date-math name's escaped `/` stays escaped), the query the proxy's
    path = "/_msearch" if msearch else request.encoded_path
    url = URL(state.base + path, encoded=True).with_query(params)
    headers = json_headers(request)
    if msearch:  # the client's JSON type as its NDJSON twin (a versioned type keeps its version)
        headers["Content-Type"] = NDJSON.sub("x-ndjson", headers["Content-Type"], count=1)
    start = time.perf_counter()
    try:
        with upstream_failures(request):
            async with state.upstream.request(
                "POST" if msearch else request.method,
                url,
                data=body,
                headers=headers,
                skip_auto_headers=SKIP_AUTO,
                allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=budget(state.config.timeout)),
            ) as resp:
                charge(request, resp.content_length or 0)  # refused before it is read, when announced
                parts = []
                async for chunk in resp.content.iter_chunked(1 << 16):
                    if resp.content_length is None:
                        charge(request, len(chunk))
                    parts.append(chunk)
                charge(request, sum(len(p) for p in parts))  # the joined copy
                payload = b"".join(parts)
                headers = CIMultiDict(resp.headers)
                status = resp.status
    finally:
        state.metrics.upstream(name, time.perf_counter() - start)
    if headers.get("Content-Encoding", "identity").lower() == "gzip":
        try:
            charge(request, 4 * len(payload))  # at least what it inflates to, before it does
            payload = gzip.decompress(payload)
        except (OSError, EOFError, zlib.error) as exc:
            raise unreachable(
                f"{request.method} {request.path}: the cluster's answer is not valid gzip"
            ) from exc
        headers.popall("Content-Encoding", None)
    return status, headers, payload


@contextlib.contextmanager
def upstream_failures(request: Request) -> Iterator[None]:
    """A call to the cluster that did not give a usable answer: 504 when slow, else 502 (refused,
    dropped, or not HTTP at all), in the cluster's error shape. Never the URL: it is the cluster's."""
    try:
        yield
    except asyncio.TimeoutError as exc:
        deadline = current()
        if deadline is not None and deadline.expired():
            raise timed_out(
                f"{request.method} {request.path}: no answer within the request's deadline of "
                f"{deadline.seconds:g}s (--deadline)"
            ) from exc
        timeout = request.state.config.timeout
        raise timed_out(f"{request.method} {request.path} took longer than {timeout}s") from exc
    except aiohttp.ClientError as exc:
        encoding = request.bad_encoding
        if encoding:  # the cluster closed the connection on a body that does not decode
            raise bad_request(
                f"the request body is labelled [Content-Encoding: {encoding}] but is not valid {encoding}",
                "parse_exception",
            ) from exc
        raise unreachable(f"{request.method} {request.path} failed: {exc.__class__.__name__}") from exc
