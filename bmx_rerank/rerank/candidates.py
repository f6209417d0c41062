"""Candidates: which documents a window holds, and their term frequencies as the scoring core wants them.

Term vectors are cached by (caller, index, id, _seq_no, _primary_term, field), in one cache shared by
every request. Why each part is there:

- index, id, _seq_no, _primary_term: one version of one document (the id picks the shard, the primary
  term and sequence number the operation on it). A document's terms change only when these do, so an
  entry is never stale, only unused. (Except across a deleted and re-created index of the same name,
  whose new documents start again at _seq_no 0, _primary_term 1: keep --cache-size in mind there.)
- Only hits of the caller's own first-stage search are looked up, so document-level security is
  honoured: a caller never gets the terms of a document it could not read.
- caller (a digest of the credentials the sidecar forwards): field-level security can hide a field of
  a document from one caller and not from another. The same document version then has different term
  vectors per caller (none at all for the one who may not see the field), so entries are never shared
  between different credentials. Callers with the same credentials share them.
- field: the terms of one field."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from bmx_rerank.scoring import Candidates
from bmx_rerank.upstream import DocRef, DocTerms

CacheKey = tuple[str, str, str, int, int, str]
# Per-request headers that say nothing about who is asking: not part of the caller's identity.
NOT_IDENTITY = frozenset(("x-opaque-id", "traceparent", "tracestate"))


def doc_refs(hits: Sequence[Mapping[str, Any]]) -> list[DocRef]:
    """Where each hit lives; `_index` and `_id` come back even with `_source: false`."""
    refs = []
    for hit in hits:
        if "_id" not in hit or "_index" not in hit:
            raise ValueError("a hit without _index/_id cannot be reranked (stored_fields: _none_?)")
        routing = hit.get("_routing")
        refs.append(DocRef(hit["_index"], str(hit["_id"]), None if routing is None else str(routing)))
    return refs


def caller(headers: Mapping[str, str]) -> str:
    """Who is asking, as a digest of the headers the sidecar forwards (never the credentials themselves)."""
    items = sorted((k.lower(), v) for k, v in headers.items() if k.lower() not in NOT_IDENTITY)
    return hashlib.sha256(repr(items).encode()).hexdigest()


def cache_key(hit: Mapping[str, Any], field: str, who: str) -> CacheKey | None:
    """The cache key of a hit for caller `who`, or None when the cluster did not return its sequence
    number."""
    seq, term = hit.get("_seq_no"), hit.get("_primary_term")
    if not isinstance(seq, int) or not isinstance(term, int) or seq < 0:
        return None
    return (who, hit["_index"], str(hit["_id"]), seq, term, field)


class TermVectorCache:
    """A bounded LRU map from `CacheKey` to a document's term frequencies and length."""

    def __init__(self, capacity: int = 100_000) -> None:
        self.capacity = capacity
        self._items: OrderedDict[CacheKey, DocTerms] = OrderedDict()

    def get(self, key: CacheKey | None) -> DocTerms | None:
        if key is None or self.capacity <= 0:
            return None
        found = self._items.get(key)
        if found is not None:
            self._items.move_to_end(key)
        return found

    def put(self, key: CacheKey | None, terms: DocTerms) -> None:
        if key is None or self.capacity <= 0 or not terms.found:
            return
        self._items[key] = terms
        self._items.move_to_end(key)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


def candidate_features(docs: Sequence[DocTerms], vocabulary: Sequence[str]) -> Candidates:
    """tf of each vocabulary term per document, and each document's full length in the field.

    Looks up the few query terms in each document, not each document's many terms in the query."""
    rows = [[doc.tf.get(term, 0) for term in vocabulary] for doc in docs]
    tf = np.array(rows, dtype=np.float64).reshape(len(docs), len(vocabulary))
    length = np.array([doc.length for doc in docs], dtype=np.float64)
    return Candidates(tf, length)
