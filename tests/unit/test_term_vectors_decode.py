"""The typed decoding of `_mtermvectors` answers (upstream.VectorsDoc): what is read, what is skipped."""

import msgspec
import orjson
import pytest

from bmx_rerank.errors import UpstreamError
from bmx_rerank.upstream import DocRef, _decode_vectors, _doc_terms, raise_doc_error

ANSWER = {
    "docs": [
        {
            "_index": "i",
            "_id": "1",
            "_version": 3,
            "found": True,
            "took": 1,
            "term_vectors": {
                "body": {
                    "field_statistics": {"sum_doc_freq": 9, "doc_count": 2, "sum_ttf": 9},
                    "terms": {
                        "a": {"term_freq": 2, "tokens": [{"position": 0}, {"position": 2}]},
                        "b": {"term_freq": 1, "ttf": 4, "doc_freq": 2},
                    },
                },
                "title": {"terms": {"c": {"term_freq": 1}}},
            },
        },
        {"_index": "i", "_id": "2", "_version": 1, "found": True, "took": 0},
        {"_index": "i", "_id": "3", "found": False},
        {"_index": "i", "_id": "4", "error": {"type": "x", "reason": "shard failed"}},
    ]
}


def test_decodes_term_frequencies_and_skips_what_is_not_read():
    docs = _decode_vectors(orjson.dumps(ANSWER)).docs
    ref = DocRef("i", "1")
    got = _doc_terms(ref, docs[0], "body")
    assert (got.found, got.tf, got.version, got.length) == (True, {"a": 2, "b": 1}, 3, 3)
    assert _doc_terms(ref, docs[0], "title").tf == {"c": 1}
    assert _doc_terms(ref, docs[0], "missing").tf == {}
    assert (_doc_terms(ref, docs[1], "body").found, docs[1].terms("body")) == (True, {})
    assert not docs[2].found and docs[2].version is None
    assert docs[3].error == {"type": "x", "reason": "shard failed"}


def test_a_document_error_names_the_document():
    with pytest.raises(UpstreamError, match=r"\[i\]\[4\]: shard failed"):
        raise_doc_error(DocRef("i", "4"), {"type": "x", "reason": "shard failed"})


@pytest.mark.parametrize(
    "body",
    [b'{"docs": [{"found": true, "term_vectors": {"body": {"terms": {"a": {"term_freq": "2"}}}}}]}', b"{"],
)
def test_an_answer_of_another_shape_is_refused_not_misread(body):
    with pytest.raises(msgspec.DecodeError):
        _decode_vectors(body)
