"""Reading request bodies within bounds: streamed inflation that stops a bomb, a size cap past which a
body goes up unread, a nesting depth past which it is not rewritten, and parsing off the event loop
for large ones."""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import AsyncIterator
from typing import Any

import orjson
from aiohttp import web

from bmx_rerank.errors import SearchError, bad_request

CHUNK = 64 * 1024
CHECK_BYTES = 64 * 1024  # inflated bytes of a passthrough body checked for a valid encoding
BAD_ENCODING = web.RequestKey("bmx_bad_encoding", str)  # set when a body does not decode as labelled
# Nesting levels of a search body the proxy rewrites (deeper ones it forwards unread, or refuses when
# they ask for a rerank): far beyond any real query (Elasticsearch refuses queries nested 30+ deep) and
# far below what copying and re-serializing can handle (orjson stops at 255, Python's recursion ~1000).
MAX_DEPTH = 100
# Bodies and answers bigger than this are parsed and serialized in a worker thread, so passthrough
# traffic never waits behind a large rerank.
THREAD_BYTES = 1 << 20


class TooLarge(Exception):
    """A search body past `max_body` (read or inflated): it goes upstream as sent, streamed, unread."""

    def __init__(self, prefix: bytes) -> None:
        super().__init__("search body too large to read")
        self.prefix = prefix

    async def body(self, request: web.Request) -> AsyncIterator[bytes]:
        yield self.prefix
        async for chunk in request.content.iter_chunked(CHUNK):
            yield chunk


class Unparsable:
    """Marks a body the proxy cannot read: the cluster gets it as it is and answers for itself."""


async def read_json_body(request: web.Request, limit: int) -> tuple[bytes, bytes]:
    """(raw bytes as sent, decoded bytes) of a search body; gzip and deflate bodies are inflated,
    streamed, to look in.

    Raises `TooLarge` once the bytes read or inflated pass `limit`: the cluster decides about such a
    body, as it would without the proxy (it may well accept a large `_msearch`), and it gets the bytes
    as they were sent. A body whose encoding does not decode is a 400 (the cluster would just close the
    connection)."""
    encoding = request.headers.get("Content-Encoding", "").lower().strip()
    inflater = Inflater(encoding, limit) if encoding in ("gzip", "deflate") else None
    parts: list[bytes] = []
    size = 0
    async for chunk in request.content.iter_chunked(CHUNK):
        parts.append(chunk)
        size += len(chunk)
        if inflater is not None:
            inflater.feed(chunk)
        if size > limit or (inflater is not None and inflater.size > limit):
            raise TooLarge(b"".join(parts))
    raw = b"".join(parts)
    if inflater is None or not raw:
        return raw, raw
    return raw, inflater.result()


def stream_body(request: web.Request) -> AsyncIterator[bytes] | None:
    """The request body as an async stream (None when there is none): never buffered whole.

    A body labelled gzip or deflate has its first bytes inflated on the way (a bounded check, output
    discarded): the cluster closes the connection on a body that does not decode, and the client then
    learns why (400) instead of getting a 502 that reads as an outage."""
    if not request.body_exists:
        return None
    encoding = request.headers.get("Content-Encoding", "").lower().strip()
    check = Inflater(encoding, CHECK_BYTES) if encoding in ("gzip", "deflate") else None

    async def chunks() -> AsyncIterator[bytes]:
        nonlocal check
        async for chunk in request.content.iter_chunked(CHUNK):
            if check is not None:
                try:
                    check.feed(chunk)
                    check.parts.clear()
                except SearchError:
                    request[BAD_ENCODING] = encoding
                    check = None
                else:
                    check = None if check.size > check.limit else check
            yield chunk

    return chunks()


class Inflater:
    """Streamed gzip/deflate inflation that stops a little past `limit` bytes (a bomb never inflates)."""

    def __init__(self, encoding: str, limit: int) -> None:
        self.encoding = encoding
        self.wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
        self.limit = limit
        self.size = 0
        self.parts: list[bytes] = []
        self._obj = zlib.decompressobj(self.wbits)

    def feed(self, data: bytes) -> None:
        try:
            while data and self.size <= self.limit:
                if self._obj.eof:  # a further gzip member follows
                    self._obj = zlib.decompressobj(self.wbits)
                piece = self._obj.decompress(data, self.limit - self.size + 1)
                self.parts.append(piece)
                self.size += len(piece)
                data = self._obj.unused_data if self._obj.eof else self._obj.unconsumed_tail
        except zlib.error as exc:
            raise self._broken() from exc

    def result(self) -> bytes:
        if not self._obj.eof:
            raise self._broken()
        return b"".join(self.parts)

    def _broken(self) -> SearchError:
        return bad_request(
            f"the request body is labelled [Content-Encoding: {self.encoding}] but is not valid {self.encoding}",
            "parse_exception",
        )


def loads(data: bytes) -> Any:
    """The JSON value of a body (None when empty), or `Unparsable`."""
    try:
        return orjson.loads(data) if data.strip() else None
    except orjson.JSONDecodeError:
        return Unparsable


async def parse(data: bytes) -> Any:
    """`loads`, in a worker thread for large payloads."""
    if len(data) > THREAD_BYTES:
        return await asyncio.to_thread(loads, data)
    return loads(data)


def too_deep(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether a JSON value nests objects/arrays deeper than `limit` (iterative: no recursion limit)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item
        if depth > limit:
            return True
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return False


def too_deep_error() -> SearchError:
    return bad_request(
        f"[bmx] the request body nests deeper than [{MAX_DEPTH}] levels, more than a rerank reads",
        "x_content_parse_exception",
    )
