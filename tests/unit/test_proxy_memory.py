"""The in-flight memory budget (`--max-in-flight`): concurrent gzip bombs past it are 429s in
Elasticsearch's `circuit_breaking_exception` shape, and the proxy's peak RSS stays under the budget
plus a stated margin; the budget comes back when they are answered, and shows in the metrics."""

from __future__ import annotations

import gc
import threading
import time

import aiohttp
import pytest

from tests.support.bombs import fire, gzip_bomb
from tests.support.fake_cluster import FakeCluster, run_proxy
from tests.support.serving import serve_app

MIB = 1 << 20
BUDGET = 128 * MIB
MARGIN = 64 * MIB  # the interpreter's own slack: freed arenas, the inflater's last piece, the test's client


def rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * 4096


class Peak:
    """The highest RSS of this process while it runs, sampled every millisecond."""

    def __init__(self) -> None:
        self.base = rss()
        self.peak = self.base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss())
            time.sleep(0.001)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak - self.base


@pytest.fixture
async def cluster():
    fake = FakeCluster()
    runner, url = await serve_app(fake.app())
    yield fake, url
    await runner.cleanup()


async def test_eight_concurrent_bombs_stay_under_the_budget_with_429s(cluster):
    _, upstream = cluster
    runner, url = await run_proxy(upstream, max_in_flight=BUDGET, max_body=64 * MIB)
    data = gzip_bomb(24 * MIB)  # each holds ~4x its inflated size while read, joined, parsed and counted
    try:
        await fire(url, data, 1)  # warm-up: the allocator's arenas
        gc.collect()
        peak = Peak()
        answers = await fire(url, data, 8)
        grown = peak.stop()
        statuses = sorted(status for status, _ in answers)
        assert 429 in statuses, statuses
        assert 400 in statuses, f"a bomb within the budget is read, and refused: {statuses}"
        for status, body in answers:
            if status == 429:
                assert body["error"]["type"] == "circuit_breaking_exception" and body["status"] == 429
                assert "[in_flight_requests]" in body["error"]["reason"]
        print(f"8 bombs: {statuses}, peak RSS +{grown / MIB:.0f} MiB")
        assert grown < BUDGET + MARGIN, f"peak RSS grew {grown / MIB:.0f} MiB, budget {BUDGET / MIB:.0f} MiB"
        async with aiohttp.ClientSession() as client, client.get(f"{url}/_bmx/metrics") as resp:
            text = await resp.text()
        assert "bmx_in_flight_bytes 0.0" in text, "every byte given back"
        limit = next(x for x in text.splitlines() if x.startswith("bmx_in_flight_limit_bytes "))
        assert float(limit.split()[1]) == BUDGET
        trips = next(x for x in text.splitlines() if x.startswith("bmx_in_flight_breaker_trips_total"))
        assert float(trips.split()[1]) == statuses.count(429)
    finally:
        await runner.cleanup()
