"""`_search`: read the body, plan it, and either forward it or have the pipeline rerank it, the first
stage sent by `relay.call`."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import orjson

from bmx_rerank.deadline import Deadline, request_budget, time_value, within
from bmx_rerank.errors import SearchError
from bmx_rerank.identity import forwardable_headers
from bmx_rerank.proxy.bodies import (
    MAX_DEPTH,
    THREAD_BYTES,
    TooDeep,
    Unparsable,
    guard_parsed,
    guard_unparsable,
    parse,
    parse_request,
    read_json_body,
)
from bmx_rerank.proxy.framing import (
    MARKER_HEADER,
    end_to_end,
    json_answer,
    json_headers,
    last_values,
    raw_response,
    unreadable_format,
)
from bmx_rerank.proxy.http import Request, Response
from bmx_rerank.proxy.memory import charge
from bmx_rerank.proxy.relay import call, forward
from bmx_rerank.rerank.pipeline import Answer, skipped
from bmx_rerank.rerank.plan import NO_INDEX, Plan, asks_bmx

log = logging.getLogger("bmx_rerank.proxy")


async def search(request: Request, index: str | None) -> Response:
    state = request.state
    config = state.config
    raw, decoded = await read_json_body(request, config.max_body, guard_length(request), config.max_depth)
    body = await parse_request(decoded, request)
    if body is Unparsable:
        await guard_unparsable(request, decoded, config.max_depth, state.metrics)
        return await forward(request, raw or None)
    depth = guard_parsed(request, body, config.max_depth, config.max_query_depth, state.metrics)
    if body is not None and not isinstance(body, dict):
        return await forward(request, raw or None)
    if depth > MAX_DEPTH:  # deeper than a rerank rewrites (--max-depth may allow it)
        if asks_bmx(body):
            raise TooDeep()
        return await forward(request, raw or None)  # the cluster answers such a body for itself
    headers = forwardable_headers(end_to_end(request))
    params = last_values(request.query)
    # statistics are per index: a search that names none is not reranked (said out loud)
    skip = unreadable_format(request) or (NO_INDEX if index is None else None)
    plan = await state.admission.plan(index, body, params, headers, skip=skip)
    if plan.spec is None:
        return await as_planned(request, plan, body, raw)
    assert index is not None
    reason = "unreadable"  # None below: the cluster answered the window in a form the rerank cannot read
    try:
        answer = await rerank(request, index, plan, headers, search_deadline(request, body, plan))
    except SearchError:
        raise
    except Exception as exc:  # a fault of the rerank's own (an answer of a shape nobody expected)
        if state.config.on_rerank_error == "fail":
            raise
        state.metrics.errors.labels("bmx_rerank_exception").inc()
        log.warning("rerank failed: the search goes as sent", extra={"fields": {"error": type(exc).__name__}})
        answer, reason = None, "rerank_error"
    if answer is None:  # the caller's own search, as sent: never the window, never a 500 of the proxy's
        declined = await state.admission.decline(index, body, params, headers, reason)
        return await as_planned(request, declined, body, raw)
    return answer


async def as_planned(request: Request, plan: Plan, body: Any, raw: bytes | None) -> Response:
    """The search sent as its plan says, without a rerank (`ext.bmx` removed, and why said)."""
    extra = None
    if plan.skipped:
        request.marker = skipped(plan.skipped)
        extra = {MARKER_HEADER: str(request.marker)}
    if plan.body == body:  # a policy's search: its original bytes
        return await forward(request, raw or None, extra=extra)
    return await forward(request, orjson.dumps(plan.body), headers=json_headers(request), extra=extra)


def guard_length(request: Request) -> int | None:
    """The largest search body the cluster is sent (None: no limit)."""
    return request.state.config.max_content_length or None


def search_deadline(request: Request, body: Any, *plans: Plan) -> Deadline | None:
    """One budget for the whole search, counted from its arrival: `--deadline`, lowered by
    `ext.bmx.deadline` and by the search's own `timeout` (query parameter or body), where given."""
    timeout = last_values(request.query).get("timeout")
    if timeout is None and isinstance(body, dict):
        timeout = body.get("timeout")
    own = [p.spec.deadline for p in plans if p.spec is not None]
    config = request.state.config
    return request_budget(config.deadline, time_value(timeout), *own, since=request.arrived)


async def rerank(
    request: Request,
    index: str,
    plan: Plan,
    headers: Mapping[str, str],
    deadline: Deadline | None = None,
) -> Response | None:
    """The pipeline's rerank, its first stage sent to the request's own path, within `deadline`; None
    where the cluster answered it in a form the rerank cannot read (the window is never the answer)."""
    state = request.state

    async def first_stage(
        body: dict[str, Any] | None, params: Mapping[str, str], *, undecoded: bool = False
    ) -> Answer:
        status, answer_headers, payload = await call(request, params, orjson.dumps(body), "search")
        if undecoded and status < 300:  # charged as `parse` charges it: the rerank decodes it
            charge(request, len(payload))
            return Answer(status, None, (answer_headers, payload), payload)
        data = await parse(payload, request) if status < 300 else Unparsable
        readable = data if isinstance(data, dict) else None
        return Answer(status, readable, (answer_headers, payload))

    async def msearch(body: bytes, params: Mapping[str, str]) -> Answer:  # a lean window's shards
        status, answer_headers, payload = await call(request, params, body, "msearch", msearch=True)
        if status < 300:  # charged as `parse` charges it: the rerank decodes it (`shards.decode`)
            charge(request, len(payload))
        return Answer(status, None, (answer_headers, payload), payload)

    with state.admission.slot(), within(deadline):
        outcome = await state.rerank.rerank(index, plan, headers, first_stage, msearch)
    answer_headers, payload = outcome.answer.raw
    if outcome.body is None or outcome.marker is None:
        if outcome.answer.status < 300:  # a window answered in YAML, CBOR...: not the caller's search
            return None
        return raw_response(outcome.answer.status, answer_headers, payload)
    request.marker = outcome.marker
    extra = {MARKER_HEADER: str(outcome.marker)}
    big = len(payload) > THREAD_BYTES
    return await json_answer(request, outcome.answer.status, answer_headers, outcome.body, extra, big)
