"""A 20-second version of benchmarks/soak.py (the full run and its figures are in benchmarks/RESULTS.md):
`bmx-rerank serve` in its own process, 16 concurrent clients in this one mixing reranked searches, plain
searches and writes into the searched index. Zero errors (a fallback counts as one), every kind of
traffic served, and the proxy's RSS after warm-up growing by less than 25 % in so short a run (the full
soak's own limit is 10 %), its file descriptors bounded by the connection pools."""

from __future__ import annotations

from benchmarks import soak


def test_short_soak_has_no_errors_and_flat_memory(elasticsearch_url: str):
    report = soak.soak(elasticsearch_url, seconds=20, clients=16, n_docs=3_000)
    assert report.errors == {}, report.errors
    assert all(n > 20 for n in report.counts.values()), report.counts
    assert report.rss_growth_pct < 25, report
    assert report.fds_after < report.fds_before + 16 + 64 + 256, report
