"""Where a passthrough's CPU goes: the proxy served with its handler cut down step by step, each in a
child process, one client sending SciFact's plain size-10 searches through it (the proxy's CPU a
request, from /proc), and the whole passthrough's Python alone, timed in process with no socket.

  at once       the server answers every request itself: no cluster (the server's own floor)
  exchange      one exchange with the cluster by the proxy's own client, its answer as it came
  proxy         the proxy as it serves (the search route, the relay, the log line)
  proxy, no log the same with the log at WARNING

    .venv/bin/python -m benchmarks.passthrough_parts [--upstream http://127.0.0.1:9200] [--requests 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import orjson

from benchmarks.proxy_latency import Http, index_corpus, plain, process_cpu
from tests.support.data import scifact_records
from tests.support.net import free_port

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("at once", "exchange", "proxy", "proxy, no log")


def child(variant: str, upstream: str, port: int) -> None:
    """The proxy with `variant`'s handler, served as `bmx-rerank serve` serves."""
    import uvloop
    from multidict import CIMultiDict
    from yarl import URL

    from bmx_rerank.logs import serve_logs
    from bmx_rerank.proxy import ProxyConfig, make_app
    from bmx_rerank.proxy.http import Response
    from bmx_rerank.proxy.server import ConnectionLimits, serve_forever
    from bmx_rerank.stats.source import FixedStats

    app = make_app(ProxyConfig(upstream=upstream), lambda session, base: FixedStats({}))
    json = CIMultiDict({"Content-Type": "application/json"})

    async def at_once(request):
        await request.content.read()
        return Response(200, b'{"took":1,"hits":{"hits":[]}}', content_type="application/json")

    async def exchange(request):
        body = await request.content.read()
        url = URL(request.state.base + request.target, encoded=True)
        answer = await request.state.upstream.request("POST", url, data=body, headers=json)
        return Response(answer.status, answer.in_hand() or b"", content_type="application/json")

    if variant == "at once":
        app.handle = at_once  # type: ignore[method-assign]
    elif variant == "exchange":
        app.handle = exchange  # type: ignore[method-assign]
    serve_logs("WARNING" if variant.endswith("no log") else "INFO", open(os.devnull, "w"))
    uvloop.install()
    print("ready", flush=True)
    serve_forever(app, "127.0.0.1", port, limits=ConnectionLimits())


def served(upstream: str, index: str, queries: list[str], requests: int) -> dict[str, float]:
    """Each variant's CPU a request (ms), one client, interleaved twice; the lower of the two."""
    procs, conns = {}, {}
    try:
        for variant in VARIANTS:
            port = free_port()
            procs[variant] = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "benchmarks.passthrough_parts",
                    "--child",
                    variant,
                    upstream,
                    str(port),
                ],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                text=True,
            )
            assert procs[variant].stdout.readline().strip() == "ready"  # type: ignore[union-attr]
            time.sleep(0.5)
            conns[variant] = Http(f"http://127.0.0.1:{port}")
        path = f"/{index}/_search"
        for conn in conns.values():
            for q in queries[:100]:
                conn.call("POST", path, plain(q, 10))
        out: dict[str, float] = {}
        asked = (queries * (requests // len(queries) + 1))[:requests]
        for _ in range(2):
            for variant, conn in conns.items():
                before = process_cpu(procs[variant].pid)
                for q in asked:
                    conn.call("POST", path, plain(q, 10))
                cpu = (process_cpu(procs[variant].pid) - before) / requests * 1000
                out[variant] = min(out.get(variant, cpu), cpu)
        return out
    finally:
        for proc in procs.values():
            proc.terminate()


async def in_process(upstream: str, index: str, query: str, requests: int) -> float:
    """The Python of one whole passthrough (µs), no socket: the request's bytes fed to a connection of
    the proxy's server, the cluster's recorded answer given back at once on a stand-in transport."""
    from bmx_rerank import h1
    from bmx_rerank.logs import serve_logs
    from bmx_rerank.proxy import ProxyConfig, make_app
    from bmx_rerank.proxy.server import Connection, ConnectionLimits, Server
    from bmx_rerank.stats.source import FixedStats

    body = orjson.dumps(plain(query, 10))
    head = f"POST /{index}/_search HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\n"
    ask = f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body
    recorded = _recorded(upstream, ask)
    serve_logs("INFO", open(os.devnull, "w"))
    loop = asyncio.get_running_loop()

    class Transport(asyncio.Transport):
        """Stands in for a socket: what is written to the cluster is answered at once."""

        def __init__(self, answer_to=None) -> None:
            super().__init__()
            self.answer_to, self.written, self.closed = answer_to, None, False

        def write(self, data) -> None:
            if self.answer_to is not None:
                loop.call_soon(self.answer_to.data_received, recorded)
            elif self.written is not None and not self.written.done():
                self.written.set_result(None)

        def is_closing(self) -> bool:
            return self.closed

        def close(self) -> None:
            self.closed = True

        abort = close

        def pause_reading(self) -> None: ...
        def resume_reading(self) -> None: ...

    async def connection(session, url, timeout, deadline):
        idle = session._idle.get(NODE)
        if idle:
            return idle.pop()
        conn = h1._Connection(session, NODE)
        conn.connection_made(Transport(conn))
        return conn

    NODE = ("http", "127.0.0.1", 9)
    h1.H1Session._connection = connection  # type: ignore[method-assign,assignment]
    app = make_app(ProxyConfig(upstream="http://127.0.0.1:9"), lambda session, base: FixedStats({}))
    await app.startup()
    client = Transport()
    conn = Connection(Server(app, ConnectionLimits()))
    conn.connection_made(client)

    async def one() -> None:
        client.written = loop.create_future()
        conn.data_received(ask)
        await client.written
        while conn.task is not None:
            await asyncio.sleep(0)

    for _ in range(300):
        await one()
    start = time.process_time()
    for _ in range(requests):
        await one()
    took = (time.process_time() - start) / requests * 1e6
    await app.cleanup()
    return took


def _recorded(upstream: str, ask: bytes) -> bytes:
    """The cluster's answer to `ask`, as it came on the wire (read to its end, as httptools finds it)."""
    import socket

    import httptools

    class End:
        done = False

        def on_message_complete(self) -> None:
            self.done = True

    end = End()
    parser = httptools.HttpResponseParser(end)
    host, port = upstream.removeprefix("http://").split(":")
    data = b""
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(ask)
        while not end.done:
            chunk = sock.recv(1 << 16)
            parser.feed_data(chunk)
            data += chunk
    return data


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--upstream", default="http://127.0.0.1:9200")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], int(args.child[2]))
        return
    engine = Http(args.upstream)
    index = f"bmxtest-parts-{uuid.uuid4().hex[:8]}"
    index_corpus(engine, index, scifact_records("corpus.jsonl", 0), shards=1)
    try:
        queries = [q["text"] for q in scifact_records("queries.jsonl", 0)]
        cpu = served(args.upstream, index, queries, args.requests)
        python = asyncio.run(in_process(args.upstream, index, queries[0], 5 * args.requests))
    finally:
        engine.call("DELETE", f"/{index}")
    print(f"proxy CPU a passthrough, one client, {args.requests} searches ({args.upstream}):")
    for variant, ms in cpu.items():
        print(f"  {variant:<14} {ms:.3f} ms")
    print(f"the whole passthrough's Python in process, no socket: {python:.0f} µs")


if __name__ == "__main__":
    main()
