"""TLS both ways: the proxy verifies an https node against a CA bundle and serves HTTPS itself."""

from __future__ import annotations

import ssl

import aiohttp
import trustme
from aiohttp import web

from bmx_rerank.nodes import server_ssl
from bmx_rerank.proxy import ProxyConfig, make_app, start_server
from bmx_rerank.stats.source import FixedStats
from tests.support.serving import serve_app


async def _https_node(ca: trustme.CA) -> tuple[web.AppRunner, str]:
    async def handle(request: web.Request) -> web.Response:
        return web.json_response({"path": request.path, "auth": request.headers.get("Authorization")})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1", "localhost").configure_cert(ctx)
    return await serve_app(app, ssl_context=ctx)


async def test_https_node_verified_with_a_ca_bundle_and_https_listener(tmp_path):
    ca = trustme.CA()
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    leaf = ca.issue_cert("127.0.0.1")
    cert_file = tmp_path / "proxy.pem"
    leaf.private_key_and_cert_chain_pem.write_to_path(str(cert_file))
    node_runner, node_url = await _https_node(ca)
    assert node_url.startswith("https://")
    stats = lambda session, base: FixedStats({})  # noqa: E731
    verified = make_app(ProxyConfig(upstream=node_url, upstream_ca=str(ca_file)), stats)
    runner, proxy_url = await start_server(verified, ssl_context=server_ssl(str(cert_file)))
    unverified = make_app(ProxyConfig(upstream=node_url), stats)  # the system trust store: no
    plain_runner, plain_url = await start_server(unverified)
    client_ctx = ssl.create_default_context(cafile=str(ca_file))
    try:
        async with aiohttp.ClientSession() as client:
            assert proxy_url.startswith("https://")
            async with client.get(
                f"{proxy_url}/idx/_doc/1", ssl=client_ctx, headers={"Authorization": "Basic dTpw"}
            ) as r:
                assert r.status == 200
                assert await r.json() == {"path": "/idx/_doc/1", "auth": "Basic dTpw"}
            async with client.get(f"{plain_url}/idx/_doc/1") as r:
                body = await r.json()
                assert r.status == 502 and "Certificate" in body["error"]["reason"]
    finally:
        await runner.cleanup()
        await plain_runner.cleanup()
        await node_runner.cleanup()
