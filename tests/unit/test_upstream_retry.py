"""Sidecar reads are retried on connection errors and 429s only, a bounded number of times."""

from __future__ import annotations

import pytest

from bmx_rerank import upstream
from bmx_rerank.errors import SearchError, UpstreamError, timed_out, unreachable


def flaky(failures: list[BaseException]):
    calls = []

    async def fake(session, method, url, body=None, headers=None, timeout=None, decode=None):
        calls.append(url)
        if failures:
            raise failures.pop(0)
        return {"tokens": [{"token": "ok"}]}

    return fake, calls


async def test_connection_errors_are_retried(monkeypatch):
    fake, calls = flaky([unreachable("down"), unreachable("down")])
    monkeypatch.setattr(upstream, "request_json", fake)
    assert [t for t, _ in await upstream.Cluster(None, "http://x").analyze("i", "f", "text")] == ["ok"]
    assert len(calls) == 3


async def test_retries_are_bounded(monkeypatch):
    fake, calls = flaky([unreachable("down")] * 5)
    monkeypatch.setattr(upstream, "request_json", fake)
    with pytest.raises(SearchError) as info:
        await upstream.Cluster(None, "http://x", attempts=2).analyze("i", "f", "text")
    assert info.value.status == 502 and len(calls) == 2


@pytest.mark.parametrize(
    "error", [UpstreamError(400, "illegal_argument_exception", "bad"), timed_out("slow")]
)
async def test_cluster_answers_and_timeouts_are_not_retried(monkeypatch, error):
    fake, calls = flaky([error])
    monkeypatch.setattr(upstream, "request_json", fake)
    with pytest.raises(SearchError):
        await upstream.Cluster(None, "http://x").analyze("i", "f", "text")
    assert len(calls) == 1


async def test_a_full_queue_429_is_retried(monkeypatch):
    rejected = UpstreamError(429, "es_rejected_execution_exception", "queue capacity = 16")
    fake, calls = flaky([rejected])
    monkeypatch.setattr(upstream, "request_json", fake)
    assert [t for t, _ in await upstream.Cluster(None, "http://x").analyze("i", "f", "text")] == ["ok"]
    assert len(calls) == 2
