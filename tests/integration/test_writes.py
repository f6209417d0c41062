"""Nothing written through the proxy is lost or altered: a small run of benchmarks/writes.py (2,000
documents by `_bulk`, some gzip-compressed, single PUTs, `_update`s, bulk updates and deletes) through
`bmx-rerank serve` in its own process, compared with the same writes sent directly. The 100,000-document
run and its figures are in benchmarks/RESULTS.md."""

from __future__ import annotations

from benchmarks import writes
from tests.support.proxy_process import serve


def test_writes_through_the_proxy_arrive_identical(engine_url: str):
    with serve(engine_url) as proxy:
        out = writes.run(engine_url, proxy.url, 2_000)
    assert out.expected > 1_800
    assert out.count_direct == out.count_proxied == out.expected, out
    assert (out.missing, out.extra, out.differing, out.answers_differing) == (0, 0, 0, 0), out
    assert out.total_sha256_direct == out.total_sha256_proxied
    assert out.identical
