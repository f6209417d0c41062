"""Where the sidecar's own calls go for a wrapped client: its nodes, its TLS settings and its
credentials, read from the official client's configuration."""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bmx_rerank.identity import basic_auth as upstream_basic_auth
from bmx_rerank.identity import credentials


@dataclass(frozen=True)
class Sidecar:
    """Where and how the sidecar's own calls go: the client's nodes (`url` the first), its TLS and
    credentials. The calls fail over from a node that cannot be reached to the next, as the client's
    own requests do (`nodes.FailoverSession`)."""

    url: str
    ssl: ssl.SSLContext | None = None
    headers: dict[str, str] = field(default_factory=dict)
    nodes: tuple[str, ...] = ()  # every node's base URL, `url` first; () is `url` alone

    @property
    def pool(self) -> tuple[str, ...]:
        return self.nodes or (self.url,)


def is_elastic(client: Any) -> bool:
    """elasticsearch-py 8/9 sit on elastic_transport (a node pool); opensearch-py has its own Transport."""
    return hasattr(client.transport, "node_pool")


def node_url(client: Any) -> str:
    """The first node's base URL of an official client (elasticsearch-py 8/9, opensearch-py 2/3)."""
    return node_urls(client)[0]


def node_urls(client: Any) -> tuple[str, ...]:
    """Every node's base URL of an official client, in the order it was given them."""
    transport = client.transport
    if is_elastic(client):
        return tuple(str(node.base_url).rstrip("/") for node in transport.node_pool.all())
    return tuple(_opensearch_url(transport, host) for host in transport.hosts)


def _opensearch_url(transport: Any, host: dict[str, Any]) -> str:
    scheme = "https" if host.get("use_ssl") or transport.kwargs.get("use_ssl") else host.get("scheme", "http")
    prefix = host.get("url_prefix", "")
    prefix = f"/{prefix.strip('/')}" if prefix.strip("/") else ""
    return f"{scheme}://{host['host']}:{host.get('port', 9200)}{prefix}"


def ssl_context(
    *,
    context: ssl.SSLContext | None = None,
    ca_certs: str | None = None,
    verify_certs: bool = True,
    client_cert: str | None = None,
    client_key: str | None = None,
) -> ssl.SSLContext:
    """The TLS context the official clients build from the same options (their own, when given one)."""
    if context is not None:
        return context
    ctx = ssl.create_default_context(cafile=ca_certs)
    if not verify_certs:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if client_cert:
        ctx.load_cert_chain(client_cert, client_key)
    return ctx


def basic_auth(user_pass: str | Sequence[str]) -> str:
    """`Basic ...` from opensearch-py's `http_auth` ("user:pass" or (user, pass))."""
    user, _, password = (user_pass if isinstance(user_pass, str) else ":".join(user_pass)).partition(":")
    return upstream_basic_auth(user, password)


def sidecar_of(client: Any, url: str | None = None) -> Sidecar:
    """The sidecar's target as the wrapped client reaches its nodes (`url`: that one alone)."""
    nodes = (url.rstrip("/"),) if url else node_urls(client)
    base = nodes[0]
    https = base.startswith("https:")
    if is_elastic(client):
        config = client.transport.node_pool.all()[0].config
        tls = None
        if https:
            tls = ssl_context(
                context=config.ssl_context,
                ca_certs=config.ca_certs,
                verify_certs=config.verify_certs,
                client_cert=config.client_cert,
                client_key=config.client_key,
            )
        return Sidecar(base, tls, credentials(client._headers), nodes)
    options = client.transport.kwargs
    tls = None
    if https:
        tls = ssl_context(
            context=options.get("ssl_context"),
            ca_certs=options.get("ca_certs"),
            verify_certs=options.get("verify_certs", True),
            client_cert=options.get("client_cert"),
            client_key=options.get("client_key"),
        )
    headers = credentials(options.get("headers") or {})
    auth = options.get("http_auth")
    if callable(auth):
        raise TypeError(
            "the wrapped client signs each request (callable http_auth, e.g. AWS SigV4): the sidecar's "
            "own calls cannot be signed the same way; use the proxy (`bmx-rerank serve`) instead"
        )
    if auth is not None:
        headers["authorization"] = basic_auth(auth)
    return Sidecar(base, tls, headers, nodes)
