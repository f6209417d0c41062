"""tf_probe's pure parts: where probes may go, how they are placed, and how hits are read back; the
term-vector cache's entries."""

from __future__ import annotations

import dataclasses
import gc
import tracemalloc
from types import MappingProxyType

import numpy as np
import orjson
import pytest

from bmx_rerank.rerank import tf_probe
from bmx_rerank.rerank.frequencies import ProbedTerms, TermFrequencies
from bmx_rerank.rerank.hits import SHARD, HitColumns
from bmx_rerank.rerank.query import Text
from bmx_rerank.rerank.rescore import score_tree
from bmx_rerank.rerank.term_vector_cache import (
    FEATURE_OVERHEAD,
    RECENT_SHARE,
    WINDOW_OVERHEAD,
    KeptScores,
    Naming,
    ProbedDoc,
    SeenWindow,
    TermVectorCache,
    cache_key,
    entry_bytes,
    hits_digest,
    token_bytes,
    version_key,
    version_keys,
    versions_digest,
)
from bmx_rerank.scoring import Candidates, Request
from bmx_rerank.stats.corpus import CorpusStats
from bmx_rerank.upstream import Cluster, DocRef, DocTerms


def _why(body: dict, params: dict | None = None) -> str | None:
    return tf_probe.why_not(body, orjson.dumps(body), params or {})


def test_why_not_refuses_every_shape_whose_answer_would_show_the_probes():
    q = {"match": {"body": "a b"}}
    assert _why({"query": q, "min_score": 1, "aggs": {"n": {"value_count": {"field": "x"}}}}) is None
    assert _why({"query": q, "explain": True}) == "explain"
    assert _why({"query": q, "profile": True}) == "explain"
    assert _why({"query": q}, {"explain": "true"}) == "explain"
    assert _why({"query": q, "highlight": {"fields": {"body": {}}}}) == "highlight"
    assert _why({"query": {"match": {"body": {"query": "a", "_name": "mine"}}}}) == "named_queries"
    assert _why({"query": q, "aggs": {"t": {"top_hits": {"size": 1}}}}) == "inner_hits"
    assert _why({"query": q, "collapse": {"field": "k", "inner_hits": {"name": "x"}}}) == "inner_hits"
    assert _why({"size": 10}) == "no_query"


def test_with_probes_wraps_the_callers_query_in_a_branch_that_never_matches():
    probe = tf_probe.Probe((("body", "a"), ("title", "b")))
    caller = {"bool": {"should": [{"match": {"body": "a"}}], "minimum_should_match": 1}}
    body = tf_probe.with_probes({"query": caller, "size": 5}, probe)
    assert body["size"] == 5
    outer = body["query"]["bool"]
    assert set(outer) == {"should"}, "a disjunction of two: no minimum_should_match, no must"
    mine, never = outer["should"]
    assert mine == caller, "wrapped, never merged into"
    assert never["bool"]["filter"] == [{"term": {"_id": tf_probe.NEVER}}]
    named = [c["intervals"][f] for c, f in zip(never["bool"]["should"][:2], ("body", "title"), strict=True)]
    assert [n["_name"] for n in named] == ["_bmx_tf_0", "_bmx_tf_1"]
    assert [n["match"]["query"] for n in named] == ["a", "b"]
    assert never["bool"]["should"][2] == {"match_all": {"_name": tf_probe.CANARY}}


def test_take_frequencies_reads_tf_and_refuses_what_it_cannot_read_exactly():
    probe = tf_probe.Probe((("body", "a"), ("body", "b")))
    ok = tf_probe.CANARY
    hits = [
        {"_id": "1", "matched_queries": {"_bmx_tf_0": 0.75, "_bmx_tf_1": 0.5, ok: 1.0}},
        {"_id": "2", "matched_queries": {ok: 1.0}},  # neither token: tf 0, exactly
        {"_id": "3", "matched_queries": {"_bmx_tf_0": 0.75}},  # no canary: probes not evaluated
        {"_id": "4"},  # nothing at all
        {"_id": "5", "matched_queries": {"_bmx_tf_0": 1.0, ok: 1.0}},  # saturated: tf too large
        {"_id": "6", "matched_queries": {"_bmx_tf_1": "NaN", ok: 1.0}},
        {"_id": "7", "matched_queries": MappingProxyType({"_bmx_tf_1": 0.5, ok: 1.0})},  # any map
        {"_id": "8", "matched_queries": ["_bmx_tf_0", ok]},  # names without scores
    ]
    got = tf_probe.take_frequencies(hits, probe)
    assert got.rows() == [
        {"body": {"a": 3, "b": 1}},
        {"body": {"a": 0, "b": 0}},
        None,
        None,
        None,
        None,
        {"body": {"a": 0, "b": 1}},
        None,
    ]
    # the table's columns as scoring reads them: a token not probed has tf 0, as an entry's `get`
    assert got.tf("body", ["b", "zz", "a"], [1, 0]).tolist() == [[0.0, 0.0, 0.0], [1.0, 0.0, 3.0]]
    assert got.tf("body", ["b", "a"], [1, 0]).tolist() == [[0.0, 0.0], [1.0, 3.0]], "every token probed"
    assert all("matched_queries" not in h for h in hits)


def test_take_frequencies_reads_each_field_of_interleaved_probes():
    probe = tf_probe.Probe((("title", "a"), ("body", "a"), ("title", "b"), ("body", "c")))
    ok = tf_probe.CANARY
    hits = [
        {"matched_queries": {"_bmx_tf_3": 0.5, ok: 1.0, "_bmx_tf_0": 0.8, "_bmx_tf_2": 0.5}},
        {"matched_queries": {"_bmx_tf_1": True, ok: 1.0}},  # a boolean is no score: not read
        {"matched_queries": {"_bmx_tf_1": 0.5, "someone_elses": 0.9, ok: 1.0}},
    ]
    got = tf_probe.take_frequencies(hits, probe)
    assert got.rows() == [
        {"title": {"a": 4, "b": 1}, "body": {"a": 0, "c": 1}},
        None,
        {"title": {"a": 0, "b": 0}, "body": {"a": 1, "c": 0}},
    ]
    assert got.tf("title", ["a", "b", "c"], [2, 0]).tolist() == [[0.0, 0.0, 0.0], [4.0, 1.0, 0.0]]
    assert got.of(0) is not got.of(0), "each hit's maps its own: the cache grows them in place"


def test_a_probed_windows_entries_are_made_a_field_at_a_time_and_only_for_a_cache_that_keeps_them():
    probe = tf_probe.Probe((("body", "a"), ("title", "a"), ("body", "b")))
    ok = tf_probe.CANARY
    hits = [
        {"matched_queries": {"_bmx_tf_0": 0.75, "_bmx_tf_1": 0.5, ok: 1.0}},
        {"matched_queries": {"_bmx_tf_2": 0.5}},  # no canary: read from its term vectors
        {"matched_queries": {ok: 1.0}},
        {"matched_queries": {ok: 1.0}},  # its length unknown: dropped
    ]
    counts = tf_probe.take_frequencies(hits, probe)
    assert counts.tokens("body") == ("a", "b") and counts.tokens("title") == ("a",)
    assert counts.counts_of("body", [2, 0]) == [[0, 0], [3, 0]]
    assert counts.counts_of("title", [0]) == [[1]]
    vectors = {"body": _full({"a": 2, "b": 1, "c": 4}), "title": _full({"x": 1})}
    lengths = np.array([[7, 2], [-1, -1], [5, 1], [-1, 3]])
    found = ProbedTerms(
        counts, ["body", "title"], lengths, np.array([True, False, True, False]), {1: vectors}
    )
    # scored from the table where probed, from the term vectors where not, in the window's order
    features = found.features("body", ["a", "c", "b"])
    assert features.tf.tolist() == [[3.0, 0.0, 0.0], [2.0, 4.0, 1.0], [0.0, 0.0, 0.0]]
    assert features.length.tolist() == [7.0, 7.0, 5.0]  # the term vectors' length: their sum
    table_only = ProbedTerms(counts, ["body", "title"], lengths, np.array([True, False, True, False]))
    assert table_only.alive == [0, 2]
    assert table_only.features("title", ["a"]).tf.tolist() == [[1.0], [0.0]]
    assert table_only.features("title", ["a"]).length.tolist() == [2.0, 1.0]
    entries = found.entries()
    assert [(i, f) for i, f, _ in entries] == [(h, f) for h in (0, 1, 2) for f in ("body", "title")], (
        "in the window's order, each hit's fields in theirs, the dropped hit left out"
    )
    assert entries[0][2] == ProbedDoc({"a": 3, "b": 0}, 7) and entries[1][2] == ProbedDoc({"a": 1}, 2)
    assert entries[2][2] is vectors["body"] and entries[4][2] == ProbedDoc({"a": 0, "b": 0}, 5)
    assert entries[0][2].tf is not entries[4][2].tf, "each entry's map its own: the cache grows it in place"
    made = entries[0][2]
    assert dict(made.items()) == {"a": 3, "b": 0} and made.held == ProbedDoc({"a": 3, "b": 0}, 7).held
    for n, hit in enumerate(hits, start=1):  # named by version; the third hit has none
        hit.update({"_index": "i", "_id": str(n), "_seq_no": 1 if n != 3 else None, "_primary_term": 1})
    frequencies = TermFrequencies(None, None, cache=TermVectorCache(), lengths=tf_probe.LengthCache())  # type: ignore[arg-type]
    frequencies.remember(HitColumns.of(hits), Naming("u"), ["body", "title"], found)
    cache = frequencies.cache
    assert len(cache) == 4, "two fields of two named hits; the third has no version"
    assert cache.get(("u", "i", "1", 1, 1, "title"), {"a"}) == ProbedDoc({"a": 1}, 2)
    assert cache.get(("u", "i", "2", 1, 1, "body")) is vectors["body"]

    class Unmade(ProbedTerms):
        def entries(self):
            raise AssertionError("no entry is made for a cache that keeps none")

    class Unnamed(Naming):
        def keys(self, hits):
            raise AssertionError("nor are the hits' keys")

    off = TermFrequencies(None, None, cache=TermVectorCache(0), lengths=tf_probe.LengthCache())  # type: ignore[arg-type]
    unmade = Unmade(counts, ["body"], lengths, found.scored)
    off.remember(HitColumns.of(hits), Unnamed("u"), ["body", "title"], unmade)


def test_version_keys_name_a_window_as_version_key_names_each_hit():
    hits = [
        {"_index": ix, "_seq_no": seq, "_primary_term": term, SHARD: shard}
        for ix in ("a", "b", "gone")
        for seq in (-1, 0, 7, True)
        for term in (1, 2, None)
        for shard in (0, 2)
    ] + [{"_seq_no": 1, "_primary_term": 1}, {"_index": "a", "_id": "x", "_seq_no": 1, "_primary_term": 1}]
    named = [
        {"_index": ix, "_id": f"d{seq}", "_seq_no": seq, "_primary_term": term, SHARD: shard}
        for ix in ("a", "b")
        for seq in (0, 7)
        for term in (1, 2)
        for shard in (0, 2)
    ] + [{"_index": "b", "_id": "x", "_seq_no": 3, "_primary_term": 1}]  # no shard: 0
    # hit by hit (some hit is named otherwise) and at once (every hit is named alike): the same keys
    for window in (hits, named, named[:1], []):
        for tables in (None, {"a": "T1", "b": "T2"}):
            assert version_keys(HitColumns.of(window), "alice", tables=tables) == [
                version_key(h, "alice", tables=tables) for h in window
            ]
    assert None not in version_keys(HitColumns.of(named), "alice", tables={"a": "T1", "b": "T2"})
    one = HitColumns.of(hits[:1])
    assert version_keys(one, "alice", tables={"a": "T1"}) == [None], "a negative _seq_no names nothing"
    lean = {"_index": "a", "_seq_no": 7, "_primary_term": 1, SHARD: 2}
    assert version_keys(HitColumns.of([lean]), "alice", tables={"a": "T1"}) == [("alice", "a", "@T1/2", 7, 1)]


def test_keys_made_later_are_the_keys_made_now_whatever_becomes_of_the_hits():
    """`Naming.later` (a kept window's keys, made only if it comes back changed) names the hits as
    `Naming.keys` did when it was called, though the hits' dicts are emptied since: a lean window's
    from the columns it holds, any other's made at once."""
    lean = [{"_index": "a", "_seq_no": n, "_primary_term": 1, SHARD: n % 3} for n in range(5)]
    named = [{"_index": "a", "_id": f"d{n}", "_seq_no": n, "_primary_term": 1} for n in range(5)]
    odd = [*lean, {"_index": "gone", "_seq_no": 1, "_primary_term": 1}]  # an index without a table
    for hits, naming in (
        (lean, Naming("alice", {"a": "T1"})),
        (named, Naming("alice")),
        (odd, Naming("alice", {"a": "T1"})),
    ):
        columns = HitColumns.of(hits)
        now, later = naming.keys(columns), naming.later(columns)
        for hit in hits:
            hit.clear()
        assert later() == now and len(now) == len(hits)


def test_a_windows_digest_names_exactly_its_hits_versions_and_tokens():
    tokens = {("body", "a b"): ["a", "b"]}
    lean = [{"_index": "a", "_seq_no": n, "_primary_term": 1, SHARD: n % 2} for n in range(6)]
    named = [{"_index": "a", "_id": f"d{n}", "_seq_no": n, "_primary_term": 1} for n in range(6)]
    tables = {"a": "T1"}

    def digest(hits, who="alice", tokens=tokens, tables=None):
        return hits_digest(HitColumns.of(hits), who, tokens, tables=tables)

    for hits, on in ((lean, tables), (named, None)):
        one = digest(hits, tables=on)
        assert one is not None and len(one) == 16 and one == digest([dict(h) for h in hits], tables=on)
        changed = [{**hits[0], "_seq_no": 99}, *hits[1:]]
        others = [
            digest(changed, tables=on),
            digest(hits[::-1], tables=on),
            digest(hits[:-1], tables=on),
            digest(hits, "bob", tables=on),
            digest(hits, tokens={("body", "a b"): ["a"]}, tables=on),
        ]
        assert len({one, *others}) == 1 + len(others), "another version, order, caller or token: another"
    assert digest(lean, tables={"a": "T2"}) != digest(lean, tables=tables), "a re-created index's table"
    moved = [{**lean[0], SHARD: 1}, *lean[1:]]
    assert digest(moved, tables=tables) != digest(lean, tables=tables), "the same version in another shard"
    # a hit named otherwise: the digest of its keys, as each is named hit by hit; none for a hit without
    odd = [*named, {"_index": "a", "_id": 7, "_seq_no": 7, "_primary_term": 1}]
    keys = version_keys(HitColumns.of(odd), "alice")
    assert None not in keys and digest(odd) == versions_digest(keys, tokens)
    assert digest([*named, {"_index": "a", "_id": "x"}]) is None, "no version: no digest"
    assert digest(lean, tables={"b": "T1"}) is None, "no table for its index"


def _probed(tf: dict[str, int], length: int = 9) -> ProbedDoc:
    return ProbedDoc(tf, length)


def _full(tf: dict[str, int]) -> DocTerms:
    return DocTerms(DocRef("i", "d"), True, tf, 1, 5, 1)


KEY = ("alice", "i", "d", 5, 1, "body")


def test_a_partial_entry_answers_only_for_the_tokens_it_knows():
    cache = TermVectorCache()
    cache.put(KEY, _probed({"a": 2, "b": 0}))
    assert cache.get(KEY, {"a", "b"}) == _probed({"a": 2, "b": 0})
    assert cache.get(KEY, {"a"}).length == 9
    assert cache.get(KEY, {"a", "c"}) is None, "c is unknown, not 0"
    assert cache.get(KEY) is None, "a reader of every term (PRF) wants full term vectors"
    assert cache.get(("bob", *KEY[1:]), {"a"}) is None, "never shared across callers"
    assert cache.get((*KEY[:3], 6, 1, "body"), {"a"}) is None, "another version of the document"


def test_a_partial_entry_of_a_tables_row_reads_weighs_and_merges_as_one_of_a_map():
    def row(tokens: tuple[str, ...], counts: list[int]) -> ProbedDoc:
        return ProbedDoc.of(tokens, counts, 9, token_bytes(dict.fromkeys(tokens, 0)))

    assert row(("a", "b"), [2, 0]) == _probed({"a": 2, "b": 0})
    assert entry_bytes(row(("a", "b"), [2, 0])) == entry_bytes(_probed({"a": 2, "b": 0}))
    cache = TermVectorCache()
    cache.put(KEY, row(("a", "b"), [2, 0]))
    cache.put(KEY, row(("b", "c"), [0, 1]))
    assert cache.get(KEY, {"a", "b", "c"}) == _probed({"a": 2, "b": 0, "c": 1})
    assert cache.bytes == entry_bytes(_probed({"a": 2, "b": 0, "c": 1}))


def test_partial_entries_merge_and_a_full_entry_always_wins():
    cache = TermVectorCache()
    cache.put(KEY, _probed({"a": 2, "b": 0}))
    cache.put(KEY, _probed({"c": 1}))
    assert cache.get(KEY, {"a", "b", "c"}) == _probed({"a": 2, "b": 0, "c": 1})
    assert cache.bytes == entry_bytes(_probed({"a": 2, "b": 0, "c": 1})), "the merged entry's weight"
    full = _full({"a": 2, "c": 1, "d": 6})
    cache.put(KEY, full)
    assert cache.get(KEY, {"zzz"}) is full and cache.get(KEY) is full
    cache.put(KEY, _probed({"e": 0}))
    assert cache.get(KEY) is full, "a partial entry never replaces full term vectors"
    assert cache.bytes == entry_bytes(full) and len(cache) == 1


def test_a_merge_grows_the_entry_in_place_and_counts_it_exactly():
    """A merge adds to the entry a window may be reading: only tokens it lacked, so a reader sees more
    tokens, never another count; its weight is what a fresh entry of the union would weigh."""
    cache = TermVectorCache()
    first = _probed({"a": 2, "b": 0})
    cache.put(KEY, first)
    read = cache.get(KEY, {"a"})
    cache.put(KEY, _probed({"b": 0, "longer-token": 3}))
    assert cache.get(KEY, {"longer-token"}) is read is first
    assert read.tf == {"a": 2, "b": 0, "longer-token": 3}
    assert cache.bytes == entry_bytes(_probed({"a": 2, "b": 0, "longer-token": 3}))
    before = cache.bytes
    cache.put(KEY, _probed({"a": 2}))  # nothing new: the entry as it was
    assert cache.bytes == before and cache.get(KEY, {"a", "b", "longer-token"}) is first


def test_partial_entries_count_against_the_byte_bound():
    one = _probed({f"t{n}": n for n in range(10)})
    cache = TermVectorCache(max_bytes=2 * entry_bytes(one) + 10)
    for n in range(3):
        cache.put(("u", "i", str(n), 1, 1, "f"), one)
    assert len(cache) == 2 and cache.bytes <= cache.max_bytes
    assert cache.get(("u", "i", "0", 1, 1, "f"), {"t1"}) is None, "the oldest was evicted"
    # a merge that outgrows the whole cache is not kept (the smaller entry stays)
    tiny = TermVectorCache(max_bytes=entry_bytes(one))
    tiny.put(KEY, one)
    tiny.put(KEY, _probed({"another": 1}))
    assert tiny.get(KEY, {"t1"}) == one and tiny.bytes <= tiny.max_bytes
    assert TermVectorCache(0).get(KEY, {"a"}) is None


@pytest.mark.parametrize("cache_bytes", [1 << 20, 0])
async def test_auto_probes_a_new_window_and_not_one_this_caller_just_had_reranked(cache_bytes):
    """The decision alone (`Prober.add`), against an in-process cluster stub: the tokens and the
    named-scores check answer at once."""
    import asyncio

    from bmx_rerank.metrics import Metrics
    from bmx_rerank.rerank.pipeline import Reranker
    from bmx_rerank.rerank.plan import plan_search
    from bmx_rerank.stats.cache import StatsView
    from bmx_rerank.stats.source import FixedStats

    async def named_scores(index, headers):
        return True

    async def tokens(index, plan, headers):
        return {("body", "a b"): ["a", "b"]}

    class Tables:  # statistics with (`{}`) or without (None) a length table
        def __init__(self, lengths):
            self.lengths = lengths

        async def get(self, index_expr, field, headers):
            return StatsView(None, False, False, None, lengths=self.lengths)  # type: ignore[arg-type]

    def reranker(mode: str, stats=None, **kw) -> Reranker:
        cache = TermVectorCache(cache_bytes)
        cluster = Cluster(None, "http://x", timeout=30.0)  # type: ignore[arg-type]  # never called
        r = Reranker(cluster, stats or Tables({}), Metrics(), probes=mode, cache=cache, **kw)  # type: ignore[arg-type]
        r.prober._reports_named_scores = named_scores  # type: ignore[method-assign]
        r.analysis.tokens = tokens  # type: ignore[method-assign]
        return r

    body = {"query": {"match": {"body": "a b"}}, "ext": {"bmx": {"field": "body"}}}
    plan = plan_search(body, {})
    alice, bob = {"Authorization": "Basic YWxpY2U="}, {"Authorization": "Basic Ym9i"}

    async def decide(r: Reranker, headers, b=plan) -> str | None:
        side = r.open("docs", b, headers)
        await r.prober.add(side, caller_of(r, headers), headers)
        side.close()
        await asyncio.sleep(0)
        assert (side.probe is None) == (side.unprobed_because is not None)
        if side.probe is not None:
            assert side.params[tf_probe.PARAM] == "true" and "_bmx_tf_0" in orjson.dumps(side.body).decode()
        return side.unprobed_because

    auto = reranker("auto")
    assert await decide(auto, alice) is None
    side = auto.open("docs", plan, alice)
    who = caller_of(auto, alice)
    auto.prober.saw(side, who)  # as the rerank does after the window
    # seen, but not kept whole (the cache let it go): probed again, as a new window
    assert await decide(auto, alice) is None
    auto.frequencies.cache.keep_window((who, side.digest), SeenWindow.of(b"hits", {}), again=False)
    side.close()
    assert await decide(auto, alice) == ("seen" if cache_bytes else None)
    assert await decide(auto, bob) is None, "another caller's windows are its own"
    other = plan_search({**body, "query": {"match": {"body": "a b c"}}}, {})
    assert await decide(auto, alice, other) is None, "a new window"
    mine = plan_search(body, {"preference": "_local"})
    assert await decide(auto, alice, mine) is None, "the caller's preference is part of the window"
    assert await decide(reranker("on"), alice) is None
    on = reranker("on")
    on.prober.seen = auto.prober.seen
    assert await decide(on, alice) is None, "on probes seen windows too"
    assert await decide(reranker("off"), alice) == "off"
    # auto probes only where a field's statistics carry a length table, length cache or not (it cannot
    # say before the search whether it holds the new window's documents); `on` probes regardless
    for cache in (tf_probe.LengthCache(0), tf_probe.LengthCache()):
        assert await decide(reranker("auto", Tables(None), lengths=cache), alice) == "no_lengths"
        assert await decide(reranker("auto", FixedStats({}), lengths=cache), alice) == "no_lengths"
        assert await decide(reranker("auto", Tables({}), lengths=cache), alice) is None
        assert await decide(reranker("on", Tables(None), lengths=cache), alice) is None
    highlight = plan_search({**body, "highlight": {"fields": {"body": {}}}}, {})
    assert await decide(auto, bob, highlight) == "highlight"
    # statistics in memory (a source that has them `cached`): no task for them, probes decided at once
    known = FixedStats({("docs", "body"): CorpusStats.empty()}, {("docs", "body"): {}})
    in_memory = reranker("auto", known)
    side = in_memory.open("docs", plan, alice)
    assert all(not isinstance(t, asyncio.Task) and t.done() for t in side.stats.values())
    side.tokens = asyncio.get_running_loop().create_future()
    side.tokens.set_result({("body", "a b"): ["a", "b"]})
    in_memory.prober._named_scores = True
    deciding = in_memory.prober.add(side, caller_of(in_memory, alice), alice)
    with pytest.raises(StopIteration):  # never waited for: all is in, decided in one step
        deciding.send(None)
    assert side.unprobed_because is None and side.probe is not None
    side.close()


def caller_of(r, headers) -> str:
    from bmx_rerank.identity import caller

    return caller(headers, r.identity_headers)


def test_a_window_is_kept_whole_for_its_versions_and_tokens_only():
    """`SeenWindow`: found again only under its caller and window, for the same document versions in
    the same order and the same tokens; its features read back as kept; it counts against the bound."""
    hits = [{"_index": "i", "_id": str(n), "_seq_no": n, "_primary_term": 1} for n in range(3)]
    tokens = {("body", "a b"): ["a", "b"]}
    keys = [cache_key(h, "", "alice") for h in hits]
    versions = versions_digest(keys, tokens)
    tf = np.array([[1, 0], [0, 2], [3, 1]], dtype=np.float64)
    features = {("body", ("a", "b")): Candidates(tf, np.array([9.0, 4.0, 7.0]))}
    cache = TermVectorCache()
    cache.keep_window(("alice", "w"), SeenWindow.of(versions, features), again=True)
    seen = cache.window(("alice", "w"), versions)
    assert seen is not None
    got = seen.features()[("body", ("a", "b"))]
    np.testing.assert_array_equal(got.tf, tf)
    np.testing.assert_array_equal(got.length, [9.0, 4.0, 7.0])
    assert cache.window(("bob", "w"), versions) is None, "never shared across callers"
    assert cache.window(("alice", "other"), versions) is None, "another window request"
    updated = [{**hits[0], "_seq_no": 7}, *hits[1:]]
    assert (
        cache.window(("alice", "w"), versions_digest([cache_key(h, "", "alice") for h in updated], tokens))
        is None
    )
    assert cache.window(("alice", "w"), versions_digest(keys[::-1], tokens)) is None, "reordered"
    assert cache.window(("alice", "w"), versions_digest(keys, {("body", "a b"): ["a"]})) is None, (
        "other tokens"
    )
    kept = SeenWindow.of(versions, features)
    assert cache.bytes == entry_bytes(kept) == WINDOW_OVERHEAD + FEATURE_OVERHEAD + 3 * 2 * 4 + 3 * 4
    assert TermVectorCache(0).window(("alice", "w"), versions) is None
    odd = SeenWindow.of(versions, {("body", ("a",)): Candidates(np.array([[0.5]]), np.array([3e9]))})
    tf, length = odd.features()[("body", ("a",))].tf, odd.features()[("body", ("a",))].length
    assert tf.tolist() == [[0.5]] and length.tolist() == [3e9], "kept as they are where int32 would not"
    small = TermVectorCache(max_bytes=entry_bytes(kept) - 1)
    small.keep_window(("alice", "w"), kept, again=True)
    assert small.window(("alice", "w"), versions) is None and small.bytes == 0, "bigger than the cache"


def _scored(leaf: Text, corpus: CorpusStats, tf: np.ndarray, length: np.ndarray):
    tokens = {(leaf.field, leaf.text): leaf.text.split()}
    features = lambda f, v: Candidates(tf, length)  # noqa: E731
    return score_tree(leaf, {leaf.field: corpus}, features, len(length), tokens, [], [1.0], Request())


def test_kept_scores_answer_only_what_made_them_and_count_against_the_bound():
    """`KeptScores`: read again only for the same scoring (`how`) on the same statistics objects (held
    weakly: a snapshot gone answers nothing), an explanation only from the whole tree, never written
    again, and counted in the window's bytes."""
    corpus = CorpusStats(1000, 50_000, np.array(["a", "b", "c"]), np.array([10, 20, 30]), np.ones(3))
    rng = np.random.default_rng(0)
    tf, length = rng.integers(0, 3, (100, 3)).astype(float), rng.integers(10, 90, 100).astype(float)
    leaf = Text("body", "a b c")
    folded = _scored(leaf, corpus, tf, length)
    how = (leaf, (), (1.0,), Request())
    kept = KeptScores.of(how, [corpus], folded, whole=True)
    assert kept.answer((Text("body", "a b c"), (), (1.0,), Request()), [corpus]) is folded, "an equal `how`"
    assert kept.answer(how, [corpus], explain=True) is folded
    assert kept.answer((leaf, (), (1.0,), Request(mode="bm25")), [corpus]) is None, "another scoring"
    assert kept.answer(how, [dataclasses.replace(corpus)]) is None, "equal numbers, another snapshot"
    assert kept.answer(how, [corpus, corpus]) is None
    assert folded.leaf is not None
    with pytest.raises(ValueError):
        folded.leaf.parts[0, 0] = 1.0  # read-only: a repeat reads what the first answer read
    root = KeptScores.of(how, [corpus], _scored(leaf, corpus, tf, length), whole=False)
    assert root.answer(how, [corpus], explain=True) is None, "an explanation reads every node's parts"
    page = root.answer(how, [corpus])
    assert page is not None and page.leaf is None and page.children == ()
    np.testing.assert_array_equal(page.scores, folded.scores)
    np.testing.assert_array_equal(page.matched, folded.matched)
    window = SeenWindow.of(b"v" * 16, {("body", ("a", "b", "c")): Candidates(tf, length)})
    assert entry_bytes(window.scored(kept)) == entry_bytes(window) + kept.nbytes
    # the estimates against tracemalloc (100 hits, 3 tokens: the whole leaf ~5,400 bytes, the root
    # alone ~1,500), each object measured alone between two full collections: they empty the free lists,
    # whose reused objects tracemalloc would not see and whose kept temporaries it would count. Twenty
    # made first fill numpy's cache of small blocks, which holds what the first ones drop.
    for whole, estimate in ((True, kept.nbytes), (False, root.nbytes)):
        many: list[KeptScores | None] = [None] * 20  # made up front: its growth is not the objects'
        held = 0
        tracemalloc.start()
        for _ in range(20):
            KeptScores.of(how, [corpus], _scored(leaf, corpus, tf, length), whole=whole)
        for n in range(len(many)):
            gc.collect()
            before = tracemalloc.get_traced_memory()[0]
            many[n] = KeptScores.of(how, [corpus], _scored(leaf, corpus, tf, length), whole=whole)
            gc.collect()
            held += tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        held /= len(many)
        assert 0.95 * held <= estimate <= 1.25 * held, (whole, held, estimate)
        del many
    # a snapshot no longer referenced anywhere: its scores answer nothing (the weak reference is dead)
    gone = KeptScores.of(how, [dataclasses.replace(corpus)], folded, whole=True)
    gc.collect()
    assert gone.corpora[0]() is None and gone.answer(how, [corpus]) is None


def test_windows_seen_once_stay_in_their_own_share_of_the_bound():
    """A window kept the first time its caller had it goes to a small LRU (1/`RECENT_SHARE` of the bound,
    beside it): one-off windows evict one another there, never documents; one found again moves to the
    main LRU."""
    tokens = {("body", "a"): ["a"]}
    features = {("body", ("a",)): Candidates(np.ones((100, 1)), np.ones(100))}
    one = SeenWindow.of(versions_digest([("u", "i", str(n), n, 1, "") for n in range(100)], tokens), features)
    cache = TermVectorCache(max_bytes=RECENT_SHARE * 3 * entry_bytes(one))  # room for 3 seen once
    doc = ("u", "i", "d", 1, 1, "body")
    cache.put(doc, _full({"a": 1}))
    for n in range(10):
        cache.keep_window(("u", f"w{n}"), one, again=False)
    assert cache.get(doc) is not None, "one-off windows never push documents out"
    assert [n for n in range(10) if cache.window(("u", f"w{n}"), one.versions)] == [7, 8, 9]
    assert cache.bytes <= cache.max_bytes * (1 + 1 / RECENT_SHARE)
    # found again, w7..w9 moved to the main LRU: ten more one-off windows leave them there
    for n in range(10, 20):
        cache.keep_window(("u", f"w{n}"), one, again=False)
    assert all(cache.window(("u", f"w{n}"), one.versions) for n in (7, 8, 9))
    cache.keep_window(("u", "w30"), one, again=True)
    assert cache.window(("u", "w30"), one.versions) is not None, "a window had before goes to the main LRU"


def test_a_probed_window_makes_its_documents_entries_only_when_it_comes_back_changed():
    """A probed window kept whole holds its documents' entries unmade (`SeenWindow.entries`): found
    again unchanged, none are made; found changed, they are made once (for the rerank to read its
    unchanged hits from), and the window stays kept without them, weighing what it then holds."""
    made: list[int] = []
    tokens = {("body", "a"): ["a"]}
    versions = versions_digest([("alice", "i", "1", 1, 1)], tokens)
    features = {("body", ("a",)): Candidates(np.array([[1.0]]), np.array([4.0]))}
    cache = TermVectorCache()
    kept = SeenWindow.of(versions, features, None, lambda: made.append(1), 5_000)
    cache.keep_window(("alice", "w"), kept, again=False)
    assert cache.bytes == entry_bytes(kept) == entry_bytes(SeenWindow.of(versions, features)) + 5_000
    assert cache.window(("alice", "w"), versions) is kept and made == []
    assert cache.holds_window(("alice", "w")) and not cache.holds_window(("bob", "w"))
    changed = versions_digest([("alice", "i", "1", 2, 1)], tokens)
    assert cache.window(("alice", "w"), changed) is None and made == [1]
    assert cache.window(("alice", "w"), changed) is None and made == [1], "made once"
    assert cache.holds_window(("alice", "w")) and cache.bytes == entry_bytes(
        SeenWindow.of(versions, features)
    )
    assert not TermVectorCache(0).holds_window(("alice", "w"))
