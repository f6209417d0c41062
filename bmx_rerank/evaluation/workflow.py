"""The whole evaluation: judged queries in, a report (and optionally an applied configuration) out."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from bmx_rerank.applied import write_config
from bmx_rerank.evaluation import measure
from bmx_rerank.evaluation.configs import ENGINE, Candidate, shrink
from bmx_rerank.evaluation.gate import DEFAULT_CONFIDENCE
from bmx_rerank.evaluation.report import Report, Row
from bmx_rerank.evaluation.run import run_all
from bmx_rerank.evaluation.selection import DEFAULT_SIGNIFICANCE, select
from bmx_rerank.stats.store import DEFAULT_STORE, now_iso
from bmx_rerank.upstream import Cluster


@dataclass(frozen=True)
class Task:
    upstream: str
    index: str
    field: str
    queries: Mapping[str, str]
    qrels: Mapping[str, Mapping[str, int]]
    candidates: Sequence[Candidate]
    folds: int = 5
    seed: int = 0
    size: int = 100
    limit: int | None = None
    concurrency: int = 4
    drop_self: bool = True
    headers: Mapping[str, str] | None = None
    significance: float = DEFAULT_SIGNIFICANCE
    confidence: float = DEFAULT_CONFIDENCE
    shrink: bool = True  # fewer configurations when the judged queries are few (`configs.shrink`)
    fields: tuple[str, ...] = ()  # several fields: searched with a multi_match over them (`field` first)
    store: str = DEFAULT_STORE  # where the statistics and applied configurations are kept


def judged(task: Task) -> dict[str, str]:
    """The queries to run: those with judgments and a text (a seeded sample of `limit` of them)."""
    ids = sorted(q for q in task.qrels if q in task.queries)
    if task.limit is not None and task.limit < len(ids):
        ids = sorted(random.Random(task.seed).sample(ids, task.limit))
    return {q: task.queries[q] for q in ids}


async def evaluate(
    task: Task, progress: Callable[[int], None] | None = None, stats_factory: Callable[..., Any] | None = None
) -> Report:
    queries = judged(task)
    if not queries:
        raise ValueError("no query has both a text and judgments: do the queries and qrels files match?")
    candidates = shrink(task.candidates, len(queries)) if task.shrink else list(task.candidates)
    runs = await run_all(
        task.upstream,
        task.index,
        task.fields if len(task.fields) > 1 else task.field,
        queries,
        candidates,
        size=task.size,
        headers=task.headers,
        concurrency=task.concurrency,
        drop_self=task.drop_self,
        progress=progress,
        stats_factory=stats_factory,
        store=task.store,
    )
    qrels = {q: dict(task.qrels[q]) for q in queries}
    scores = {c.name: measure.per_query(qrels, runs.runs[c.name]) for c in candidates}
    ids = list(queries)
    engine = scores[ENGINE][measure.PRIMARY]
    rows = [
        Row(
            c.name,
            c.bmx,
            {m: measure.mean(scores[c.name][m], ids) for m in measure.MEASURES},
            measure.compare(scores[c.name][measure.PRIMARY], engine, ids),
            runs.fallbacks[c.name],
        )
        for c in candidates
    ]
    names = [c.name for c in candidates]
    primary = {n: scores[n][measure.PRIMARY] for n in names}
    selection = select(primary, names, ENGINE, task.folds, task.seed, task.significance, task.confidence)
    report = Report(
        task.index,
        ",".join(task.fields) if len(task.fields) > 1 else task.field,
        len(ids),
        task.folds,
        rows,
        selection,
        per_query=primary,
        texts=dict(queries),
        grid_size=len(task.candidates),
    )
    if any(r.fallbacks for r in rows):
        report.notes.append(
            "some reranks fell back to the engine's order (see the proxy log): fix that first"
        )
    if estimated := sum(runs.estimated.values()):
        report.notes.append(
            f"{estimated} reranks scored with estimated statistics: [{task.store}] holds no snapshot of "
            "the index or of a field (`bmx-rerank stats build`; --stats-index names another store)"
        )
    return report


async def apply(
    report: Report, upstream: str, headers: Mapping[str, str] | None = None, store: str = DEFAULT_STORE
) -> dict[str, Any]:
    """Store the chosen configuration (with its evidence) as the index's configuration in the cluster."""
    chosen = report.row(report.selection.chosen)
    evidence = {
        "evaluated_at": now_iso(),
        "measure": measure.PRIMARY,
        "queries": report.queries,
        "chosen": chosen.name,
        "chosen_score": chosen.means[measure.PRIMARY],
        "best": report.selection.best,
        "cross_validated": report.selection.cv_score,
        "engine": report.selection.engine_score,
        "folds": report.folds,
        "fold_choices": list(report.selection.fold_choices),
        "significance": report.selection.significance,
        "configurations": {r.name: r.means for r in report.rows},
        "compared": len(report.rows),
        "grid": report.grid_size,
        **(
            {"gate": gate.to_json(report.texts), "decision": gate.reason}
            if (gate := report.selection.gate)
            else {}
        ),
    }
    async with aiohttp.ClientSession() as session:
        return await write_config(
            Cluster(session, upstream), report.index, chosen.bmx, evidence, headers, store
        )
