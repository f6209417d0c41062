"""A few-seconds version of benchmarks/proxy_latency.py (the full run and its figures are in
benchmarks/RESULTS.md): every way of asking is measured, the reranked ones rerank, and the target
ratios and the plot come out of the rows."""

from __future__ import annotations

import argparse
import json
import pickle
import re
import uuid

from benchmarks import proxy_latency as bench
from benchmarks import shard_shares
from bmx_rerank.rerank.shards import shard_sizes
from bmx_rerank.stats.routing import default_routing_shards
from tests.support.benchmark_runs import ROOT, run_benchmark
from tests.support.data import beir_records, scifact_records


def test_small_latency_run_measures_every_way_of_asking(elasticsearch_url: str, tmp_path, capsys) -> None:
    args = argparse.Namespace(
        windows="10,40", clients="1,2", duration=0.5, workers="1", loop="asyncio", shards=1, in_engine=True
    )
    docs = scifact_records("corpus.jsonl", 400)
    queries = [q["text"] for q in scifact_records("queries.jsonl", bench.WARMUP + 3)]
    rows = bench.run_engine("es", elasticsearch_url, docs, queries, args)
    # the first sights' pages fetched ahead: those of 40 (a window of 10 is its top two pages)
    out = capsys.readouterr().out
    assert re.search(r"^es: the fetch ahead held \d of 3 first sights' pages whole$", out, re.M), out
    # the integ-test Elasticsearch can score nothing in the engine: said, and no such rows
    assert "es: no --in-engine rows: the cluster lacks lang-painless, mapper-extras" in out, out
    assert not any(r["request"] in bench.IN_ENGINE for r in rows)
    kinds = {(r["request"], r["clients"]) for r in rows}
    ways = (
        "plain size-10",
        "passthrough",
        "bare relay",
        "client relay",
        "protocol relay",
        "plain size-N",
        "rescore N",
        "rerank warm",
        "rerank first",
    )
    for kind in ways:
        assert (kind, 1) in kinds and (kind, 2) in kinds, kind
    assert ("rerank again", 1) in kinds, "a third time, at one client (its answer checked equal)"
    assert ("rerank fresh", 1) in kinds, "the warm proxy's first sights, at one client"
    assert all(r["n"] > 0 and r["p50"] > 0 and r["rps"] > 0 for r in rows)
    # Several clients: the CPU each request cost the engine, and the proxy when there is one.
    for r in (r for r in rows if r["clients"] == 2):
        assert r["cpu_engine_ms"] > 0, r
        assert (r["cpu_proxy_ms"] > 0) == (
            r["request"] not in ("plain size-10", bench.GZIP, "plain size-N", "rescore N")
        ), r
    assert (bench.GZIP, 2) in kinds and (bench.GZIP, 1) not in kinds, "gzipped: several clients only"
    measures = dict((m, v) for m, v, _ in bench.targets(rows, "es"))
    assert measures["passthrough p50 - direct p50 (one client)"].endswith("ms")
    assert re.fullmatch(
        r"([+-][\d.]+ / ){2}[+-][\d.]+ ms",
        measures["one client: p50 - direct p50, bare / client / protocol relay"],
    )
    # what the engine's gzip costs, from the two direct rows at several clients
    gzipped, direct = (
        next(r for r in rows if r["request"] == k and r["clients"] == 2)
        for k in (bench.GZIP, "plain size-10")
    )
    assert re.fullmatch(r"\d+ %; [\d.]+ / [\d.]+ ms", bench.compression_cost(gzipped, direct))
    bench.plot(rows, ["es"], [10, 40], str(tmp_path / "latency.png"))
    assert (tmp_path / "latency.png").stat().st_size > 1000


def test_small_latency_run_times_in_engine_scoring_beside_the_sidecar(
    opensearch_url: str, tmp_path, capsys
) -> None:
    """On OpenSearch (with painless and token_count) `serve --in-engine`'s first sights and warm reranks
    are timed beside the engine's `rescore`: each first sight scored in the engine to the sidecar's
    scores, each warm one the sidecar's kept window (checked in the run), their target rows computed."""
    args = argparse.Namespace(
        windows="100", clients="1,8", duration=0.5, workers="1", loop="asyncio", shards=1, in_engine=True
    )
    docs = scifact_records("corpus.jsonl", 400)
    queries = [q["text"] for q in scifact_records("queries.jsonl", bench.WARMUP + 3)]
    rows = bench.run_engine("os", opensearch_url, docs, queries, args)
    for row in bench.IN_ENGINE:
        one, eight = bench.find(rows, "os", row, 100), bench.find(rows, "os", row, 100, 8)
        assert one["n"] == 3 and one["p50"] > 0, one
        assert eight["rps"] > 0 and eight["cpu_proxy_ms"] > 0 and eight["cpu_engine_ms"] > 0, eight
    measures = dict((m, v) for m, v, _ in bench.targets(rows, "os"))
    assert re.fullmatch(
        r"[\d.]+x / [\d.]+x", measures["--in-engine: first sight / warm w100 / engine rescore w100 (p50)"]
    )
    assert re.fullmatch(
        r"[\d.]+ ms / [\d.]+ ms", measures["--in-engine: proxy CPU per first sight / warm (8 clients)"]
    )
    bench.plot(rows, ["os"], [100], str(tmp_path / "latency.png"))  # its two lines too
    assert (tmp_path / "latency.png").stat().st_size > 1000
    out = capsys.readouterr().out
    assert "os: --in-engine, window 100: 0 of 3 first sights the sidecar's" in out, out
    # over several shards too (each window's edge searched first): the rows, and what the sidecar scored
    args.shards, args.clients = 2, "1"
    rows = bench.run_engine("os", opensearch_url, docs[:300], queries[: bench.WARMUP + 3], args)
    for row in bench.IN_ENGINE:
        assert bench.find(rows, "os", row, 100)["n"] == 3
    assert re.search(
        r"^os: --in-engine, window 100: [0-3] of 3 first sights the sidecar's$", capsys.readouterr().out, re.M
    )


def test_small_profile_run_reports_time_and_cpu_per_request(elasticsearch_url: str) -> None:
    """benchmarks/profile_rerank.py, a few first sights without the profiler: the proxy's timers and
    the CPU each request cost the proxy (and how much of it in the kernel), the engine and the client."""
    args = ["--upstream", elasticsearch_url, "--mode", "first", "--requests", "5", "--profile-out", ""]
    run = run_benchmark("profile_rerank", *args)
    assert run.returncode == 0, run.stderr[-2000:]
    cpu = re.search(
        r"CPU per request: proxy ([\d.]+) ms \(([\d.]+) ms of it in the kernel\), engine ([\d.]+) ms, "
        r"client ([\d.]+) ms",
        run.stdout,
    )
    assert cpu and float(cpu.group(1)) > 0 and float(cpu.group(3)) > 0, run.stdout
    assert re.search(r"upstream search\s+[\d.]+ ms/request \(5 calls\)", run.stdout), run.stdout


def test_small_profile_run_of_in_engine_scoring_over_several_shards(opensearch_url: str) -> None:
    """`--in-engine` over 2 shards: each first sight two searches (the window's edge, then the rescore),
    scored in the engine (or, where the edge tied, by the sidecar: counted)."""
    args = ["--upstream", opensearch_url, "--mode", "first", "--requests", "5", "--profile-out", ""]
    run = run_benchmark("profile_rerank", *args, "--shards", "2", "--in-engine")
    assert run.returncode == 0, run.stderr[-2000:]
    scored = re.search(r'bmx_in_engine_total\{outcome="scored"\} ([\d.]+)', run.stdout)
    tied = re.search(r'bmx_in_engine_total\{outcome="edge_tied"\} ([\d.]+)', run.stdout)
    assert scored and float(scored.group(1)) + float(tied.group(1) if tied else 0) == 5, run.stdout
    calls = re.search(r"upstream search\s+[\d.]+ ms/request \((\d+) calls\)", run.stdout)
    assert calls and int(calls.group(1)) >= 2 * float(scored.group(1)), run.stdout


def test_small_side_by_side_run_compares_two_checkouts(elasticsearch_url: str) -> None:
    """benchmarks/ab_proxies.py with this checkout on both sides (once with its caches off on one side
    and on on the other): both proxies rerank, each line has its p50, its ratio to the plain search and
    its CPU per request, and the answers are the same; `--mode pair` times a first sight and its
    repeat apart too."""
    root = str(ROOT)
    runs = (
        ("first", "scifact", "3", []),
        ("passthrough", "nfcorpus", "3", []),
        ("fresh", "scifact", "6", ["--caches", "off,on"]),  # each query once: 6 first sights through each
        ("pair", "scifact", "6", []),  # 6 first sights, each with its repeat at once
    )
    for mode, dataset, queries, caches in runs:
        args = ["--mode", mode, "--queries", queries, "--dataset", dataset, "--upstream", elasticsearch_url]
        run = run_benchmark("ab_proxies", root, root, *args, *caches)
        assert run.returncode == 0, run.stderr[-2000:]
        assert run.stdout.startswith(f"{dataset}, {mode}, "), run.stdout
        # one checkout twice, its caches off then on: each line says which
        assert not caches or re.search(r"\(caches off\): p50 .*\n.*\(caches on\): p50 ", run.stdout), (
            run.stdout
        )
        lines = re.findall(r"p50 ([\d.]+) ms \(([\d.]+)x\), proxy CPU ([\d.]+) ms/request", run.stdout)
        assert len(lines) == 2 and all(float(p) > 0 for p, _, _ in lines), run.stdout
        # CPU is read in clock ticks: 6 searches passed through may not cost one
        assert all(float(cpu) > 0 or mode == "passthrough" for _, _, cpu in lines), run.stdout
        assert "differ between the two (anything but `took`): 0 of 6" in run.stdout, run.stdout
        # a pair's two searches timed apart too, each within the pair
        apart = re.findall(r"first sight p50 ([\d.]+) ms, its repeat p50 ([\d.]+) ms", run.stdout)
        assert len(apart) == (2 if mode == "pair" else 0), run.stdout
        for (pair, _, _), (first, repeat) in zip(lines, apart, strict=False):
            assert 0 < float(repeat) < float(pair) and 0 < float(first) < float(pair), run.stdout


def test_small_shard_shares_run_counts_short_shares_at_each_margin(elasticsearch_url: str, tmp_path) -> None:
    """benchmarks/shard_shares.py on NFCorpus's first 200 queries over 3 shards: a row per margin, the
    shipped one marked, as many hits asked as the proxy asks, no fewer windows short at a smaller
    margin (the shares of a smaller one are the first hits of a larger one's), and how often that marks
    the index; then on an index of one's own, with one's own queries."""
    args = ["--upstream", elasticsearch_url, "--dataset", "nfcorpus", "--queries", "200"]
    run = run_benchmark("shard_shares", *args)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = re.findall(r"^\| ([\d.]+)( \(shipped\))? \| (\d+) \| (\d+) \(", run.stdout, re.M)
    assert [float(r[0]) for r in rows] == [2.5, 3.0, 3.5, 4.0, 5.0], run.stdout
    assert [r[0] for r in rows if r[1]] == ["3.0"], run.stdout
    assert [int(r[2]) for r in rows if r[1]] == [shard_sizes({"size": 100}, None, 3)[0]], run.stdout  # type: ignore[index]
    shorts = [int(r[3]) for r in rows]
    assert shorts == sorted(shorts, reverse=True) and shorts[0] > 0, run.stdout
    said = r"mark the index uneven \(8 of its last 32\) (once in [\d,]+|never in [\d,]+) first sights"
    assert re.search(said, run.stdout), run.stdout
    # an index of one's own, as it is (its shard count read from it), with one's own queries
    index = f"bmxtest-own-shares-{uuid.uuid4().hex[:8]}"
    engine = bench.Http(elasticsearch_url)
    bench.index_corpus(engine, index, beir_records("nfcorpus", "corpus.jsonl"), shards=2)
    try:
        queries = tmp_path / "queries.jsonl"
        queries.write_text(
            "".join(json.dumps(q) + "\n" for q in beir_records("nfcorpus", "queries.jsonl", 40))
        )
        args = ["--upstream", elasticsearch_url, "--index", index, "--field", "body"]
        own = run_benchmark("shard_shares", *args, "--queries-file", str(queries))
    finally:
        engine.call("DELETE", f"/{index}")
    assert own.returncode == 0, own.stderr[-2000:]
    assert re.search(rf"^{index}, 2 shards, window 100: \d+ full windows of 40 queries$", own.stdout, re.M), (
        own.stdout
    )
    assert len(re.findall(r"^\| [\d.]+", own.stdout, re.M)) == 5, own.stdout
    # the simulation of `ShortShares`' rule: every first sight short marks it each 8; none, never
    assert shard_shares.marked_by_chance(1.0) == 8 and shard_shares.marked_by_chance(0.0) is None
    assert 300 < (shard_shares.marked_by_chance(0.1) or 0) < 3000  # 10 %: 3.2 of 32 on average


def test_small_first_stage_costs_run_checks_the_probes_leave_the_hits_alone(elasticsearch_url: str) -> None:
    """benchmarks/first_stage_costs.py on a few queries: every variant timed; the script itself asserts
    that each probed first stage answers the plain one's ids and scores, with the probes reported."""
    run = run_benchmark("first_stage_costs", elasticsearch_url, "23")
    assert run.returncode == 0, run.stderr[-2000:]
    rows = dict(re.findall(r"^(.+?)\s+p50\s+([\d.]+) ms$", run.stdout, re.M))
    for row in (
        "s100",
        "s100 + probes (never-matching branch)",
        "s100 + probes (filter + match_all, before)",
        "mtv100",
        "lean s100 + probes",
        "lean s100 + the canary alone",
        "lean s100 + as many named match_all",
        "lean s100 + term probes (no positions)",
        "lean s100 + probes (caller's query a must, before)",
        "lean s100 + probes + top_hits 20 (page inside)",
        "page of 10 by _seq_no",
        "rescore w100",
    ):
        assert float(rows[row]) > 0, run.stdout


def test_small_after_first_sight_run_times_each_step(elasticsearch_url: str) -> None:
    """benchmarks/after_first_sight.py on a few queries: every step timed, through the proxy and
    straight to the engine."""
    run = run_benchmark("after_first_sight", elasticsearch_url, "23")
    assert run.returncode == 0, run.stderr[-2000:]
    rows = dict(re.findall(r"^(.+?)\s+p50\s+([\d.]+) ms$", run.stdout, re.M))
    assert len(rows) == 6 and all(float(v) > 0 for v in rows.values()), run.stdout
    assert float(rows["first sight (proxy)"]) > float(rows["lean stage after a repeat (engine)"]), run.stdout


def test_small_word_guesses_run_counts_the_rule_against_the_engine(elasticsearch_url: str) -> None:
    """benchmarks/word_guesses.py on 300 documents of each corpus: a table row per corpus, every word
    the rule takes exactly as the engine tokenizes it."""
    run = run_benchmark("word_guesses", "--upstream", elasticsearch_url, "--docs", "300")
    assert run.returncode == 0, run.stderr[-2000:]
    rows = re.findall(
        r"^\| ([\w:, -]+) \| ([\d,]+) \| ([\d,]+) \| ([\d,]+) \| (\d+) \| (\d+) \|$", run.stdout, re.M
    )
    assert [r[0].split(":")[0] for r in rows] == ["scifact", "nfcorpus", "short words", "short words"], (
        run.stdout
    )
    for _, words, taken, exact, wrong, _extra in rows:
        assert int(words.replace(",", "")) > 500 and taken == exact and wrong == "0", run.stdout


def test_small_first_sight_cpu_run_replays_to_the_same_bytes_and_counts(
    elasticsearch_url: str, tmp_path
) -> None:
    """benchmarks/first_sight_cpu.py on 3 queries: recorded, replayed with no cluster to the very bytes
    the proxy answered, counted under callgrind, and timed each rerank alone, warm and cold."""
    recording = str(tmp_path / "first.pkl")
    run = run_benchmark(
        "first_sight_cpu", "record", recording, "--upstream", elasticsearch_url, "--queries", "3"
    )
    assert run.returncode == 0, run.stderr[-2000:]
    run = run_benchmark("first_sight_cpu", "replay", recording, "--check")
    assert run.returncode == 0 and "answers that differ 0 of 3" in run.stdout, run.stdout + run.stderr[-2000:]
    run = run_benchmark("first_sight_cpu", "count", recording, "--repeats", "1")
    assert run.returncode == 0, run.stderr[-2000:]
    counted = re.search(r"([\d,]+) instructions a rerank", run.stdout)
    assert counted and int(counted.group(1).replace(",", "")) > 100_000, run.stdout
    run = run_benchmark("first_sight_cpu", "cold", recording, "--repeats", "1")
    assert run.returncode == 0, run.stderr[-2000:]
    ways = re.findall(r", ([^,]+): a rerank p50 ([\d.]+) ms, its plan ([\d.]+) ms$", run.stdout, re.M)
    assert [w for w, _, _ in ways] == ["back to back", "after 64 MiB walked", "after 3 ms asleep"], run.stdout
    assert all(0 < float(plan) < float(whole) for _, whole, plan in ways), run.stdout


def test_small_first_sight_cpu_run_over_three_shards_serves_the_table_as_stats_build_keeps_it(
    elasticsearch_url: str, tmp_path
) -> None:
    """Over 3 shards the recording's length table knows the routing its sweep proved (as `stats build`
    records it), so each first sight searches its likely page beside its first stage; and two passes
    replay to the same bytes (a first sight's window is one the proxy never saw split)."""
    recording = tmp_path / "first3.pkl"
    run = run_benchmark(
        "first_sight_cpu", "record", str(recording), "--upstream", elasticsearch_url, "--queries", "3",
        "--shards", "3",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    kept = pickle.loads(recording.read_bytes())
    assert list(kept["routing"].values()) == [default_routing_shards(3)], kept["routing"]
    beside = [k for k in kept["answers"] if b'"size":20,' in k[2] and b"_bmx_tf_" not in k[2]]
    assert len(beside) == 3 and all(k[1].startswith(f"/{kept['index']}/_search") for k in beside), beside
    run = run_benchmark("first_sight_cpu", "replay", str(recording), "--check", "--repeats", "2")
    assert run.returncode == 0 and "answers that differ 0 of 6" in run.stdout, run.stdout + run.stderr[-2000:]


def test_small_passthrough_parts_run_times_every_part(elasticsearch_url: str) -> None:
    """benchmarks/passthrough_parts.py on 60 searches: each cut of the proxy's handler and the whole
    passthrough's Python in process."""
    run = run_benchmark("passthrough_parts", "--upstream", elasticsearch_url, "--requests", "60")
    assert run.returncode == 0, run.stderr[-2000:]
    parts = dict(re.findall(r"^  (.+?)\s+([\d.]+) ms$", run.stdout, re.M))
    assert set(parts) == {"at once", "exchange", "proxy", "proxy, no log"}, run.stdout
    # /proc counts CPU in 10 ms ticks: 60 answers at once (about 0.08 ms each) may add up to none.
    assert all(float(ms) >= 0 for ms in parts.values()), run.stdout
    assert float(parts["proxy"]) > 0, run.stdout
    in_process = re.search(r"no socket: (\d+) µs", run.stdout)
    assert in_process and int(in_process.group(1)) > 0, run.stdout


async def test_the_closed_loop_asks_for_answers_uncompressed_unless_told() -> None:
    """The several-client rows ask for no compression, as the official clients do by default (aiohttp
    would ask for gzip), and the gzip row asks for it."""
    from aiohttp import web

    from tests.support.net import free_port

    asked: list[str] = []

    async def search(request: web.Request) -> web.Response:
        asked.append(request.headers.get("Accept-Encoding", ""))
        return web.json_response({"hits": {"hits": []}})

    app = web.Application()
    app.router.add_post("/i/_search", search)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        url = f"http://127.0.0.1:{port}"
        await bench.closed_loop(url, "/i/_search", [b"{}"], 2, 0.05)
        assert asked and set(asked) == {"identity"}, set(asked)
        asked.clear()
        await bench.closed_loop(url, "/i/_search", [b"{}"], 2, 0.05, "gzip, deflate")
        assert asked and set(asked) == {"gzip, deflate"}, set(asked)
    finally:
        await runner.cleanup()


def test_small_page_depth_run_counts_pages_the_best_hits_hold(elasticsearch_url: str) -> None:
    """benchmarks/page_depth.py on 6 NFCorpus queries: a row per depth, the shipped one marked, and no
    fewer pages held whole by more of the first stage's best hits."""
    args = ["--upstream", elasticsearch_url, "--dataset", "nfcorpus", "--queries", "6"]
    run = run_benchmark("page_depth", *args)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = re.findall(r"best +(\d+) hold the page in (\d+) of (\d+)(  <- .*)?$", run.stdout, re.M)
    assert [int(k) for k, *_ in rows] == [10, 12, 14, 15, 16, 18, 20, 25, 30], run.stdout
    held = [int(h) for _, h, _, _ in rows]
    assert held == sorted(held) and 0 < int(rows[0][2]) <= 6, run.stdout
    assert [k for k, _, _, mark in rows if mark] == ["20"], run.stdout


def test_small_idle_gaps_run_times_every_way_after_each_pause(elasticsearch_url: str) -> None:
    """benchmarks/idle_gaps.py: a row a pause, every way of asking timed after it, each rerank a repeat
    (checked in the run: `tf: window`), the ratio computed from the row's own p50s."""
    run = run_benchmark(
        "idle_gaps",
        "--upstream",
        elasticsearch_url,
        "--queries",
        str(bench.WARMUP + 3),
        "--docs",
        "400",
        "--pauses",
        "0,5",
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "3 searches each way and pause, one client" in run.stdout, run.stdout
    rows = re.findall(
        r"^\| (\d+) ms \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+)x ",
        run.stdout,
        re.M,
    )
    assert [r[0] for r in rows] == ["0", "5"], run.stdout
    for row in rows:
        plain, relay, passthrough, rescore, warm, ratio = map(float, row[1:])
        assert min(plain, relay, passthrough, rescore, warm) > 0
        # each figure is printed to 0.01, the ratio from the unrounded p50s: within what rounding allows
        low, high = (warm - 0.005) / (rescore + 0.005), (warm + 0.005) / (rescore - 0.005)
        assert low - 0.005 <= ratio <= high + 0.005, row
