"""Plain-HTTP access to one real engine, the same for Elasticsearch and OpenSearch; the type of the
`make_index` fixture; and what a test does when an engine it needs is not there."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest


@dataclass(frozen=True)
class Response:
    """An engine's answer: HTTP status, parsed JSON body and headers."""

    status: int
    body: Any
    headers: dict[str, str]


@dataclass(frozen=True)
class EngineClient:
    """Plain-HTTP access to one engine; identical for ES and OpenSearch, unlike the official clients."""

    kind: str
    url: str
    version: str = ""

    @property
    def major(self) -> int:
        """The server's major version (0 when unknown), for the few answers that differ by major."""
        return int(self.version.split(".")[0]) if self.version else 0

    def call(
        self, method: str, path: str, body: Any = None, params: dict[str, Any] | None = None
    ) -> Response:
        """Send a request and return the response whatever its status (tests assert on errors too)."""
        query = ""
        if params:
            query = "?" + urllib.parse.urlencode(
                {k: (str(v).lower() if isinstance(v, bool) else v) for k, v in params.items()}
            )
        data = None if body is None else json.dumps(body).encode()
        if isinstance(body, str):  # NDJSON for _bulk
            data = body.encode()
        content_type = "application/x-ndjson" if isinstance(body, str) else "application/json"
        request = urllib.request.Request(
            f"{self.url}{path}{query}", data=data, method=method, headers={"Content-Type": content_type}
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as resp:
                status, raw, headers = resp.status, resp.read(), dict(resp.headers)
        except urllib.error.HTTPError as err:
            status, raw, headers = err.code, err.read(), dict(err.headers)
        return Response(status, json.loads(raw) if raw else None, headers)

    def ok(self, method: str, path: str, body: Any = None, params: dict[str, Any] | None = None) -> Any:
        """Send a request that must succeed; return its JSON body."""
        resp = self.call(method, path, body, params)
        assert 200 <= resp.status < 300, f"{method} {path} -> {resp.status}: {resp.body}"
        return resp.body


MakeIndex = Callable[..., str]  # the `make_index` fixture: creates an index, returns its name


def unavailable(reason: str) -> None:
    """Skip, or fail when the run promised real engines (BMX_REQUIRE_ENGINES=1)."""
    if os.environ.get("BMX_REQUIRE_ENGINES") == "1":
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)
