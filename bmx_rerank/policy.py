"""Server-side rerank policies: the drop-in case, where clients change nothing at all.

A policy maps an index pattern to fields and BMX parameters. It applies to a search without `ext.bmx`
whose scoring clauses are text queries on its fields (`match`, `multi_match`, `bool` must/should, ...),
whatever filters surround them; a search that names none of its fields is left alone, and one it
cannot rerank is forwarded as sent, marked with the reason. One rule per line, in a file or a repeated
`--policy` option:

    PATTERN=FIELDS[,key=value,...]     e.g.   articles-*=body,window_size=200,normalize=paper
                                              papers=title^2|abstract,window_size=100

FIELDS is one field, or several separated by `|`, each with an optional `^weight` (as `ext.bmx.fields`).
Keys are those of `ext.bmx` except `query`, `field` and `fields`; `augment` names a provider
(`augment=prf`, `augment=llm`). Blank lines and `#` comments are ignored.
The first rule whose pattern matches wins; a comma-separated index expression matches a rule only when
every part does (each part is an index name, alias or pattern, compared with shell-style wildcards)."""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bmx_rerank.errors import SearchError
from bmx_rerank.rerank.spec import RerankSpec, parse_spec

NOT_IN_POLICY = ("query", "field", "fields")


@dataclass(frozen=True)
class Rule:
    pattern: str
    spec: RerankSpec


class PolicyError(ValueError):
    """A policy line that cannot be used; names the line."""


def parse_rule(line: str, *, widen_default: bool = True) -> Rule:
    """One `PATTERN=FIELDS[,key=value...]` rule."""
    pattern, sep, rest = line.strip().partition("=")
    parts = [p.strip() for p in rest.split(",")]
    if not sep or not pattern.strip() or not parts[0]:
        raise PolicyError(f"policy {line!r}: expected PATTERN=FIELDS[,key=value,...]")
    fields = [f.strip() for f in parts[0].split("|")]
    raw: dict[str, Any] = {"fields": fields} if len(fields) > 1 or "^" in parts[0] else {"field": parts[0]}
    for part in parts[1:]:
        key, eq, value = part.partition("=")
        key = key.strip()
        if not eq or not key:
            raise PolicyError(f"policy {line!r}: expected key=value, got {part!r}")
        if key in NOT_IN_POLICY:
            where = "the FIELDS part" if key.startswith("field") else "the request"
            raise PolicyError(f"policy {line!r}: [{key}] comes from {where}, not from a key")
        raw[key] = _value(value.strip())
    if raw.get("augment") == "given":
        raise PolicyError(f"policy {line!r}: [augment] in a policy names a provider (prf, llm)")
    try:
        return Rule(pattern.strip(), parse_spec(raw, widen_default=widen_default, where="policy"))
    except SearchError as exc:
        raise PolicyError(f"policy {line!r}: {exc.reason}") from exc


def parse_rules(lines: Iterable[str], *, widen_default: bool = True) -> list[Rule]:
    """Rules from lines of text; blank lines and comments skipped."""
    rules = []
    for line in lines:
        text = line.split("#", 1)[0].strip()
        if text:
            rules.append(parse_rule(text, widen_default=widen_default))
    return rules


def load_rules(path: str | Path, *, widen_default: bool = True) -> list[Rule]:
    return parse_rules(Path(path).read_text().splitlines(), widen_default=widen_default)


def match(rules: Sequence[Rule], index_expr: str) -> RerankSpec | None:
    """The spec of the first rule matching every index of the expression, or None."""
    names = [n.strip() for n in index_expr.split(",") if n.strip()]
    if not names:
        return None
    for rule in rules:
        if all(fnmatch.fnmatchcase(name, rule.pattern) for name in names):
            return rule.spec
    return None


def _value(text: str) -> Any:
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("none", "null"):
        return None if lowered == "null" else "none"
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text
