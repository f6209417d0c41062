"""The rerank proxy: a drop-in `_search` in front of Elasticsearch/OpenSearch.

Every request passes through untouched (method, path, query string, headers, body bytes streamed both
ways, compressed bodies left compressed), except searches that carry `ext.bmx` or match a server-side
policy: those are widened to the rerank window, rescored with exact BMX, and paged inside the window.
Failures talking to the cluster come back in Elasticsearch's error shape (502 unreachable, 504 timeout);
the cluster's own errors pass through as they are; nothing ever answers with a stack trace.

    config      ProxyConfig, and the typed state of a running app
    app         routes, startup, the ops endpoints (/_bmx/health, ready, metrics), dispatch
    admission   which searches are reranked (ext.bmx, policies, applied configurations, load)
    search      `_search`; msearch: `_msearch` (both rerank through `rerank.pipeline`)
    relay       calls to the cluster on a client's behalf: streamed or buffered
    bodies      reading request bodies within bounds; framing: headers, answers, errors
    http        a request as the server parsed it, an answer (whole or streamed)
    server      the HTTP/1.1 server, its connection limits and Elasticsearch-shaped protocol errors"""

from bmx_rerank.proxy.app import ProxyApp, make_app, search_route, split_upstream
from bmx_rerank.proxy.config import ProxyConfig, ProxyState
from bmx_rerank.proxy.server import serve_forever, start_server

__all__ = [
    "ProxyApp",
    "ProxyConfig",
    "ProxyState",
    "make_app",
    "search_route",
    "serve_forever",
    "split_upstream",
    "start_server",
]
