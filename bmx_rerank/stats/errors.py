"""Errors of the statistics layer, in Elasticsearch's shape so the proxy and CLI report them like the rest."""

from __future__ import annotations

from dataclasses import dataclass

from bmx_rerank.errors import SearchError


@dataclass
class StatisticsError(SearchError):
    """Statistics cannot be built, loaded or refreshed for a reason the user can act on."""


def not_text_field(field: str, index: str, kind: str) -> StatisticsError:
    return StatisticsError(
        400,
        "bmx_field_not_text_exception",
        f"field [{field}] of [{index}] is [{kind}]: BMX statistics need an analyzed text field",
    )


def field_missing(field: str, index: str) -> StatisticsError:
    return StatisticsError(400, "bmx_field_not_found_exception", f"field [{field}] not found in [{index}]")


def no_index(expr: str) -> StatisticsError:
    return StatisticsError(404, "index_not_found_exception", f"no such index [{expr}]")


def empty_corpus(index: str, field: str) -> StatisticsError:
    return StatisticsError(
        400,
        "bmx_empty_corpus_exception",
        f"[{index}] has no live document with a token in field [{field}]: nothing to build statistics from "
        "(the field is empty or missing in every document, or the cluster cannot give its term vectors: "
        "`_source` is disabled or leaves the field out, and the field has neither `term_vector` nor `store`)",
    )


def corrupt_snapshot(snapshot: str, reason: str) -> StatisticsError:
    return StatisticsError(500, "bmx_statistics_corrupt_exception", f"snapshot [{snapshot}]: {reason}")
