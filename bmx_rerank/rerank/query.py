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

import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

How = Literal["sum", "max"]


@dataclass(frozen=True)
class Text:
    """One text scored on one field: a `match`, or one field of a `multi_match`."""

    field: str
    text: str
    boost: float = 1.0
    quoted: bool = False  # a phrase's text: the cluster analyses it with the field's search_quote_analyzer


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


class Declined(Exception):
    """A search BMX cannot score exactly: it goes to the cluster as sent, and the answer says
    `X-BMX-Rerank: skipped; reason=<reason>`. `reason` is a short, stable token (see docs/proxy.md)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


# The query types read into the tree; the others in a scoring position decline (see `KNOWN`).
READ = frozenset(
    "match match_phrase multi_match combined_fields query_string simple_query_string bool dis_max".split()
)
# Each type's fields fold as the cluster folds them: the best field plus `tie_breaker` times the
# others, the tie_breaker defaulting by type: 0 for a best-of, 1 (the sum) for most_fields. A query's
# own tie_breaker stands for the default, most_fields' too (with 0.3 it is a best-of, as in the cluster).
# None: BMX has no blended or BM25F statistics, so these are scored as a sum by rule, each field on its
# own statistics, weighted by its boost (docs/proxy.md states the rule).
MULTI_MATCH_TIES: dict[str, float | None] = {
    "best_fields": 0.0,
    "phrase": 0.0,  # each field's phrase scored on its terms
    "most_fields": 1.0,
    "cross_fields": None,
    "combined_fields": None,
}
# Query types declined by name in a scoring position (docs/proxy.md lists them); any other is
# `unknown_query`. Inside `filter`/`must_not` every query is fine: it only decides matching.
KNOWN = frozenset(
    """term terms terms_set range exists ids prefix wildcard regexp fuzzy constant_score function_score
    script_score script nested has_child has_parent parent_id boosting knn hybrid neural neural_sparse
    semantic sparse_vector text_expansion weighted_tokens more_like_this intervals span_term span_near
    span_or span_not span_first span_multi span_containing span_within field_masking_span geo_distance
    geo_bounding_box geo_polygon geo_shape shape distance_feature rank_feature pinned rule percolate
    wrapper match_phrase_prefix match_bool_prefix""".split()
)
PREFIX_TYPES = {"phrase_prefix": "match_phrase_prefix", "bool_prefix": "match_bool_prefix"}
# query_string / simple_query_string are scored only when their text is plain words (the cluster's
# parser then builds exactly a multi_match of their `type`); any operator or syntax declines.
_QS_SYNTAX = re.compile(r'[=&|><!(){}\[\]^"~*?:\\/]|(?:^|\s)[+-]|\b(?:AND|OR|NOT)\b')
_SQS_SYNTAX = re.compile(r'[+|"*()~\\]|(?:^|\s)-')


def understand(query: Any, *, lenient: bool = False) -> Node | None:
    """The scoring tree of a search's `query`: what its text clauses score and how they combine.

    None when nothing in it scores text (only filters, `match_all`). Non-scoring parts (bool `filter`
    and `must_not`) are not in the tree: they stay with the first stage, untouched. A clause that scores
    in a way BMX cannot reproduce raises `Declined`, unless `lenient` (the caller combines BMX with the
    first stage's own score, which carries that clause): it is then left out of the tree."""
    return _Reader(lenient).node(query, in_max=False, required=True, whole=True, top=True)


def on_fields(text: str, fields: Sequence[tuple[str, float]], how: How = "max") -> Node:
    """`text` scored on several weighted fields (one field: a plain `Text`)."""
    if len(fields) == 1:
        name, boost = fields[0]
        return Text(name, text, boost)
    return Combine(how, tuple(Text(name, text, boost) for name, boost in fields))


def weigh(node: Node, boosts: Mapping[str, float]) -> Node:
    """Every leaf multiplied by its field's weight in `boosts` (a field absent weighs 1)."""
    if isinstance(node, Text):
        return boosted(node, boosts.get(node.field, 1.0))
    return replace(node, parts=tuple(weigh(p, boosts) for p in node.parts))


def restrict(node: Node, allowed: Sequence[str], *, lenient: bool = False) -> Node | None:
    """The tree if it scores only `allowed` fields. Otherwise `Declined("field")`, or with `lenient` the
    tree without the other fields' leaves (None if nothing is left)."""
    if isinstance(node, Text):
        if node.field in allowed:
            return node
        if lenient:
            return None
        raise Declined("field", f"[{node.field}] is not a field the rerank scores ({', '.join(allowed)})")
    parts = [p for p in (restrict(p, allowed, lenient=lenient) for p in node.parts) if p is not None]
    return _fold(node.how, parts, node.tie_breaker, node.boost)


def boosted(node: Node, boost: float) -> Node:
    """`node` with its boost multiplied by `boost`."""
    return node if boost == 1.0 else replace(node, boost=node.boost * boost)


def parse_field(spec: str) -> tuple[str, float]:
    """`"title^2"` -> `("title", 2.0)`, `"title"` -> `("title", 1.0)`; ValueError if malformed."""
    name, caret, boost = spec.partition("^")
    if not name or (caret and not boost):
        raise ValueError(f"expected NAME or NAME^BOOST, got [{spec}]")
    try:
        value = float(boost) if caret else 1.0
    except ValueError:
        raise ValueError(f"expected NAME or NAME^BOOST, got [{spec}]") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"boost of [{name}] must be a finite number >= 0, got [{boost}]")
    return name, value


def _fold(how: How, parts: Sequence[Node], tie_breaker: float, boost: float) -> Node | None:
    """A Combine of `parts`, or the one part itself (boost carried over), or None."""
    if not parts:
        return None
    if len(parts) == 1:  # a sum or max of one part is that part
        return boosted(parts[0], boost)
    return Combine(how, tuple(parts), tie_breaker, boost)


class _Reader:
    """One walk of a query: each query type's reading, with the leniency of the walk."""

    def __init__(self, lenient: bool) -> None:
        self.lenient = lenient

    def decline(self, reason: str, detail: str = "") -> None:
        if not self.lenient:
            raise Declined(reason, detail)

    def node(
        self, query: Any, *, in_max: bool, required: bool = False, whole: bool = False, top: bool = False
    ) -> Node | None:
        """`required`: every hit of the whole query matches this clause (the query, and the `must`
        clauses of a required `bool`), so a constant it scores is the same shift for every hit.
        `whole`: the clause sits in the query itself or in a required `bool`, so a clause that matches
        every document (`match_all`) adds its constant to every hit's sum."""
        if not isinstance(query, Mapping) or len(query) != 1:
            raise Declined("malformed", "a query is an object with one key: the cluster answers for it")
        kind, body = next(iter(query.items()))
        if kind == "match_all":
            if in_max:  # a constant inside a max is not a shift: it may win the max
                self.decline("match_all", "match_all inside dis_max or best_fields")
            elif not whole:  # only the hits that match its optional bool get it
                self.decline("match_all", "match_all in a bool that not every hit matches")
            return None  # adds the same constant to every hit of a sum: left out
        if kind == "match_none" or _scores_zero(kind, body):
            return None  # only decides matching
        if _scores_constant(kind, body):
            if top or not required or in_max:  # only the hits it matches get it, or nothing else scores
                self.decline(kind, f"[{kind}] adds a constant to the hits it matches")
            return None
        read = getattr(self, f"_{kind}", None) if kind in READ else None
        if read is None:  # the reason names the query type, if it is one (never an arbitrary string)
            self.decline(
                kind if kind in KNOWN else "unknown_query", f"[{kind}] is not a text score BMX reproduces"
            )
            return None
        if not isinstance(body, Mapping):
            raise Declined("malformed", f"[{kind}] expects an object")
        if not required and (condition := _condition(kind, body)) is not None:
            # The cluster counts an optional clause's score only on the hits it matches; BMX scores its
            # terms wherever they occur and cannot see the rest of what it asks.
            self.decline(
                "optional_condition", f"[{kind}] in a should or dis_max clause matches only {condition}"
            )
            return None
        if kind == "bool":
            return self._bool(body, required=required and not in_max)
        return read(body)

    def _match(self, body: Mapping[str, Any], kind: str = "match") -> Node | None:
        if len(body) != 1:
            raise Declined("malformed", f"[{kind}] expects one field")
        field, value = next(iter(body.items()))
        options: Mapping[str, Any] = value if isinstance(value, Mapping) else {"query": value}
        if not self._plain_options(options):
            return None
        return Text(field, _text(options.get("query")), _boost(options), quoted=kind == "match_phrase")

    def _match_phrase(self, body: Mapping[str, Any]) -> Node | None:
        # The phrase (and its slop) decides which documents match, in the first stage; its terms are scored.
        return self._match(body, "match_phrase")

    def _multi_match(self, body: Mapping[str, Any]) -> Node | None:
        kind = body.get("type", "best_fields")
        if kind in PREFIX_TYPES:
            self.decline(PREFIX_TYPES[kind], f"multi_match type [{kind}] expands terms")
            return None
        if kind not in MULTI_MATCH_TIES:
            raise Declined("malformed", f"unknown multi_match type [{kind}]")
        return self._on_fields(body, body.get("fields"), MULTI_MATCH_TIES[kind], quoted=kind == "phrase")

    def _combined_fields(self, body: Mapping[str, Any]) -> Node | None:
        return self._on_fields(body, body.get("fields"), None)

    def _query_string(self, body: Mapping[str, Any]) -> Node | None:
        if _QS_SYNTAX.search(_text(body.get("query"))):
            self.decline("query_string", "query_string syntax beyond plain words")
            return None
        fields = body.get("fields", [body["default_field"]] if "default_field" in body else None)
        kind = body.get("type", "best_fields")
        if kind in PREFIX_TYPES or kind not in MULTI_MATCH_TIES:
            self.decline("query_string", f"query_string type [{kind}]")
            return None
        return self._on_fields(body, fields, MULTI_MATCH_TIES[kind], quoted=kind == "phrase")

    def _simple_query_string(self, body: Mapping[str, Any]) -> Node | None:
        plain = str(body.get("flags", "ALL")).upper() == "NONE"
        if not plain and _SQS_SYNTAX.search(_text(body.get("query"))):
            self.decline("simple_query_string", "simple_query_string syntax beyond plain words")
            return None
        # The cluster sums every term on every field (it has no tie_breaker): per field, a sum.
        return self._on_fields(body, body.get("fields"), None)

    def _bool(self, body: Mapping[str, Any], required: bool = False) -> Node | None:
        # A lone `should` beside no `must` or `filter` is asked of every hit that matches the bool
        lone = (
            not _items(body.get("must"))
            and not _items(body.get("filter"))
            and len(_items(body.get("should"))) == 1
        )
        parts = [
            node
            for clause in ("must", "should")  # filter and must_not only decide matching
            for item in _items(body.get(clause))
            if (
                node := self.node(
                    item, in_max=False, required=required and (clause == "must" or lone), whole=required
                )
            )
            is not None
        ]
        return _fold("sum", parts, 0.0, _boost(body))

    def _dis_max(self, body: Mapping[str, Any]) -> Node | None:
        parts = [n for q in _items(body.get("queries")) if (n := self.node(q, in_max=True)) is not None]
        return _fold("max", parts, _number(body.get("tie_breaker", 0.0), "tie_breaker"), _boost(body))

    def _on_fields(
        self, body: Mapping[str, Any], fields: Any, tie_default: float | None, *, quoted: bool = False
    ) -> Node | None:
        """`text` on each field, folded as the best plus `tie_breaker` times the rest (its default
        `tie_default`; 1 is the sum), or summed by rule where `tie_default` is None."""
        if not self._plain_options(body):
            return None
        if fields is None or fields == []:
            self.decline("default_field", "no fields: the index's default_field decides, unknown here")
            return None
        names = fields if isinstance(fields, list) else [fields]
        try:
            weighted = [parse_field(f) if isinstance(f, str) else _bad(f) for f in names]
        except ValueError as exc:
            raise Declined("malformed", str(exc)) from None
        if any("*" in name for name, _ in weighted):
            self.decline("field_pattern", "a field pattern expands to fields known only to the mapping")
            return None
        if tie_default is not None and len(weighted) > 1 and (condition := _asks_more(body)) is not None:
            # each field's part is folded in only where that field matches on its own
            self.decline(
                "optional_condition", f"a field's part of a best-of or sum counts only on {condition}"
            )
            return None
        text = _text(body.get("query"))
        tie = 1.0 if tie_default is None else _number(body.get("tie_breaker", tie_default), "tie_breaker")
        how: How = "sum" if tie == 1.0 else "max"
        return _fold(
            how, [Text(n, text, b, quoted) for n, b in weighted], 0.0 if how == "sum" else tie, _boost(body)
        )

    def _plain_options(self, options: Mapping[str, Any]) -> bool:
        fuzziness = options.get("fuzziness")
        if fuzziness not in (None, 0, "0"):
            self.decline("fuzzy", "fuzzy expansions are scored by the cluster's rewrite")
            return False
        if options.get("analyzer") is not None:
            self.decline("analyzer", "the query names its own analyzer")
            return False
        return True


# `minimum_should_match` values that ask for no more than one term or clause.
_ONE_ENOUGH = (None, 0, 1, "0", "1")


def _condition(kind: str, body: Mapping[str, Any]) -> str | None:
    """What a text or `bool` clause asks of a hit beyond one of its terms occurring in it (a phrase,
    every term, a filter, all of several `must` clauses), said for a reason's detail; None when one
    term is enough, so that the clause matches exactly where BMX gives it a score."""
    if kind == "bool":
        if not _items(body.get("must")) and not _items(body.get("should")):
            return None  # filters only: it scores 0 wherever it matches
        if _items(body.get("filter")) or _items(body.get("must_not")):
            return "the hits its filter and must_not let through"
        musts = len(_items(body.get("must")))
        if musts > 1 or (musts and _items(body.get("should"))):
            return "the hits that match every one of its must clauses"
        if body.get("minimum_should_match") not in _ONE_ENOUGH:
            return "the hits that match enough of its should clauses"
        return None
    if kind == "match_phrase":
        return "the hits that hold its phrase"
    options: Any = body
    if kind == "match":
        options = next(iter(body.values())) if len(body) == 1 else None
        options = options if isinstance(options, Mapping) else {}
    return _asks_more(options)


def _asks_more(options: Mapping[str, Any]) -> str | None:
    """What a text query's options ask of a hit (or of each field's part) beyond one of its terms."""
    if options.get("type") == "phrase":
        return "the hits that hold its phrase"
    if str(options.get("operator", options.get("default_operator", "or"))).lower() == "and":
        return "the hits that hold every one of its terms"
    if options.get("minimum_should_match") not in _ONE_ENOUGH:
        return "the hits that hold enough of its terms"
    return None


def _scores_zero(kind: str, body: Any) -> bool:
    """A join that gives its hits score 0: `nested` and `has_child` with `score_mode: none` (has_child's
    default)."""
    if not isinstance(body, Mapping):
        return False
    if kind == "nested":
        return body.get("score_mode") == "none"
    return kind == "has_child" and body.get("score_mode", "none") == "none"


def _scores_constant(kind: str, body: Any) -> bool:
    """A query that gives every hit it matches its boost: `constant_score`, `has_parent` without `score`."""
    if not isinstance(body, Mapping):
        return False
    return kind == "constant_score" or (kind == "has_parent" and body.get("score") is not True)


def _items(value: Any) -> list[Any]:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise Declined("malformed", "the query text must be a string")


def _number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise Declined("malformed", f"[{name}] must be a number")
    try:
        number = float(value)
    except ValueError:
        raise Declined("malformed", f"[{name}] must be a number") from None
    if not math.isfinite(number) or number < 0:
        raise Declined("malformed", f"[{name}] must be a finite number >= 0")
    return number


def _boost(options: Mapping[str, Any]) -> float:
    return _number(options.get("boost", 1.0), "boost")


def _bad(value: Any) -> tuple[str, float]:
    raise ValueError(f"a field must be a string, got {value!r}")
