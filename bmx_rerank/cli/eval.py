"""`bmx-rerank eval`: measure the engine's ranking and BMX configurations on your own judged queries,
choose one by cross-validation, and (`--apply`) make it the index's configuration in the cluster."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import click
import orjson

from bmx_rerank.cli.options import parse_headers
from bmx_rerank.defaults import EVAL_CONFIDENCE as DEFAULT_CONFIDENCE
from bmx_rerank.evaluation.configs import (
    DEFAULT_ALPHAS,
    DEFAULT_BETAS,
    DEFAULT_FIELD_WEIGHTS,
    DEFAULT_FUSED,
    DEFAULT_WINDOWS,
    QUERIES_PER_CANDIDATE,
)
from bmx_rerank.evaluation.data import DataError, read_qrels, read_queries
from bmx_rerank.stats.store import DEFAULT_STORE


@click.command("eval")
@click.argument("index")
@click.option(
    "--field",
    "field_names",
    required=True,
    multiple=True,
    help="The text field searched and reranked; repeated, the fields of a multi_match (each with its "
    "own statistics), and field weights join the grid.",
)
@click.option(
    "--queries",
    "queries_path",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="Queries: BEIR queries.jsonl (_id, text) or id<TAB>text.",
)
@click.option(
    "--qrels",
    "qrels_path",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="Judgments: BEIR qrels tsv (query-id corpus-id score) or TREC qrels (qid 0 docid grade).",
)
@click.option("--upstream", default="http://127.0.0.1:9200", show_default=True, help="Cluster URL.")
@click.option(
    "--header",
    "header_values",
    multiple=True,
    metavar="'NAME: VALUE'",
    help="A header for every call, e.g. 'Authorization: ApiKey ...' (repeatable).",
)
@click.option(
    "--window",
    "windows",
    multiple=True,
    type=int,
    default=DEFAULT_WINDOWS,
    show_default=True,
    help="Rerank window sizes to try (repeatable; the first is used for the grid).",
)
@click.option(
    "--alpha",
    "alphas",
    multiple=True,
    type=float,
    default=DEFAULT_ALPHAS,
    show_default=True,
    help="BMX alpha values of the grid (repeatable).",
)
@click.option(
    "--beta",
    "betas",
    multiple=True,
    type=float,
    default=DEFAULT_BETAS,
    show_default=True,
    help="BMX beta values of the grid (repeatable).",
)
@click.option(
    "--fuse",
    "fused",
    multiple=True,
    type=click.FloatRange(0.0, 1.0),
    default=DEFAULT_FUSED,
    show_default=True,
    help="Also try BMX fused with the engine's own score (combine: linear), this weight on the engine's "
    "(repeatable; --fuse 0 alone: none).",
)
@click.option(
    "--field-weight",
    "field_weights",
    multiple=True,
    type=click.FloatRange(0.0, 100.0, min_open=True),
    default=DEFAULT_FIELD_WEIGHTS,
    show_default=True,
    help="With several --field: also try BMX with each field but the last weighted so (repeatable).",
)
@click.option("--prf/--no-prf", default=True, show_default=True, help="Try pseudo-relevance feedback.")
@click.option(
    "--llm-url", envvar="BMX_LLM_BASE_URL", help="OpenAI-compatible base URL: also try LLM augmentation."
)
@click.option("--llm-model", envvar="BMX_LLM_MODEL", default="gpt-4o-mini", show_default=True)
@click.option(
    "--folds",
    default=5,
    show_default=True,
    type=click.IntRange(min=2),
    help="Cross-validation folds over queries.",
)
@click.option(
    "--significance",
    default=1.0,
    show_default=True,
    help="Below 1: choose only among configurations beating the engine with a one-sided paired t-test at "
    "this family-wise level (Bonferroni) on the queries they are chosen on; 1: the best mean.",
)
@click.option(
    "--confidence",
    default=DEFAULT_CONFIDENCE,
    show_default=True,
    type=click.FloatRange(0.5, 0.999),
    help="Apply a configuration other than the engine's only when the interval of its gain on new "
    "queries at this confidence lies above zero.",
)
@click.option(
    "--full-grid",
    is_flag=True,
    help=f"Compare every configuration whatever the number of judged queries (default: one per "
    f"{QUERIES_PER_CANDIDATE} queries, the plainest first).",
)
@click.option("--seed", default=0, show_default=True, help="Seed of the fold split and of --limit's sample.")
@click.option("--limit", type=int, help="Evaluate a seeded sample of this many judged queries.")
@click.option(
    "--size", default=100, show_default=True, help="Hits measured per query (recall@100 wants 100)."
)
@click.option(
    "--concurrency",
    default=4,
    show_default=True,
    type=click.IntRange(min=1),
    help="Queries in flight at once.",
)
@click.option(
    "--stats-index",
    envvar="BMX_STATS_INDEX",
    default=DEFAULT_STORE,
    show_default=True,
    help="Index the statistics and applied configurations are stored in (as `serve --stats-index`).",
)
@click.option(
    "--keep-self/--drop-self",
    default=False,
    show_default=True,
    help="BEIR drops a hit whose id is the query's own id.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON instead of a table.")
@click.option("--save", "save_path", type=click.Path(dir_okay=False), help="Also write the JSON report here.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), help="Write a PNG bar chart here.")
@click.option(
    "--apply",
    "do_apply",
    is_flag=True,
    help="Store the chosen configuration as the index's configuration (proxies pick it up).",
)
def command(
    index: str,
    field_names: tuple[str, ...],
    queries_path: str,
    qrels_path: str,
    upstream: str,
    header_values: tuple[str, ...],
    windows: tuple[int, ...],
    alphas: tuple[float, ...],
    betas: tuple[float, ...],
    fused: tuple[float, ...],
    field_weights: tuple[float, ...],
    prf: bool,
    llm_url: str | None,
    llm_model: str,
    folds: int,
    significance: float,
    confidence: float,
    full_grid: bool,
    seed: int,
    limit: int | None,
    size: int,
    concurrency: int,
    stats_index: str,
    keep_self: bool,
    as_json: bool,
    save_path: str | None,
    plot_path: str | None,
    do_apply: bool,
) -> None:
    """Evaluate rankings of INDEX on judged queries: the engine's BM25 vs BMX, exact BM25, a grid, PRF, LLM."""
    try:
        from bmx_rerank.evaluation.configs import grid
        from bmx_rerank.evaluation.report import plot, table
        from bmx_rerank.evaluation.workflow import Task, apply, evaluate
    except ImportError as exc:  # the evaluation extras are not installed
        raise click.ClickException(f"{exc}: install them with pip install 'bmx-rerank[eval]'") from exc
    from tqdm import tqdm

    if do_apply and any(c in index for c in ",*?"):  # a proxy looks up the name it is sent
        raise click.BadParameter(
            "--apply stores the configuration of one index or alias name: a proxy looks up the name a "
            "search names, never a pattern or a list",
            param_hint="INDEX",
        )
    for path, option in ((save_path, "--save"), (plot_path, "--plot")):
        folder = Path(path).resolve().parent if path else None
        if folder is not None and not (folder.is_dir() and os.access(folder, os.W_OK)):
            raise click.BadParameter(f"cannot write into {folder}", param_hint=option)  # before, not after
    if llm_url:
        os.environ["BMX_LLM_BASE_URL"] = llm_url  # the in-process proxy's reranker reads its LLM from there
        os.environ["BMX_LLM_MODEL"] = llm_model
    try:
        queries = read_queries(queries_path)
        qrels = read_qrels(qrels_path)
    except DataError as exc:
        raise click.BadParameter(str(exc)) from exc
    fused = tuple(w for w in fused if w > 0)
    fields = tuple(dict.fromkeys(field_names))
    candidates = grid(
        fields if len(fields) > 1 else fields[0],
        windows=windows,
        alphas=alphas,
        betas=betas,
        fused=fused,
        field_weights=field_weights,
        prf=prf,
        llm=bool(llm_url),
    )
    task = Task(
        upstream,
        index,
        fields[0],
        queries,
        qrels,
        candidates,
        folds=folds,
        seed=seed,
        significance=significance,
        confidence=confidence,
        shrink=not full_grid,
        fields=fields,
        size=size,
        limit=limit,
        concurrency=concurrency,
        drop_self=not keep_self,
        headers=parse_headers(header_values),
        store=stats_index,
    )
    from bmx_rerank.evaluation.configs import shrink

    total = len([q for q in qrels if q in queries]) if limit is None else min(limit, len(qrels))
    runs = len(candidates) if full_grid else len(shrink(candidates, total))
    bar = tqdm(total=total * runs, unit="search", file=sys.stderr, disable=as_json or None)
    try:
        report = asyncio.run(evaluate(task, progress=bar.update))
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    except Exception as exc:  # noqa: BLE001 - the cluster's own errors, said plainly
        raise click.ClickException(cluster_reason(exc)) from exc
    finally:
        bar.close()
    if plot_path:
        plot(report, plot_path)
    if save_path:
        with open(save_path, "wb") as fh:
            fh.write(orjson.dumps(report.to_json(), option=orjson.OPT_INDENT_2))
    if as_json:
        click.echo(orjson.dumps(report.to_json(), option=orjson.OPT_INDENT_2).decode())
    else:
        click.echo(table(report))
        if plot_path:
            click.echo(f"plot: {plot_path}")
    if do_apply:
        doc = asyncio.run(apply(report, upstream, parse_headers(header_values), stats_index))
        what = (
            "pass through (the engine's ranking stays)" if not doc["info"]["rerank"] else doc["info"]["bmx"]
        )
        click.echo(
            f"applied to {index}: {report.selection.chosen}: {what} (shown by `bmx-rerank applied {index}`)",
            err=as_json,
        )


def cluster_reason(exc: Exception) -> str:
    """An error said plainly: the cluster's root cause where it gave one (`all shards failed` names
    none: its first failure's reason does, e.g. a query past `maxClauseCount`)."""
    reason = getattr(exc, "reason", None) or f"{exc.__class__.__name__}: {exc}"
    try:
        error = orjson.loads(getattr(exc, "payload", b"") or b"{}").get("error") or {}
    except (orjson.JSONDecodeError, AttributeError):
        return reason
    causes = [c.get("reason") for c in error.get("root_cause") or [] if isinstance(c, dict)]
    failed = [
        f.get("reason", {}).get("reason") for f in error.get("failed_shards") or [] if isinstance(f, dict)
    ]
    detail = next((r for r in [*causes, *failed] if isinstance(r, str) and r and r != reason), None)
    return f"{reason}: {detail}" if detail else reason
