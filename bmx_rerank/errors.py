"""Errors in Elasticsearch's own shape, so clients of the proxy parse them as they parse the cluster's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class SearchError(Exception):
    """An error a client should see as `{"error": {...}, "status": N}` with HTTP status N."""

    status: int
    type: str
    reason: str

    def __str__(self) -> str:
        return f"[{self.status}] {self.type}: {self.reason}"

    def body(self) -> dict[str, Any]:
        cause = {"type": self.type, "reason": self.reason}
        return {"error": {"root_cause": [cause], **cause}, "status": self.status}


def bad_request(reason: str, type_: str = "illegal_argument_exception") -> SearchError:
    """A 400 for input the client can fix (Elasticsearch uses this type for invalid parameters)."""
    return SearchError(400, type_, reason)


@dataclass
class UpstreamError(SearchError):
    """The cluster answered with an error; `payload` is its body, passed to the client unchanged."""

    payload: bytes = b""
    content_type: str = "application/json"


def unreachable(reason: str) -> SearchError:
    """The cluster could not be reached: 502, as a gateway would answer."""
    return SearchError(502, "bmx_upstream_unreachable_exception", reason)


def timed_out(reason: str) -> SearchError:
    """The cluster did not answer in time: 504."""
    return SearchError(504, "bmx_upstream_timeout_exception", reason)
