"""Several cluster nodes behind one base URL: round robin, failover on connection errors, TLS.

Every call site builds its URLs on `NodePool.base` (the first node) as if there were one cluster
address; `FailoverSession` sends each request to the next node in turn instead and, when that node
cannot be reached, to the one after. A request is sent again elsewhere only when it certainly never
reached a node (the connection could not be made) or when sending it twice cannot change anything (a
read: GET/HEAD, or a search, count, term-vector, analysis or mget call, with a body held in memory).
A write that may have reached a node is never repeated: its failure is the client's to see (502).
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import aiohttp
from yarl import URL

# Endpoints (the last path segment) that only read: sending one twice answers twice, changes nothing.
# Not `_search/scroll` (a scroll continuation moves its cursor) nor `_pit` (opens a context).
READ_ENDPOINTS = frozenset(
    (
        "_search",
        "_msearch",
        "_count",
        "_mtermvectors",
        "_termvectors",
        "_analyze",
        "_field_caps",
        "_mget",
        "_validate",
        "_explain",
        "_search_shards",
    )
)
READ_METHODS = frozenset(("GET", "HEAD", "OPTIONS"))
# Connected, then cut before an answer: the request may have reached the node.
MAYBE_SENT = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)
DEFAULT_QUARANTINE = 2.0  # seconds a node that refused a connection goes to the back of the line


def parse_nodes(values: Iterable[str]) -> tuple[str, ...]:
    """Node URLs from `--upstream` values, each one URL or a comma-separated list; without a trailing
    slash. Raises ValueError for a URL that is not http(s)://host[:port][/prefix] or carries credentials
    (each request goes up with its own, see `proxy.make_app`)."""
    nodes: list[str] = []
    for value in values:
        for part in value.split(","):
            part = part.strip()
            if not part:
                continue
            url = URL(part)
            if url.scheme not in ("http", "https") or not url.host:
                raise ValueError(f"expected an http:// or https:// node URL, got {part!r}")
            if url.user is not None or url.password is not None:
                raise ValueError(
                    "the upstream URL must not carry credentials: the proxy passes on each client's own "
                    "(Authorization and other authentication headers), so nobody reads more through it "
                    "than directly"
                )
            if url.query_string or url.fragment:
                raise ValueError(f"a node URL takes no query or fragment, got {part!r}")
            nodes.append(str(url).rstrip("/"))
    if not nodes:
        raise ValueError("no upstream node given")
    if len(set(nodes)) != len(nodes):
        raise ValueError("an upstream node is listed twice")
    return tuple(nodes)


def client_ssl(
    ca: str | None = None, cert: str | None = None, key: str | None = None, verify: bool = True
) -> ssl.SSLContext:
    """The TLS context for https nodes: the system's trust store or `ca` (a PEM bundle), a client
    certificate when `cert` is given (`key`: its private key, unless in the same file), and no check
    of the node's certificate at all when `verify` is False."""
    if key and not cert:
        raise ValueError("--upstream-key needs --upstream-cert")
    ctx = ssl.create_default_context(cafile=ca)
    if cert:
        ctx.load_cert_chain(cert, key)
    if not verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def server_ssl(cert: str, key: str | None = None) -> ssl.SSLContext:
    """The TLS context of the proxy's own listener."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    return ctx


class NodePool:
    """The nodes in round-robin order; one that could not be reached goes to the back for a while."""

    def __init__(
        self,
        nodes: Sequence[str],
        *,
        quarantine: float = DEFAULT_QUARANTINE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not nodes:
            raise ValueError("no upstream node given")
        self.nodes = tuple(n.rstrip("/") for n in nodes)
        self.quarantine = quarantine
        self.clock = clock
        self._next = 0
        self._down_until: dict[str, float] = {}

    @property
    def base(self) -> str:
        """The URL prefix call sites build on; `FailoverSession` swaps it for the node it picks."""
        return self.nodes[0]

    def order(self) -> list[str]:
        """Every node once, starting one further than the previous call; nodes that failed lately last."""
        start = self._next
        self._next = (self._next + 1) % len(self.nodes)
        turn = [self.nodes[(start + i) % len(self.nodes)] for i in range(len(self.nodes))]
        now = self.clock()
        up = [n for n in turn if self._down_until.get(n, 0.0) <= now]
        return up + [n for n in turn if n not in up]

    def failed(self, node: str) -> None:
        self._down_until[node] = self.clock() + self.quarantine

    def answered(self, node: str) -> None:
        self._down_until.pop(node, None)

    def within(self, url: str | URL) -> str:
        """A URL built on `base`, as text; a request outside the upstream cluster is refused."""
        text = str(url)
        if not text.startswith(self.base):
            raise ValueError("a request outside the upstream cluster")
        return text

    def locate(self, url: str | URL) -> tuple[str, URL]:
        """(prefix, rest) of a URL built on `base`: the rest as it is encoded."""
        return self.base, URL(self.within(url)[len(self.base) :] or "/", encoded=True)


def may_resend(method: str, url: URL, data: Any) -> bool:
    """True when sending the request a second time cannot change anything (see the module doc)."""
    if data is not None and not isinstance(data, (bytes, bytearray, str)):
        return False  # a stream is consumed by the first attempt
    if method.upper() in READ_METHODS:
        return True
    segments = [s for s in url.path.split("/") if s]
    return bool(segments) and segments[-1] in READ_ENDPOINTS


class FailoverSession:
    """What the proxy uses of `aiohttp.ClientSession` (`request`, `post`, `get`, `head`, `close`), each
    request on the next node of `pool`, failing over as the module doc says."""

    def __init__(self, session: aiohttp.ClientSession, pool: NodePool) -> None:
        self.session = session
        self.pool = pool

    @property
    def closed(self) -> bool:
        return self.session.closed

    async def close(self) -> None:
        await self.session.close()

    def request(self, method: str, url: str | URL, **kwargs: Any) -> _Pending:
        return _Pending(self._send(method, url, kwargs))

    def get(self, url: str | URL, **kwargs: Any) -> _Pending:
        return self.request("GET", url, **kwargs)

    def post(self, url: str | URL, **kwargs: Any) -> _Pending:
        return self.request("POST", url, **kwargs)

    def put(self, url: str | URL, **kwargs: Any) -> _Pending:
        return self.request("PUT", url, **kwargs)

    def head(self, url: str | URL, **kwargs: Any) -> _Pending:
        return self.request("HEAD", url, **kwargs)

    def delete(self, url: str | URL, **kwargs: Any) -> _Pending:
        return self.request("DELETE", url, **kwargs)

    async def _send(self, method: str, url: str | URL, kwargs: dict[str, Any]) -> aiohttp.ClientResponse:
        if len(self.pool.nodes) == 1:  # nowhere to fail over to: the call as it is, on the one node
            self.pool.within(url)  # a request outside the upstream cluster is refused here too
            target = url if isinstance(url, URL) else URL(url, encoded=True)
            return await self.session.request(method, target, **kwargs)
        _, rest = self.pool.locate(url)
        resend = may_resend(method, rest, kwargs.get("data"))
        last: BaseException | None = None
        for node in self.pool.order():
            target = URL(node + str(rest), encoded=True)
            try:
                resp = await self.session.request(method, target, **kwargs)
            except aiohttp.ClientConnectorCertificateError:
                raise  # a certificate the CA bundle does not vouch for is configuration: no node will do
            except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
                self.pool.failed(node)  # never connected: nothing was sent
                last = exc
                continue
            except MAYBE_SENT as exc:
                self.pool.failed(node)
                if not resend:
                    raise
                last = exc
                continue
            self.pool.answered(node)
            return resp
        assert last is not None
        raise last


class _Pending:
    """A request under way: awaited, or used with `async with` like aiohttp's own."""

    def __init__(self, coro: Any) -> None:
        self._coro = coro
        self._resp: aiohttp.ClientResponse | None = None

    def __await__(self):
        return self._coro.__await__()

    async def __aenter__(self) -> aiohttp.ClientResponse:
        self._resp = await self._coro
        return self._resp

    async def __aexit__(self, *exc: object) -> None:
        assert self._resp is not None
        self._resp.release()
        await self._resp.wait_for_close()
