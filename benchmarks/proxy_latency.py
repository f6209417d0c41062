"""Latency and throughput of reranked searches through the proxy next to what a user would do otherwise.

For each engine: index SciFact (title + text, standard analyzer, 1 shard) into a fresh
`bmxtest-proxy-bench-*` index and start two proxies in child processes (exact statistics from one
sweep, held in memory; served as `bmx-rerank serve` serves, its log included): a "warm" one with its
caches, and a "first sight" one with every cache off (term vectors, lengths, analysis), so each of its
reranks is the first sight of its window and query.
Ways of asking, per window N (10, 100, 1000):

  plain size-10   a `match` query, size 10, straight to the engine
  plain size-N    the same with size N (what a user re-sorting the top N would ask)
  rescore N       size 10 with the engine's own `rescore` (window N, a `match` rescore query)
  plain size-10, gzip  the same with gzipped answers (several clients only; every other row asks for
                  none, as the official clients do by default: what compression costs the engine)
  passthrough     the plain size-10 request through the proxy, no ext.bmx
  bare relay      the same through a bare aiohttp relay (the floor of an aiohttp proxy hop)
  client relay    the same through aiohttp's server with the protocol relay's upstream client (how an
                  aiohttp hop's cost splits between its server and its client)
  protocol relay  the same through an HTTP/1.1 relay on asyncio.Protocol (the floor of a lower-level
                  Python server's hop: requests and answers framed, bytes forwarded)
  rerank warm N   ext.bmx window N, size 10, after the same search once (caches warm: the window
                  read whole from the LRU of windows seen once)
  rerank again N  the same a third time (the window moved to the main LRU; at 8 and 32 clients every
                  "rerank warm" is a third time or later: the closed loop repeats its queries)
  rerank first N  the same through the first-sight proxy
  rerank fresh N  the warm proxy's own first sight of the window, the one before "rerank warm" (one
                  client): a first sight with the caches on, as shipped, which also fills them
  rerank first --in-engine N  through a `serve --in-engine` proxy, every cache off: the window scored
                  by the engine's Painless rescore (each page's scores checked against the sidecar's)
  rerank warm --in-engine N   through a `serve --in-engine` proxy with its caches, after the engine
                  scored the window ENGINE_SIGHTS times and the sidecar kept it (checked: the same
                  page as "rerank again")
                  Both where the cluster has lang-painless and mapper-extras (the index then has
                  `serve --in-engine`'s `body.len`; `--no-in-engine`: neither). Over several shards
                  a first sight whose window's edge ties with the next hit is the sidecar's: counted

One client (this process, one keep-alive connection): every query is sent every way in turn,
interleaved, so drift hits all rows alike. 8 and 32 clients: a closed loop of that many connections
(asyncio, this process; the proxies and engines are other processes) for `--duration` seconds per
row. p50/p95/p99 in ms and throughput (requests/s); for those rows also the CPU each request cost the
engine (its `_nodes/stats`), the proxy (its processes, /proc) and the client (this process): on 2 shared
cores they explain the throughput ratios. Prints Markdown tables, writes the raw numbers
as JSON and a plot (p50 at one client vs window, one line per way of asking, one panel per engine).

    .venv/bin/python -m benchmarks.proxy_latency [--engines es,os] [--queries 120] [--windows 10,100,1000]
        [--clients 1,8,32] [--duration 4] [--workers 1,2] [--loop uvloop] [--plot benchmarks/latency.png]
        [--no-in-engine]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import os
import re
import signal
import statistics as pystats
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from tests.support.corpora import SCIFACT_MAPPINGS, index_scifact
from tests.support.data import scifact_records
from tests.support.engine_client import EngineClient
from tests.support.net import free_port
from tests.support.reranked import scores

ROOT = Path(__file__).resolve().parents[1]
ENGINES = {"es": "http://127.0.0.1:9200", "os": "http://127.0.0.1:9201"}
WARMUP = 20  # queries sent before measuring (not recorded), other than the measured ones
T = TypeVar("T")


class Http:
    """One persistent HTTP/1.1 connection (the way a client library keeps one)."""

    def __init__(self, url: str) -> None:
        self.url = url
        parts = urlsplit(url)
        self.conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)

    def call(
        self, method: str, path: str, body: object = None, ndjson: str | None = None
    ) -> tuple[int, dict]:
        data = (
            ndjson.encode() if ndjson is not None else (None if body is None else json.dumps(body).encode())
        )
        ctype = "application/x-ndjson" if ndjson is not None else "application/json"
        self.conn.request(method, path, body=data, headers={"Content-Type": ctype})
        resp = self.conn.getresponse()
        raw = resp.read()
        return resp.status, (json.loads(raw) if raw else {})

    def ok_text(self, method: str, path: str) -> str:
        self.conn.request(method, path)
        resp = self.conn.getresponse()
        return resp.read().decode()

    def ok(self, method: str, path: str, body: object = None, ndjson: str | None = None) -> dict:
        status, answer = self.call(method, path, body, ndjson)
        if status >= 300:
            raise RuntimeError(f"{method} {path} -> {status}: {str(answer)[:300]}")
        return answer


def index_corpus(engine: Http, index: str, docs: list[dict], shards: int = 1, lengths: bool = False) -> None:
    """SciFact records into a fresh index (1 shard unless said), as every benchmark of the proxy's
    latency uses it; `lengths`: with the `token_count` sub-field `serve --in-engine` reads (as `bmx-rerank
    lengths add` makes it), refused where the cluster has no `token_count`."""
    mappings = SCIFACT_MAPPINGS
    if lengths:
        from bmx_rerank.rerank import in_engine  # not in versions before `--in-engine` (ab_proxies' trees)

        body = {**SCIFACT_MAPPINGS["properties"]["body"]}
        body["fields"] = {in_engine.SUFFIX: in_engine.length_mapping(body["analyzer"])}
        mappings = {"properties": {"body": body}}
    index_scifact(EngineClient("?", engine.url), index, docs, shards=shards, chunk=1000, mappings=mappings)


# ---- the proxy, in child processes ------------------------------------------------------------------


def sweep_stats(upstream: str, index: str) -> tuple[Any, dict | None, dict[str, int]]:
    """Exact statistics of the index's `body` and, in versions that build one, each concrete index's
    document-length table and the routing shard count its sweep proved (what `stats build` keeps: a
    table of several shards that knows its routing names the shard of a hit searched by `_id`), from
    one sweep."""
    import aiohttp

    from bmx_rerank import upstream as cluster_calls
    from bmx_rerank.stats import build as stats_build

    async def sweep():
        async with aiohttp.ClientSession() as session:
            make = getattr(cluster_calls, "Cluster", None)  # an older version takes (session, url)
            target = (session, upstream) if make is None else (make(session, upstream),)
            if not hasattr(stats_build, "build_with_lengths"):  # an older version (the baseline)
                return await stats_build.build(*target, index, "body", {}), None, {}
            results = await stats_build.sweep_all(*target, index, "body", {})
            corpus, tables = stats_build.summed(results)
            routing = {  # as `stats build` records it
                ix: shards
                for ix, r in results.items()
                if (shards := stats_build.table_routing(r.lengths, r.marks, r.routing)) is not None
            }
            return corpus, tables or None, routing

    return asyncio.run(sweep())


def stats_source(
    index: str, corpus: Any, lengths: dict | None, routing: dict[str, int], shards: int = 1
) -> Any:
    """FixedStats with the length table where this version's FixedStats takes one, served as the
    statistics cache serves it where this version has the form: a mapped `LengthIndex`, keyed by
    document version on an index of one shard, and on one of several where every row of the sweep's
    table has its shard (versions that record it), with the routing shard count its sweep proved
    (`routing`, by index; versions that take it)."""
    import inspect
    import shutil
    import tempfile

    from bmx_rerank.stats.source import FixedStats

    try:
        from bmx_rerank.stats.length_index import LengthIndex
    except ImportError:  # a version before the mapped table
        LengthIndex = None  # noqa: N806
    if lengths is not None and LengthIndex is not None:
        params = inspect.signature(LengthIndex.from_table).parameters
        where = tempfile.mkdtemp(prefix="bmx-bench-lengths-")

        def keying(ix: str, table: Any) -> dict[str, Any]:
            if "by_version" not in params:
                return {}
            if shards == 1:
                return {"by_version": True, **({"shards": 1} if "shards" in params else {})}
            if "shards" in params and getattr(table, "shards_known", False):
                routed = (
                    {"routing_shards": routing[ix]} if ix in routing and "routing_shards" in params else {}
                )
                return {"by_version": True, "shards": shards, **routed}
            return {"by_version": False}

        lengths = {
            ix: LengthIndex.from_table(t, f"{where}/{ix}.len", **keying(ix, t)) for ix, t in lengths.items()
        }
        shutil.rmtree(where)  # the tables stay mapped; nothing is left behind when the process is killed
    tables = {"lengths": {(index, "body"): lengths}} if lengths is not None else {}
    return FixedStats({(index, "body"): corpus}, **tables)


def shard_count(upstream: str, index: str) -> int:
    settings = Http(upstream).ok("GET", f"/{index}/_settings")
    return int(settings[index]["settings"]["index"]["number_of_shards"])


def serve_child(upstream: str, index: str, port: int, caches: bool, workers: int, loop: str) -> None:
    """The proxy: exact statistics (and, in versions that build one, the document-length table) swept
    once, then served from memory by `workers` processes sharing the port (SO_REUSEPORT), each with its
    own event loop of kind `loop`."""
    import multiprocessing

    corpus, lengths, routing = sweep_stats(upstream, index)
    ctx = multiprocessing.get_context("fork")
    procs = [
        ctx.Process(
            target=_serve_worker,
            args=(upstream, index, port, caches, loop, corpus, lengths, routing),
            daemon=True,
        )
        for _ in range(workers)
    ]
    for proc in procs:
        proc.start()
    # terminate() of this process must take its workers along (daemon children are only reaped by a
    # normal exit): SIGTERM becomes SystemExit, and the workers are stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print("ready", flush=True)
    try:
        for proc in procs:
            proc.join()
    finally:
        for proc in procs:
            proc.kill()  # a benchmark's proxy: nothing to drain
        for proc in procs:
            proc.join(5)


def _serve_worker(
    upstream: str, index: str, port: int, caches: bool, loop: str, corpus, lengths, routing
) -> None:
    from bmx_rerank.logs import serve_logs
    from bmx_rerank.proxy import ProxyConfig, make_app
    from bmx_rerank.proxy.server import ConnectionLimits, serve_forever

    # with lengths: first sights without _mtermvectors
    stats = stats_source(index, corpus, lengths, routing, shard_count(upstream, index))
    in_engine = os.environ.get("BMX_RERANK_IN_ENGINE") == "1"  # as `serve` reads it
    config = ProxyConfig(upstream=upstream, in_engine=in_engine, **cache_option(caches))
    app = make_app(config, lambda session, base: stats)
    if not caches:
        app.on_startup.append(_no_analysis_cache)
    if loop == "uvloop":
        import uvloop

        uvloop.install()
    # as `bmx-rerank serve` serves: its server (connection limits, errors in Elasticsearch's shape) and
    # its log at its default level, a JSON line a request (written to /dev/null here)
    serve_logs("INFO", open(os.devnull, "w"))
    serve_forever(app, "127.0.0.1", port, reuse_port=True, limits=ConnectionLimits())


def cache_option(caches: bool) -> dict[str, int]:
    """The term-vector (and page) caches on (default size) or off, in this version's options."""
    import dataclasses

    from bmx_rerank.proxy import ProxyConfig

    names = {f.name for f in dataclasses.fields(ProxyConfig)}
    if "page_cache_bytes" in names:  # a first sight fetches its page too
        return {"cache_bytes": (256 << 20) if caches else 0, "page_cache_bytes": (64 << 20) if caches else 0}
    if "cache_bytes" in names:
        return {"cache_bytes": (256 << 20) if caches else 0}
    return {"cache_size": 100_000 if caches else 0}


async def _no_analysis_cache(app) -> None:
    """A first-sight proxy: no analysis remembered, no length cache (the length table still answers)."""
    from bmx_rerank.rerank.analysis import AnalysisCache
    from bmx_rerank.rerank.tf_probe import LengthCache

    reranker = app.state.rerank
    reranker.analysis.cache = AnalysisCache(0)
    reranker.frequencies.lengths = LengthCache(0)


def relay_child(upstream: str, port: int, loop: str) -> None:
    """The floor of an aiohttp proxy hop: a bare aiohttp relay (read the request, send it upstream on a
    pooled connection, answer the bytes), nothing else. Passthrough is compared with it."""
    import aiohttp
    from aiohttp import web

    async def handle(request: web.Request) -> web.Response:
        body = await request.read()
        headers = {"Content-Type": request.headers.get("Content-Type", "application/json")}
        url = upstream + request.raw_path
        async with request.app["session"].request(request.method, url, data=body, headers=headers) as up:
            data = await up.read()
            ctype = up.headers.get("Content-Type", "application/json")
            return web.Response(status=up.status, body=data, headers={"Content-Type": ctype})

    async def session(app: web.Application):
        app["session"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256))
        yield
        await app["session"].close()

    app = web.Application()
    app.cleanup_ctx.append(session)
    app.router.add_route("*", "/{path:.*}", handle)
    if loop == "uvloop":
        import uvloop

        uvloop.install()
    print("ready", flush=True)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def _serve(factory: Callable[[], asyncio.Protocol], port: int, loop: str) -> None:
    """Serve `factory`'s protocol on 127.0.0.1:port, on uvloop when `loop` says so, as relay_child."""

    async def serve() -> None:
        server = await asyncio.get_running_loop().create_server(factory, "127.0.0.1", port)
        print("ready", flush=True)
        await server.serve_forever()

    if loop == "uvloop":
        import uvloop

        uvloop.install()
    asyncio.run(serve())


CHUNKED, TO_CLOSE = -1, -2  # a body's framing besides a length (_Framer.left)
CLOSES = re.compile(rb"\r\nconnection:[ \t]*close\b", re.IGNORECASE)  # in an answer's head


def _body_length(head: bytes, method: bytes) -> int:
    """A body's length, CHUNKED, or (an answer with neither header) TO_CLOSE, from its message's head;
    `method`: the request's, for an answer (b"" for a request)."""
    lines = head.split(b"\r\n")
    if method:
        status = int(lines[0].split(None, 2)[1])
        if method == b"HEAD" or status in (204, 304) or status < 200:
            return 0
    length = TO_CLOSE if method else 0
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"transfer-encoding" and b"chunked" in value.lower():
            return CHUNKED
        if name == b"content-length":
            length = int(value)
    return length


def _whole_chunks(buf: bytearray) -> tuple[int, bool]:
    """How many bytes at the start of a chunked body are whole chunks, and whether the last chunk (and
    the trailers) ended it."""
    pos = 0
    while (eol := buf.find(b"\r\n", pos)) >= 0:
        size = int(bytes(buf[pos:eol]).split(b";")[0], 16)
        if size == 0:
            end = buf.find(b"\r\n\r\n", eol)
            return (end + 4, True) if end >= 0 else (pos, False)
        if len(buf) < eol + size + 4:
            break
        pos = eol + size + 4
    return pos, False


class _Framer:
    """HTTP/1.1 messages one after another out of a byte stream, as they come: a head, then a body of
    Content-Length bytes, or chunks (passed on as they are), or (an answer) up to the stream's end."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.left: int | None = None  # what is left of the body; None: between messages
        self.head = b""

    def take(self, method: bytes = b"") -> tuple[bytes, bool]:
        """The current message's bytes here (taken off `buf`), and whether they end it."""
        buf, out = self.buf, b""
        if self.left is None:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > 1 << 16:
                    raise ValueError("no end of a head in 64 KiB")
                return out, False
            self.head = out = bytes(buf[: end + 4])
            del buf[: end + 4]
            self.left = _body_length(self.head, method)
        if self.left == CHUNKED:
            n, whole = _whole_chunks(buf)
        elif self.left == TO_CLOSE:
            n, whole = len(buf), False
        else:
            n = min(self.left, len(buf))
            self.left -= n
            whole = self.left == 0
        if n:
            out += buf[:n]
            del buf[:n]
        if whole:
            self.left = None
        return out, whole


def protocol_relay_child(upstream: str, port: int, loop: str) -> None:
    """The floor of a lower-level Python HTTP server's hop: an HTTP/1.1 keep-alive relay on
    asyncio.Protocol, one upstream connection per client connection (opened at its first request). It
    parses what a proxy must to see requests one by one (request line, end of the head, Content-Length;
    an answer's length or chunks), rewrites nothing, forwards the bytes; pipelined requests wait for
    the answer before them. Anything else (a bad head, upstream gone mid-answer) closes both, loudly."""
    parts = urlsplit(upstream)

    class Relay(asyncio.Protocol):
        def __init__(self) -> None:
            self.request, self.answer = _Framer(), _Framer()
            self.up: asyncio.Transport | None = None
            self.method, self.awaiting, self.connecting = b"", False, None  # awaiting: an answer

        def connection_made(self, transport) -> None:
            self.client = transport

        def data_received(self, data: bytes) -> None:
            self.request.buf += data
            self.forward()

        def forward(self) -> None:  # client -> upstream: the request under way, or the next once answered
            try:
                while self.request.buf and (self.request.left is not None or not self.awaiting):
                    if self.up is None:
                        if not self.connecting:
                            self.connecting = asyncio.ensure_future(self.connect())  # kept: a task
                        return
                    starting = self.request.left is None
                    data, whole = self.request.take()
                    if starting and data:
                        self.method, self.awaiting = self.request.head.split(b" ", 1)[0], True
                    self.up.write(data)
                    if not whole:
                        return
            except ValueError as exc:
                self.fail(f"request: {exc!r}")

        async def connect(self) -> None:
            try:
                up = Upstream(self)
                await asyncio.get_running_loop().create_connection(lambda: up, parts.hostname, parts.port)
            except OSError as exc:
                return self.fail(f"upstream: {exc!r}")
            finally:
                self.connecting = None
            self.up = up.transport
            if self.client.is_closing():
                self.up.close()
            else:
                self.forward()

        def answered(self, data: bytes) -> None:  # upstream -> client, as it comes
            self.answer.buf += data
            try:
                while self.answer.buf:
                    if not self.awaiting:
                        raise ValueError("bytes from upstream with no request under way")
                    data, whole = self.answer.take(self.method)
                    self.client.write(data)
                    if not whole:
                        return
                    if self.answer.head[9:10] != b"1":  # not an interim (1xx) answer
                        self.awaiting = False
                        if CLOSES.search(self.answer.head):  # the next request on another connection
                            self.up.close()
                            self.up = None
                        self.forward()
            except ValueError as exc:
                self.fail(f"answer: {exc!r}")

        def upstream_lost(self, transport: asyncio.BaseTransport) -> None:
            if transport is not self.up:  # one closed after a `Connection: close`
                return
            self.up = None
            if self.answer.left == TO_CLOSE:  # the end of that answer
                self.client.close()
            elif (self.awaiting or self.answer.buf) and not self.client.is_closing():
                self.fail("upstream closed mid-exchange")
            self.answer = _Framer()

        def fail(self, reason: str) -> None:
            print(f"protocol relay: {reason}; closing the client's connection", file=sys.stderr, flush=True)
            self.client.abort()
            if self.up is not None:
                self.up.abort()

        def connection_lost(self, exc: Exception | None) -> None:
            if self.up is not None:
                self.up.close()

        def pause_writing(self) -> None:  # the client reads slower than upstream answers
            if self.up is not None:
                self.up.pause_reading()

        def resume_writing(self) -> None:
            if self.up is not None:
                self.up.resume_reading()

    class Upstream(asyncio.Protocol):
        def __init__(self, relay: Relay) -> None:
            self.relay = relay

        def connection_made(self, transport) -> None:
            self.transport = transport

        def data_received(self, data: bytes) -> None:
            self.relay.answered(data)

        def connection_lost(self, exc: Exception | None) -> None:
            self.relay.upstream_lost(self.transport)

        def pause_writing(self) -> None:
            self.relay.client.pause_reading()

        def resume_writing(self) -> None:
            self.relay.client.resume_reading()

    _serve(Relay, port, loop)


def client_relay_child(upstream: str, port: int, loop: str) -> None:
    """Between the two floors: aiohttp's server, with the protocol relay's framing as its upstream client
    (a pool of keep-alive connections, each request's answer read whole). Against the bare relay, how
    an aiohttp hop's cost splits between its server and its client."""
    from aiohttp import web

    parts, idle = urlsplit(upstream), []

    class Upstream(asyncio.Protocol):
        def connection_made(self, transport) -> None:
            self.transport, self.answer, self.waiter = transport, _Framer(), None

        def data_received(self, data: bytes) -> None:
            self.answer.buf += data
            while self.answer.buf and self.waiter is not None:
                out, whole = self.answer.take(self.method)
                self.got += out
                if whole:
                    self.waiter.set_result(bytes(self.got))
                    self.waiter = None

        def connection_lost(self, exc: Exception | None) -> None:
            if self in idle:
                idle.remove(self)
            if self.waiter is not None:
                self.waiter.set_exception(ConnectionError("upstream closed mid-answer"))

    async def handle(request: web.Request) -> web.Response:
        body = await request.read()
        up = idle.pop() if idle else None
        if up is None:
            _, up = await asyncio.get_running_loop().create_connection(Upstream, parts.hostname, parts.port)
        up.method, up.got, up.waiter = (
            request.method.encode(),
            bytearray(),
            asyncio.get_running_loop().create_future(),
        )
        ctype = request.headers.get("Content-Type", "application/json")
        up.transport.write(
            f"{request.method} {request.raw_path} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: {ctype}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        answer = await up.waiter
        idle.append(up)
        head, data = answer[: len(up.answer.head)], answer[len(up.answer.head) :]
        if _body_length(head, up.method) == CHUNKED:
            data, chunks = b"", data
            while (size := int(chunks[: chunks.find(b"\r\n")].split(b";")[0], 16)) > 0:
                start = chunks.find(b"\r\n") + 2
                data, chunks = data + chunks[start : start + size], chunks[start + size + 2 :]
        status = int(head.split(None, 2)[1])
        return web.Response(status=status, body=data, headers={"Content-Type": "application/json"})

    app = web.Application()
    app.router.add_route("*", "/{path:.*}", handle)
    if loop == "uvloop":
        import uvloop

        uvloop.install()
    print("ready", flush=True)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


# The direct size-10 search at several clients, its answers gzipped: what compression costs the engine
GZIP = "plain size-10, gzip"
RELAYS = {"bare relay": "aiohttp", "client relay": "client", "protocol relay": "protocol"}  # row: kind
ENGINE_FIRST, ENGINE_WARM = IN_ENGINE = ("rerank first --in-engine", "rerank warm --in-engine")


def ahead_served(proxy: Http) -> tuple[float, float]:
    """How many of a first-sight proxy's pages its fetches ahead held whole, and how many not (its
    `bmx_page_ahead_total`; 0, 0 in versions without it)."""
    found = re.findall(
        r'^bmx_page_ahead_total\{outcome="(\w+)"\} (\S+)$', proxy.ok_text("GET", "/_bmx/metrics"), re.M
    )
    counts = {outcome: float(n) for outcome, n in found}
    return counts.get("covered", 0.0), counts.get("fetched_after", 0.0)


def process_cpu(pid: int, *, kernel: bool = False) -> float:
    """User + system CPU seconds of a process and all its descendants (Linux /proc); `kernel`: system
    alone (their socket reads and writes, their waits)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        total += (int(fields[12]) + (0 if kernel else int(fields[11]))) / tick
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as fh:
                total += sum(process_cpu(int(child), kernel=kernel) for child in fh.read().split())
    except (FileNotFoundError, ProcessLookupError):
        pass
    return total


@contextlib.contextmanager
def pinned(url: str) -> Iterator[None]:
    """The engine's local nodes (every thread; those made later inherit it) on core 0, this process and
    the children it starts meanwhile on the other cores (a sidecar with cores of its own, as on a host
    of its own); every core for all of them again after."""
    every = set(range(os.cpu_count() or 1))
    if len(every) < 2:
        raise SystemExit("pinning needs 2 cores")
    nodes = [int(n["process"]["id"]) for n in Http(url).ok("GET", "/_nodes/process")["nodes"].values()]

    def engine_on(cores: set[int]) -> None:
        for pid in nodes:
            for task in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(ProcessLookupError):
                    os.sched_setaffinity(int(task), cores)

    engine_on({0})
    os.sched_setaffinity(0, every - {0})
    try:
        yield
    finally:
        os.sched_setaffinity(0, every)
        engine_on(every)


def engine_cpu(url: str) -> float:
    """CPU seconds the engine's (local) nodes have used: their process ids from `_nodes/process`, their
    CPU from /proc (the nodes' own statistics refresh only once a second)."""
    nodes = Http(url).ok("GET", "/_nodes/process")["nodes"].values()
    return sum(process_cpu(int(n["process"]["id"])) for n in nodes)


class Proxy:
    """A proxy (or, `relay`: True or a kind of RELAYS, a relay) in a child process; `checkout`: another
    checkout's code and venv (benchmarks/ab_proxies.py), else this one's."""

    def __init__(
        self,
        upstream: str,
        index: str,
        *,
        caches: bool,
        workers: int,
        loop: str,
        relay: bool | str = False,
        checkout: Path | None = None,
        in_engine: bool = False,
    ) -> None:
        """`in_engine`: the proxy scores in the engine where it can (`serve --in-engine`)."""
        self.port = free_port()
        if relay:
            kind = "aiohttp" if relay is True else relay
            argv = ["--relay-child", upstream, str(self.port), loop, *([kind] if kind != "aiohttp" else [])]
        else:
            argv = [
                "--serve-child",
                upstream,
                index,
                str(self.port),
                "1" if caches else "0",
                str(workers),
                loop,
            ]
        python = sys.executable if checkout is None else str(checkout / ".venv/bin/python")
        self.child = subprocess.Popen(
            [python, "-m", "benchmarks.proxy_latency", *argv],
            stdout=subprocess.PIPE,
            text=True,
            cwd=checkout or ROOT,
            env={**os.environ, "BMX_RERANK_IN_ENGINE": "1" if in_engine else "0"},
        )
        assert self.child.stdout is not None and self.child.stdout.readline().strip() == "ready"
        self.url = f"http://127.0.0.1:{self.port}"
        for _ in range(200):
            try:
                Http(self.url).call("GET", "/" if relay else "/_bmx/health")
                time.sleep(0.3)  # every worker up
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("proxy did not start")

    def cpu(self) -> float:
        return process_cpu(self.child.pid)

    def stop(self) -> None:
        self.child.terminate()
        self.child.wait(10)


# ---- ways of asking -----------------------------------------------------------------------------------


def plain(q: str, size: int) -> dict:
    return {"query": {"match": {"body": q}}, "size": size}


def rescore(q: str, window: int) -> dict:
    rescore_query = {"match": {"body": {"query": q, "operator": "or"}}}
    return {**plain(q, 10), "rescore": {"window_size": window, "query": {"rescore_query": rescore_query}}}


def rerank(q: str, window: int) -> dict:
    return {**plain(q, 10), "ext": {"bmx": {"field": "body", "window_size": window}}}


def interleaved(
    ways: Mapping[str, Callable[[T], object]], items: Sequence[T], skip: int = 0, pause_ms: float = 0.0
) -> dict[str, list[float]]:
    """Each of `items` asked every way in turn, so drift hits every way alike: the ms each ask took,
    a list a way, the first `skip` items untimed, each ask `pause_ms` after the one before."""
    times: dict[str, list[float]] = {way: [] for way in ways}
    for i, item in enumerate(items):
        for way, ask in ways.items():
            if pause_ms:
                time.sleep(pause_ms / 1000)
            start = time.perf_counter()
            ask(item)
            if i >= skip:
                times[way].append((time.perf_counter() - start) * 1000)
    return times


def summary(samples: list[float]) -> dict:
    ordered = sorted(samples)

    def pct(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(round(p * (len(ordered) - 1))))]

    return {"n": len(ordered), "p50": pystats.median(ordered), "p95": pct(0.95), "p99": pct(0.99)}


Row = tuple[str, str, int, int]  # (engine, request, window, clients)


def sequential(
    engine: Http,
    warm: Http,
    first: Http,
    relays: dict[str, Http],
    index: str,
    queries: list[str],
    windows: list[int],
    engine_scored: tuple[Http, Http] | None = None,
    sidecars: Counter[int] | None = None,
) -> dict[tuple[str, int], list[float]]:
    """One client: every way of asking per query, interleaved. `engine_scored`: two `serve --in-engine`
    proxies, every cache off (each search a first sight, scored in the engine) and caches on (its warm
    rerank: the window the sidecar kept after the engine scored it ENGINE_SIGHTS times). `sidecars`
    counts the first sights of the former that the sidecar scored (over several shards, a window whose
    edge tied with the next hit), by window."""
    times: dict[tuple[str, int], list[float]] = {}
    path = f"/{index}/_search"
    if engine_scored is not None:  # first each window to its warm proxy, untimed, until it keeps it
        from bmx_rerank.rerank.pipeline import ENGINE_SIGHTS

        for q in queries:
            for n in windows:
                for _ in range(ENGINE_SIGHTS + 1):  # the engine's sights, then the one that keeps it
                    engine_scored[1].ok("POST", path, rerank(q, n))

    def timed(kind: str, window: int, conn: Http, body: dict) -> dict:
        start = time.perf_counter()
        answer = conn.ok("POST", path, body)
        times.setdefault((kind, window), []).append((time.perf_counter() - start) * 1000)
        return answer

    for q in queries:
        timed("plain size-10", 0, engine, plain(q, 10))
        timed("passthrough", 0, warm, plain(q, 10))
        for row, conn in relays.items():
            timed(row, 0, conn, plain(q, 10))
        for n in windows:
            answer = timed("plain size-N", n, engine, plain(q, n))
            # What a window without `_source` and then the page's hits by id would cost upstream.
            timed("size-N, no _source", n, engine, {**plain(q, n), "_source": False})
            ids = [h["_id"] for h in answer["hits"]["hits"][:10]]
            page = {
                "query": {"bool": {"must": [plain(q, 10)["query"]], "filter": [{"ids": {"values": ids}}]}}
            }
            timed("page of 10 by ids", n, engine, {**page, "size": 10})
            timed("rescore N", n, engine, rescore(q, n))
            # `--in-engine`'s rows before the sidecar's, so the warm proxy's passthrough of the next
            # query follows its own last rerank after as few requests as without them: a process idle
            # for longer runs colder (+0.15 ms on that passthrough when these came after). Its warm
            # rerank follows another request to its proxy, as "rerank warm" follows "rerank fresh"
            # (timed straight after other proxies' requests instead, it measured 1.60x a rescore
            # against the sidecar's 1.42x: the same code, colder).
            if engine_scored is not None:
                inside = timed(ENGINE_FIRST, n, engine_scored[0], rerank(q, n))
                engine_scored[1].ok("POST", path, rerank(q, n))
                repeat = timed(ENGINE_WARM, n, engine_scored[1], rerank(q, n))
            timed("rerank fresh", n, warm, rerank(q, n))  # the first sight, for the warm proxy
            answer = timed("rerank warm", n, warm, rerank(q, n))
            assert answer["_bmx"]["reranked"] is True, answer["_bmx"]
            # A third time: the window kept whole in the main LRU (rerank/term_vector_cache.py), the
            # same answer
            again = timed("rerank again", n, warm, rerank(q, n))
            assert scores(again) == scores(answer), (scores(again), scores(answer))
            answer = timed("rerank first", n, first, rerank(q, n))
            assert answer["_bmx"]["reranked"] is True, answer["_bmx"]
            if engine_scored is not None:
                # the engine's float32 scores against the sidecar's float64 (ties may swap hits, not
                # scores); the warm one is the window the sidecar kept
                if inside["_bmx"]["tf"] != "engine":
                    assert sidecars is not None, inside["_bmx"]
                    sidecars[n] += 1
                ours, theirs = ([s for _, s in scores(a)] for a in (answer, inside))
                assert len(ours) == len(theirs), (ours, theirs)
                gap = max(
                    (abs(a - b) / max(abs(a), 1e-9) for a, b in zip(ours, theirs, strict=True)), default=0.0
                )
                assert gap < 1e-6, (ours, theirs)
                assert repeat["_bmx"]["tf"] == "window", repeat["_bmx"]
                assert scores(repeat) == scores(again), (scores(repeat), scores(again))
    return times


async def closed_loop(
    url: str, path: str, bodies: list[bytes], clients: int, seconds: float, encoding: str = "identity"
) -> dict:
    """`clients` connections, each sending its next request as soon as the last is answered, each
    accepting answers in `encoding`."""
    import aiohttp

    latencies: list[float] = []
    stop = time.perf_counter() + seconds
    connector = aiohttp.TCPConnector(limit=clients, force_close=False)
    # No compressed answers unless asked (the row "plain size-10, gzip"), as the one-client rows
    # (http.client) and the official clients (their `http_compress` off by default) ask: aiohttp asks
    # for gzip unless told, and the engine's gzip costs it ~0.3 ms of CPU a size-10 SciFact search,
    # which the direct and passed-through rows paid and the proxy's own calls and answers never do.
    headers = {"Content-Type": "application/json", "Accept-Encoding": encoding}
    async with aiohttp.ClientSession(connector=connector) as session:

        async def client(offset: int) -> None:
            i = offset
            while time.perf_counter() < stop:
                body = bodies[i % len(bodies)]
                i += clients
                start = time.perf_counter()
                async with session.post(url + path, data=body, headers=headers) as resp:
                    await resp.read()
                    assert resp.status == 200, resp.status
                latencies.append((time.perf_counter() - start) * 1000)

        began = time.perf_counter()
        await asyncio.gather(*(client(k) for k in range(clients)))
        elapsed = time.perf_counter() - began
    return {**summary(latencies), "rps": len(latencies) / elapsed}


# what `serve --in-engine` needs on every node: `token_count` (mapper-extras) and scripts with term
# statistics (lang-painless)
IN_ENGINE_MODULES = frozenset({"mapper-extras", "lang-painless"})


def in_engine_lacks(engine: Http) -> list[str]:
    """The modules `serve --in-engine` needs that some node of the cluster lacks, sorted."""
    nodes = engine.ok("GET", "/_nodes/plugins")["nodes"].values()
    every = set.intersection(
        *({m["name"] for m in n.get("modules", []) + n.get("plugins", [])} for n in nodes)
    )
    return sorted(IN_ENGINE_MODULES - every)


def run_engine(name: str, url: str, docs: list[dict], queries: list[str], args) -> list[dict]:
    engine = Http(url)
    index = f"bmxtest-proxy-bench-{uuid.uuid4().hex[:8]}"
    # `--in-engine` scores a window in the engine, with the index's length sub-field (over several
    # shards after a search of the window's edge)
    missing = in_engine_lacks(engine)
    in_engine = args.in_engine and not missing
    if args.in_engine and missing:  # Elasticsearch's integ-test build: neither
        print(f"{name}: no --in-engine rows: the cluster lacks {', '.join(missing)}")
    index_corpus(engine, index, docs, args.shards, lengths=in_engine)
    windows = [int(w) for w in args.windows.split(",")]
    clients = [int(c) for c in args.clients.split(",")]
    workers = [int(w) for w in args.workers.split(",")]
    proxies = {
        ("warm", 1): Proxy(url, index, caches=True, workers=1, loop=args.loop),
        ("first", 1): Proxy(url, index, caches=False, workers=1, loop=args.loop),
    }
    if in_engine:
        proxies[ENGINE_FIRST, 1] = Proxy(url, index, caches=False, workers=1, loop=args.loop, in_engine=True)
        proxies[ENGINE_WARM, 1] = Proxy(url, index, caches=True, workers=1, loop=args.loop, in_engine=True)
    for row, kind in RELAYS.items():
        proxies[row, 1] = Proxy(url, index, caches=False, workers=1, loop=args.loop, relay=kind)
    by_url = {p.url: p for p in proxies.values()}
    rows: list[dict] = []
    try:
        warm, first = Http(proxies["warm", 1].url), Http(proxies["first", 1].url)
        relays = {row: Http(proxies[row, 1].url) for row in RELAYS}
        scored = (
            (Http(proxies[ENGINE_FIRST, 1].url), Http(proxies[ENGINE_WARM, 1].url)) if in_engine else None
        )
        for q in queries[:WARMUP]:  # JIT, caches, connections; other queries than the measured ones
            for conn in (engine, warm, first, *(scored or ())):
                conn.ok("POST", f"/{index}/_search", rerank(q, 100) if conn is not engine else plain(q, 100))
        measured = queries[WARMUP:]
        start = time.perf_counter()
        served = ahead_served(first)
        sidecars: Counter[int] = Counter()  # `--in-engine` first sights the sidecar scored, by window
        times = sequential(engine, warm, first, relays, index, measured, windows, scored, sidecars)
        for n in windows if scored else ():  # over several shards, a window whose edge tied
            print(
                f"{name}: --in-engine, window {n}: {sidecars[n]} of {len(measured)} first sights the sidecar's"
            )
        assert args.shards > 1 or not sidecars, ("on one shard every window is the engine's", sidecars)
        held, missed = (b - a for a, b in zip(served, ahead_served(first), strict=True))
        if held + missed:  # how often the first stage's top two pages held the reranked page
            print(f"{name}: the fetch ahead held {held:.0f} of {held + missed:.0f} first sights' pages whole")
        for (kind, window), samples in times.items():
            s = summary(samples)
            rows.append(
                {
                    "engine": name,
                    "request": kind,
                    "window": window,
                    "clients": 1,
                    "workers": 1,
                    **s,
                    "rps": 1000 / pystats.fmean(samples),
                }
            )
        print(f"{name}: one client done in {time.perf_counter() - start:.0f}s", file=sys.stderr, flush=True)
        if 2 in workers:
            proxies["warm", 2] = Proxy(url, index, caches=True, workers=2, loop=args.loop)
            by_url[proxies["warm", 2].url] = proxies["warm", 2]
        path = f"/{index}/_search"
        for c in [c for c in clients if c > 1]:
            cells: list[tuple[str, int, str, Callable[[str], dict], int]] = [
                ("plain size-10", 0, url, lambda q: plain(q, 10), 1),
                (GZIP, 0, url, lambda q: plain(q, 10), 1),
                ("passthrough", 0, proxies["warm", 1].url, lambda q: plain(q, 10), 1),
                *((row, 0, proxies[row, 1].url, lambda q: plain(q, 10), 1) for row in RELAYS),
            ]
            if ("warm", 2) in proxies:
                cells.append(("passthrough", 0, proxies["warm", 2].url, lambda q: plain(q, 10), 2))
            for n in windows:
                cells += [
                    ("plain size-N", n, url, lambda q, n=n: plain(q, n), 1),
                    ("rescore N", n, url, lambda q, n=n: rescore(q, n), 1),
                    ("rerank warm", n, proxies["warm", 1].url, lambda q, n=n: rerank(q, n), 1),
                    ("rerank first", n, proxies["first", 1].url, lambda q, n=n: rerank(q, n), 1),
                ]
                if ("warm", 2) in proxies:
                    cells.append(("rerank warm", n, proxies["warm", 2].url, lambda q, n=n: rerank(q, n), 2))
                if in_engine:  # its warm proxy kept every measured window in the one-client rows
                    cells += [
                        (row, n, proxies[row, 1].url, lambda q, n=n: rerank(q, n), 1) for row in IN_ENGINE
                    ]
            for kind, window, target, make, nworkers in cells:
                bodies = [json.dumps(make(q)).encode() for q in measured]
                if kind == "rerank warm" and nworkers == 2:  # warm both workers' caches first
                    asyncio.run(closed_loop(target, path, bodies, 4, 0.0 + len(bodies) * 0.02))
                proxy = by_url.get(target)
                before = (engine_cpu(url), proxy.cpu() if proxy else 0.0, time.process_time())
                encoding = "gzip, deflate" if kind == GZIP else "identity"
                result = asyncio.run(closed_loop(target, path, bodies, c, args.duration, encoding))
                after = (engine_cpu(url), proxy.cpu() if proxy else 0.0, time.process_time())
                done = result["rps"] * args.duration
                cpu = {  # ms of CPU per request: who the 2 cores worked for
                    f"cpu_{who}_ms": 1000 * (b - a) / done
                    for who, a, b in zip(("engine", "proxy", "client"), before, after, strict=True)
                }
                rows.append(
                    {
                        "engine": name,
                        "request": kind,
                        "window": window,
                        "clients": c,
                        "workers": nworkers,
                        **result,
                        **cpu,
                    }
                )
            print(f"{name}: {c} clients done", file=sys.stderr, flush=True)
        return rows
    finally:
        for proxy in proxies.values():
            proxy.stop()
        engine.call("DELETE", f"/{index}")


# ---- reporting ------------------------------------------------------------------------------------------


def find(
    rows: list[dict], engine: str, request: str, window: int, clients: int = 1, workers: int = 1
) -> dict:
    for r in rows:
        if (r["engine"], r["request"], r["window"], r["clients"], r["workers"]) == (
            engine,
            request,
            window,
            clients,
            workers,
        ):
            return r
    return {}


def targets(rows: list[dict], engine: str) -> list[tuple[str, str, str]]:
    """Issue 18's target rows, computed from one run, then the relays' floors: (measure, value, target)."""

    def ratio(a: dict, b: dict, key: str = "p50") -> str:
        return f"{a[key] / b[key]:.2f}x" if a and b else "n/a"

    def cpu(request: str, window: int) -> str:
        row = find(rows, engine, request, window, 8)
        return f"{row['cpu_proxy_ms']:.2f} ms" if row and "cpu_proxy_ms" in row else "n/a"

    def share(a: dict, b: dict) -> str:
        return f"{100 * a['rps'] / b['rps']:.0f} %" if a and b else "n/a"

    rescore100 = find(rows, engine, "rescore N", 100)
    p, d = find(rows, engine, "passthrough", 0), find(rows, engine, "plain size-10", 0)
    relays = " / ".join(row.removesuffix(" relay") for row in RELAYS) + " relay"
    floors = [find(rows, engine, row, 0) for row in RELAYS]
    direct8 = find(rows, engine, "plain size-10", 0, 8)
    return [
        (
            "warm rerank w100 / engine rescore w100 (p50)",
            ratio(find(rows, engine, "rerank warm", 100), rescore100),
            "<= 1.5x",
        ),
        (
            "the same again (a third time) w100 / engine rescore w100 (p50)",
            ratio(find(rows, engine, "rerank again", 100), rescore100),
            "<= 1.5x",
        ),
        (
            "first sight w100 / engine rescore w100 (p50)",
            ratio(find(rows, engine, "rerank first", 100), rescore100),
            "<= 2.5x",
        ),
        (
            "first sight, caches on (as shipped) w100 / engine rescore w100 (p50)",
            ratio(find(rows, engine, "rerank fresh", 100), rescore100),
            "<= 2.5x",
        ),
        (
            "proxy CPU per warm / first sight / passthrough (8 clients)",
            f"{cpu('rerank warm', 100)} / {cpu('rerank first', 100)} / {cpu('passthrough', 0)}",
            "<= 1.5 / 2.5 / 0.3 ms",
        ),
        (
            "passthrough p50 - direct p50 (one client)",
            f"{p['p50'] - d['p50']:+.2f} ms" if p and d else "n/a",
            "<= +0.3 ms",
        ),
        (
            "8 clients: passthrough qps / direct; warm rerank qps / engine rescore qps",
            f"{share(find(rows, engine, 'passthrough', 0, 8), find(rows, engine, 'plain size-10', 0, 8))}; "
            f"{share(find(rows, engine, 'rerank warm', 100, 8), find(rows, engine, 'rescore N', 100, 8))}",
            ">= 90 %; >= 60 %",
        ),
        *(
            [
                (
                    "--in-engine: first sight / warm w100 / engine rescore w100 (p50)",
                    f"{ratio(find(rows, engine, ENGINE_FIRST, 100), rescore100)} / "
                    f"{ratio(find(rows, engine, ENGINE_WARM, 100), rescore100)}",
                    "<= 2.5x / <= 1.5x",
                ),
                (
                    "--in-engine: proxy CPU per first sight / warm (8 clients)",
                    f"{cpu(ENGINE_FIRST, 100)} / {cpu(ENGINE_WARM, 100)}",
                    "<= 2.5 / 1.5 ms",
                ),
                (
                    "--in-engine, 8 clients: first sight; warm rerank qps / engine rescore qps",
                    f"{share(find(rows, engine, ENGINE_FIRST, 100, 8), find(rows, engine, 'rescore N', 100, 8))}; "
                    f"{share(find(rows, engine, ENGINE_WARM, 100, 8), find(rows, engine, 'rescore N', 100, 8))}",
                    ">= 60 %",
                ),
            ]
            if find(rows, engine, ENGINE_FIRST, 100)
            else []
        ),
        (
            "warm rerank w1000 / engine rescore w1000 (p50)",
            ratio(find(rows, engine, "rerank warm", 1000), find(rows, engine, "rescore N", 1000)),
            "<= 2.0x",
        ),
        (
            "the same again (a third time) w1000 / engine rescore w1000 (p50)",
            ratio(find(rows, engine, "rerank again", 1000), find(rows, engine, "rescore N", 1000)),
            "<= 2.0x",
        ),
        (
            f"one client: p50 - direct p50, {relays}",
            " / ".join(f"{f['p50'] - d['p50']:+.2f}" if f and d else "n/a" for f in floors) + " ms",
            "(the floors)",
        ),
        (
            f"8 clients: qps / direct; proxy CPU per request, {relays}",
            " / ".join(share(find(rows, engine, row, 0, 8), direct8) for row in RELAYS)
            + "; "
            + " / ".join(cpu(row, 0) for row in RELAYS),
            "(the floors)",
        ),
        (
            "8 clients: direct qps with gzipped answers / without; the engine's CPU a search, the same",
            compression_cost(find(rows, engine, GZIP, 0, 8), direct8),
            "(what compression costs)",
        ),
    ]


def compression_cost(gzip: dict | None, plain: dict | None) -> str:
    """The direct search's throughput with gzipped answers against without, and the engine's CPU a
    search in each (the rows "plain size-10, gzip" and "plain size-10" at the same clients)."""
    if not gzip or not plain:
        return "n/a"
    qps = f"{100 * gzip['rps'] / plain['rps']:.0f} %"
    return f"{qps}; {gzip['cpu_engine_ms']:.2f} / {plain['cpu_engine_ms']:.2f} ms"


def plot(rows: list[dict], engines: list[str], windows: list[int], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(engines), figsize=(6 * len(engines), 4.5), squeeze=False)
    kinds = ["plain size-10", "passthrough", "plain size-N", "rescore N", "rerank warm", "rerank again"]
    kinds.append("rerank first")
    for ax, engine in zip(axes[0], engines, strict=True):
        for kind in kinds + [k for k in IN_ENGINE if find(rows, engine, k, windows[0])]:
            ys = [find(rows, engine, kind, 0 if kind in kinds[:2] else n).get("p50") for n in windows]
            style = "--" if kind in kinds[:2] else "-o"
            ax.plot(windows, ys, style, label=kind.replace("-N", "-window").replace(" N", " (window)"))
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(windows, [str(w) for w in windows])
        ax.set_xlabel("window (hits reranked / requested)")
        ax.set_ylabel("p50 latency, one client (ms)")
        ax.set_title({"es": "Elasticsearch", "os": "OpenSearch"}.get(engine, engine))
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engines", default="es,os")
    parser.add_argument("--queries", type=int, default=120, help=f"the first {WARMUP} are warm-up")
    parser.add_argument("--docs", type=int, default=0, help="0: the whole corpus")
    parser.add_argument("--windows", default="10,100,1000")
    parser.add_argument("--clients", default="1,8,32")
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per row with several clients")
    parser.add_argument("--workers", default="1,2", help="proxy processes: 1, or 1,2 to compare")
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    parser.add_argument("--shards", type=int, default=1, help="primary shards of the SciFact index")
    parser.add_argument(
        "--no-in-engine",
        dest="in_engine",
        action="store_false",
        help="no `serve --in-engine` rows (else on one shard where the cluster has token_count and painless)",
    )
    parser.add_argument("--plot", default=str(ROOT / "benchmarks" / "latency.png"))
    parser.add_argument("--json", default="", help="also write the raw rows here")
    parser.add_argument("--serve-child", nargs=6, help=argparse.SUPPRESS)
    parser.add_argument("--relay-child", nargs="+", help=argparse.SUPPRESS)  # upstream port loop [kind]
    args = parser.parse_args()
    if args.relay_child:
        children = {"aiohttp": relay_child, "client": client_relay_child, "protocol": protocol_relay_child}
        relay = (*args.relay_child, "aiohttp")[:4]
        if len(args.relay_child) not in (3, 4) or relay[3] not in children:
            parser.error(f"--relay-child upstream port loop [{'|'.join(children)}]")
        children[relay[3]](relay[0], int(relay[1]), relay[2])
        return
    if args.serve_child:
        upstream, index, port, caches, workers, loop = args.serve_child
        serve_child(upstream, index, int(port), caches == "1", int(workers), loop)
        return
    docs = scifact_records("corpus.jsonl", args.docs)
    queries = [q["text"] for q in scifact_records("queries.jsonl", args.queries)]
    engines = args.engines.split(",")
    rows: list[dict] = []
    for name in engines:
        rows += run_engine(name, ENGINES[name], docs, queries, args)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    windows = [int(w) for w in args.windows.split(",")]
    if args.plot:
        plot(rows, engines, windows, args.plot)
    print(
        f"{len(docs)} documents, {len(queries) - WARMUP} measured queries, loop {args.loop}, "
        f"{os.cpu_count()} cores, {args.shards} shard(s), load average before: {os.getloadavg()[0]:.2f}"
    )
    print(
        "\n| engine | request | window | clients | proxy workers | n | p50 ms | p95 ms | p99 ms | req/s "
        "| CPU ms/req: engine | proxy | client |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    first = {row: k for k, row in enumerate(RELAYS)}  # the relays side by side, the rest by name

    def order(r: dict) -> tuple:
        return (r["engine"], r["clients"], r["window"], first.get(r["request"], len(first)), r["request"])

    for r in sorted(rows, key=lambda r: (*order(r), r["workers"])):
        cpu = " | ".join(
            f"{r[k]:.2f}" if k in r else "" for k in ("cpu_engine_ms", "cpu_proxy_ms", "cpu_client_ms")
        )
        print(
            f"| {r['engine']} | {r['request']} | {r['window'] or '-'} | {r['clients']} | {r['workers']} "
            f"| {r['n']} | {r['p50']:.2f} | {r['p95']:.2f} | {r['p99']:.2f} | {r['rps']:.0f} | {cpu} |"
        )
    print("\n| engine | measure | this run | target |\n|---|---|---|---|")
    for name in engines:
        for measure, value, target in targets(rows, name):
            print(f"| {name} | {measure} | {value} | {target} |")


if __name__ == "__main__":
    main()
