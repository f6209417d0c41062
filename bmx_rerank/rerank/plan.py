"""Reading a search request: should it be reranked, with which parameters, and what goes upstream.

Semantics follow Elasticsearch retrievers' `rank_window_size`: the cluster returns the window from 0,
the sidecar rescores it and slices `from`/`size` inside it. Requests whose paging the window cannot
honour (a non-score `sort`, `scroll`, a point in time, `search_after`) pass through unreranked."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from bmx_rerank.errors import SearchError, bad_request
from bmx_rerank.rerank.query import Node, Text
from bmx_rerank.rerank.spec import MAX_WINDOW, RerankSpec, parse_spec
from bmx_rerank.rerank.widen import match_clause, widen

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


def plan_search(
    body: Mapping[str, Any] | None,
    params: Mapping[str, str],
    policy: RerankSpec | None = None,
    *,
    widen_default: bool = True,
    skip: str | None = None,
) -> Plan:
    """Decide how to serve a search. `policy` is the server-side spec for this index, if any; `skip`, a
    reason the caller already knows not to rerank (`ext.bmx` is still validated and removed)."""
    body_out = copy.deepcopy(dict(body)) if body is not None else None
    params_out = dict(params)
    raw = _pop_ext_bmx(body_out)
    if raw is None and policy is None:
        return Plan(body_out, params_out)
    spec = parse_spec(raw, widen_default=widen_default) if raw is not None else policy
    assert spec is not None
    source = body_out or {}
    skipped = skip or _unpageable(source, params)
    if skipped:
        return Plan(body_out, params_out, skipped=skipped if raw is not None else None)
    query = source.get("query")
    if raw is None:  # policy: only a plain match/multi_match on the field, nothing else is touched
        text = plain_match_text(query, spec.field)
        if text is None:
            return Plan(body_out, params_out)
    else:
        text = spec.query if spec.query is not None else find_match_text(query, spec.field)
        if text is None:
            raise bad_request(
                f"[bmx] needs [query]: the request has no match query on field [{spec.field}] to take it from"
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
    # The window needs _index, _id, _score and _seq_no, which a filter_path may drop: it is applied to
    # the answer instead, after the rerank.
    filter_path = params_out.pop("filter_path", None)
    if query is None:
        query = match_clause(spec.field, text)
    first["query"] = widen(query, spec.field, spec.augment.queries) if spec.widen else query
    first["from"] = 0
    first["size"] = spec.window_size
    wants_seq_no = bool(source.get("seq_no_primary_term")) or _truthy(params.get("seq_no_primary_term"))
    first["seq_no_primary_term"] = True
    scoring = Text(spec.field, text)
    return Plan(
        first, params_out, spec, text, from_, size, wants_seq_no, filter_path=filter_path, scoring=scoring
    )


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


def plain_match_text(query: Any, field: str) -> str | None:
    """The text of a top-level `match` on `field` or `multi_match` whose fields include it, else None."""
    if not isinstance(query, Mapping) or len(query) != 1:
        return None
    if "match" in query:
        return _match_text(query["match"], field)
    if "multi_match" in query:
        return _multi_match_text(query["multi_match"], field)
    return None


def find_match_text(query: Any, field: str) -> str | None:
    """Like `plain_match_text`, also looking inside `bool` clauses (first hit, depth first)."""
    text = plain_match_text(query, field)
    if text is not None or not isinstance(query, Mapping):
        return text
    body = query.get("bool")
    if not isinstance(body, Mapping):
        return None
    for clause in ("must", "should", "filter"):
        items = body.get(clause, [])
        for item in items if isinstance(items, list) else [items]:
            text = find_match_text(item, field)
            if text is not None:
                return text
    return None


def _match_text(match: Any, field: str) -> str | None:
    if not isinstance(match, Mapping) or field not in match:
        return None
    value = match[field]
    if isinstance(value, Mapping):
        value = value.get("query")
    return value if isinstance(value, str) else None


def _multi_match_text(mm: Any, field: str) -> str | None:
    if not isinstance(mm, Mapping) or not isinstance(mm.get("query"), str):
        return None
    fields = mm.get("fields", [])
    names = [f.split("^", 1)[0] for f in (fields if isinstance(fields, list) else [fields])]
    return mm["query"] if field in names else None


def _int_param(params: Mapping[str, str], body: Mapping[str, Any], name: str, default: int) -> int:
    value: Any = params.get(name, body.get(name, default))
    if isinstance(value, str):
        try:
            value = int(value)
        except ValueError:
            raise bad_request(f"Failed to parse int parameter [{name}] with value [{value}]") from None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise bad_request(f"[{name}] parameter must be a non-negative integer, got [{value}]")
    return value


def _truthy(value: str | None) -> bool:
    return value is not None and value.lower() in ("", "true")
