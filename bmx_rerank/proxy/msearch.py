"""`_msearch`: each item planned as a `_search` is (admission), the reranked items' first stages and
the others sent in one request, the reranked items' answers replaced by the pipeline's."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any

import orjson

from bmx_rerank.deadline import within
from bmx_rerank.identity import forwardable_headers
from bmx_rerank.proxy.bodies import (
    MAX_DEPTH,
    THREAD_BYTES,
    TooDeep,
    Unparsable,
    beyond_64_bits,
    guard_parsed,
    guard_unparsable,
    loads,
    parse,
    read_json_body,
)
from bmx_rerank.proxy.framing import (
    MARKER_HEADER,
    end_to_end,
    json_answer,
    last_values,
    raw_response,
    unreadable_format,
)
from bmx_rerank.proxy.http import Request, Response
from bmx_rerank.proxy.memory import charge
from bmx_rerank.proxy.relay import call, forward
from bmx_rerank.proxy.search import guard_length, search_deadline
from bmx_rerank.rerank import filter_path
from bmx_rerank.rerank.pipeline import Answer
from bmx_rerank.rerank.plan import NO_INDEX, Plan, asks_bmx
from bmx_rerank.rerank.window import Window


def parse_ndjson(data: bytes) -> list[Any] | None:
    """The lines of an NDJSON body as JSON values, or None when any line is not JSON the proxy can send
    on unchanged (not valid, or holding an integer beyond 64 bits), or a blank line comes before the
    last: the cluster reads it as an item's line (and refuses it), which skipping it would pair
    otherwise."""
    out = []
    for line in data.rstrip().split(b"\n"):
        value = loads(line)
        if value is Unparsable or value is None or beyond_64_bits(line, value):
            return None
        out.append(value)
    return out


def item_index(header: Mapping[str, Any], default: str | None) -> str | None:
    value = header.get("index", default)
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return value if isinstance(value, str) else default


async def msearch(request: Request, index: str | None) -> Response:
    state = request.state
    config = state.config
    raw, decoded = await read_json_body(request, config.max_body, guard_length(request), config.max_depth)
    charge(request, 2 * len(decoded))  # its lines, and their parsed values
    chunks = [line for line in decoded.split(b"\n") if line.strip()]
    lines = (
        await asyncio.to_thread(parse_ndjson, decoded)
        if len(decoded) > THREAD_BYTES
        else parse_ndjson(decoded)
    )
    if lines is None:
        await guard_unparsable(request, decoded, config.max_depth, state.metrics)
        return await forward(request, raw or None)
    depths = [
        guard_parsed(request, line, config.max_depth, config.max_query_depth, state.metrics) for line in lines
    ]
    if len(lines) % 2 or not all(isinstance(x, dict) for x in lines):
        return await forward(request, raw or None)
    headers = forwardable_headers(end_to_end(request))
    # Per item: None when it goes up as sent, else its plan (a rerank, or ext.bmx removed and why).
    plans: list[tuple[str | None, Plan | None]] = []
    skip = unreadable_format(request)
    reranked, overloaded = 0, False
    for header, body, depth in zip(lines[0::2], lines[1::2], depths[1::2], strict=True):
        ix = item_index(header, index)
        if depth > MAX_DEPTH:  # deeper than a rerank rewrites (--max-depth may allow it)
            if asks_bmx(body):
                raise TooDeep()
            plans.append((ix, None))
            continue
        unnamed = NO_INDEX if ix is None else None  # statistics are per index
        plan = await state.admission.plan(ix, body, {}, headers, skip=skip or unnamed, admit=False)
        if plan.spec is not None:
            overloaded = overloaded or (reranked == 0 and state.admission.overloaded())
            reason = "overloaded" if overloaded else "max_msearch" if reranked >= config.max_msearch else None
            if reason:
                plan = await state.admission.decline(ix, body, {}, headers, reason)
            else:
                reranked += 1
        unchanged = plan.spec is None and not plan.skipped and plan.body == body
        plans.append((ix, None if unchanged else plan))
    if all(p is None for _, p in plans):
        return await forward(request, raw)
    searches = {i: (ix, p) for i, (ix, p) in enumerate(plans) if p is not None and p.spec is not None and ix}
    # As for a single search: the window needs what a filter_path may drop; it applies at the end.
    params = last_values(request.query)
    fpath = params.pop("filter_path", None) if searches else None

    async def first_stage(windows: Mapping[int, Window]) -> Answer:
        out = b"".join(
            (
                orjson.dumps(windows[i].msearch_header(h, params.get("preference")))
                + b"\n"
                + orjson.dumps(windows[i].body or {})
                + b"\n"
            )
            if i in windows
            else head + b"\n" + (item if p is None else orjson.dumps(p.body or {})) + b"\n"
            for i, (h, head, item, (_, p)) in enumerate(
                zip(lines[0::2], chunks[0::2], chunks[1::2], plans, strict=True)
            )
        )
        status, answer_headers, payload = await call(request, params, out, "msearch")
        data = await parse(payload, request) if status < 300 else Unparsable
        readable = data if isinstance(data, dict) and isinstance(data.get("responses"), list) else None
        return Answer(status, readable, (status, answer_headers, payload))

    deadline = search_deadline(request, None, *(p for _, p in searches.values()))
    with state.admission.slot() if reranked else contextlib.nullcontext(), within(deadline):
        answer, bodies = await state.rerank.rerank_each(searches, headers, first_stage)
    status, answer_headers, payload = answer.raw
    if answer.data is None:
        return raw_response(status, answer_headers, payload)
    responses = answer.data["responses"]
    for i, item in bodies.items():
        responses[i] = item
    for i, (_, p) in enumerate(plans):
        item = responses[i] if i < len(responses) else None
        if p is not None and p.skipped and isinstance(item, dict) and "error" not in item:
            item["_bmx"] = {"reranked": False, "skipped": p.skipped}
    answer_body = filter_path.apply(answer.data, fpath)
    big = len(payload) > THREAD_BYTES
    return await json_answer(request, status, answer_headers, answer_body, {MARKER_HEADER: "msearch"}, big)
