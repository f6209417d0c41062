"""Reading a field's mapping: whether the cluster can give its term vectors (`upstream.readable`)."""

from __future__ import annotations

import pytest

from bmx_rerank.upstream import readable

TEXT = {"type": "text", "term_vector": "no"}  # as a mapping read with its defaults says it


@pytest.mark.parametrize(
    ("field", "spec", "source", "can"),
    [
        ("body", TEXT, None, True),  # `_source` not read: taken as kept
        ("body", TEXT, {}, True),
        ("body", TEXT, {"enabled": True, "includes": [], "excludes": []}, True),
        ("body", TEXT, {"enabled": False}, False),
        ("body", {**TEXT, "term_vector": "yes"}, {"enabled": False}, True),  # stored term vectors
        ("body", {**TEXT, "store": True}, {"enabled": False}, True),  # made again from the stored value
        ("body", TEXT, {"excludes": ["body"]}, False),
        ("body", TEXT, {"excludes": ["bo*"]}, False),
        ("body", TEXT, {"excludes": ["title"]}, True),
        ("meta.body", TEXT, {"excludes": ["meta"]}, False),  # an object above it
        ("meta.body", TEXT, {"excludes": ["meta.*"]}, False),
        ("body", TEXT, {"includes": ["title"]}, False),
        ("body", TEXT, {"includes": ["title", "body"]}, True),
        ("meta.body", TEXT, {"includes": ["meta"]}, True),
        ("body.en", TEXT, {"includes": ["body"]}, True),  # a multi-field: its value is its parent's
    ],
)
def test_whether_a_fields_term_vectors_can_be_read(
    field: str, spec: dict, source: dict | None, can: bool
) -> None:
    assert readable(field, spec, source) is can
