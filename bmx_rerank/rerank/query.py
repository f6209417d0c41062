"""Query understanding: which text a search scores, on which fields, and how the parts combine.

The planning side turns a search body into a `Scoring` tree (pure, no I/O); the execution side scores
every `Text` leaf with BMX (or exact BM25) on its own field, with that field's corpus statistics, and
folds the leaves as the query's own structure combines them:

- `Combine("sum")`: the parts add up, as `bool` `must`/`should` clauses and `multi_match` `most_fields` do;
- `Combine("max")`: the best part plus `tie_breaker` times the others, as `dis_max` and `multi_match`
  `best_fields` do.

Boosts multiply the part they sit on. What does not score (filter, must_not, post_filter) stays with the
first stage and is not in the tree."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

How = Literal["sum", "max"]


@dataclass(frozen=True)
class Text:
    """One text scored on one field: a `match`, or one field of a `multi_match`."""

    field: str
    text: str
    boost: float = 1.0


@dataclass(frozen=True)
class Combine:
    """Parts folded into one score: their sum, or the best plus `tie_breaker` times the rest."""

    how: How
    parts: tuple[Node, ...]
    tie_breaker: float = 0.0
    boost: float = 1.0


Node = Text | Combine


def leaves(node: Node) -> Iterator[Text]:
    """Every `Text` of a tree, depth first, in the query's order."""
    if isinstance(node, Text):
        yield node
        return
    for part in node.parts:
        yield from leaves(part)


def fields(node: Node) -> list[str]:
    """The distinct fields a tree scores, in first-seen order (one statistics lookup each)."""
    return list(dict.fromkeys(leaf.field for leaf in leaves(node)))
