"""Reading request bodies within bounds: streamed inflation that stops a bomb, a size cap past which a
body goes up unread, the guard that keeps from the cluster what would harm it (bodies nested deeper
than it accepts, bodies over its `http.max_content_length`), and parsing off the event loop for large
ones."""

from __future__ import annotations

import asyncio
import logging
import re
import sys
import zlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import numpy as np
import orjson

from bmx_rerank import defaults
from bmx_rerank.errors import SearchError, bad_request
from bmx_rerank.proxy.http import Request
from bmx_rerank.proxy.memory import charge

log = logging.getLogger("bmx_rerank.proxy")

CHUNK = 64 * 1024
CHECK_BYTES = 64 * 1024  # inflated bytes of a passthrough body checked for a valid encoding
PIECE = 1 << 20  # inflated bytes at most per piece, when inflating a streamed body
# Nesting levels of a search body the proxy forwards (`--max-depth`; deeper ones are a 400 before they
# reach the cluster): a query at Elasticsearch's own limit of 30 nested bool queries fits, and it is
# far below what copying and re-serializing can handle (orjson stops at 255, Python's recursion ~1000)
# and what kills a node (OpenSearch dies of a StackOverflowError on a few hundred levels).
MAX_DEPTH = defaults.MAX_DEPTH
# Bodies and answers bigger than this are parsed and serialized in a worker thread, so passthrough
# traffic never waits behind a large rerank.
THREAD_BYTES = 1 << 20


class TooLarge(Exception):
    """A search body past `max_body` (read or inflated): it goes upstream as sent, streamed, unread, but
    checked on the way (`body`)."""

    def __init__(
        self, prefix: bytes, max_content: int | None = None, max_depth: int = 0, encoding: str = ""
    ) -> None:
        super().__init__("search body too large to read")
        self.prefix = prefix
        self.max_content = max_content
        self.max_depth = max_depth
        self.size = 0  # bytes sent up so far
        self.refusal: SearchError | None = None  # why the stream was cut, when it was
        compressed = inflated_as(encoding) is not None and (max_depth or max_content is not None)
        self._inflater = Inflater(encoding, max_content or sys.maxsize) if compressed else None
        self._depth = RawDepth() if max_depth else None

    async def body(self, request: Request) -> AsyncIterator[bytes]:
        """The body as sent, each chunk sent up only once it is known to keep the body within the
        cluster's limits: its length read (or inflated) within `max_content`, its nesting, counted on the
        inflated bytes outside strings, within `max_depth`. Else the stream is cut there, with the reason
        in `refusal`: the cluster gets a body that never ends, and never reads it."""
        yield await self._checked(self.prefix)
        async for chunk in request.content.iter_chunked(CHUNK):
            yield await self._checked(chunk)

    async def _checked(self, chunk: bytes) -> bytes:
        self.size += len(chunk)
        if self.max_content is not None and self.size > self.max_content:
            self._refuse(ContentTooLong(self.max_content))
        pieces = self._inflater.pieces(chunk) if self._inflater is not None else (chunk,)
        try:
            for piece in pieces:
                if self._depth is not None and self._depth.feed(piece) > self.max_depth:
                    self._refuse(TooDeep(self.max_depth))
                await asyncio.sleep(0)  # a bomb's chunk inflates to many pieces: the loop goes on meanwhile
        except SearchError as err:  # or the inflater's 400: not the gzip or deflate it is labelled
            self.refusal = self.refusal or err
            raise
        if (
            self._inflater is not None
            and self.max_content is not None
            and self._inflater.size > self.max_content
        ):
            self._refuse(ContentTooLong(self.max_content))
        return chunk

    def _refuse(self, error: SearchError) -> None:
        self.refusal = error
        raise error


class ContentTooLong(SearchError):
    """A search body over `--max-content-length` (the cluster's `http.max_content_length`): a 413."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            413,
            "content_too_long_exception",
            f"[bmx] the request body is larger than [{limit}] bytes (--max-content-length, the "
            "cluster's http.max_content_length)",
        )


class Unparsable:
    """Marks a body the proxy cannot read: the cluster gets it as it is and answers for itself."""


async def read_json_body(
    request: Request, limit: int, max_content: int | None = None, max_depth: int = 0
) -> tuple[bytes, bytes]:
    """(raw bytes as sent, decoded bytes) of a search body; gzip and deflate bodies are inflated,
    streamed, to look in.

    Raises `TooLarge` once the bytes read or inflated pass `limit`: the cluster decides about such a
    body, as it would without the proxy (it may well accept a large `_msearch`), and it gets the bytes
    as they were sent, provided they nest no deeper than `max_depth` (0: not counted; see `TooLarge`). A body whose encoding does not decode is a 400 (the cluster would just close the
    connection). A body whose declared length, or whose bytes read or inflated, pass `max_content`
    is a 413 (`ContentTooLong`) and never reaches the cluster."""
    if max_content is not None and (request.content_length or 0) > max_content:
        raise ContentTooLong(max_content)
    encoding = request.headers.get("Content-Encoding", "").lower().strip()
    depth_limit = max_depth if is_text(request) else 0
    inflater = Inflater(encoding, limit) if inflated_as(encoding) else None
    parts: list[bytes] = []
    size = 0
    async for chunk in request.content.iter_chunked(CHUNK):
        charge(request, len(chunk))  # the in-flight budget: what is read, and what it inflates to
        parts.append(chunk)
        size += len(chunk)
        if inflater is not None:
            before = inflater.size
            inflater.feed(chunk)
            charge(request, inflater.size - before)
        if max_content is not None and size > max_content:
            raise ContentTooLong(max_content)
        if size > limit or (inflater is not None and inflater.size > limit):
            raise TooLarge(b"".join(parts), max_content, depth_limit, encoding)
    charge(request, size)  # the joined copy
    raw = b"".join(parts)
    if inflater is None or not raw:
        return raw, raw
    charge(request, inflater.size)
    return raw, inflater.result()


def stream_body(request: Request) -> AsyncIterator[bytes] | None:
    """The request body as an async stream (None when there is none): never buffered whole.

    A body labelled gzip or deflate has its first bytes inflated on the way (a bounded check, output
    discarded): the cluster closes the connection on a body that does not decode, and the client then
    learns why (400) instead of getting a 502 that reads as an outage."""
    if not request.body_exists:
        return None
    encoding = request.headers.get("Content-Encoding", "").lower().strip()
    check = Inflater(encoding, CHECK_BYTES) if inflated_as(encoding) else None

    async def chunks() -> AsyncIterator[bytes]:
        nonlocal check
        async for chunk in request.content.iter_chunked(CHUNK):
            if check is not None:
                try:
                    check.feed(chunk)
                    check.parts.clear()
                except SearchError:
                    request.bad_encoding = encoding
                    check = None
                else:
                    check = None if check.size > check.limit else check
            yield chunk

    return chunks()


def inflated_as(encoding: str) -> str | None:
    """The compression a `Content-Encoding` names, as the cluster reads it (Netty takes the `x-` names
    too), or None: another (the cluster's to read) or none."""
    return {"gzip": "gzip", "x-gzip": "gzip", "deflate": "deflate", "x-deflate": "deflate"}.get(encoding)


def _deflate_bits(first: bytes) -> int:
    """`deflate` as Netty reads it: a zlib stream (its two-byte header), else raw deflate."""
    zlib_header = len(first) >= 2 and first[0] & 0x0F == 8 and (first[0] << 8 | first[1]) % 31 == 0
    return zlib.MAX_WBITS if zlib_header else -zlib.MAX_WBITS


class Inflater:
    """Streamed gzip/deflate inflation that stops a little past `limit` bytes (a bomb never inflates)."""

    def __init__(self, encoding: str, limit: int) -> None:
        self.encoding = encoding
        self.wbits = (
            16 + zlib.MAX_WBITS if inflated_as(encoding) == "gzip" else 0
        )  # 0: known on the first bytes
        self.limit = limit
        self.size = 0
        self.parts: list[bytes] = []
        self._obj = zlib.decompressobj(self.wbits) if self.wbits else None

    def feed(self, data: bytes) -> None:
        """Inflate `data` and keep what it gives (`parts`)."""
        self.parts.extend(self.pieces(data))

    def pieces(self, data: bytes, step: int = PIECE) -> Iterator[bytes]:
        """Inflate `data`, in pieces of at most `step` bytes, kept by nobody here (a bomb's chunk never
        inflates whole at once)."""
        if self._obj is None and data:
            self.wbits = _deflate_bits(data)
            self._obj = zlib.decompressobj(self.wbits)
        try:
            while data and self.size <= self.limit:
                assert self._obj is not None
                if self._obj.eof:  # a further gzip member follows
                    self._obj = zlib.decompressobj(self.wbits)
                piece = self._obj.decompress(data, min(step, self.limit - self.size + 1))
                self.size += len(piece)
                data = self._obj.unused_data if self._obj.eof else self._obj.unconsumed_tail
                yield piece
        except zlib.error as exc:
            raise self._broken() from exc

    def result(self) -> bytes:
        if self._obj is None or not self._obj.eof:
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


# 19 digits or more: where an integer may be beyond 64 bits (-2^63 has 19)
LONG_DIGITS = re.compile(rb"\d{19,}")
INT64_EDGE = 2.0**63


def beyond_64_bits(data: bytes, value: Any) -> bool:
    """Whether a parsed body holds an integer orjson read as a float, being beyond 64 bits: written
    back it would change (1.2345678901234568e+29 for 123456789012345678901234567890), and a `term` on
    it would find other documents. A float literal that large (1e30) is read alike by the cluster;
    the digits' run tells the two apart, looked for first since it is rare."""
    if LONG_DIGITS.search(data) is None:
        return False
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float):
            if abs(item) >= INT64_EDGE and item.is_integer():
                return True
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


async def parse_request(data: bytes, request: Request) -> Any:
    """`parse` of a request's body, which the proxy may send on written anew: `Unparsable` also where
    it holds an integer beyond 64 bits (`beyond_64_bits`), which would not go on unchanged. The
    cluster's answers are only read, so `parse` reads them."""
    value = await parse(data, request)
    return Unparsable if value is not Unparsable and beyond_64_bits(data, value) else value


async def parse(data: bytes, request: Request | None = None) -> Any:
    """`loads`, in a worker thread for large payloads; with `request`, the parsed value is charged to
    its in-flight budget (estimated as the size of the text) before it is made."""
    if request is not None:
        charge(request, len(data))
    if len(data) > THREAD_BYTES:
        return await asyncio.to_thread(loads, data)
    return loads(data)


def nesting(value: Any) -> tuple[int, int]:
    """How deep a JSON value nests objects and arrays (the value itself is level 1), and how deep it
    nests `bool` queries, as Elasticsearch counts against `indices.query.bool.max_nested_depth`: one
    iterative walk (no recursion limit) for both."""
    deepest, deepest_bool = 0, 0
    stack: list[tuple[Any, int, int]] = [(value, 1, 0)]
    while stack:
        item, depth, bools = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(item, dict):
            for key, child in item.items():
                if isinstance(child, (dict, list)):
                    inner = bools + 1 if key == "bool" and isinstance(child, dict) else bools
                    deepest_bool = max(deepest_bool, inner)
                    stack.append((child, depth + 1, inner))
        else:
            stack.extend((c, depth + 1, bools) for c in item if isinstance(c, (dict, list)))
    return deepest, deepest_bool


class TooDeep(SearchError):
    """A search body nested deeper than `--max-depth`: a 400, as the cluster's parser would answer."""

    def __init__(self, limit: int = MAX_DEPTH) -> None:
        super().__init__(
            400,
            "x_content_parse_exception",
            f"[bmx] the request body nests deeper than [{limit}] levels (--max-depth), more than the "
            "cluster is sent",
        )


# A JSON string (escapes included), to blank out before brackets are counted.
# (Unrolled: the parts cannot overlap, so nothing backtracks; Python 3.10 has no possessive `*+`.)
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_DEPTH_CHUNK = 1 << 20


def raw_depth(data: bytes) -> int:
    """The deepest nesting of `[`/`{` in JSON text, counted on the bytes (outside strings), for a body
    the parser refused: orjson stops at 255 levels, the cluster's parser may not."""
    return RawDepth().feed(data)


class RawDepth:
    """The deepest nesting of `[`/`{` in JSON text fed piece by piece (a streamed body), counted on the
    bytes outside strings; a string may span pieces. Unbalanced closers never count below zero."""

    def __init__(self) -> None:
        self.deepest = 0
        self.level = 0
        self._in_string = False
        self._escaped = False  # the last piece ended in a string, on a backslash escaping the next byte

    def feed(self, data: bytes) -> int:
        """Count `data`; the deepest nesting so far."""
        if not data:
            return self.deepest
        if self._in_string:
            if self._escaped:
                data, self._escaped = data[1:], False
            data = b'"' + data  # the open string again from its start: it ends where a string ends
        # A string left open at the end is closed by a last quote (after a byte a pending backslash
        # escapes), so every string matches and the pattern never scans the open one from each of its
        # quotes again (quadratic); that quote is left over only when no string was open.
        outside = _STRING.sub(b"", data + b'\x00"')
        self._in_string = not outside.endswith(b'"')
        if self._in_string:  # inside a string, an odd run of backslashes ends on one escaping the next byte
            self._escaped = (len(data) - len(data.rstrip(b"\\"))) % 2 == 1
        self.deepest, self.level = _count(outside.translate(None, _NOT_BRACKETS), self.level, self.deepest)
        return self.deepest


def _count(brackets: bytes, level: int, deepest: int) -> tuple[int, int]:
    """(deepest, level after) for a run of `[]{}` bytes entered at `level`: vectorized, a part at a time."""
    for start in range(0, len(brackets), _DEPTH_CHUNK):
        part = brackets[start : start + _DEPTH_CHUNK]
        codes = np.frombuffer(part, dtype=np.uint8)
        steps = np.where((codes == ord("[")) | (codes == ord("{")), 1, -1).astype(np.int64)
        levels = level + np.cumsum(steps)
        if int(levels.min()) < 0:  # a stray closer: this part one by one (rare, only in broken bodies)
            for code in part:
                level = level + 1 if code in b"[{" else max(0, level - 1)
                deepest = max(deepest, level)
            continue
        deepest = max(deepest, int(levels.max()))
        level = int(levels[-1])
    return deepest, level


# Binary formats the cluster reads: their bytes are no text, so `[` and `{` in them are no nesting.
BINARY_TYPES = ("cbor", "smile")


def is_text(request: Request) -> bool:
    """Whether a body's brackets count as nesting: any body but a CBOR or Smile one. JSON and NDJSON, a
    body sent without a type, YAML (whose flow style nests with the same brackets), and any other type
    (the cluster refuses it, so counting costs nothing legitimate)."""
    kind = request.headers.get("Content-Type", "").lower()
    return not any(binary in kind for binary in BINARY_TYPES)


async def guard_unparsable(request: Request, decoded: bytes, limit: int, metrics: Any) -> None:
    """A search body the proxy cannot parse (not JSON, or not valid) goes to the cluster only when it
    is neither nested deeper than `limit` (counted on the raw bytes) nor could ask for a rerank:
    `ext.bmx` is never forwarded unread. Raises the 400 otherwise. CBOR and Smile bodies are the
    cluster's to read (`is_text`)."""
    if not is_text(request):
        return
    depth = 0
    if limit:
        charge(request, 2 * len(decoded))  # the copies the count makes
        big = len(decoded) > THREAD_BYTES
        depth = await asyncio.to_thread(raw_depth, decoded) if big else raw_depth(decoded)
    if limit and depth > limit:
        refuse(request, metrics, "depth", depth=depth)
        raise TooDeep(limit)
    if b'"bmx"' in decoded:
        refuse(request, metrics, "unparsable_bmx")
        raise bad_request(
            "[bmx] the request body asks for a rerank but is not JSON the rerank proxy can read and send "
            "on unchanged (not valid, or holding an integer beyond 64 bits)",
            "x_content_parse_exception",
        )


def refuse(request: Request, metrics: Any, reason: str, **fields: Any) -> None:
    """Count and log a request the guard keeps from the cluster."""
    metrics.guarded.labels(reason).inc()
    log.warning(
        "refused by the guard",
        extra={"fields": {"reason": reason, "method": request.method, "path": request.path, **fields}},
    )


def guard_parsed(request: Request, body: Any, max_depth: int, max_query_depth: int, metrics: Any) -> int:
    """A parsed search body (or `_msearch` line) nested deeper than the cluster accepts: the 400, before
    it reaches the cluster (0 turns a limit off). Returns the body's nesting depth (0: not an object
    or array), for the caller's own bound on what it rewrites."""
    if body is None or not isinstance(body, (dict, list)):
        return 0
    depth, bools = nesting(body)
    if max_depth and depth > max_depth:
        refuse(request, metrics, "depth")
        raise TooDeep(max_depth)
    if max_query_depth and bools > max_query_depth:
        refuse(request, metrics, "query_depth", depth=bools)
        raise bool_depth_error(max_query_depth)
    return depth


def bool_depth_error(limit: int) -> SearchError:
    """As Elasticsearch words it (its own limit, `indices.query.bool.max_nested_depth`, default 30)."""
    return bad_request(
        "The nested depth of the query exceeds the maximum nested depth for queries set in "
        f"[indices.query.bool.max_nested_depth] ([{limit}], --max-query-depth)",
        "x_content_parse_exception",
    )
