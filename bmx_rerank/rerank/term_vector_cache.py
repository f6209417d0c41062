"""The term-vector cache: each window document's term frequencies, kept for the next window that holds it.

Term vectors are cached by (caller, index, id, _seq_no, _primary_term, field), in one cache shared by
every request. Why each part is there:

- index, id, _seq_no, _primary_term: one version of one document (the id picks the shard, the primary
  term and sequence number the operation on it). A document's terms change only when these do, so an
  entry is never stale, only unused. (Except across a deleted and re-created index of the same name,
  whose new documents start again at _seq_no 0, _primary_term 1: keep --cache-bytes in mind there.)
- Only hits of the caller's own first-stage search are looked up, so document-level security is
  honoured: a caller never gets the terms of a document it could not read.
- caller (a digest of the caller's authentication headers, `IDENTITY_HEADERS`): field-level security
  can hide a field of a document from one caller and not from another. The same document version then
  has different term vectors per caller (none at all for the one who may not see the field), so
  entries are never shared between different credentials. Callers with the same credentials share
  them; headers that vary per request (X-Request-Id, X-Opaque-Id, traceparent) are not identity.
- field: the terms of one field.

The cache is bounded in bytes (an estimate of each entry's Python objects), not entries: one entry of
a long document weighs as much as thousands of short ones.

An entry is either a document's full term vectors (`_mtermvectors`) or a partial one, a `ProbedDoc`:
the frequencies of the tokens a first stage probed (rerank/tf_probe), 0 included, and the exact
length. A partial entry answers only a window whose tokens in that field it all knows; partial entries
of one key merge (the union of their tokens: both are exact for that document version), and a full
entry always wins over a partial one. A probed window kept whole holds its documents' partial entries
unmade (`SeenWindow.entries`): they are made only when it comes back changed, for its unchanged hits,
so that a first sight (most windows are never asked for again) puts nothing per document.

A window that comes back whole is kept whole too (`SeenWindow`): the same caller's
same request (`Window.digest`) whose hits are the same document versions in the same order, analysed
into the same tokens, has the same frequencies and lengths in every field, so the arrays the scoring
core read last time (its candidate features) are read again, without a lookup per hit. Most windows
are never asked for again, so a window seen once is kept in a small LRU of its own (bounded by
1/`RECENT_SHARE` of the bound, beside it: one-off windows never push documents out) and moves to the
main one when it comes back, as W-TinyLFU's admission window does.

A kept window keeps its scores too (`KeptScores`), with what made them: the scoring tree, the
augmentations and their weights, the scoring request, and each field's statistics (by identity, held
weakly: a refreshed snapshot is another object, and an old one is never kept alive by a window). The
same window scored the same way on the same statistics is not scored again; anything else is, and the
window then keeps its new scores. Only the final scores are kept (~2.2 KB for 100 hits), unless the
search asked for an explanation, which reads every node's parts."""

from __future__ import annotations

import contextlib
import hashlib
import weakref
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from functools import partial
from itertools import repeat
from typing import Any, ClassVar

import numpy as np
import orjson
from cachetools import LRUCache

from bmx_rerank import defaults
from bmx_rerank.rerank.hits import SHARD, HitColumns
from bmx_rerank.rerank.rescore import Folded
from bmx_rerank.scoring import Candidates
from bmx_rerank.upstream import DocTerms

CacheKey = tuple[str, str, str, int, int, str]
VersionKey = tuple[str, str, str, int, int]  # a `CacheKey` less its field: one document version
ENTRY_OVERHEAD = 400  # bytes of a key, a DocTerms and its dict, whatever the document
TERM_BYTES = 120  # per distinct term: a dict slot, a str object and an int, beyond the term's own text
WindowKey = tuple[str, str]  # (caller, window digest): never the length of a `CacheKey`
# A kept window's key, digest and dicts, and per (field, vocabulary) its key and two array objects,
# beyond the arrays' data (tracemalloc: 2,730 bytes a window of 100 hits, one field, 3 tokens)
WINDOW_OVERHEAD, FEATURE_OVERHEAD = 800, 350
# A kept window's scores beyond their arrays: the scores' own objects and weak references, each node
# of the folded tree, each leaf's scores and each of its token labels. Tracemalloc, each object made
# alone between two full collections (they empty the free lists, whose reuse it would miss), after 20
# made and dropped (numpy's cache of small blocks full); medians, 100 hits and 3 tokens: one leaf 5,377
# bytes, counted 5,770; a `dis_max` of two 11,639, counted 12,440; a root alone 1,536, counted 1,700;
# beyond its arrays a leaf holds 324 + 132 a token, counted 450 + 140.
KEPT_BYTES, FOLDED_NODE_BYTES, LEAF_BYTES, LABEL_BYTES = 400, 400, 450, 140
# Windows seen once get 1/32 of the bound beside it (8 MiB beside the default 256: 1,000-1,700 windows
# of 100 hits with their scores for queries of 12 to 3 tokens, 130-220 of 1,000; at 1/128 a window of
# 1,000 was gone before its repeat among 60 other queries): a repeat or the next page soon after finds
# its window there. A probed window goes to the main LRU at once, with its documents' entries unmade
# (`SeenWindow.entries`): where those entries went before, one a document.
RECENT_SHARE = 32
Features = dict[tuple[str, tuple[str, ...]], Candidates]  # (field, vocabulary) -> tf and lengths


def numbered_in(table: str, shard: Any) -> str:
    """What a lean hit's `_seq_no` and `_primary_term` count within: its index's length table (an index
    re-created under its name has another) and its shard (`SHARD`; 0 in an index of one)."""
    return f"{table}/{shard}"


def version_key(
    hit: Mapping[str, Any], who: str, *, tables: Mapping[str, str] | None = None
) -> VersionKey | None:
    """What names a hit's document version for caller `who`: its cache key less the field (None when
    the cluster did not return its sequence number or, as `doc_refs` says, where it lives). `tables`: the
    hit is a lean window's (`rerank/lean.py`), named by its index, the index's length table (index ->
    the table's identity: a re-created index has another), its shard (`SHARD`) and its version, with or
    without its `_id`."""
    seq, term = hit.get("_seq_no"), hit.get("_primary_term")
    if not isinstance(seq, int) or not isinstance(term, int) or seq < 0 or "_index" not in hit:
        return None
    if tables is not None:
        table = tables.get(hit["_index"])
        if table is None:
            return None
        return (who, hit["_index"], f"@{numbered_in(table, hit.get(SHARD, 0))}", seq, term)
    if "_id" not in hit:
        return None
    return (who, hit["_index"], str(hit["_id"]), seq, term)


@dataclass(frozen=True)
class Naming:
    """How a window's hits are named for the caches: by caller `who` and, for a lean window's hits,
    each index's length table (`tables`, see `version_key`)."""

    who: str
    tables: Mapping[str, str] | None = None

    def key(self, hit: Mapping[str, Any]) -> VersionKey | None:
        return version_key(hit, self.who, tables=self.tables)

    def keys(self, hits: HitColumns) -> list[VersionKey | None]:
        return version_keys(hits, self.who, tables=self.tables)

    def later(self, hits: HitColumns) -> Callable[[], list[VersionKey | None]]:
        """The hits' keys when called, for a kept window that may never need them (`SeenWindow.entries`):
        where their columns name them (a lean window's hits, named alike), those columns alone are held
        (not the hits) and no key is made until then; else the keys are made now."""
        if self.tables is not None and _alike(hits, self.tables):
            return partial(version_keys, replace(hits, hits=()), self.who, tables=self.tables)
        keys = self.keys(hits)
        return lambda: keys


def version_keys(
    hits: HitColumns, who: str, *, tables: Mapping[str, str] | None = None
) -> list[VersionKey | None]:
    """Each hit's `version_key`: what every cache names it by. Made from the hits' columns at once
    where every hit is named alike (`_alike`), else hit by hit."""
    if not _alike(hits, tables):
        return [version_key(h, who, tables=tables) for h in hits.hits]
    names = _names(hits, tables)
    return list(zip(repeat(who), hits.index, names, hits.seq_no, hits.primary_term))  # noqa: B905  # `repeat` never ends


def hits_digest(
    hits: HitColumns,
    who: str,
    tokens: Mapping[tuple[str, str], Sequence[str]],
    *,
    tables: Mapping[str, str] | None = None,
) -> bytes | None:
    """What names a window kept whole: a 16-byte digest of its hits' versions, as `version_keys` names
    them, and its tokens; None where a hit has none. Hits named alike (`_alike`) are digested from their
    columns (no key a hit: a window of 1,000 hits makes none), any others as `versions_digest` of their
    keys; a window's hits always take the same of the two, so it always finds itself."""
    if not _alike(hits, tables):
        keys = version_keys(hits, who, tables=tables)
        return None if None in keys else versions_digest(keys, tokens)
    indices = hits.index
    if tables is None:
        named: list[Any] = hits.column("_id")
    else:  # each index's table, then each hit's shard (None in a window searched whole): `_names`
        # without a string a hit
        named = [[(ix, tables[ix]) for ix in sorted(set(indices))], hits.shard]
    columns = ["columns", who, indices, named, hits.seq_no, hits.primary_term, list(tokens.items())]
    return hashlib.blake2b(orjson.dumps(columns), digest_size=16).digest()


def _alike(hits: HitColumns, tables: Mapping[str, str] | None) -> bool:
    """Every hit is named alike, as `version_key` names it: an integer version, an index and an `_id`
    string or, lean, a table for its index."""
    if not hits.versioned or min(hits.seq_no, default=0) < 0 or None in hits.index:
        return False
    if tables is None:
        return set(map(type, hits.column("_id"))) <= {str}
    return set(hits.index) <= tables.keys()


def _names(hits: HitColumns, tables: Mapping[str, str] | None) -> list[str]:
    """Each hit's name within its index (`version_key`'s third part), for hits named alike."""
    if tables is None:
        return hits.column("_id")
    at = list(zip(hits.index, hits.shard, strict=True))  # shard None: a window searched whole, shard 0
    tags = {pair: f"@{numbered_in(tables[pair[0]], pair[1] or 0)}" for pair in set(at)}
    return list(map(tags.__getitem__, at))


def cache_key(
    hit: Mapping[str, Any], field: str, who: str, *, tables: Mapping[str, str] | None = None
) -> CacheKey | None:
    """The cache key of a hit's `field` for caller `who` (`version_key` and the field)."""
    version = version_key(hit, who, tables=tables)
    return None if version is None else (*version, field)


def field_keys(
    versions: Sequence[VersionKey | None], names: Sequence[str]
) -> list[dict[str, CacheKey | None]]:
    """Each hit's cache key per field, from its `version_key`."""
    return [{f: None if v is None else (*v, f) for f in names} for v in versions]


class ProbedDoc:
    """Some tokens' frequencies in one document version, and its exact field length: a partial entry,
    read as a `DocTerms` is (`tf`, `length`).

    `tf` holds every token it knows, those the document lacks with 0 (exact for that token); any
    other token is unknown, so the entry answers only for `tf`'s keys (see `TermVectorCache.get`).

    A window makes one a hit and field (`of`: its row of the probes' table and the field's tokens,
    shared by the window's entries), and most are never read again: the map is made when first read.
    Not frozen: `learn` grows it in place."""

    __slots__ = ("_counts", "_tf", "_tokens", "held", "length")
    found: ClassVar[bool] = True  # as a `DocTerms` of a document found

    def __init__(self, tf: dict[str, int], length: int, held: int = -1) -> None:
        self._tf: dict[str, int] | None = tf
        self._tokens: Sequence[str] = ()
        self._counts: Sequence[int] = ()
        self.length = length
        # its tokens' `token_bytes`, kept exact by `learn` (-1: counted here; a window's entries of one
        # field know the same tokens, counted once for all)
        self.held = token_bytes(tf) if held < 0 else held

    @classmethod
    def of(cls, tokens: Sequence[str], counts: Sequence[int], length: int, held: int) -> ProbedDoc:
        """The entry of `tokens` with `counts` (in their order), its map made when first read."""
        doc = cls.__new__(cls)
        doc._tf, doc._tokens, doc._counts, doc.length, doc.held = None, tokens, counts, length, held
        return doc

    def items(self) -> Iterable[tuple[str, int]]:
        """Its (token, frequency) pairs, without making its map."""
        return self._tf.items() if self._tf is not None else zip(self._tokens, self._counts, strict=True)

    @property
    def tf(self) -> dict[str, int]:
        if self._tf is None:
            self._tf = dict(zip(self._tokens, self._counts, strict=True))
            self._tokens = self._counts = ()
        return self._tf

    def learn(self, added: Mapping[str, int], held: int) -> None:
        """Know `added` too (whose `token_bytes` are `held`): tokens it lacked, exact for this same
        document version. In place, so that a merge costs what it adds, not what the entry knows already
        (a popular document's entry grows with every query that probed it: 9 µs a merge at 400 tokens,
        where a copy took them all). A window reading this entry meanwhile sees more tokens, never
        another count of one."""
        self.tf.update(added)
        self.held += held

    def __eq__(self, other: object) -> bool:
        return type(other) is ProbedDoc and (self.tf, self.length, self.held) == (
            other.tf,
            other.length,
            other.held,
        )

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"ProbedDoc({self.tf!r}, {self.length!r})"


Terms = DocTerms | ProbedDoc  # a document's terms in one field, as an entry holds them


@dataclass(frozen=True)
class KeptScores:
    """A window's scores (`folded`, read-only) and what made them: `how` (the scoring tree, the
    augmentations, their weights, the scoring request) and each field's statistics (`corpora`, held
    weakly and compared by identity). `whole`: the folded tree with every node's parts, which an
    explanation reads; else its root alone (the final scores and what matched), all a page needs."""

    how: Hashable
    corpora: tuple[weakref.ref[Any], ...]
    folded: Folded
    whole: bool

    @classmethod
    def of(cls, how: Hashable, corpora: Sequence[Any], folded: Folded, *, whole: bool) -> KeptScores:
        if not whole:
            folded = Folded(folded.node, folded.scores, folded.matched)
        for node in _nodes(folded):
            for array in (
                node.scores,
                node.matched,
                *((node.leaf.scores, node.leaf.parts) if node.leaf else ()),
            ):
                array.flags.writeable = False  # read again by every repeat: never changed
        return cls(how, tuple(weakref.ref(c) for c in corpora), folded, whole)

    def answer(self, how: Hashable, corpora: Sequence[Any], *, explain: bool = False) -> Folded | None:
        """The scores, if these are what made them (the same statistics objects, still alive) and they
        hold what is asked (`explain`: every node's parts)."""
        if self.how != how or len(corpora) != len(self.corpora) or (explain and not self.whole):
            return None
        same = all(ref() is corpus for ref, corpus in zip(self.corpora, corpora, strict=True))
        return self.folded if same else None

    @property
    def nbytes(self) -> int:
        """Its arrays, labels and objects (estimated)."""
        total = KEPT_BYTES
        for node in _nodes(self.folded):
            total += FOLDED_NODE_BYTES + node.scores.nbytes + node.matched.nbytes
            if node.leaf is not None:
                leaf = node.leaf
                total += LEAF_BYTES + leaf.scores.nbytes + leaf.parts.nbytes + LABEL_BYTES * len(leaf.labels)
        return total


def _nodes(folded: Folded) -> list[Folded]:
    """The folded tree's nodes, depth first."""
    out, todo = [], [folded]
    while todo:
        node = todo.pop()
        out.append(node)
        todo.extend(node.children)
    return out


@dataclass(frozen=True)
class SeenWindow:
    """A window scored whole: its hits' versions and the tokens it was analysed into (`versions_digest`),
    the candidate features its scoring read, and its last scores."""

    versions: bytes
    # (field, vocabulary) -> tf and lengths, as int32 where that is exact (Lucene counts both in ints):
    # half the float64 arrays the scoring core reads
    kept: dict[tuple[str, tuple[str, ...]], tuple[np.ndarray, np.ndarray]]
    scores: KeptScores | None = None
    # a probed window's documents' entries, made only if the window comes back changed (`window`): its
    # unchanged documents then need no `_mtermvectors`; and what holding them weighs
    entries: Callable[[], None] | None = field(default=None, compare=False)
    entries_bytes: int = 0

    @classmethod
    def of(
        cls,
        versions: bytes,
        features: Features,
        scores: KeptScores | None = None,
        entries: Callable[[], None] | None = None,
        entries_bytes: int = 0,
    ) -> SeenWindow:
        kept = {k: (_compact(c.tf), _compact(c.length)) for k, c in features.items()}
        return cls(versions, kept, scores, entries, entries_bytes)

    def scored(self, scores: KeptScores) -> SeenWindow:
        """This window with other scores."""
        return replace(self, scores=scores)

    def features(self) -> Features:
        """The candidate features, as the scoring core read them."""
        return {k: Candidates(tf, length) for k, (tf, length) in self.kept.items()}


def _compact(values: np.ndarray) -> np.ndarray:
    """`values` as int32 where that keeps every value, else as they are."""
    if values.size and not (values.min() >= 0 and values.max() < 2**31):
        return values
    small = values.astype(np.int32)
    return small if np.array_equal(small, values) else values


def versions_digest(
    keys: Sequence[tuple[Any, ...]], tokens: Mapping[tuple[str, str], Sequence[str]]
) -> bytes:
    """A window's hits' versions (their keys, in order) and its analysed tokens, as 16 bytes: BLAKE2b,
    so two windows that differ never meet in practice (2^-64 odds even among 2^32 windows), where the
    keys alone take ~200 bytes a hit."""
    return hashlib.blake2b(orjson.dumps([keys, list(tokens.items())]), digest_size=16).digest()


def entry_bytes(entry: Terms | SeenWindow) -> int:
    """Estimated memory of one cached document's term frequencies (a partial entry's 0s included), or
    of a kept window."""
    if type(entry) is SeenWindow:
        arrays = sum(tf.nbytes + length.nbytes for tf, length in entry.kept.values())
        scores = entry.scores.nbytes if entry.scores is not None else 0
        return WINDOW_OVERHEAD + FEATURE_OVERHEAD * len(entry.kept) + arrays + scores + entry.entries_bytes
    return ENTRY_OVERHEAD + (entry.held if type(entry) is ProbedDoc else token_bytes(entry.tf))


def token_bytes(tf: Mapping[str, int]) -> int:
    """Estimated memory of an entry's tokens: a slot, a str object and an int each, and their text."""
    return TERM_BYTES * len(tf) + sum(map(len, tf))


class TermVectorCache:
    """An LRU map from `CacheKey` to a document's term frequencies, and from `WindowKey` to a window
    kept whole (one seen once in a small LRU beside it), bounded in (estimated) bytes."""

    def __init__(self, max_bytes: int = defaults.CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._items: LRUCache[CacheKey | WindowKey, Terms | SeenWindow] = LRUCache(
            max(1, max_bytes), getsizeof=entry_bytes
        )
        self._recent: LRUCache[WindowKey, SeenWindow] = LRUCache(
            max(1, max_bytes // RECENT_SHARE), getsizeof=entry_bytes
        )

    def get(self, key: CacheKey | None, needs: AbstractSet[str] | None = None) -> Terms | None:
        """The entry, if it answers for every token in `needs` (None: every term, so full term
        vectors only); a partial entry that does not is a miss."""
        if key is None or self.max_bytes <= 0:
            return None
        try:
            entry = self._items[key]  # one lookup (and LRU touch), where `.get` makes two
        except KeyError:
            return None
        if type(entry) is ProbedDoc and (needs is None or not entry.tf.keys() >= needs):
            return None
        return entry  # type: ignore[return-value]  # a `CacheKey` names a document

    def put(self, key: CacheKey | None, terms: Terms) -> None:
        """Keep `terms` under `key`: a partial entry merges with a partial one already there and
        never replaces a full one."""
        if key is None or self.max_bytes <= 0 or not terms.found:
            return
        if type(terms) is ProbedDoc and key in self._items:  # (a new entry needs no lookup)
            old = self._items[key]
            if type(old) is not ProbedDoc:
                return  # full term vectors know every token
            # the union of what both know (each exact for this document version)
            known = old.tf
            added = {t: n for t, n in terms.items() if t not in known}
            held = token_bytes(added)
            if not added or entry_bytes(old) + held > self.max_bytes:
                return  # nothing new, or a merge that outgrows the whole cache: the entry stays
            old.learn(added, held)
            terms = old  # counted again at its new size
        try:
            self._items[key] = terms
        except ValueError:  # a document bigger than the whole cache is not kept
            pass

    def window(self, key: WindowKey, versions: bytes) -> SeenWindow | None:
        """The window kept under `key`, if its hits and tokens were these (`versions_digest`); one seen
        once moves to the main LRU."""
        if self.max_bytes <= 0:
            return None
        seen = self._items.get(key)
        if seen is None and (seen := self._recent.pop(key, None)) is not None:
            self._keep(self._items, key, seen)
        if type(seen) is SeenWindow and seen.versions == versions:
            return seen
        if type(seen) is SeenWindow and seen.entries is not None:
            # changed: its documents' entries, once, for those of its hits that did not change
            seen.entries()
            self._keep(
                self._items if key in self._items else self._recent,
                key,
                replace(seen, entries=None, entries_bytes=0),
            )
        return None

    def holds_window(self, key: WindowKey) -> bool:
        """Whether a window is kept under `key` (whatever its hits now are)."""
        return self.max_bytes > 0 and (key in self._items or key in self._recent)

    def keep_window(self, key: WindowKey, seen: SeenWindow, *, again: bool) -> None:
        """Keep a window scored whole (replacing what `key` held: its hits or tokens changed); `again`:
        its caller had it before (else it goes to the LRU of windows seen once)."""
        if self.max_bytes > 0:
            self._keep(self._items if again or key in self._items else self._recent, key, seen)

    @staticmethod
    def _keep(lru: LRUCache[Any, Any], key: WindowKey, seen: SeenWindow) -> None:
        with contextlib.suppress(ValueError):  # a window bigger than its LRU is not kept
            lru[key] = seen

    @property
    def bytes(self) -> int:
        return int(self._items.currsize + self._recent.currsize)

    def __len__(self) -> int:
        return len(self._items) + len(self._recent)
