"""Reranked answers compared: a reranked search sent as plain HTTP, its (id, score) list, and the check
that two answers are the same to 1e-6 (e.g. term frequencies from probes against `_mtermvectors`)."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

# `_mtermvectors` options that ask for term frequencies only.
TV = {"term_statistics": False, "field_statistics": False, "positions": False, "offsets": False}


def body_lengths(engine: Any, index: str, ids: list[str]) -> dict[str, int]:
    """Each document's length in `body`, from its term vectors (what a length table must hold)."""
    docs = [{"_index": index, "_id": i, "fields": ["body"], **TV} for i in ids]
    answer = engine.ok("POST", "/_mtermvectors", {"docs": docs})["docs"]
    return {
        d["_id"]: sum(
            v["term_freq"] for v in d.get("term_vectors", {}).get("body", {}).get("terms", {}).values()
        )
        for d in answer
    }


def search(
    url: str, index: str, text: str, extra: dict | None = None, headers: dict[str, str] | None = None
) -> dict:
    """A reranked `match` search of `body` (window and size 100) sent to `url` (with `headers`): its
    answer."""
    body = {
        "query": {"match": {"body": text}},
        "size": 100,
        "ext": {"bmx": {"field": "body", "window_size": 100}},
        **(extra or {}),
    }
    req = urllib.request.Request(
        f"{url}/{index}/_search",
        json.dumps(body).encode(),
        {"Content-Type": "application/json", **(headers or {})},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


def scores(answer: dict) -> list[tuple[str, float]]:
    """(id, score) of each hit of a reranked answer."""
    assert answer["_bmx"]["reranked"] is True, answer["_bmx"]
    return [(h["_id"], h["_score"]) for h in answer["hits"]["hits"]]


def same(a: list[tuple[str, float]], b: list[tuple[str, float]]) -> None:
    """The same ids in the same order, scores equal to 1e-6."""
    assert [i for i, _ in a] == [i for i, _ in b]
    assert all(abs(x - y) <= 1e-6 for (_, x), (_, y) in zip(a, b, strict=True))
