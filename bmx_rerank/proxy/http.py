"""What the proxy's handlers read and answer: a request as its connection parsed it (head, body as it
comes, the per-request state the proxy keeps), and an answer (a body in hand, or one streamed).

The server (`proxy.server`) makes them; nothing here touches a socket except through `Body`'s
connection, which pauses reading while a body's unread bytes pile up."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Protocol

import orjson
from multidict import CIMultiDict, CIMultiDictProxy, MultiDict, MultiDictProxy
from yarl import URL

if TYPE_CHECKING:
    from bmx_rerank.h1 import Client
    from bmx_rerank.proxy.config import ProxyState
    from bmx_rerank.proxy.memory import Account
    from bmx_rerank.rerank.pipeline import Marker

# A request body's bytes held unread before its connection stops reading (aiohttp's server paused at
# 2 x 64 KiB; a search body usually arrives whole in one read and is taken at once).
HIGH_WATER = 1 << 18
LOW_WATER = HIGH_WATER // 4
NO_QUERY: MultiDictProxy[str] = MultiDictProxy(MultiDict())


class Chunks(Protocol):
    """A body streamed as it comes; `aclose` when done with it, read whole or not."""

    def __aiter__(self) -> AsyncIterator[bytes]: ...
    async def aclose(self) -> None: ...


class Reading(Protocol):
    """What a body needs of its connection."""

    def pause_body(self) -> None: ...
    def resume_body(self) -> None: ...
    def continue_body(self) -> None: ...


class Body:
    """A request body as it comes off the connection: chunks in arrival order, the connection's reading
    paused past `HIGH_WATER` bytes unread and resumed below `LOW_WATER`. A request that said
    `Expect: 100-continue` is told to go on when its body is first read, never before: a body the proxy
    refuses up front (a 413) is not solicited."""

    __slots__ = ("_conn", "_chunks", "_buffered", "_eof", "_error", "_waiter", "_expects", "size", "dropped")

    def __init__(self, conn: Reading, *, expects: bool = False) -> None:
        self._conn = conn
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._eof = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._expects = expects
        self.size = 0  # bytes received so far
        self.dropped = False  # the rest is read off the connection and dropped (`drop`)

    # the connection's side
    def feed(self, chunk: bytes) -> None:
        if self.dropped:
            self.size += len(chunk)
            return
        self._chunks.append(chunk)
        self._buffered += len(chunk)
        self.size += len(chunk)
        if self._buffered > HIGH_WATER:
            self._conn.pause_body()
        self._wake()

    def end(self) -> None:
        self._eof = True
        self._wake()

    def drop(self) -> None:
        """Nobody reads the rest: what is buffered goes, and what comes is dropped."""
        self.dropped = True
        self._chunks.clear()
        self._buffered = 0

    def fail(self, exc: BaseException) -> None:
        """The connection was lost before the body ended."""
        if not self._eof:
            self._error = exc
            self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # the handler's side
    def at_eof(self) -> bool:
        """All of the body was received and read."""
        return self._eof and not self._chunks

    @property
    def complete(self) -> bool:
        """All of the body was received (read or not)."""
        return self._eof

    async def read_chunk(self, limit: int = 1 << 16) -> bytes:
        """The next bytes of the body as they came, at most `limit` of them; b"" at its end."""
        while not self._chunks:
            if self._eof:
                return b""
            if self._error is not None:
                raise self._error
            if self._expects:
                self._expects = False
                self._conn.continue_body()
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        chunk = self._chunks.popleft()
        if len(chunk) > limit:
            self._chunks.appendleft(chunk[limit:])
            chunk = chunk[:limit]
        self._buffered -= len(chunk)
        if self._buffered <= LOW_WATER:
            self._conn.resume_body()
        return chunk

    async def iter_chunked(self, limit: int) -> AsyncIterator[bytes]:
        """The body's bytes as they come, at most `limit` at a time."""
        while chunk := await self.read_chunk(limit):
            yield chunk

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.iter_chunked(1 << 20)])


class Request:
    """One request: its head as sent (`target` is the request target as it came, path and query still
    encoded), its body, the proxy's state, and what the proxy learns about it while serving it."""

    __slots__ = (
        "method",
        "target",
        "version",
        "headers",
        "content",
        "keep_alive",
        "client",
        "state",
        "arrived",
        "account",
        "marker",
        "bad_encoding",
        "end_to_end",
        "_url",
        "_path",
    )

    def __init__(
        self,
        method: str,
        target: str,
        version: tuple[int, int],
        headers: CIMultiDictProxy[str],
        content: Body,
        keep_alive: bool,
        client: Client,
        state: ProxyState,
        arrived: float,
    ) -> None:
        self.method = method
        self.target = target
        self.version = version
        self.headers = headers
        self.content = content
        self.keep_alive = keep_alive
        self.client = client  # its connection, where an answer may be relayed as it comes
        self.state = state
        self.arrived = arrived  # time.monotonic() when its head was read: its deadline counts from it
        self.account: Account | None = None  # its share of the in-flight budget (searches)
        self.marker: Marker | None = None  # what happened to a search, for the metrics and the log
        self.bad_encoding: str | None = None  # a body that does not decode as its Content-Encoding says
        self.end_to_end: CIMultiDict[str] | None = None  # its headers less hop-by-hop ones (framing)
        self._url: URL | None = None  # made when first asked for (not every request needs it)
        self._path: str | None = None

    @property
    def raw_path(self) -> str:
        """The request target as sent (path and query, still encoded)."""
        return self.target

    @property
    def url(self) -> URL:
        if self._url is None:
            self._url = URL(self.target, encoded=True)
        return self._url

    @property
    def encoded_path(self) -> str:
        """The path as sent, still encoded (a date-math name's `/` is `%2F` there, and its own)."""
        return self.target.split("?", 1)[0]

    @property
    def path(self) -> str:
        """The decoded path."""
        if self._path is None:
            path = self.encoded_path
            self._path = path if "%" not in path else self.url.path
        return self._path

    @property
    def query(self) -> MultiDictProxy[str]:
        if "?" not in self.target:  # most searches: no URL to make
            return NO_QUERY
        return self.url.query

    @property
    def content_length(self) -> int | None:
        value = self.headers.get("Content-Length")
        return int(value) if value is not None and value.isdigit() else None

    @property
    def body_exists(self) -> bool:
        """The request has a body (a length above 0, or chunks)."""
        return bool(self.content_length) or "Transfer-Encoding" in self.headers


class Response:
    """An answer: status, headers and either a body in hand or `chunks` streamed as they come (`close`:
    the connection ends after it). The server adds the framing headers (length or chunks,
    `Connection`). Or an answer relayed to the client as the cluster sent it (`sent`: done once all of
    it went, with whether the cluster's connection stays open; `h1.H1Response.pipe`)."""

    __slots__ = ("status", "reason", "headers", "body", "chunks", "sent", "close")

    def __init__(
        self,
        status: int,
        body: bytes = b"",
        *,
        headers: CIMultiDict[str] | None = None,
        reason: str | None = None,
        chunks: Chunks | None = None,
        sent: asyncio.Future[bool] | None = None,
        content_type: str | None = None,
    ) -> None:
        self.status = status
        self.reason = reason
        self.headers: CIMultiDict[str] = headers if headers is not None else CIMultiDict()
        self.body = body
        self.chunks = chunks
        self.sent = sent
        self.close = False
        if content_type is not None:
            self.headers["Content-Type"] = content_type

    def force_close(self) -> None:
        self.close = True


def json_response(value: Any, status: int = 200) -> Response:
    return Response(status, orjson.dumps(value), content_type="application/json")


def reason_of(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""
