"""The configurations `eval` compares: the engine's own ranking and `ext.bmx` variants of the rerank."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

ENGINE = "engine"
# `bmx-rerank eval`'s default grid (its options say the same).
DEFAULT_WINDOWS = (100, 200)
DEFAULT_ALPHAS = (0.5, 1.0, 1.5)
DEFAULT_BETAS = (0.05, 0.2)
DEFAULT_FUSED = (0.3, 0.5, 0.7)  # weights of the engine's own (min-max normalized) score, `combine: linear`
DEFAULT_FIELD_WEIGHTS = (0.5, 2.0)  # with several fields: each but the last weighted so, in turn


@dataclass(frozen=True)
class Candidate:
    """One ranking to measure: `bmx` None is the engine's own (searched directly, no proxy)."""

    name: str
    bmx: Mapping[str, Any] | None = field(default=None, hash=False)

    @property
    def is_engine(self) -> bool:
        return self.bmx is None


def grid(
    field_name: str | Sequence[str],
    *,
    windows: Sequence[int] = (100,),
    alphas: Sequence[float] = (),
    betas: Sequence[float] = (),
    prf: bool = True,
    llm: bool = False,
    fused: Sequence[float] = (),
    field_weights: Sequence[float] = (),
    extra: Mapping[str, Any] | None = None,
) -> list[Candidate]:
    """The engine, exact BM25 and BMX at each window, an alpha x beta grid of BMX at the first window,
    BMX fused with the engine's own score (`combine: linear`, one per weight of the engine's score in
    `fused`), with several fields BMX with each field but the last weighted by each of `field_weights`
    (`fields: ["title^2", "text"]`: the proxy scores each field with its own statistics), and the
    augmentations (PRF; LLM when one is configured). `extra` joins every `ext.bmx`."""
    names = [field_name] if isinstance(field_name, str) else list(field_name)
    base: dict[str, Any] = {"field": names[0], **(extra or {})}
    if len(names) > 1:
        base["fields"] = names
    out = [Candidate(ENGINE)]
    for window in windows:
        suffix = "" if window == windows[0] else f" w{window}"
        out.append(Candidate(f"bm25{suffix}", {**base, "mode": "bm25", "window_size": window}))
        out.append(Candidate(f"bmx{suffix}", {**base, "mode": "bmx", "window_size": window}))
    first = {**base, "mode": "bmx", "window_size": windows[0]}
    for alpha, beta in itertools.product(alphas or [None], betas or [None]):
        if alpha is None and beta is None:
            continue
        values = {k: v for k, v in (("alpha", alpha), ("beta", beta)) if v is not None}
        label = " ".join(f"{k}={v:g}" for k, v in values.items())
        out.append(Candidate(f"bmx {label}", {**first, **values}))
    for weight in fused:
        out.append(Candidate(f"bmx+engine {weight:g}", {**first, "combine": "linear", "weight": weight}))
    for name in names[:-1] if len(names) > 1 else ():
        for weight in field_weights:
            weighted = [f"{n}^{weight:g}" if n == name else n for n in names]
            out.append(Candidate(f"bmx {name}^{weight:g}", {**first, "fields": weighted}))
    if prf:
        out.append(Candidate("bmx+prf", {**first, "augment": {"provider": "prf"}}))
        out.append(Candidate("bm25+prf", {**first, "mode": "bm25", "augment": {"provider": "prf"}}))
    if llm:
        out.append(Candidate("bmx+llm", {**first, "augment": {"provider": "llm"}}))
    return out


# What is compared first when the judged queries allow only a few: the plain levers before their
# variants, and PRF last: it rewrites the query, so its per-query changes have the heaviest tails (on
# SciFact 29 wins and 36 losses in 300 queries, against 24 and 16 for BMX), and a draw of 60 queries can
# hold most of its wins and few of its losses (benchmarks/RESULTS.md, "Advice that holds on new
# queries"): it joins from 70 judged queries on.
PRIORITY = (
    "bmx",
    "bm25",
    "bmx+engine 0.5",
    "bmx+engine 0.3",
    "bmx+engine 0.7",
    "bmx w200",
    "bmx+prf",
    "bm25+prf",
)
QUERIES_PER_CANDIDATE = 10  # judged queries per configuration compared with the engine


def max_compared(n_queries: int) -> int:
    """How many configurations besides the engine `n_queries` judged queries can choose among: one per
    QUERIES_PER_CANDIDATE queries, at least one (15 queries: 1, 30: 3, 60: 6; 150 or more: the default grid of 15)."""
    return max(1, n_queries // QUERIES_PER_CANDIDATE)


def shrink(candidates: Sequence[Candidate], n_queries: int) -> list[Candidate]:
    """The engine and the first `max_compared(n_queries)` others by PRIORITY (then field weights, then
    the grid's order), kept in the grid's order."""
    others = [c for c in candidates if not c.is_engine]
    rank = {name: i for i, name in enumerate(PRIORITY)}

    def order(i: int) -> tuple[int, int]:
        name = others[i].name
        # field weights (`bmx title^2`) right after the named levers, before the alpha/beta grid
        return (rank.get(name, len(rank) + (0 if "^" in name else 1)), i)

    by_priority = sorted(range(len(others)), key=order)
    keep = {others[i].name for i in by_priority[: max_compared(n_queries)]}
    return [c for c in candidates if c.is_engine or c.name in keep]


def default_grid(
    field_name: str | Sequence[str], *, fused: bool = True, llm: bool = False
) -> list[Candidate]:
    """`eval`'s default grid (`fused=False`: as it was before fusion and field weights joined it)."""
    return grid(
        field_name,
        windows=DEFAULT_WINDOWS,
        alphas=DEFAULT_ALPHAS,
        betas=DEFAULT_BETAS,
        fused=DEFAULT_FUSED if fused else (),
        field_weights=DEFAULT_FIELD_WEIGHTS if fused else (),
        llm=llm,
    )
