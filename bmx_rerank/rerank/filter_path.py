"""Elasticsearch's `filter_path` response filtering, applied by the sidecar after a rerank.

A rerank needs `_index`, `_id`, `_score` and `_seq_no` of every window hit, which a client's
`filter_path` (say `hits.hits._id`) would remove from the first stage's answer. So the proxy drops
`filter_path` from the first stage and applies it to the answer it builds, as the cluster would have:
comma-separated dotted paths, `*` inside a name, `**` for any depth, arrays transparent, a leading `-`
for an exclusion (inclusions apply first, then exclusions); nothing included gives `{}`."""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

Path = tuple[str, ...]
_MISSING = object()


def parse(expr: str) -> tuple[list[Path], list[Path]]:
    """(inclusions, exclusions) of a `filter_path` value."""
    includes: list[Path] = []
    excludes: list[Path] = []
    for part in expr.split(","):
        part = part.strip()
        target = excludes if part.startswith("-") else includes
        part = part.lstrip("-")
        if part:
            target.append(tuple(part.split(".")))
    return includes, excludes


def apply(value: Any, expr: str | None) -> Any:
    """`value` as the cluster would answer it with `?filter_path=expr` (None or empty: unchanged)."""
    if not expr:
        return value
    includes, excludes = parse(expr)
    if includes:
        value = _include(value, includes)
        if value is _MISSING:
            return {}
    if excludes:
        value = _exclude(value, excludes)
    return value


@lru_cache(maxsize=256)
def _glob(pattern: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(p) for p in pattern.split("*")) + r"\Z", re.S)


def _step(paths: Sequence[Path], key: str) -> list[Path]:
    """What is left of each path once `key` is consumed; an empty path means `key` matched whole."""
    out: list[Path] = []
    for path in paths:
        if not path:
            continue
        if path[0] == "**":
            out.append(path)  # `**` takes this name and stays for deeper ones
            out.extend(_step([path[1:]], key) if len(path) > 1 else [()])
        elif _glob(path[0]).match(key):
            out.append(path[1:])
    return out


def _include(value: Any, paths: list[Path]) -> Any:
    if any(not p for p in paths):
        return value
    if isinstance(value, dict):
        out = {}
        for key, child in value.items():
            rest = _step(paths, key)
            kept = _include(child, rest) if rest else _MISSING
            if kept is not _MISSING:
                out[key] = kept
        return out if out else _MISSING
    if isinstance(value, list):
        items = [kept for item in value if (kept := _include(item, paths)) is not _MISSING]
        return items if items else _MISSING
    return _MISSING


def _exclude(value: Any, paths: list[Path]) -> Any:
    if isinstance(value, dict):
        out = {}
        for key, child in value.items():
            rest = _step(paths, key)
            if any(not p for p in rest):
                continue
            out[key] = _exclude(child, rest) if rest else child
        return out
    if isinstance(value, list):
        return [_exclude(item, paths) for item in value]
    return value
