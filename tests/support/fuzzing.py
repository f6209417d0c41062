"""Bad input for the proxy: the proxy with a tagging fake cluster behind it in a thread, requests as raw
bytes, fixed malformed cases, and the verdict on each answer. Shared by tests/unit/test_fuzz_proxy.py (a
few hundred generated examples in CI) and benchmarks/fuzz.py (>= 10,000, with the proxy's peak RSS);
the generator is `tests.support.fuzz_strategies`.

The proxy runs for real (`make_app` + `start_server`) on an event loop in a thread of its own;
requests go to it as raw bytes over a socket, so anything a client could send can be sent (lowercase
methods, bad framing, 8 KiB+ request lines). The fake cluster marks every answer it makes with
`X-Fake-Upstream: 1`: an error answer without that header is the sidecar's own."""

from __future__ import annotations

import http.client
import json
import math
import socket
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from bmx_rerank.proxy import start_server
from tests.support.fake_cluster import UPSTREAM_TAG, TaggingCluster, proxy_app
from tests.support.proxy_thread import LoopThread
from tests.support.serving import serve_app

# ---- the servers, in a thread ---------------------------------------------------------------------


@dataclass
class Servers:
    """Where the proxy (with the tagging cluster behind it) listens."""

    proxy_host: str = "127.0.0.1"
    proxy_port: int = 0
    upstream: str = ""


STATS_INDICES = ("docs", "docs,other", "docs-*", "other")


@contextmanager
def running(**config: Any) -> Iterator[Servers]:
    """Start the tagging cluster and the proxy on an event loop in a daemon thread; stop both on exit."""
    loop = LoopThread()
    runners: list[web.AppRunner] = []
    try:
        # a cluster bounds a head by its size (http.max_header_size), not by its number of headers
        fake_runner, upstream = loop.run(serve_app(TaggingCluster().app(), max_headers=1 << 15), 30)
        runners.append(fake_runner)
        runner, url = loop.run(start_server(proxy_app(upstream, STATS_INDICES, **config)), 30)
        runners.insert(0, runner)
        yield Servers(proxy_port=int(url.rsplit(":", 1)[1]), upstream=upstream)
    finally:
        for runner in runners:
            loop.run(runner.cleanup(), 30)
        loop.close()


# ---- sending raw requests -------------------------------------------------------------------------


@dataclass(frozen=True)
class Raw:
    """One request exactly as it goes on the wire (head and body given separately for readability)."""

    method: str
    target: str
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""
    framing: str = "length"  # length | chunked | none | both (Content-Length and Transfer-Encoding)

    def wire(self, host: str) -> bytes:
        lines = [f"{self.method} {self.target} HTTP/1.1", f"Host: {host}", "Connection: close"]
        lines += [f"{k}: {v}" for k, v in self.headers]
        body = self.body
        if self.framing in ("length", "both"):
            lines.append(f"Content-Length: {len(body)}")
        if self.framing in ("chunked", "both"):
            lines.append("Transfer-Encoding: chunked")
            if self.framing == "chunked":
                body = (f"{len(body):x}\r\n".encode() + body + b"\r\n" if body else b"") + b"0\r\n\r\n"
        head = "\r\n".join(lines).encode("latin-1", "replace") + b"\r\n\r\n"
        return head + body

    def describe(self) -> str:
        return f"{self.method} {self.target[:120]} body={len(self.body)}B {self.body[:160]!r} framing={self.framing}"


@dataclass(frozen=True)
class Answer:
    status: int  # 0: the connection closed without an answer
    headers: dict[str, str]
    body: bytes


def send(servers: Servers, raw: Raw | bytes, timeout: float = 30.0) -> Answer:
    """Send the bytes, read one HTTP answer (or none, when the server just closes)."""
    data = raw.wire(f"{servers.proxy_host}:{servers.proxy_port}") if isinstance(raw, Raw) else raw
    with socket.create_connection((servers.proxy_host, servers.proxy_port), timeout=timeout) as sock:
        try:
            sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may answer and close before reading everything: read what it said
        resp = http.client.HTTPResponse(sock, method=raw.method.upper() if isinstance(raw, Raw) else None)
        try:
            resp.begin()
        except (http.client.RemoteDisconnected, ConnectionResetError):
            return Answer(0, {}, b"")
        except http.client.HTTPException as exc:  # e.g. a status line that is not HTTP/1.x
            return Answer(-1, {}, repr(exc).encode())
        try:
            body = resp.read()
        except (http.client.IncompleteRead, ConnectionResetError) as exc:
            body = getattr(exc, "partial", b"")
        return Answer(resp.status, {k.lower(): v for k, v in resp.getheaders()}, body)


# ---- the verdict ----------------------------------------------------------------------------------


def es_error_shape(body: bytes, status: int) -> str | None:
    """None when `body` is `{"error": {"root_cause": [...], "type", "reason"}, "status": status}`."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return f"not JSON: {body[:200]!r}"
    if not isinstance(doc, dict) or not isinstance(doc.get("error"), dict):
        return f"no error object: {body[:200]!r}"
    err = doc["error"]
    if not isinstance(err.get("root_cause"), list) or not err["root_cause"]:
        return f"no root_cause: {body[:200]!r}"
    if not isinstance(err.get("type"), str) or not isinstance(err.get("reason"), str):
        return f"no type/reason: {body[:200]!r}"
    if doc.get("status") != status:
        return f"status {doc.get('status')} in the body, {status} on the wire"
    return None


def problems(raw: Raw | None, answer: Answer) -> list[str]:
    """What is wrong with the proxy's answer to `raw`: [] when it is acceptable."""
    out = []
    from_upstream = answer.headers.get(UPSTREAM_TAG.lower()) == "1"
    if answer.status == 0:
        out.append("no answer at all (connection closed)")
    elif answer.status == -1:
        out.append(f"an answer that is not HTTP/1.x: {answer.body[:200]!r}")
    elif answer.status >= 500 and not from_upstream:
        out.append(f"sidecar answered {answer.status}: {answer.body[:300]!r}")
    if answer.status >= 400 and not from_upstream and (raw is None or raw.method.upper() != "HEAD"):
        shape = es_error_shape(answer.body, answer.status)
        if shape:
            out.append(f"rejection {answer.status} not in Elasticsearch's error shape: {shape}")
    marker = answer.headers.get("x-bmx-rerank", "")
    if answer.status == 200 and marker in ("bmx", "bm25"):
        try:
            doc = json.loads(answer.body)
            scores = [h.get("_score") for h in doc["hits"]["hits"]]
        except (ValueError, KeyError, TypeError) as exc:
            return [*out, f"reranked 200 is not a search answer: {exc}"]
        bad = [s for s in scores if not isinstance(s, (int, float)) or not math.isfinite(s)]
        if bad:
            out.append(f"reranked scores not finite numbers: {bad[:3]}")
    return out


# ---- fixed cases ---------------------------------------------------------------------------------


def bmx_body(**bmx: Any) -> bytes:
    """A reranked search for `t0 t3` with these ext.bmx parameters."""
    return json.dumps(
        {"query": {"match": {"body": "t0 t3"}}, "ext": {"bmx": {"field": "body", **bmx}}}
    ).encode()


LONG = "a" * 9000
# Malformed HTTP a client could send, as it goes on the wire.
RAW_HTTP = {
    "request line over 8 KiB": f"POST /docs/_search?q={LONG} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
    "header over 16 KiB": f"GET / HTTP/1.1\r\nHost: x\r\nX-Big: {LONG * 2}\r\n\r\n",
    "many headers": "GET / HTTP/1.1\r\nHost: x\r\n" + "".join(f"X-{i}: v\r\n" for i in range(200)) + "\r\n",
    "content-length with transfer-encoding": (
        "POST /docs/_search HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
        "0\r\n\r\n"
    ),
    "lowercase method": "post /docs/_search HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
    "unknown method": "FOO /docs/_search HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
    "bad chunk size": "POST /docs/_search HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
    "two content-lengths": (
        "POST /docs/_search HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}"
    ),
    "negative content-length": "POST /docs/_search HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
    "header without colon": "GET / HTTP/1.1\r\nHost: x\r\nnot a header\r\n\r\n",
    "absolute-URL target": (
        "POST http://127.0.0.1:1/docs/_search HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
    ),
    "asterisk target": "OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n",
    "HTTP/2.0 on a 1.1 socket": "GET / HTTP/2.0\r\nHost: x\r\n\r\n",
    "HTTP/1.2": "GET /docs/_search HTTP/1.2\r\nHost: x\r\n\r\n",
    "NUL in the target": "GET /do\x00cs/_search HTTP/1.1\r\nHost: x\r\n\r\n",
}


def nest(depth: int, where: str) -> bytes:
    """A body nested `depth` levels deep: inside ext.bmx, inside the query, or as the whole body."""
    inner = b"[" * depth + b"1" + b"]" * depth
    if where == "bmx":
        return b'{"query":{"match":{"body":"t0"}},"ext":{"bmx":{"field":"body","augment":' + inner + b"}}}"
    if where == "query":
        return b'{"query":{"bool":{"filter":' + inner + b"}}}"
    if where == "objects":
        return b'{"a":' * depth + b"1" + b"}" * depth
    return inner


def gzip_bomb(inflated: int) -> bytes:
    """A valid gzip of a JSON search whose inflated size is about `inflated` bytes (mostly spaces)."""
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    out = [comp.compress(b'{"query":{"match":{"body":"t0"}},"ext":{"bmx":{"field":"body"}}')]
    block = b" " * (1 << 20)
    for _ in range(inflated >> 20):
        out.append(comp.compress(block))
    out.append(comp.compress(b"}"))
    out.append(comp.flush())
    return b"".join(out)
