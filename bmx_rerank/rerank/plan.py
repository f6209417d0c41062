"""Reading a search request: should it be reranked, with which parameters, and what goes upstream.

Semantics follow Elasticsearch retrievers' `rank_window_size`: the cluster returns the window from 0,
the sidecar rescores it and slices `from`/`size` inside it. Requests whose paging the window cannot
honour (a non-score `sort`, `scroll`, a point in time, `search_after`) pass through unreranked."""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from bmx_rerank import defaults
from bmx_rerank.errors import SearchError, bad_request
from bmx_rerank.rerank import filter_path as filter_paths
from bmx_rerank.rerank.query import Declined, Node, Text, fields, on_fields, restrict, understand, weigh
from bmx_rerank.rerank.spec import DEFAULT_WINDOW, MAX_WINDOW, RerankSpec, parse_spec
from bmx_rerank.rerank.widen import text_clause, widen

DEFAULT_SIZE = 10


@dataclass(frozen=True)
class Plan:
    """The outcome of reading one search.

    `spec` None: forward `body` (with any `ext.bmx` removed) unreranked; `skipped` says why, if the
    client had asked for a rerank. Otherwise `body` is the first-stage request for the window."""

    body: dict[str, Any] | None
    params: dict[str, str]
    spec: RerankSpec | None = None
    query_text: str = ""
    from_: int = 0
    size: int = DEFAULT_SIZE
    wants_seq_no: bool = False
    skipped: str | None = None
    filter_path: str | None = None  # the client's, applied to the reranked answer (see filter_path)
    scoring: Node | None = None  # what is scored and how the parts combine (see `query`)
    no_stored_fields: bool = False  # the client's `stored_fields: _none_`, applied to the reranked answer

    def shaped(self, answer: dict[str, Any]) -> dict[str, Any]:
        """A reranked (or paged) answer as the caller asked for it: its hits without the stored fields
        `stored_fields: _none_` leaves out, then its `filter_path`."""
        if self.no_stored_fields:
            hits = answer.get("hits")
            if isinstance(hits, dict) and isinstance(hits.get("hits"), list):
                page = [{k: v for k, v in h.items() if k not in STORED} for h in hits["hits"]]
                answer = {**answer, "hits": {**hits, "hits": page}}
        return filter_paths.apply(answer, self.filter_path)

    @property
    def scored(self) -> Node:
        """What a rerank scores: the scoring tree, or (plans without one) the text on the spec's field."""
        assert self.spec is not None
        return self.scoring if self.scoring is not None else Text(self.spec.field, self.query_text)


# Top-level parts that score (or pick hits) beside the query: declined unless `ext.bmx.combine` says how
# BMX meets the first stage's score. `collapse` is declined always: each group's hit is picked by the
# cluster's score.
OTHER_SCORING = ("knn", "sub_searches", "rank", "retriever", "rescore", "indices_boost", "min_score")
ALWAYS_DECLINED = ("collapse",)
RETRIEVAL = ("knn", "sub_searches", "rank", "retriever")  # a first stage besides `query`
# A hit's stored fields, which `stored_fields: _none_` leaves out of the answer: the window needs each
# hit's `_id`, so the first stage reads none of them but these (no `_source`), and the sidecar drops them.
NONE = "_none_"
STORED = ("_id", "_routing", "_ignored")
# `from` and `size`: an integer in the URL; in the body, a number or a string of one (the cluster's
# lenient read of a body's integer)
DIGITS = re.compile(r"[+-]?[0-9]+")
NUMBER = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")


# The reason a search that names no index (`/_search`, an `_msearch` item without one) is not
# reranked: statistics are kept per index.
NO_INDEX = "no_index"


def plan_search(
    body: Mapping[str, Any] | None,
    params: Mapping[str, str],
    policy: RerankSpec | None = None,
    *,
    widen_default: bool = True,
    skip: str | None = None,
) -> Plan:
    """Decide how to serve a search. `policy` is the server-side spec for this index, if any; `skip`, a
    reason the caller already knows not to rerank (`ext.bmx` is still validated and removed).

    A declined search goes as sent (`ext.bmx` removed) with `skipped` set. Under a policy, a search whose
    scoring clauses are on none of the policy's fields is not the policy's business: it passes unmarked."""
    if policy is None and not asks_bmx(body):  # passed through as sent: nothing to copy deeply
        return Plan(dict(body) if body is not None else None, dict(params))
    body_out = copy.deepcopy(dict(body)) if body is not None else None
    params_out = dict(params)
    raw = _pop_ext_bmx(body_out)
    if raw is None and policy is None:
        return Plan(body_out, params_out)
    spec = parse_spec(raw, widen_default=widen_default) if raw is not None else policy
    assert spec is not None
    source = body_out or {}
    query = source.get("query")
    if raw is None and not mentions(query, spec.field_names):
        return Plan(body_out, params_out)

    def declined(reason: str) -> Plan:
        return Plan(body_out, params_out, skipped=reason)

    # `q=` in the URL: a Lucene query string on the index's default field, read by the cluster only
    skipped = skip or ("q" if "q" in params else None) or _unpageable(source, params)
    skipped = skipped or _other_scoring(source, spec.combine)
    if skipped:
        return declined(skipped)
    try:
        scoring = scoring_tree(query, spec, policy=raw is None)
    except Declined as exc:
        return declined(exc.reason)
    if raw is None and (scoring is None or not set(fields(scoring)) & set(spec.field_names)):
        return Plan(body_out, params_out)  # its scoring clauses are not on the policy's fields
    if scoring is None:
        raise bad_request(
            f"[bmx] needs [query]: the request has no text query on [{', '.join(spec.field_names)}] "
            "to take it from, nor [ext.bmx.query]"
        )
    try:
        from_ = _int_param(params, source, "from", 0)
        size = _int_param(params, source, "size", DEFAULT_SIZE)
    except SearchError:
        if raw is not None:
            raise
        return Plan(body_out, params_out)  # drop-in: the cluster answers for paging it may accept or not
    if from_ + size > spec.window_size and raw is None:
        # Drop-in: a client that never asked for a rerank must not get a 400 for its page size.
        if from_ + size > MAX_WINDOW:
            return Plan(body_out, params_out)
        spec = replace(spec, window_size=from_ + size)
    if from_ + size > spec.window_size:
        raise bad_request(
            f"[bmx] from + size [{from_ + size}] must be less than or equal to window_size "
            f"[{spec.window_size}]: the rerank window is paged, like rank_window_size"
        )
    if size == 0:
        # Nothing to order (aggregations, counts): fetching and scoring a window would change nothing
        # but `max_score`, which the cluster leaves null for `size: 0`.
        return Plan(body_out, params_out, skipped="size" if raw is not None else None)
    first = dict(source)
    params_out.pop("from", None)
    params_out.pop("size", None)
    # not with `_source` or `fields` asked for (the cluster refuses either with it, as it will the
    # caller), nor with `highlight` (the cluster's hits then carry `_id` after all); the URL's
    # `stored_fields` and `_source*` stand for the body's
    sources = [v for k, v in params.items() if k in ("_source", "_source_includes", "_source_excludes")]
    reads = any(v != "false" for v in sources) if sources else source.get("_source") not in (None, False)
    reads = reads or "fields" in source or "highlight" in source
    # `["_none_"]` is the same to the cluster, and what elasticsearch-py sends for a list
    no_stored = params.get("stored_fields", source.get("stored_fields")) in (NONE, [NONE]) and not reads
    if no_stored:
        first.pop("stored_fields", None)
        params_out.pop("stored_fields", None)
        first["_source"] = False
    # The window needs _index, _id, _score and _seq_no, which a filter_path may drop: it is applied to
    # the answer instead, after the rerank.
    filter_path = params_out.pop("filter_path", None)
    retrieval = any(k in source for k in RETRIEVAL)
    if query is None and not retrieval and spec.query is not None:
        query = text_clause(spec.field_names, spec.query)
    # Widening adds to the first stage's score: a combination that reads that score is not widened.
    if spec.widen and spec.combine in (None, "replace") and (query is not None or not retrieval):
        query = widen(query, spec.field_names, spec.augment.queries)
    if query is not None:
        first["query"] = query
    first["from"] = 0
    first["size"] = spec.window_size
    wants_seq_no = bool(source.get("seq_no_primary_term")) or _truthy(params.get("seq_no_primary_term"))
    first["seq_no_primary_term"] = True
    text = scoring.text if isinstance(scoring, Text) else ""
    return Plan(
        first,
        params_out,
        spec,
        text,
        from_,
        size,
        wants_seq_no,
        filter_path=filter_path,
        scoring=scoring,
        no_stored_fields=no_stored,
    )


@dataclass(frozen=True)
class Bounds:
    """What a server allows one rerank (`serve --max-window`, `--max-augment`, `--no-widen`)."""

    max_window: int = MAX_WINDOW  # hits a rerank may ask the cluster for
    max_augment: int = defaults.MAX_AUGMENT  # augmented queries (WQA): each costs an `_analyze`
    widen: bool = True  # the first stage asks for what augmented queries match, too


def bounded_plan(
    body: dict[str, Any] | None,
    params: Mapping[str, str],
    policy: RerankSpec | None,
    bounds: Bounds,
    *,
    skip: str | None = None,
) -> Plan:
    """`plan_search` within the server's bounds: a rerank the client asked for beyond them is a 400; a
    policy's beyond them (a deep page through a drop-in policy) is not reranked at all. A request that
    does not name its window gets the default, or `max_window` when that is smaller."""
    ext = body.get("ext") if isinstance(body, dict) else None
    raw = ext.get("bmx") if isinstance(ext, dict) else None
    if isinstance(raw, dict) and "window_size" not in raw and bounds.max_window < DEFAULT_WINDOW:
        body = {**body, "ext": {**ext, "bmx": {**raw, "window_size": bounds.max_window}}}  # type: ignore[dict-item]
    plan = plan_search(body, params, policy, widen_default=bounds.widen, skip=skip)
    spec = plan.spec
    if spec is None:
        return plan
    if spec.window_size > bounds.max_window:
        if not asks_bmx(body):
            return Plan(body, dict(params))
        raise bad_request(
            f"[bmx] [window_size] must lie in [1, {bounds.max_window}] (the server's --max-window), "
            f"got {spec.window_size}"
        )
    if len(spec.augment.queries) > bounds.max_augment:
        raise bad_request(
            f"[bmx] [augment.queries] takes at most {bounds.max_augment} queries (the server's "
            f"--max-augment), got {len(spec.augment.queries)}"
        )
    return plan


def asks_bmx(body: Any) -> bool:
    """Whether a search body carries `ext.bmx` (read without copying it)."""
    return isinstance(body, dict) and isinstance(body.get("ext"), dict) and "bmx" in body["ext"]


def scoring_tree(query: Any, spec: RerankSpec, *, policy: bool = False) -> Node | None:
    """What the rerank scores: `ext.bmx.query` on the spec's fields (as multi_match `best_fields`), or
    the query's own text clauses, weighted by the spec's field weights. `ext.bmx` restricts them to its
    fields (it says which fields score); a `policy` scores every field the query scores, each on its own
    statistics, so that a `multi_match` over the policy's field and another loses no part of its score.

    Raises `Declined` for a query BMX cannot score; with `combine`, such clauses are left to the first
    stage's score the combination reads."""
    lenient = spec.combine is not None
    if spec.query is not None:
        tree: Node | None = on_fields(spec.query, [(name, 1.0) for name in spec.field_names])
    elif query is None:
        return None
    else:
        tree = understand(query, lenient=lenient)
        if tree is not None and not policy:
            tree = restrict(tree, spec.field_names, lenient=lenient)
    return weigh(tree, dict(spec.fields)) if tree is not None else None


def mentions(query: Any, fields: Sequence[str]) -> bool:
    """True when the query names one of `fields` anywhere (as a key, or in a `fields`/`default_field`)."""
    if isinstance(query, Mapping):
        for key, value in query.items():
            if key in fields:
                return True
            if key in ("fields", "default_field"):
                names = value if isinstance(value, list) else [value]
                if any(isinstance(n, str) and n.split("^", 1)[0] in fields for n in names):
                    return True
            if mentions(value, fields):
                return True
    elif isinstance(query, list):
        return any(mentions(item, fields) for item in query)
    return False


def _other_scoring(body: Mapping[str, Any], combine: str | None) -> str | None:
    for key in ALWAYS_DECLINED:
        if key in body:
            return key
    if combine is None:
        for key in OTHER_SCORING:
            if body.get(key) is not None:
                return key
    return None


def _pop_ext_bmx(body: dict[str, Any] | None) -> Any:
    if not body or not isinstance(body.get("ext"), dict) or "bmx" not in body["ext"]:
        return None
    raw = body["ext"].pop("bmx")
    if not body["ext"]:
        del body["ext"]
    if raw is None:
        raise bad_request("[bmx] expected an object, got null", "x_content_parse_exception")
    return raw


def _unpageable(body: Mapping[str, Any], params: Mapping[str, str]) -> str | None:
    if "scroll" in params:
        return "scroll"
    if "pit" in body:
        return "pit"
    if "search_after" in body:
        return "search_after"
    if not score_sorted(body.get("sort", params.get("sort"))):
        return "sort"
    return None


def score_sorted(sort: Any) -> bool:
    """True when a `sort` value is absent or sorts by relevance only (descending `_score`)."""
    if sort is None:
        return True
    items = sort if isinstance(sort, list) else [sort]
    for item in items:
        if isinstance(item, str):
            if item not in ("_score", "_score:desc"):
                return False
        elif isinstance(item, Mapping) and list(item) == ["_score"]:
            order = item["_score"]
            order = order.get("order", "desc") if isinstance(order, Mapping) else order
            if order != "desc":
                return False
        else:
            return False
    return True


def _int_param(params: Mapping[str, str], body: Mapping[str, Any], name: str, default: int) -> int:
    """`from` or `size`, from the URL (an integer) or else the body, read as the cluster reads a body's
    integer: a number or a numeric string, a fraction cut off (`5.5` and `"5"` are 5)."""
    value: Any = params[name] if name in params else body.get(name, default)
    if isinstance(value, str):
        text = value.strip()
        number = DIGITS if name in params else NUMBER
        if not number.fullmatch(text):
            raise bad_request(f"Failed to parse int parameter [{name}] with value [{value}]")
        value = int(text) if name in params else int(float(text))
    elif isinstance(value, float) and math.isfinite(value):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise bad_request(f"[{name}] parameter must be a non-negative integer, got [{value}]")
    return value


def _truthy(value: str | None) -> bool:
    return value is not None and value.lower() in ("", "true")
