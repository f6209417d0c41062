"""A few-seconds version of benchmarks/in_engine.py (the full run and its figures are in
benchmarks/RESULTS.md): BMX as a Painless rescore gives the proxy's page on one shard, and over three
shards when kept to the global window; `serve --in-engine`'s warm pages come from windows the sidecar
kept; every way of asking is timed."""

from __future__ import annotations

import re

from benchmarks.proxy_latency import WARMUP
from tests.support.benchmark_runs import run_benchmark
from tests.support.engine_client import EngineClient

PAGES = (
    r"pages unlike the proxy's: (\d+) of (\d+) \(each shard's window\), (\d+) of (\d+) "
    r"\(the global window, its cutoff untied\); largest relative score gap ([\d.e+-]+)"
)


def test_small_in_engine_run_matches_the_proxy_on_one_shard(engine: EngineClient) -> None:
    """On each OpenSearch; the integ-test Elasticsearch has no `token_count`, and the run says so."""
    args = ["--upstream", engine.url, "--queries", str(WARMUP + 6), "--docs", "500", "--window", "40"]
    args += ["--clients", "2", "--duration", "0.5", "--log", "40"]
    run = run_benchmark("in_engine", *args)
    if engine.kind == "elasticsearch":
        assert run.returncode == 2, run.stderr[-2000:]
        assert "needs OpenSearch with mapper-extras and lang-painless" in run.stderr
        assert "token_count" in run.stderr and "Traceback" not in run.stderr
        return
    assert run.returncode == 0, run.stderr[-2000:]
    found = re.search(PAGES, run.stdout)
    assert found, run.stdout
    assert found.group(1) == found.group(3) == "0" and int(found.group(2)) >= WARMUP, run.stdout
    assert int(found.group(4)) > 0 and float(found.group(5)) < 1e-6, "float32's rounding, no other gap"
    served = re.search(
        r"answers unlike the proxy's own rerank, or \(but at a tied edge\) not from the engine: (\d+) of (\d+)",
        run.stdout,
    )
    assert served and served.group(1) == "0" and int(served.group(2)) >= WARMUP, run.stdout
    warm = re.search(r"or not from a window the sidecar kept: (\d+) of (\d+)", run.stdout)
    assert warm and warm.group(1) == "0" and warm.group(2) == served.group(2), run.stdout
    reordered = re.search(
        r"pages alike but for the order of hits of equal score: (\d+) .*, (\d+) ", run.stdout
    )
    assert reordered, run.stdout  # SciFact's first 500 documents hold no twins to tie: none reordered
    assert reordered.groups() == ("0", "0"), run.stdout
    for way in (
        "plain size-10",
        "rescore N",
        "painless BMX rescore N",
        "the same, global window",
        "proxy first sight N",
        "proxy warm N",
        "proxy --in-engine first sight N",
        "proxy --in-engine sight that keeps N",
        "proxy --in-engine warm N",
    ):
        assert re.search(rf"^\| {way} \| [\d.]+ \| [\d.]+x \|$", run.stdout, re.M), (way, run.stdout)
    log = r"a query log of 40 searches over (\d+) queries \(Zipf 1.0\), caches empty at its start:"
    assert (logged := re.search(log, run.stdout)) and 1 < int(logged.group(1)) < 40, run.stdout
    for way in ("proxy", "proxy --in-engine", "proxy --in-engine, caches off"):
        assert re.search(rf"^\| {way} \| [\d.]+ \| [\d.]+x \|$", run.stdout, re.M), (way, run.stdout)
    loop = r"^2 clients: rescore N \d+ req/s, painless BMX rescore N \d+ req/s \(\d+ % of rescore\)$"
    assert re.search(loop, run.stdout, re.M), run.stdout
    for way in ("proxy warm N", "proxy --in-engine first sight N", "proxy --in-engine warm N"):
        assert re.search(rf"^\| {way} \| \d+ \| \d+ % \|$", run.stdout, re.M), (way, run.stdout)


def test_small_in_engine_run_over_three_shards_keeps_to_the_global_window(opensearch_url: str) -> None:
    """A `rescore` window is per shard: over 3 shards a window of 10 (the page) reranks up to 30 hits,
    so pages unlike the proxy's come out, and are counted; with the global window's cutoff, none, as
    `serve --in-engine` answers."""
    args = ["--upstream", opensearch_url, "--queries", str(WARMUP + 3), "--docs", "500", "--window", "10"]
    args += ["--clients", "1", "--log", "0"]  # no closed loop, no query log
    run = run_benchmark("in_engine", *args, "--shards", "3")
    assert run.returncode == 0, run.stderr[-2000:]
    assert "3 shard(s), window 10" in run.stdout
    found = re.search(PAGES, run.stdout)
    assert found and 0 < int(found.group(1)) <= int(found.group(2)), run.stdout
    # `serve --in-engine` keeps to the global window too (a window whose edge ties is the sidecar's)
    assert "not from the engine: 0 of" in run.stdout, run.stdout
    assert found.group(3) == "0" and int(found.group(4)) > 0 and float(found.group(5)) < 1e-6, run.stdout
    assert "clients:" not in run.stdout
