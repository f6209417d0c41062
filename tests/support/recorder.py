"""A recording HTTP server in front of an engine: forwards every request unchanged and keeps what the
engine received (method, path, query, headers, body), so tests assert on the wire, not on a client."""

from __future__ import annotations

import json
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "accept-encoding"}


@dataclass(frozen=True)
class Received:
    method: str
    path: str  # unquoted
    query: dict[str, str]
    headers: dict[str, str]  # lower-case names
    body: Any  # parsed JSON, the raw text (NDJSON), or None

    @property
    def endpoint(self) -> str:
        """The last path segment (`_search`, `_analyze`, `_mtermvectors`, ...)."""
        return self.path.rstrip("/").rsplit("/", 1)[-1]


class Recorder:
    """`url` forwards to `upstream`; `received` lists the requests; `delay[endpoint]` holds one back."""

    def __init__(self, upstream: str, tls: ssl.SSLContext | None = None) -> None:
        """`tls`: serve HTTPS with this server context (the engine behind stays plain HTTP)."""
        self.upstream = upstream.rstrip("/")
        self.received: list[Received] = []
        self.delay: dict[str, float] = {}
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        scheme = "https" if tls is not None else "http"
        self.url = f"{scheme}://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def requests(self, endpoint: str) -> list[Received]:
        with self._lock:
            return [r for r in self.received if r.endpoint == endpoint]

    def clear(self) -> None:
        with self._lock:
            self.received.clear()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _forward(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length") or 0))
                split = urllib.parse.urlsplit(self.path)
                text = raw.decode() if raw else ""
                try:
                    body: Any = json.loads(text) if text else None
                except ValueError:
                    body = text
                seen = Received(
                    self.command,
                    urllib.parse.unquote(split.path),
                    dict(urllib.parse.parse_qsl(split.query, keep_blank_values=True)),
                    {k.lower(): v for k, v in self.headers.items()},
                    body,
                )
                with recorder._lock:
                    recorder.received.append(seen)
                time.sleep(recorder.delay.get(seen.endpoint, 0.0))
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
                request = urllib.request.Request(
                    recorder.upstream + self.path, data=raw or None, method=self.command, headers=headers
                )
                try:
                    with urllib.request.urlopen(request, timeout=60) as resp:
                        status, data, out = resp.status, resp.read(), resp.headers
                except urllib.error.HTTPError as err:
                    status, data, out = err.code, err.read(), err.headers
                try:
                    self.send_response(status)
                    for key, value in out.items():
                        if key.lower() not in HOP_BY_HOP:
                            self.send_header(key, value)
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(data)
                except OSError:  # the client gave up (a request timeout under test)
                    pass

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _forward

        return Handler
