"""The configurations `eval` compares: the engine's own ranking and `ext.bmx` variants of the rerank."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

ENGINE = "engine"


@dataclass(frozen=True)
class Candidate:
    """One ranking to measure: `bmx` None is the engine's own (searched directly, no proxy)."""

    name: str
    bmx: Mapping[str, Any] | None = field(default=None, hash=False)

    @property
    def is_engine(self) -> bool:
        return self.bmx is None


def grid(
    field_name: str,
    *,
    windows: Sequence[int] = (100,),
    alphas: Sequence[float] = (),
    betas: Sequence[float] = (),
    prf: bool = True,
    llm: bool = False,
    extra: Mapping[str, Any] | None = None,
) -> list[Candidate]:
    """The engine, exact BM25 and BMX at each window, an alpha x beta grid of BMX at the first window,
    and the augmentations (PRF; LLM when one is configured). `extra` joins every `ext.bmx`."""
    base = {"field": field_name, **(extra or {})}
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
    if prf:
        out.append(Candidate("bmx+prf", {**first, "augment": {"provider": "prf"}}))
        out.append(Candidate("bm25+prf", {**first, "mode": "bm25", "augment": {"provider": "prf"}}))
    if llm:
        out.append(Candidate("bmx+llm", {**first, "augment": {"provider": "llm"}}))
    return out
