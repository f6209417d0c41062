"""Does `eval --apply` give advice that holds on new queries? The resampling protocol of issue 20.

For each collection (BEIR, `../shared/data/beir/NAME`), engine and analyzer: tune on a random draw of
15, 30 or 60 judged queries (`eval --apply`'s choice), then measure the applied configuration on every
other judged query, against the engine's own BM25. Per size: the share of draws that lose more than
0.5 nDCG@10 points, the worst draw, the mean held-out change, and how often the engine was kept, for
today's rule (5-fold cross-validation over the 13-configuration grid, `selection.cross_validate`) and
the new one (`gate.decide` over the grid shrunk to the draw's size, fusion included) side by side;
`new-q` is the new rule with the narrower interval of `gate.decide(method="queries")` (the held-out
per-query differences resampled, the choices as made), for comparison.

How: every configuration of the full grid is run ONCE per collection/engine/analyzer on all judged
queries, through the proxy exactly as `eval` runs them (`evaluation.run.run_all`), and each query's
nDCG@10 kept (cached in `--cache`). A draw then needs no search: `eval`'s choice on the tuning queries
is a function of their per-query scores, and the applied configuration's held-out score is the mean of
its per-query scores on the other queries. That this equals sending those queries as plain searches
through a proxy serving the applied configuration is checked once per setting (`--check`: the first
draw that applies something is written with `write_config` and its held-out queries searched through
a proxy that reads it; the two means are printed side by side).

  .venv/bin/python -m benchmarks.eval_resampling --engine es=http://127.0.0.1:9200 \\
      --engine os=http://127.0.0.1:9201 --dataset scifact --dataset nfcorpus --draws 20

The `english` analyzer is skipped where the engine has none (the integ-test Elasticsearch).
`--fields` indexes title and text as fields of their own (statistics for both): searches are
`multi_match` over them and field weights (`bmx title^2`, `bmx title^0.5`) join the grid.
`--queries N --other-docs M` index a slice (N judged queries, their judged documents and M others) for
a quick run (the CI test does)."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import numpy as np
import orjson

from bmx_rerank.applied import delete_config, write_config
from bmx_rerank.evaluation import measure
from bmx_rerank.evaluation.beir import FIELD, TITLE, load_beir, shared_dataset
from bmx_rerank.evaluation.configs import ENGINE, Candidate, default_grid, shrink
from bmx_rerank.evaluation.data import read_qrels, read_queries
from bmx_rerank.evaluation.gate import DEFAULT_CONFIDENCE, decide
from bmx_rerank.evaluation.run import ranking, run_all, search_body
from bmx_rerank.evaluation.selection import cross_validate
from bmx_rerank.upstream import Cluster

LOSS = 0.005  # "lost more than 0.5 nDCG@10 points"
RULES = ("today", "new", "new-q")
CHECK_TOLERANCE = 0.001  # through the proxy vs from the cache, mean nDCG@10


@dataclass
class Setting:
    dataset: str
    engine: str
    url: str
    analyzer: str
    index: str
    queries: dict[str, str] = field(default_factory=dict)  # judged queries: id -> text
    qrels: dict[str, dict[str, int]] = field(default_factory=dict)
    scores: dict[str, dict[str, float]] = field(default_factory=dict)  # config -> qid -> nDCG@10
    run_seconds: float = 0.0
    searches: int = 0
    root: Path | None = None
    fields: tuple[str, ...] = (FIELD,)  # several: title and text apart, searched with a multi_match

    @property
    def label(self) -> str:
        return f"{self.dataset} {self.engine} {self.analyzer}" + (" fields" if len(self.fields) > 1 else "")

    @property
    def searched(self) -> str | tuple[str, ...]:
        return self.fields if len(self.fields) > 1 else self.fields[0]


@dataclass(frozen=True)
class Draw:
    setting: str
    size: int
    draw: int
    chosen: dict[str, str]  # rule -> configuration applied
    change: dict[str, float]  # rule -> held-out change over the engine (nDCG@10, 0..1)
    seconds: float  # time to decide (both rules, from cached scores)
    tuning: tuple[str, ...] = ()


def _slice(root: Path, n_queries: int | None, other_docs: int | None, seed: int, out: Path) -> Path:
    """A BEIR folder holding `n_queries` judged test queries, their judged documents and `other_docs`
    other documents (the whole collection when both are None)."""
    if n_queries is None and other_docs is None:
        return root
    queries, qrels = read_queries(root / "queries.jsonl"), read_qrels(root / "qrels" / "test.tsv")
    ids = sorted(q for q in qrels if q in queries)
    if n_queries is not None and n_queries < len(ids):
        ids = sorted(random.Random(seed).sample(ids, n_queries))
    wanted = {d for q in ids for d in qrels[q]}
    others, lines = 0, []
    for line in (root / "corpus.jsonl").read_bytes().splitlines():
        if not line.strip():
            continue
        doc_id = orjson.loads(line)["_id"]
        if doc_id in wanted or (other_docs is None or others < other_docs):
            others += doc_id not in wanted
            lines.append(line)
    (out / "qrels").mkdir(parents=True, exist_ok=True)
    (out / "corpus.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    (out / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": q, "text": queries[q]}) + "\n" for q in ids)
    )
    (out / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t{g}\n" for q in ids for d, g in qrels[q].items())
    )
    return out


async def _has_analyzer(session: aiohttp.ClientSession, url: str, analyzer: str) -> bool:
    body = orjson.dumps({"analyzer": analyzer, "text": "running"})
    async with session.post(
        f"{url}/_analyze", data=body, headers={"Content-Type": "application/json"}
    ) as resp:
        return resp.status == 200


async def measure_setting(s: Setting, root: Path, grid: Sequence[Candidate], cache: Path | None) -> None:
    """Index the collection (unless it is there), run every configuration on every judged query once."""
    queries, qrels = read_queries(root / "queries.jsonl"), read_qrels(root / "qrels" / "test.tsv")
    s.queries = {q: queries[q] for q in sorted(qrels) if q in queries}
    s.qrels = {q: qrels[q] for q in s.queries}
    names = [c.name for c in grid]
    path = cache / f"{s.index}.json" if cache else None
    if path and path.is_file():
        data = orjson.loads(path.read_bytes())
        if data["names"] == names and sorted(data["queries"]) == sorted(s.queries):
            s.scores, s.run_seconds, s.searches = data["scores"], data["seconds"], data["searches"]
            print(f"{s.label}: per-query scores from {path}")
            return
    async with aiohttp.ClientSession() as session:
        docs = await load_beir(
            Cluster(session, s.url), s.index, root, analyzer=s.analyzer, separate=len(s.fields) > 1
        )
    print(
        f"{s.label}: {docs} documents in {s.index}, {len(s.queries)} judged queries, {len(grid)} configurations"
    )
    start = time.perf_counter()
    runs = await run_all(s.url, s.index, s.searched, s.queries, grid, concurrency=4)
    s.run_seconds = time.perf_counter() - start
    s.searches = len(s.queries) * len(grid)
    fell = {n: k for n, k in runs.fallbacks.items() if k}
    if fell:
        print(f"  fallbacks (reranks that fell back to the engine's order): {fell}")
    s.scores = {c.name: measure.per_query(s.qrels, runs.runs[c.name])[measure.PRIMARY] for c in grid}
    print(f"  {s.searches} searches in {s.run_seconds:.0f} s ({s.searches / s.run_seconds:.1f}/s)")
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = {"names": names, "queries": list(s.queries), "scores": s.scores}
        path.write_bytes(orjson.dumps({**data, "seconds": s.run_seconds, "searches": s.searches}))


def choose(
    scores: Mapping[str, Mapping[str, float]],
    tuning: Sequence[str],
    grid: Sequence[Candidate],
    old_names: Sequence[str],
    confidence: float,
) -> dict[str, str]:
    """What `eval --apply` stores on the tuning queries, under today's rule and the new one."""
    sub = {n: {q: scores[n][q] for q in tuning} for n in scores}
    today = cross_validate({n: sub[n] for n in old_names}, old_names, ENGINE, k=5, seed=0).chosen
    names = [c.name for c in shrink(grid, len(tuning))]
    shrunk = {n: sub[n] for n in names}
    gate = decide(shrunk, names, ENGINE, confidence=confidence, k=5, seed=0)
    per_query = decide(shrunk, names, ENGINE, confidence=confidence, k=5, seed=0, method="queries")
    return {
        "today": today,
        "new": gate.best if gate.apply else ENGINE,
        "new-q": per_query.best if per_query.apply else ENGINE,
    }


def resample(
    s: Setting,
    grid: Sequence[Candidate],
    old_names: Sequence[str],
    sizes: Sequence[int],
    draws: int,
    seed: int,
    confidence: float,
) -> list[Draw]:
    ids = list(s.queries)
    out = []
    for size in sizes:
        if size >= len(ids):
            print(f"  {s.label}: only {len(ids)} judged queries, no draws of {size}")
            continue
        for d in range(draws):
            tuning = sorted(random.Random(f"{seed}|{s.dataset}|{size}|{d}").sample(ids, size))
            held = [q for q in ids if q not in set(tuning)]
            start = time.perf_counter()
            chosen = choose(s.scores, tuning, grid, old_names, confidence)
            secs = time.perf_counter() - start
            change = {
                r: float(np.mean([s.scores[c][q] - s.scores[ENGINE][q] for q in held]))
                for r, c in chosen.items()
            }
            out.append(Draw(s.label, size, d, chosen, change, secs, tuple(tuning)))
    return out


async def check_through_proxy(
    s: Setting, draw: Draw, grid: Sequence[Candidate], name: str
) -> tuple[float, float]:
    """Apply configuration `name` with `write_config` and send its held-out queries as plain searches
    through a proxy reading applied configurations: (measured mean nDCG@10, mean from the cache)."""
    from bmx_rerank.proxy import ProxyConfig, make_app, start_server
    from bmx_rerank.stats.source import statistics_source

    held = [q for q in s.queries if q not in set(draw.tuning)]
    bmx = next(c.bmx for c in grid if c.name == name)
    app = make_app(ProxyConfig(upstream=s.url, applied_ttl=60.0), statistics_source(60.0))
    runner, proxy = await start_server(app)
    run: dict[str, dict[str, float]] = {}
    try:
        async with aiohttp.ClientSession() as session:
            await write_config(Cluster(session, s.url), s.index, bmx, {"benchmark": "eval_resampling"})
            gate = asyncio.Semaphore(4)

            async def one(qid: str) -> None:
                async with gate:
                    body = orjson.dumps(search_body(s.searched, s.queries[qid], 100, None))
                    async with session.post(
                        f"{proxy}/{s.index}/_search", data=body, headers={"Content-Type": "application/json"}
                    ) as resp:
                        answer = orjson.loads(await resp.read())
                    assert (answer.get("_bmx") or {}).get("reranked") is (bmx is not None), answer.get("_bmx")
                    run[qid] = ranking(answer, qid, True)

            await asyncio.gather(*(one(q) for q in held))
            await delete_config(Cluster(session, s.url), s.index)
    finally:
        await runner.cleanup()
    got = measure.per_query({q: s.qrels[q] for q in held}, run)[measure.PRIMARY]
    cached = s.scores[name]
    return float(np.mean([got[q] for q in held])), float(np.mean([cached[q] for q in held]))


def summary(draws: Sequence[Draw], sizes: Sequence[int]) -> list[str]:
    lines = [
        "| tuning queries | draws | rule | lost > 0.5 | worst | mean held-out change | engine kept |",
        "|---|---|---|---|---|---|---|",
    ]
    for size in sizes:
        group = [d for d in draws if d.size == size]
        if not group:
            continue
        for rule in RULES:
            ch = np.array([d.change[rule] for d in group])
            kept = sum(d.chosen[rule] == ENGINE for d in group)
            lost = int((ch < -LOSS).sum())
            lines.append(
                f"| {size} | {len(group)} | {rule} | {lost} ({100 * lost / len(group):.1f} %) | "
                f"{100 * ch.min():+.2f} | {100 * ch.mean():+.2f} | {kept} ({100 * kept / len(group):.0f} %) |"
            )
    return lines


def per_setting(draws: Sequence[Draw], sizes: Sequence[int]) -> list[str]:
    lines = [
        "| setting | size | today: mean / worst / kept | new: mean / worst / kept "
        "| new-q: mean / worst / kept | new applied |",
        "|---|---|---|---|---|---|",
    ]
    for label in dict.fromkeys(d.setting for d in draws):
        for size in sizes:
            group = [d for d in draws if d.setting == label and d.size == size]
            if not group:
                continue
            cells = []
            for rule in RULES:
                ch = np.array([d.change[rule] for d in group])
                kept = sum(d.chosen[rule] == ENGINE for d in group)
                cells.append(f"{100 * ch.mean():+.2f} / {100 * ch.min():+.2f} / {kept}")
            applied = sorted({d.chosen["new"] for d in group} - {ENGINE})
            lines.append(f"| {label} | {size} | {' | '.join(cells)} | {', '.join(applied) or '-'} |")
    return lines


async def cleanup(settings: Sequence[Setting]) -> None:
    """Delete the indices, their statistics and configuration documents (by id: the integ-test engines
    have no `_delete_by_query`)."""
    async with aiohttp.ClientSession() as session:
        for s in settings:
            async with session.delete(f"{s.url}/{s.index}") as resp:
                await resp.read()
            query = {"query": {"prefix": {"key": s.index + "|"}}, "size": 10000, "_source": False}
            # (every field's statistics: their keys all start with "INDEX|")
            async with session.post(
                f"{s.url}/bmx-stats/_search",
                data=orjson.dumps(query),
                headers={"Content-Type": "application/json"},
            ) as resp:
                hits = (
                    orjson.loads(await resp.read()).get("hits", {}).get("hits", [])
                    if resp.status == 200
                    else []
                )
            ids = [h["_id"] for h in hits]
            if ids:
                lines = b"".join(
                    orjson.dumps({"delete": {"_index": "bmx-stats", "_id": i}}) + b"\n" for i in ids
                )
                async with session.post(
                    f"{s.url}/_bulk?refresh=true",
                    data=lines,
                    headers={"Content-Type": "application/x-ndjson"},
                ) as resp:
                    await resp.read()
            await delete_config(Cluster(session, s.url), s.index)


async def main_async(args: argparse.Namespace) -> int:
    fields = (TITLE, FIELD) if args.fields else (FIELD,)
    grid = default_grid(fields if args.fields else FIELD)
    old_names = [c.name for c in default_grid(fields if args.fields else FIELD, fused=False)]
    engines = dict(e.split("=", 1) for e in args.engine)
    settings: list[Setting] = []
    tmp = tempfile.TemporaryDirectory(prefix="evalgate-")
    async with aiohttp.ClientSession() as session:
        for dataset in args.dataset:
            root = shared_dataset(dataset)
            if root is None:
                raise SystemExit(f"no shared dataset {dataset} (set BMX_BEIR_DIR)")
            root = _slice(root, args.queries, args.other_docs, args.seed, Path(tmp.name) / dataset)
            for engine, url in engines.items():
                for analyzer in args.analyzer:
                    if not await _has_analyzer(session, url.rstrip("/"), analyzer):
                        print(
                            f"{dataset} {engine} {analyzer}: skipped (the engine has no {analyzer} analyzer)"
                        )
                        continue
                    index = f"{args.index_prefix}{dataset}-{engine}-{analyzer}" + (
                        "-fields" if args.fields else ""
                    )
                    settings.append(
                        Setting(dataset, engine, url.rstrip("/"), analyzer, index, root=root, fields=fields)
                    )
    wall = time.perf_counter()
    all_draws: list[Draw] = []
    checks = []
    try:
        for s in settings:
            assert s.root is not None
            await measure_setting(s, s.root, grid, Path(args.cache) if args.cache else None)
            draws = resample(s, grid, old_names, args.sizes, args.draws, args.seed, args.confidence)
            all_draws += draws
            if args.check and draws:
                # The first configuration a rule applied (else plain BMX), on that draw's held-out queries.
                found = [(d, d.chosen[r]) for d in draws for r in ("new", "today") if d.chosen[r] != ENGINE]
                draw, name = found[0] if found else (draws[0], "bmx")
                got, cached = await check_through_proxy(s, draw, grid, name)
                checks.append((s.label, name, got, cached))
    finally:
        if args.cleanup:
            await cleanup(settings)
    tmp.cleanup()
    print()
    print(f"settings: {', '.join(s.label for s in settings)}; confidence {args.confidence}; seed {args.seed}")
    for s in settings:
        per_draw = {size: size * len(grid) + (len(s.queries) - size) for size in args.sizes}
        rate = s.searches / s.run_seconds if s.run_seconds else float("nan")
        est = ", ".join(f"{size}: {n} searches ≈ {n / rate:.0f} s" for size, n in per_draw.items())
        print(
            f"  {s.label}: {len(s.queries)} judged queries x {len(grid)} configurations, {s.searches} searches "
            f"in {s.run_seconds:.0f} s ({rate:.1f}/s); one draw through the proxy would take {est}"
        )
    if all_draws:
        secs = [d.seconds for d in all_draws]
        print(f"  deciding one draw from cached scores (all three rules): mean {1000 * np.mean(secs):.0f} ms")
    for label, name, got, cached in checks:
        print(
            f"  check {label}: {name} applied, held-out queries through the proxy {100 * got:.2f}, "
            f"from the cached per-query scores {100 * cached:.2f}"
        )
    print(f"wall time {time.perf_counter() - wall:.0f} s\n")
    print("\n".join(summary(all_draws, args.sizes)))
    print()
    print("\n".join(per_setting(all_draws, args.sizes)))
    if args.json:
        Path(args.json).write_bytes(
            orjson.dumps(
                {
                    "draws": [{k: v for k, v in d.__dict__.items() if k != "tuning"} for d in all_draws],
                    "checks": checks,
                },
                option=orjson.OPT_INDENT_2,
            )
        )
    bad = [c for c in checks if abs(c[2] - c[3]) > CHECK_TOLERANCE]
    return 1 if bad else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", action="append", required=True, metavar="NAME=URL")
    ap.add_argument("--dataset", action="append", default=[], help="BEIR dataset name (repeatable)")
    ap.add_argument("--analyzer", action="append", default=[], help="default: standard and english")
    ap.add_argument("--sizes", default="15,30,60", help="tuning queries per draw, comma-separated")
    ap.add_argument("--draws", type=int, default=20, help="draws per size and setting")
    ap.add_argument("--confidence", type=float, default=DEFAULT_CONFIDENCE)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--queries", type=int, help="index a slice: this many judged queries ...")
    ap.add_argument("--other-docs", type=int, help="... their judged documents and this many others")
    ap.add_argument(
        "--fields",
        action="store_true",
        help="title and text as fields of their own (multi_match; field weights)",
    )
    ap.add_argument("--index-prefix", default="evalgate-")
    ap.add_argument(
        "--cache", help="folder for the per-query scores (reused when the grid and queries match)"
    )
    ap.add_argument("--no-check", dest="check", action="store_false", help="skip the through-the-proxy check")
    ap.add_argument(
        "--cleanup", action="store_true", help="delete the indices and their statistics afterwards"
    )
    ap.add_argument("--json", help="write every draw here")
    args = ap.parse_args()
    args.dataset = args.dataset or ["scifact"]
    args.analyzer = args.analyzer or ["standard", "english"]
    args.sizes = [int(x) for x in args.sizes.split(",") if x.strip()]
    raise SystemExit(asyncio.run(main_async(args)))


if __name__ == "__main__":
    main()
