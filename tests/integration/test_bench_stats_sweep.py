"""A small run of benchmarks/stats_sweep.py (the full runs and their figures are in benchmarks/RESULTS.md):
on stored term vectors, the sweep runs in one and two slices, every rate is reported against both
scans, and a small vocabulary publishes and loads back."""

from __future__ import annotations

import re

from tests.support.benchmark_runs import run_benchmark


def test_small_sweep_benchmark_reports_every_rate(elasticsearch_url: str) -> None:
    args = ["--upstream", elasticsearch_url, "--terms", "2000", "--repeat", "1", "--variants", "200x2"]
    args += ["--slices", "1,2", "--term-vector", "yes"]
    run = run_benchmark("stats_sweep", *args, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    out = run.stdout
    assert "field mapping: term_vector yes" in out
    rates = dict(re.findall(r"^\s+(.+?)\s+([\d,]+) docs/s", out, re.M))
    assert {"bare id scan", "scan with _source"} <= set(rates), out
    for slices in (1, 2):
        label = f"sweep {slices} slice(s) batch=200 concurrency=2"
        assert int(rates[label].replace(",", "")) > 0, out
    assert '"terms": 2000' in out and '"chunks": 1' in out, out


def test_term_vector_size_benchmark_reports_both_mappings(elasticsearch_url: str) -> None:
    """benchmarks/term_vector_size.py on 300 documents: stored term vectors make the index bigger."""
    args = ["--upstream", elasticsearch_url, "--docs", "300"]
    run = run_benchmark("term_vector_size", *args, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    found = re.search(r"300 documents: term_vector no ([\d,]+) bytes, yes ([\d,]+) bytes", run.stdout)
    assert found, run.stdout
    assert int(found.group(2).replace(",", "")) > int(found.group(1).replace(",", "")), run.stdout
