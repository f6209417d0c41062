"""`bmx-rerank demo`: BM25 from the engine next to BMX through the proxy, on the bundled sample corpus."""

from __future__ import annotations

import asyncio
import sys

import aiohttp
import click

from bmx_rerank import demo
from bmx_rerank.errors import SearchError
from bmx_rerank.upstream import Cluster


async def evaluation_step(
    session: aiohttp.ClientSession, upstream: str, shown: str, headers: dict[str, str], n_queries: int
) -> None:
    """Engine BM25 vs the configuration `bmx-rerank eval` chooses, nDCG@10, on shared SciFact queries:
    the expected gain on new queries with its interval, and the decision in words."""
    from bmx_rerank.evaluation.beir import FIELD, load_beir, shared_dataset

    root = shared_dataset("scifact")
    if root is None:
        click.echo("evaluation: skipped (no shared BEIR SciFact here; set BMX_BEIR_DIR to its folder)")
        return
    from bmx_rerank.evaluation.configs import grid
    from bmx_rerank.evaluation.data import read_qrels, read_queries
    from bmx_rerank.evaluation.gate import interval_text
    from bmx_rerank.evaluation.workflow import Task, evaluate

    index = "bmx-demo-scifact"
    n = await load_beir(Cluster(session, upstream), index, root)
    click.echo(f"evaluation: SciFact ({n} documents in {index}), {n_queries} judged test queries")
    task = Task(
        shown,
        index,
        FIELD,
        read_queries(root / "queries.jsonl"),
        read_qrels(root / "qrels" / "test.tsv"),
        grid(FIELD, windows=(100,), alphas=(), betas=(), fused=(0.5,)),
        limit=n_queries,
        headers=headers,
    )
    report = await evaluate(task)
    sel = report.selection
    engine = report.row("engine").means["nDCG@10"]
    width = max(len(r.name) for r in report.rows)
    click.echo(
        "\n".join(
            f"  {r.name:<{width}} nDCG@10 {100 * r.means['nDCG@10']:6.2f}  ({100 * (r.means['nDCG@10'] - engine):+.2f})"
            for r in report.rows
        )
    )
    gate = sel.gate
    assert gate is not None
    click.echo(
        f"  expected gain on new queries of applying the best ({gate.best}): {100 * gate.expected:+.2f}, "
        f"{interval_text(gate)}; chance that applying loses {100 * gate.p_loss:.0f} % "
        f"({gate.compared} configurations compared, nested cross-validation and a bootstrap of the choice)\n"
        f"  decision: {gate.reason}\n"
        f"  (your own data: bmx-rerank eval INDEX --field F --queries Q --qrels QRELS [--apply])\n"
    )


async def run(
    upstream: str, queries: tuple[str, ...], size: int, window: int, serve: bool, eval_queries: int = 0
) -> None:
    from bmx_rerank.proxy import ProxyConfig, make_app, split_upstream, start_server
    from bmx_rerank.stats.build import build_snapshots
    from bmx_rerank.stats.source import statistics_source

    # http://user:pass@host: the demo's own calls use the URL; its searches through the proxy carry the
    # same credentials as a header, as any client would (the proxy itself holds none).
    shown, auth = split_upstream(upstream)
    client_headers = {"Authorization": auth} if auth else {}
    async with aiohttp.ClientSession() as session:
        n = await demo.load_corpus(session, upstream)
        click.echo(f"corpus: {n} Python standard-library docstrings in index {demo.INDEX} at {shown}")
        infos = await build_snapshots(Cluster(session, upstream), demo.INDEX, demo.FIELD, {})
        vocab = sum(i.vocabulary_size for i in infos)
        click.echo(f"statistics: exact, built by a full sweep ({vocab} terms), stored in the cluster")
        runner, proxy_url = await start_server(make_app(ProxyConfig(upstream=shown), statistics_source(5.0)))
        try:
            click.echo(f"proxy: {proxy_url} -> {shown}\n")
            for query in queries or demo.QUERIES:
                bm25 = await demo.top_hits(session, upstream, demo.search_body(query, size))
                bmx = await demo.top_hits(
                    session, proxy_url, demo.search_body(query, size, {"window_size": window}), client_headers
                )
                columns = [("Elasticsearch BM25 (direct)", bm25), ("BMX (through bmx-rerank)", bmx)]
                click.echo(demo.side_by_side(query, columns) + "\n")
            if eval_queries > 0:
                await evaluation_step(session, upstream, shown, client_headers, eval_queries)
            if serve:
                click.echo(f"serving on {proxy_url}; Ctrl-C stops")
                await asyncio.Event().wait()
        finally:
            await runner.cleanup()


@click.command("demo")
@click.option(
    "--upstream", help="Use this cluster instead of starting a local one (e.g. http://127.0.0.1:9200)."
)
@click.option(
    "--engine",
    "kind",
    type=click.Choice(["elasticsearch", "opensearch"]),
    default="elasticsearch",
    show_default=True,
    help="Which engine to start when no --upstream is given.",
)
@click.option(
    "--query", "queries", multiple=True, help="A query to show (repeatable; default: a built-in set)."
)
@click.option("--size", default=5, show_default=True, help="Hits shown per ranking.")
@click.option("--window", default=100, show_default=True, help="Candidates the proxy reranks.")
@click.option("--serve", is_flag=True, help="Keep the proxy running afterwards.")
@click.option(
    "--eval-queries",
    default=100,
    show_default=True,
    help="SciFact test queries of the evaluation step (0 skips it; needs the shared BEIR data).",
)
def command(
    upstream: str | None,
    kind: str,
    queries: tuple[str, ...],
    size: int,
    window: int,
    serve: bool,
    eval_queries: int,
) -> None:
    """Load the sample corpus, build statistics, and show BM25 next to BMX for a few queries."""
    from bmx_rerank.testing import engine as eng

    try:
        if upstream is None:
            request = eng.StartRequest(
                kind=kind,  # type: ignore[arg-type]
                version=eng.DEFAULT_VERSIONS[kind],
                port=eng.DEFAULT_PORTS[kind],
                java_home=None,
                timeout=eng.START_TIMEOUT_S,
            )
            upstream = eng.start(request, eng.default_reporter).url
            click.echo(f"engine: {kind} at {upstream} (stop it with `bmx-rerank engine stop {kind}`)")
        asyncio.run(run(upstream.rstrip("/"), queries, size, window, serve, eval_queries))
    except (eng.EngineError, SearchError) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        pass
