"""The in-flight memory budget in front of every real engine: 8 concurrent gzip bombs (24 MiB each once
inflated, a few KiB sent) against `bmx-rerank serve --max-in-flight 128MiB`, in its own process so that
its peak RSS is its own (VmHWM, started over after a warm-up bomb). Past the budget a bomb is a 429 in
Elasticsearch's `circuit_breaking_exception` shape; one within it is read whole and refused (400: it asks
for a rerank and is not JSON), never forwarded. The peak RSS grows by less than the budget plus a stated
margin, the budget is all given back, and the engine and a reranked search are fine afterwards.
(Against a fake cluster, with the budget's metrics: tests/unit/test_proxy_memory.py.)"""

from __future__ import annotations

import asyncio
import json
import urllib.request

from tests.support.bombs import fire, gzip_bomb
from tests.support.corpora import bulk
from tests.support.engine_client import EngineClient
from tests.support.proxy_process import serve

MIB = 1 << 20
BUDGET = 128 * MIB
# The interpreter's own slack over what the budget counts: arenas freed but not returned, the inflater's
# last piece, buffers of the 8 connections.
MARGIN = 64 * MIB


def test_eight_concurrent_bombs_stay_under_the_budget_with_429s(engine: EngineClient, make_index):
    index = make_index({"properties": {"body": {"type": "text"}}})
    bulk(engine, index, {str(i): {"body": f"red fox {i}"} for i in range(5)})
    data = gzip_bomb(24 * MIB)  # each holds ~4x its inflated size while read, joined, parsed and counted
    with serve(engine.url, ["--max-in-flight", "128MiB", "--max-body", "64MiB"]) as proxy:
        asyncio.run(fire(proxy.url, data, 1, f"/{index}/_search"))  # warm-up: the allocator's arenas
        base = proxy.rss_kib() * 1024
        proxy.reset_peak()
        answers = asyncio.run(fire(proxy.url, data, 8, f"/{index}/_search"))
        grown = proxy.peak_kib() * 1024 - base
        statuses = sorted(status for status, _ in answers)
        print(f"{engine.kind} {engine.version}: 8 bombs {statuses}, peak RSS +{grown / MIB:.0f} MiB")
        assert 429 in statuses and 400 in statuses, statuses
        assert set(statuses) <= {400, 429}, statuses
        for status, body in answers:
            assert (
                body["status"] == status and body["error"]["root_cause"][0]["type"] == body["error"]["type"]
            )
            if status == 429:
                assert body["error"]["type"] == "circuit_breaking_exception"
                assert "[in_flight_requests]" in body["error"]["reason"]
            else:
                assert body["error"]["type"] == "x_content_parse_exception", body
        assert grown < BUDGET + MARGIN, f"peak RSS grew {grown / MIB:.0f} MiB, budget {BUDGET / MIB:.0f} MiB"
        with urllib.request.urlopen(f"{proxy.url}/_bmx/metrics", timeout=10) as resp:
            assert "bmx_in_flight_bytes 0.0" in resp.read().decode(), "every byte given back"
        search = {"query": {"match": {"body": "fox"}}, "ext": {"bmx": {"field": "body"}}}
        request = urllib.request.Request(
            f"{proxy.url}/{index}/_search", json.dumps(search).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as resp:
            assert json.loads(resp.read())["_bmx"]["reranked"] is True
    assert engine.call("GET", "/_cluster/health").status == 200, "the engine is up"
