"""Honest selection: choose the configuration on some queries, report it on others (k-fold CV).

Queries are shuffled once (seeded) and cut into k folds. For each fold the configuration with the best
mean nDCG@10 on the other folds is chosen and measured on that fold alone; the held-out numbers of all
folds together are what to expect on new queries. Ties go to the earlier configuration in the list,
the engine first: a rerank must beat the engine's own ranking to be chosen at all. What `--apply`
stores is the configuration that is best on all queries (the same rule, the most data)."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Selection:
    chosen: str  # best on all queries: what --apply stores
    cv_score: float  # mean held-out nDCG@10 of the per-fold choices
    engine_score: float  # the engine's mean over the same queries
    fold_choices: tuple[str, ...]
    per_query: dict[str, float]  # held-out nDCG@10 of the fold's choice, per query


def folds(queries: Sequence[str], k: int, seed: int = 0) -> list[list[str]]:
    order = sorted(queries)
    random.Random(seed).shuffle(order)
    k = max(2, min(k, len(order)))
    return [order[i::k] for i in range(k)]


def best(scores: Mapping[str, Mapping[str, float]], names: Sequence[str], queries: Sequence[str]) -> str:
    """The name with the highest mean over `queries`; the first such in `names` on a tie."""
    means = [float(np.mean([scores[n][q] for q in queries])) for n in names]
    top = max(means)
    return names[next(i for i, m in enumerate(means) if m >= top - 1e-12)]


def cross_validate(
    scores: Mapping[str, Mapping[str, float]], names: Sequence[str], engine: str, k: int = 5, seed: int = 0
) -> Selection:
    """`scores[name][qid]`: the primary measure per configuration and query; `names[0]` wins ties."""
    queries = sorted(scores[engine])
    parts = folds(queries, k, seed)
    held: dict[str, float] = {}
    choices = []
    for i, test in enumerate(parts):
        train = [q for j, part in enumerate(parts) if j != i for q in part]
        choice = best(scores, names, train)
        choices.append(choice)
        for q in test:
            held[q] = scores[choice][q]
    return Selection(
        chosen=best(scores, names, queries),
        cv_score=float(np.mean([held[q] for q in queries])),
        engine_score=float(np.mean([scores[engine][q] for q in queries])),
        fold_choices=tuple(choices),
        per_query=held,
    )
