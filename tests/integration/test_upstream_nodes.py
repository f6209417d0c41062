"""The proxy in front of a cluster reached over TLS through two nodes, one of which stops mid-run.

How the nodes are made: two TLS-terminating TCP relays (asyncio, in this process), each with a
certificate from a throwaway CA (trustme) and each forwarding to the real engine's plain HTTP port.
The proxy sees two https nodes whose certificates it verifies against the CA bundle; the client talks
HTTPS to the proxy. Why relays and not an engine with x-pack TLS or a second node: they cost no engine
start (CI time) and let the test cut one node's every connection at a moment it chooses, in-flight
requests included, which is what a node stopping does to the proxy. What the engine itself does over
TLS is not under test here, the proxy's TLS client and its failover are; an Elasticsearch serving HTTPS
itself (x-pack security, a generated CA) is in test_container.py.
"""

from __future__ import annotations

import asyncio
import ssl
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
import trustme
from yarl import URL

from bmx_rerank.nodes import NodePool, server_ssl
from bmx_rerank.proxy import ProxyConfig, make_app, start_server
from bmx_rerank.stats.build import build_snapshots
from bmx_rerank.stats.source import statistics_source
from bmx_rerank.upstream import Cluster
from tests.support.corpora import bulk
from tests.support.engine_client import EngineClient

pytestmark = pytest.mark.integration

DOCS = [
    "entropy weighted ranking of documents",
    "a quick brown fox jumps over the lazy dog",
    "ranking with bm25 and exact corpus statistics",
    "weighted query augmentation for ranking",
    "the lazy dog sleeps",
    "statistics of a corpus: entropy and document frequency",
] * 5


class Relay:
    """One "node": TLS in, plain TCP out to the engine; counts connections; `stop()` cuts them all."""

    def __init__(self, target: URL, tls: ssl.SSLContext) -> None:
        self.target, self.tls = target, tls
        self.connections = 0
        self.transports: list[asyncio.BaseTransport] = []
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0, ssl=self.tls)
        return f"https://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        up_reader, up_writer = await asyncio.open_connection(self.target.host, self.target.port)
        self.transports += [writer.transport, up_writer.transport]

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, ssl.SSLError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    async def stop(self) -> None:
        """As a node that stops: the port closes and every open connection is cut, mid-request or not."""
        assert self.server is not None
        self.server.close()
        for transport in self.transports:
            transport.abort()
        await self.server.wait_closed()


@dataclass
class Deployment:
    engine: EngineClient
    index: str
    store: str
    ca_file: str
    client_tls: ssl.SSLContext
    relays: list[Relay]
    nodes: list[str]
    proxy_tls: ssl.SSLContext


@pytest.fixture
async def deployment(engine: EngineClient, tmp_path: Path) -> AsyncIterator[Deployment]:
    """An index with exact statistics in its own statistics index, two TLS nodes, certificates."""
    ca = trustme.CA()
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    node_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(node_tls)
    proxy_pem = tmp_path / "proxy.pem"
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(proxy_pem))
    index, store = f"bmx-test-{uuid.uuid4().hex[:12]}", f"bmx-test-stats-{uuid.uuid4().hex[:8]}"
    engine.ok("PUT", f"/{index}", {"settings": {"number_of_shards": 2, "number_of_replicas": 0}})
    bulk(engine, index, {str(i): {"body": d} for i, d in enumerate(DOCS)})
    async with aiohttp.ClientSession() as session:
        await build_snapshots(Cluster(session, engine.url), index, "body", {}, store=store)
    relays = [Relay(URL(engine.url), node_tls), Relay(URL(engine.url), node_tls)]
    nodes = [await r.start() for r in relays]
    client_tls = ssl.create_default_context(cafile=str(ca_file))
    try:
        yield Deployment(
            engine, index, store, str(ca_file), client_tls, relays, nodes, server_ssl(str(proxy_pem))
        )
    finally:
        for relay in relays:
            if relay.server is not None and relay.server.is_serving():
                await relay.stop()
        engine.call("DELETE", f"/{index}")
        engine.call("DELETE", f"/{store}")


def _app(d: Deployment, **config):
    cfg = ProxyConfig(upstream=d.nodes, **config)
    return make_app(cfg, statistics_source(5.0, d.store))


RERANKED = {"query": {"match": {"body": "entropy ranking"}}, "size": 5, "ext": {"bmx": {"field": "body"}}}


async def test_https_nodes_verified_with_the_ca_bundle_and_https_to_the_proxy(deployment: Deployment):
    d = deployment
    runner, url = await start_server(_app(d, upstream_ca=d.ca_file), ssl_context=d.proxy_tls)
    untrusting, plain_url = await start_server(_app(d))  # the system trust store knows no such CA
    try:
        assert url.startswith("https://")
        async with aiohttp.ClientSession() as client:
            async with client.post(f"{url}/{d.index}/_search", json=RERANKED, ssl=d.client_tls) as resp:
                body = await resp.json()
                assert resp.status == 200, body
                assert resp.headers["X-BMX-Rerank"] == "bmx"
            marker = body["_bmx"]
            assert marker["reranked"] is True and marker["estimated"] is False, marker  # from --stats-index
            assert body["hits"]["hits"][0]["_source"]["body"].startswith("entropy")
            async with client.get(f"{url}/{d.index}/_count", ssl=d.client_tls) as resp:
                assert (await resp.json())["count"] == len(DOCS)
            async with client.post(f"{plain_url}/{d.index}/_search", json=RERANKED) as resp:
                err = await resp.json()
                assert resp.status == 502 and "Certificate" in err["error"]["reason"], err
            with pytest.raises(aiohttp.ClientConnectorCertificateError):  # nor does the client's default
                await client.get(f"{url}/_cluster/health")
    finally:
        await runner.cleanup()
        await untrusting.cleanup()
    assert all(r.connections > 0 for r in d.relays)  # round robin: both nodes carried traffic


async def test_a_node_stopped_mid_run_fails_no_search(deployment: Deployment, monkeypatch):
    d = deployment
    failovers: list[str] = []
    real_failed = NodePool.failed

    def failed(pool: NodePool, node: str) -> None:
        failovers.append(node)
        real_failed(pool, node)

    monkeypatch.setattr(NodePool, "failed", failed)
    runner, url = await start_server(_app(d, upstream_ca=d.ca_file), ssl_context=d.proxy_tls)
    statuses: list[int] = []
    answers: list[list[str]] = []
    stop_after = 30
    stopped = asyncio.Event()

    async def one(client: aiohttp.ClientSession, i: int) -> None:
        kind = i % 3
        if kind == 0:
            req = client.post(f"{url}/{d.index}/_search", json=RERANKED, ssl=d.client_tls)
        elif kind == 1:
            plain = {"query": {"match": {"body": "lazy dog"}}, "size": 3}
            req = client.post(f"{url}/{d.index}/_search", json=plain, ssl=d.client_tls)
        else:
            req = client.get(f"{url}/{d.index}/_count", ssl=d.client_tls)
        async with req as resp:
            body = await resp.json()
            statuses.append(resp.status)
            if kind == 0 and resp.status == 200:
                assert body["_bmx"]["reranked"] is True, body["_bmx"]
                answers.append([h["_id"] for h in body["hits"]["hits"]])
        if len(statuses) == stop_after and not stopped.is_set():
            stopped.set()
            await d.relays[1].stop()

    try:
        async with aiohttp.ClientSession() as client:
            for start in range(0, 120, 6):  # six at a time: some are in flight on node 2 when it stops
                await asyncio.gather(*(one(client, i) for i in range(start, start + 6)))
    finally:
        await runner.cleanup()
    assert stopped.is_set()
    assert statuses == [200] * 120, [s for s in statuses if s != 200]
    assert len(answers) == 40 and all(a == answers[0] for a in answers)  # same ranking before and after
    assert d.relays[1].connections > 0 and d.relays[0].connections > 0
    assert failovers and set(failovers) == {d.nodes[1]}  # node 2's requests went to node 1 after it stopped
