"""A lean window over one index of several shards: one search per shard, merged as the cluster merges.

In an index of several shards `_seq_no` names a document version only within its shard, and a hit
without stored fields does not say its shard. Searching each shard on its own (`preference=_shards:i`)
says it, at the price of a search per shard the cluster runs anyway: a search of N shards is N shard
searches. The cluster's own merge is simple enough to do here exactly: each shard scores with its own
statistics in both cases (`query_then_fetch`), hits are ordered by score and, between equal scores,
by shard number (checked on Elasticsearch 8.19 and OpenSearch 2.19), totals add up to the
`track_total_hits` bound. What would not merge exactly (aggregations, `search_type`, `routing`, a
caller's own `preference`) keeps the window from being searched so (`lean.narrow`)."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from itertools import chain, repeat
from operator import attrgetter
from typing import Any, overload

import msgspec
import numpy as np
import orjson
from cachetools import TTLCache

from bmx_rerank.rerank.hits import SHARD, HitColumns, scores
from bmx_rerank.rerank.window import Window

# Shard preferences tried in turn, until the cluster takes one: Elasticsearch keeps the caller's
# replica choice after `|` (a custom string: every page of a query reads the same copies); OpenSearch
# takes only its named preferences there (`_primary`: the same copy every time, too)
FORMS = ("_shards:{shard}|{custom}", "_shards:{shard}|_primary")
# What a merged answer may hold at its top: anything else (aggregations, suggestions, a PIT id,
# profiles, remote clusters) is not merged here, and the window goes again in full
MERGED = frozenset({"took", "timed_out", "_shards", "hits", "terminated_early"})
_SCORE, _INDEX, _SEQ_NO, _PRIMARY_TERM = map(attrgetter, ("score", "index", "seq_no", "primary_term"))
DEFAULT_TRACK_TOTAL_HITS = 10_000  # the bound a search counts its hits to when it names none
# Hits asked of a shard beyond its share of the window the last time (at least; or an eighth more):
# enough that its last one ranks below the window when nothing changed, and a little change does not
# send the shards' searches again whole (`shard_sizes`)
SIZE_MARGIN = 8
# What a shard is asked for beyond its even share of a window no split is known of (a first sight), in
# standard deviations of its count were a shard's hits of a window ~Binomial(n, 1/shards) (routed by
# `_id`): 49 hits of a window of 100 over 3 shards, 379 of 1,000. Real windows gather on one shard more
# than that (each shard scores with its own statistics): measured over 3 shards, a share of a window of
# 100 passes it in 0.1 % of SciFact's queries and 5 % of NFCorpus's (at five deviations, 58 hits: 0.1
# and 2.6 %; `benchmarks/shard_shares.py`). A short share costs the shards' searches again (`ShortShares`)
EVEN_SPREAD = 3.0
# An index whose first sights' even shares fell short this often, of its last first sights, has its
# first sights ask every shard for the whole window for a while (`ShortShares`): a share short now and
# then costs less than asking for whole windows always; one short often (an index routed by a value of
# its own) costs a second search each time
UNEVEN_SHORTS, UNEVEN_OF = 8, 32
# A window's parameters an `_msearch` header line takes as they are (strings, as in a URL); any other
# but `preference` (and the probes' own, on the `_msearch` URL where the cluster takes it: Elasticsearch
# does, OpenSearch 2.19 and 3.3 do not) sends one search a shard
MSEARCH_HEADER = frozenset({"request_cache", "allow_no_indices", "ignore_unavailable", "expand_wildcards"})


def preference(form: int, shard: int, custom: str | None) -> str:
    """The preference that sends a search to shard `shard` alone, in `FORMS[form]`."""
    return FORMS[form].format(shard=shard, custom=custom or "bmx")


async def search_each(
    send: Callable[[dict[str, Any] | None, Mapping[str, str]], Awaitable[Any]],
    window: Window,
    form: int,
    sizes: Sequence[int] | None = None,
) -> list[Any]:
    """The window's search sent to each of its shards at once, with `send` (the front end's first
    stage): the answers in shard order. `sizes`: the hits asked of each shard (`shard_sizes`), else
    the whole window."""
    custom = window.params.get("preference")
    body = window.body
    assert body is not None
    return list(
        await asyncio.gather(
            *(
                send(
                    body if sizes is None else {**body, "size": sizes[i]},
                    {**window.params, "preference": preference(form, i, custom)},
                )
                for i in range(window.shards)
            )
        )
    )


def msearch_body(
    window: Window,
    form: int,
    *,
    on_url: AbstractSet[str] = frozenset(),
    sizes: Sequence[int] | None = None,
) -> bytes | None:
    """The window's search of each of its shards as one `_msearch` body (NDJSON), None when one of its
    parameters has no place in an `_msearch` header line (`in_header`), but those `on_url` (sent as the
    `_msearch`'s own). `sizes`: the hits asked of each shard (`shard_sizes`), else the whole window."""
    params = {k: v for k, v in window.params.items() if k not in on_url}
    if not in_header(params) or window.body is None:
        return None
    custom = params.pop("preference", None)
    body = window.body
    if sizes is None:
        searches = [orjson.dumps(body)] * window.shards
    else:
        searches = [orjson.dumps({**body, "size": n}) for n in sizes]
    lines = msearch_lines(
        window.index_expr,
        ((params | {"preference": preference(form, i, custom)}, searches[i]) for i in range(window.shards)),
    )
    return b"\n".join(lines) + b"\n"


def shard_sizes(
    body: Mapping[str, Any], counts: Sequence[int] | None, shards: int, spread: float = EVEN_SPREAD
) -> list[int] | None:
    """What to ask each of `shards` shards for, for a window whose hits came `counts[i]` from shard i
    the last time: that and a margin (`SIZE_MARGIN`), instead of the whole window each (a window of
    1,000 over 3 shards: ~1,100 hits decoded instead of 3,000). With no count known (a first sight):
    an even share and a margin of `spread` deviations (`EVEN_SPREAD`; another in
    benchmarks/shard_shares.py). None (the whole window each): a search whose shards' answers may
    depend on how many hits they are asked for (`terminate_after`, a count bound of its own). Whether
    the answers hold the window is checked (`hold_window`)."""
    if "terminate_after" in body or type(body.get("track_total_hits", True)) is not bool:
        return None
    size = int(body.get("size", 10))
    if counts is None:
        margin = math.ceil(spread * math.sqrt(size * (shards - 1)) / shards)
        return [min(size, -(-size // shards) + max(SIZE_MARGIN, margin))] * shards
    return [min(size, n + max(SIZE_MARGIN, n // 8)) for n in counts]


class ShortShares:
    """The indices whose first sights ask every shard for the whole window, not an even share: those
    whose even shares fell short in `UNEVEN_SHORTS` of their last `UNEVEN_OF` first sights, for `ttl`
    seconds. Bounded: `indices` index expressions each remembered, and as many marked."""

    def __init__(self, indices: int, ttl: float, timer: Callable[[], float] = time.monotonic) -> None:
        self.marked: TTLCache[str, bool] = TTLCache(maxsize=indices, ttl=ttl, timer=timer)
        # index expression -> its last first sights, one bit each (1: short), the newest lowest
        self.record: TTLCache[str, int] = TTLCache(maxsize=indices, ttl=ttl, timer=timer)

    def __contains__(self, index_expr: object) -> bool:
        return index_expr in self.marked

    def add(self, index_expr: str, short: bool) -> None:
        """Record whether a first sight's even shares on `index_expr` fell short."""
        record = ((self.record.get(index_expr, 0) << 1) | short) & ((1 << UNEVEN_OF) - 1)
        if record.bit_count() >= UNEVEN_SHORTS:
            self.marked[index_expr] = True
            self.record.pop(index_expr, None)
        else:
            self.record[index_expr] = record


def hold_window(answers: Sequence[Mapping[str, Any]], sizes: Sequence[int], size: int) -> bool:
    """Whether each shard's first `sizes[i]` hits hold every hit of its that the window of `size` would
    rank: a shard that sent as many as it was asked must end below the window's last score (its
    hits not sent score no higher than its last, and one equal to the window's last could rank
    before it). A shard's hits are its first hits of a larger search too (Lucene ranks by score,
    then document: the same order for any size). A hit without a score holds nothing."""
    each = [_scores(answer["hits"].get("hits", [])) for answer in answers]
    if any(s is None for s in each):
        return False
    every = np.concatenate(each)  # type: ignore[arg-type]
    last = -np.partition(-every, size - 1)[size - 1] if len(every) >= size else -np.inf
    return all(
        len(found) < asked or asked >= size or found[-1] < last  # type: ignore[arg-type,index]
        for found, asked in zip(each, sizes, strict=True)
    )


def _scores(hits: Sequence[Any]) -> np.ndarray | None:
    """A shard's hits' scores, None where one has none: its `Hit`s' read in one C-level pass (a `Hit`
    always has one)."""
    if hits and isinstance(hits[0], Hit):
        return np.fromiter(map(_SCORE, hits), np.float64, len(hits))
    found = [h.get("_score") for h in hits]
    return None if None in found else np.fromiter(found, np.float64, len(found))


def in_header(params: Mapping[str, str]) -> bool:
    """Whether an `_msearch` header line can carry these search parameters (`MSEARCH_HEADER`, and the
    shard's own `preference`)."""
    return set(params) - {"preference"} <= MSEARCH_HEADER


def msearch_lines(index_expr: str, searches: Iterable[tuple[Mapping[str, str], bytes]]) -> list[bytes]:
    """An `_msearch`'s NDJSON lines: for each search (its header parameters, its JSON body) a header
    line naming `index_expr`, then the body."""
    return [
        line for params, body in searches for line in (orjson.dumps({"index": index_expr, **params}), body)
    ]


def items(answer: Mapping[str, Any] | None, shards: int) -> list[dict[str, Any]] | None:
    """An `_msearch` answer's items as the shards' search answers (in shard order), None unless each
    is a success."""
    found = (answer or {}).get("responses")
    if not isinstance(found, list) or len(found) != shards:
        return None
    out = []
    for item in found:
        if not isinstance(item, dict) or "error" in item or int(item.get("status", 200)) >= 300:
            return None
        out.append({k: v for k, v in item.items() if k != "status"})
    return out


class Hit(msgspec.Struct, gc=False, forbid_unknown_fields=True, kw_only=True):
    """A lean window's hit as a shard sends it, decoded into no dict (`decode`): any other field, or
    one of another type, fails its decoding, and the answer is decoded whole."""

    # the fields in the order the cluster sends them (`to_builtins` keeps it); what names a lean hit
    # required: a window of `Hit`s is versioned (`HitColumns.versioned`)
    index: str = msgspec.field(name="_index")
    version: Any = msgspec.field(name="_version", default=msgspec.UNSET)
    seq_no: int = msgspec.field(name="_seq_no")
    primary_term: int = msgspec.field(name="_primary_term")
    score: float = msgspec.field(name="_score")  # a window's, with no sort: always a number
    matched_queries: Any = msgspec.UNSET  # the probes'


# a JSON key of a hit -> its `Hit` field
_HIT_FIELDS = {f.encode_name: f.name for f in msgspec.structs.fields(Hit)}


class _Hits(msgspec.Struct, gc=False, forbid_unknown_fields=True):
    hits: list[Hit] = msgspec.field(default_factory=list)
    total: Any = msgspec.UNSET
    max_score: Any = msgspec.UNSET


class _Item(msgspec.Struct, gc=False, forbid_unknown_fields=True):
    hits: _Hits
    took: Any = msgspec.UNSET
    timed_out: Any = msgspec.UNSET
    shards: Any = msgspec.field(name="_shards", default=msgspec.UNSET)
    terminated_early: Any = msgspec.UNSET
    status: int = 200

    def answer(self) -> dict[str, Any]:
        """The item as `items` gives it, its hits left `Hit`s."""
        top = {"took": self.took, "timed_out": self.timed_out, "_shards": self.shards}
        top["terminated_early"] = self.terminated_early
        hits = {"total": self.hits.total, "max_score": self.hits.max_score, "hits": self.hits.hits}
        return {
            **{k: v for k, v in top.items() if v is not msgspec.UNSET},
            "hits": {k: v for k, v in hits.items() if v is not msgspec.UNSET},
        }


class _Msearch(msgspec.Struct, gc=False):
    responses: list[_Item]


_decode = msgspec.json.Decoder(_Msearch).decode


def decode(payload: bytes, shards: int) -> list[dict[str, Any]] | None:
    """An `_msearch` answer's items as `items` reads them, each shard's hits decoded as `Hit`s: no
    dict made or freed a hit, when most never make the window (a window of 1,000 over 3 shards keeps
    a third). An answer a `Hit` or `_Item` does not describe (an error, an aggregation, a field of
    its own) is decoded whole, as before."""
    try:
        found = _decode(payload).responses
    except msgspec.ValidationError:
        whole = _whole(payload)
        return None if whole is None else items(whole, shards)
    except msgspec.DecodeError:  # not JSON
        return None
    if len(found) != shards or any(item.status >= 300 for item in found):
        return None
    return [item.answer() for item in found]


_decode_search = msgspec.json.Decoder(_Item).decode


def decode_search(payload: bytes) -> tuple[dict[str, Any], HitColumns | None] | None:
    """A lean window's answer from its one shard, as `decode` reads an `_msearch`'s: its hits decoded
    as `Hit`s (each made a dict only when read, unmarked: `WindowHits`) and their columns read from
    them; an answer a `Hit` or `_Item` does not describe (an aggregation, a field of its own, an
    error) decoded whole, with no columns; None when it is no JSON object. A repeated
    window of 1,000 is 0.6-0.7 ms faster so (benchmarks/RESULTS.md)."""
    try:
        item: _Item | None = _decode_search(payload)
    except msgspec.ValidationError:
        item = None
    except msgspec.DecodeError:  # not JSON
        return None
    # an engine writes `terminated_early` before `_shards`: decoded whole, in the engine's own order
    if item is None or item.terminated_early is not msgspec.UNSET or item.status != 200:
        whole = _whole(payload)
        return None if whole is None else (whole, None)
    found = item.hits.hits
    answer = item.answer()
    answer["hits"]["hits"] = hits = WindowHits(found, None)
    scores = np.fromiter(map(_SCORE, found), np.float64, len(found))
    return answer, _typed_columns(hits, found, [None] * len(found), scores)  # searched whole


def decode_each(payloads: Sequence[bytes]) -> list[dict[str, Any]] | None:
    """The answers of a window's search sent to each shard on its own (`search_each`), as `decode` reads
    an `_msearch`'s items: each shard's hits as `Hit`s, or, where one answer is not so described, every
    answer decoded whole (a merge reads one form of hit); None where one is no JSON object."""
    try:
        return [_decode_search(payload).answer() for payload in payloads]
    except msgspec.ValidationError:
        pass
    except msgspec.DecodeError:  # not JSON
        return None
    out = []
    for payload in payloads:
        if (whole := _whole(payload)) is None:
            return None
        out.append(whole)
    return out


def _whole(payload: bytes) -> dict[str, Any] | None:
    """An answer a `Hit` or `_Item` does not describe, decoded whole; None where it is no JSON object,
    or JSON that orjson does not take (an integer past 64 bits)."""
    try:
        whole = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
    return whole if isinstance(whole, dict) else None


def _typed_columns(
    hits: Sequence[dict[str, Any]], typed: list[Hit], shards: list[Any], scores: np.ndarray
) -> HitColumns:
    """The columns of a window's `hits`, read from their `Hit`s (`typed`, in the same order), with each
    hit's shard and score."""
    return HitColumns(
        hits,
        *(list(map(read, typed)) for read in (_INDEX, _SEQ_NO, _PRIMARY_TERM)),
        shards,
        True,  # `Hit` requires both, as integers
        scores,
    )


def merge(
    answers: Sequence[Mapping[str, Any]], body: Mapping[str, Any]
) -> tuple[dict[str, Any], HitColumns] | None:
    """The answers of one search sent to each shard (in shard order) as the search of every shard
    would have answered, each hit of the window marked with its shard (`SHARD`): in place (the answers
    are this search's own), or as it is made a dict (`Hit`s, from `decode`: `WindowHits`); and its
    hits' columns (of `Hit`s, read from them and from the merge's own scores and shards); None when
    one holds what is not merged here (`MERGED`)."""
    if any(not set(a) <= MERGED or not isinstance(a.get("hits"), Mapping) for a in answers):
        return None
    size = int(body.get("size", 10))
    # Every shard's hits in shard order, ranked by score with a stable sort: between equal scores the
    # lower shard first, and a shard's own order. Only the hits that make the window are marked (each
    # shard sent a whole window of its own); a window of 1,000 on 3 shards ranks 3,000 hits.
    each = [answer["hits"].get("hits", []) for answer in answers]
    every = list(chain.from_iterable(each))
    typed = bool(every) and isinstance(every[0], Hit)
    first = np.fromiter(map(_SCORE, every), np.float64, len(every)) if typed else scores(every)
    ranked = np.argsort(-first, kind="stable")[:size]
    # each ranked hit's shard: how many shards' hits lie before it in `every`
    shard_of = np.searchsorted(np.cumsum([len(hits) for hits in each]), ranked, side="right").tolist()
    hits: dict[str, Any] = {}
    total = _total([a["hits"].get("total") for a in answers], body.get("track_total_hits"))
    if total is not None:
        hits["total"] = total
    tops = [a["hits"]["max_score"] for a in answers if a["hits"].get("max_score") is not None]
    hits["max_score"] = max(tops) if tops else None
    window = list(map(every.__getitem__, ranked.tolist()))
    if typed:  # made dicts only when read (a probed window's probes read from the `Hit`s)
        hits["hits"] = WindowHits(window, shard_of)
        columns = _typed_columns(hits["hits"], window, shard_of, first[ranked])  # the merge's scores
    else:
        # marked in place: a third of the time of a copy of each (0.37 -> 0.14 ms for a window of 1,000)
        for hit, shard in zip(window, shard_of, strict=True):
            hit[SHARD] = shard
        hits["hits"] = window
        columns = HitColumns.of(window)
    merged: dict[str, Any] = {
        "took": max(int(a.get("took", 0)) for a in answers),
        "timed_out": any(a.get("timed_out") for a in answers),
        "_shards": _shards([a.get("_shards") or {} for a in answers]),
    }
    early = [a["terminated_early"] for a in answers if "terminated_early" in a]
    if early:
        merged["terminated_early"] = any(early)
    merged["hits"] = hits
    return merged, columns


class WindowHits(Sequence[dict[str, Any]]):
    """A window's `Hit`s, each made a dict (as the cluster sent it, marked with its shard where the
    window was merged from several) when first read: a rerank reads their columns (`column`), the
    probes' `matched_queries` (`take_matched`) and the dicts of a few (its page, the page fetched
    ahead)."""

    __slots__ = ("_hits", "_shards", "_made", "_all")

    def __init__(self, hits: list[Hit], shards: list[int] | None) -> None:
        self._hits, self._shards = hits, shards
        self._made: list[dict[str, Any] | None] = [None] * len(hits)
        self._all = False

    def __len__(self) -> int:
        return len(self._hits)

    @overload
    def __getitem__(self, i: int) -> dict[str, Any]: ...
    @overload
    def __getitem__(self, i: slice) -> list[dict[str, Any]]: ...
    def __getitem__(self, i: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        made = self._made[i]
        if made is None:
            made = msgspec.to_builtins(self._hits[i])
            self._made[i] = made if self._shards is None else _marked(made, self._shards[i])
        return made

    def column(self, key: str, default: Any = None) -> list[Any]:
        """Every hit's `key` (`default` where it has none), as `HitColumns.column` reads it, with no
        dict made: a hit not made one has a `Hit`'s fields alone (and its shard's mark)."""
        field = _HIT_FIELDS.get(key)
        if self._made.count(None) != len(self._made):  # some made (a caller may have marked them)
            return list(map(self._read, range(len(self._hits)), repeat(key), repeat(field), repeat(default)))
        if field is not None:
            values = list(map(attrgetter(field), self._hits))
            if msgspec.UNSET in values:
                return [default if v is msgspec.UNSET else v for v in values]
            return values
        return (
            list(self._shards) if key == SHARD and self._shards is not None else [default] * len(self._hits)
        )

    def _read(self, i: int, key: str, field: str | None, default: Any) -> Any:
        made = self._made[i]
        if made is not None:
            return made.get(key, default)
        if field is not None:
            value = getattr(self._hits[i], field)
            return default if value is msgspec.UNSET else value
        return self._shards[i] if key == SHARD and self._shards is not None else default

    def take_matched(self) -> list[Any]:
        """Each hit's `matched_queries` (None where it has none), taken from it: read from the `Hit`s,
        no dict made (a probed window's probes: `tf_probe.take_frequencies`); a hit made a dict after
        this shows none."""
        out: list[Any] = []
        for hit, made in zip(self._hits, self._made, strict=True):
            if made is not None:
                out.append(made.pop("matched_queries", None))
            else:
                out.append(None if hit.matched_queries is msgspec.UNSET else hit.matched_queries)
            hit.matched_queries = msgspec.UNSET
        return out

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if not self._all:  # every hit made at once (those made already kept: a caller may have marked them)
            fresh = msgspec.to_builtins(self._hits)
            if self._shards is not None:
                fresh = map(_marked, fresh, self._shards)
            self._made = [m if m is not None else f for m, f in zip(self._made, fresh, strict=True)]
            self._all = True
        return iter(self._made)  # type: ignore[arg-type]


def _marked(hit: dict[str, Any], shard: int) -> dict[str, Any]:
    hit[SHARD] = shard
    return hit


def _total(totals: Sequence[Any], track: Any) -> Any:
    """The shards' hit counts added up as the cluster adds them: an exact sum up to the search's
    `track_total_hits` bound, that bound as a lower bound past it (a count as an integer stays one)."""
    if any(t is None for t in totals):
        return None
    if all(isinstance(t, int) for t in totals):
        return sum(totals)
    value = sum(int(t["value"]) for t in totals)
    relation = "gte" if any(t.get("relation") == "gte" for t in totals) else "eq"
    bound = DEFAULT_TRACK_TOTAL_HITS if track is None else track
    if isinstance(bound, int) and not isinstance(bound, bool) and value > bound:
        value, relation = bound, "gte"
    return {"value": value, "relation": relation}


def _shards(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {
        k: sum(int(p.get(k, 0)) for p in parts) for k in ("total", "successful", "skipped", "failed")
    }
    failures = [f for p in parts for f in p.get("failures", [])]
    if failures:
        out["failures"] = failures
    return out
