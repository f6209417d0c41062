"""HTTP framing: which headers go on, how the proxy's own answers and errors are written."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from multidict import CIMultiDict

from bmx_rerank.errors import SearchError, UpstreamError
from bmx_rerank.proxy.http import Request, Response

# RFC 9110 §7.6.1 connection-specific headers, plus those the proxy recomputes itself.
HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        "Connection",
        "Keep-Alive",
        "Proxy-Authenticate",
        "Proxy-Authorization",
        "Proxy-Connection",
        "TE",
        "Trailer",
        "Transfer-Encoding",
        "Upgrade",
        "Host",
    )
)
# Headers aiohttp's client would add on its own to an upstream request; the client's own choice must win.
SKIP_AUTO = ("Accept-Encoding", "User-Agent", "Content-Type", "Accept")
MARKER_HEADER = "X-BMX-Rerank"
METHODS = frozenset(("GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH"))  # the cluster's
MAX_LINE = 4096  # request line, as Elasticsearch's http.max_initial_line_length
# One header: the larger of the engines' http.max_header_size (Elasticsearch 8: 16 KB; OpenSearch 8 KB,
# which answers a longer one with its own 400).
MAX_FIELD = 16384


def end_to_end_headers(headers: Mapping[str, str], *, drop: Sequence[str] = ()) -> CIMultiDict[str]:
    """Headers minus hop-by-hop ones (and `drop`), duplicates kept: a request's or an answer's."""
    skip = HOP_BY_HOP | {d.lower() for d in drop}
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in headers.items():
        if name.lower() not in skip:
            out.add(name, value)
    return out


def end_to_end(request: Request) -> CIMultiDict[str]:
    """The request's end-to-end headers, credentials included, sorted out once a request: shared, read
    them (`client_headers` gives a copy to change)."""
    if request.end_to_end is None:
        request.end_to_end = end_to_end_headers(request.headers)
    return request.end_to_end


def client_headers(request: Request, *, drop: Sequence[str] = ()) -> CIMultiDict[str]:
    """What goes upstream on the client's behalf: its end-to-end headers, credentials included (a copy
    of its own for the caller)."""
    out = CIMultiDict(end_to_end(request))
    for name in drop:
        out.popall(name, None)
    return out


def json_headers(request: Request) -> CIMultiDict[str]:
    """Client headers for a body the proxy re-serialized: identity encoding both ways. No Content-Type
    is added where the client sent none: the cluster refuses such a body (406), as without the proxy."""
    return client_headers(request, drop=("Content-Length", "Content-Encoding", "Accept-Encoding"))


def unreadable_format(request: Request) -> str | None:
    """ "format" when the client asked for an answer the proxy cannot rerank (YAML, CBOR, Smile, via
    `format`, `Accept`, or without `Accept` the body's own `Content-Type`, which the cluster then
    answers in): it would get the raw window otherwise. Such a search passes through."""
    formats = request.query.getall("format", [])
    if formats and formats[-1].lower() != "json":  # the cluster reads a repeated parameter's last value
        return "format"
    accept = request.headers.get("Accept", "").lower()
    if accept and "json" not in accept and "*/*" not in accept:
        return "format"
    content_type = request.headers.get("Content-Type", "").lower()
    if not accept and content_type and "json" not in content_type:
        return "format"
    return None


def last_values(query: Any) -> dict[str, str]:
    """A request's query parameters, a repeated one's last value standing, as the cluster reads them."""
    return dict(query.items())


def error_response(err: SearchError) -> Response:
    """An error as the client would get it from the cluster: the cluster's own payload when it sent one."""
    if isinstance(err, UpstreamError) and err.payload:
        return Response(err.status, err.payload, content_type=err.content_type)
    return Response(err.status, orjson.dumps(err.body()), content_type="application/json")


def raw_response(status: int, headers: CIMultiDict[str], payload: bytes) -> Response:
    """The cluster's buffered answer as it was."""
    return Response(status, payload, headers=end_to_end_headers(headers, drop=("Content-Length",)))


async def json_answer(
    request: Request,
    status: int,
    headers: CIMultiDict[str],
    body: Any,
    extra: Mapping[str, str],
    big: bool = False,
) -> Response:
    """An answer the proxy built; indented, with a final newline, when the client asked for `pretty`.
    A `big` one is serialized in a worker thread."""
    pretty = request.query.get("pretty", "false").lower() in ("", "true")
    option = orjson.OPT_SERIALIZE_NUMPY | (orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE if pretty else 0)
    data = (
        await asyncio.to_thread(orjson.dumps, body, option=option)
        if big
        else orjson.dumps(body, option=option)
    )
    out = end_to_end_headers(headers, drop=("Content-Length", "Content-Encoding"))
    if "Content-Type" not in out:
        out["Content-Type"] = "application/json"
    out.update(extra)
    return Response(status, data, headers=out)
