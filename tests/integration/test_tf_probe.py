"""Term frequencies from the first stage (rerank/tf_probe) on real engines: read back exactly, and a
proxy using them answers exactly as one fetching `_mtermvectors`, also after documents change."""

from __future__ import annotations

import dataclasses
import json
import random
import uuid
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from bmx_rerank.rerank import pipeline, tf_probe
from bmx_rerank.rerank.word_tokens import _standard, standard_analysis
from bmx_rerank.stats import build as stats_build
from bmx_rerank.stats.lengths import DocLengths
from bmx_rerank.stats.source import FixedStats
from bmx_rerank.upstream import Cluster
from tests.support.corpora import bulk, index_scifact
from tests.support.data import scifact_records
from tests.support.engine_client import EngineClient
from tests.support.proxy_thread import ProxyThread
from tests.support.recorder import Recorder
from tests.support.reranked import TV, same, scores, search
from tests.support.words import CLASSES, JOINING, punctuated, short_words, standard_tokens

pytestmark = pytest.mark.integration

DOCS = 800
QUERIES = 25


@pytest.fixture(scope="module")
def corpus(engine: EngineClient) -> Iterator[tuple[EngineClient, str, list[str]]]:
    index = f"bmxtest-tfprobe-{uuid.uuid4().hex[:10]}"
    index_scifact(engine, index, scifact_records("corpus.jsonl", DOCS), shards=2)
    queries = [q["text"] for q in scifact_records("queries.jsonl", QUERIES)]
    try:
        yield engine, index, queries
    finally:
        engine.call("DELETE", f"/{index}")


def _shapes(text: str) -> list[dict]:
    """First stages the probes must leave exactly as they are: the caller's `bool` with its own
    `minimum_should_match`, `min_score`, totals counted to a bound or exactly, aggregations, scores
    that are not sums."""
    words = text.split()
    should = [{"match": {"body": w}} for w in words[:4]]
    return [
        {"query": {"match": {"body": text}}, "size": 100},
        {"query": {"bool": {"should": should, "minimum_should_match": 2}}, "size": 50},
        {"query": {"match": {"body": text}}, "size": 100, "min_score": 3.0, "track_total_hits": True},
        {"query": {"match": {"body": text}}, "size": 20, "track_total_hits": 7},
        {
            "query": {
                "bool": {"must": [{"match": {"body": text}}], "filter": [{"exists": {"field": "body"}}]}
            },
            "size": 100,
            "aggs": {
                "n": {"value_count": {"field": "_seq_no"}},
                "h": {"histogram": {"field": "_seq_no", "interval": 50}},
            },
        },
        # scores that are no sum of the terms': every hit 0, a constant, the best clause's and a tie
        {"query": {"bool": {"filter": [{"match": {"body": text}}]}}, "size": 30},
        {"query": {"constant_score": {"filter": {"match": {"body": text}}, "boost": 2.5}}, "size": 30},
        {"query": {"dis_max": {"queries": should, "tie_breaker": 0.3}}, "size": 60},
    ]


def test_probe_scores_read_back_as_the_term_vectors_frequencies(corpus) -> None:
    """Thousands of (hit, term) pairs: tf from the probes equals `_mtermvectors`' term_freq, and the
    probes change neither the hits, their order, their scores, the total nor the aggregations, for
    every first-stage shape in `_shapes`."""
    engine, index, queries = corpus
    pairs = shapes = 0
    for text in queries:
        tokens = [
            t["token"]
            for t in engine.ok("POST", f"/{index}/_analyze", {"field": "body", "text": text})["tokens"]
        ]
        probe = tf_probe.probe_terms({("body", text): tokens})
        assert probe is not None
        for plain in _shapes(text):
            plain = {**plain, "_source": False, "seq_no_primary_term": True}
            assert tf_probe.why_not(plain, json.dumps(plain).encode(), {}) is None
            want = engine.ok("POST", f"/{index}/_search", plain)
            got = engine.ok(
                "POST", f"/{index}/_search", tf_probe.with_probes(plain, probe), {tf_probe.PARAM: "true"}
            )
            assert [(h["_id"], h["_score"]) for h in got["hits"]["hits"]] == [
                (h["_id"], h["_score"]) for h in want["hits"]["hits"]
            ]
            assert got["hits"]["total"] == want["hits"]["total"]
            assert got["hits"]["max_score"] == want["hits"]["max_score"]
            assert got.get("aggregations") == want.get("aggregations")
            shapes += bool(want["hits"]["hits"])
            hits = got["hits"]["hits"]
            frequencies = tf_probe.take_frequencies(hits, probe).rows()
            assert all("matched_queries" not in h for h in hits)
            docs = [{"_index": index, "_id": h["_id"], "fields": ["body"], **TV} for h in hits]
            vectors = engine.ok("POST", "/_mtermvectors", {"docs": docs})["docs"] if docs else []
            for tf, vector in zip(frequencies, vectors, strict=True):
                terms = vector["term_vectors"]["body"]["terms"]
                assert tf is not None, "every hit carries the canary"
                for _, term in probe.pairs:
                    pairs += 1
                    assert tf["body"].get(term, 0) == terms.get(term, {}).get("term_freq", 0), term
    assert pairs >= 3000 and shapes >= 4 * len(queries)


def test_shapes_whose_answer_would_show_the_probes_are_not_probed(corpus) -> None:
    """Highlighting, `top_hits` and collapse `inner_hits` would show the probes (their tokens
    highlighted, their names in the inner hits' `matched_queries`): `why_not` refuses them, and the
    engine proves why (the probed answer differs)."""
    engine, index, queries = corpus
    text = queries[0]
    tokens = [
        t["token"] for t in engine.ok("POST", f"/{index}/_analyze", {"field": "body", "text": text})["tokens"]
    ]
    probe = tf_probe.probe_terms({("body", text): tokens})
    assert probe is not None
    query = {"match": {"body": text}}
    shapes = {
        "inner_hits": {"query": query, "aggs": {"t": {"top_hits": {"size": 3}}}},
        "highlight": {"query": {"match_all": {}}, "highlight": {"fields": {"body": {"type": "plain"}}}},
    }
    for reason, body in shapes.items():
        assert tf_probe.why_not(body, json.dumps(body).encode(), {}) == reason
        got = engine.ok(
            "POST", f"/{index}/_search", tf_probe.with_probes(body, probe), {tf_probe.PARAM: "true"}
        )
        tf_probe.take_frequencies(got["hits"]["hits"], probe)  # removes the top-level hits' names only
        want = engine.ok("POST", f"/{index}/_search", body)
        assert json.dumps(got["hits"]["hits"]) != json.dumps(want["hits"]["hits"]) or json.dumps(
            got.get("aggregations")
        ) != json.dumps(want.get("aggregations")), reason
    collapse = {"query": query, "collapse": {"field": "_id", "inner_hits": {"name": "x"}}}
    assert tf_probe.why_not(collapse, json.dumps(collapse).encode(), {}) == "inner_hits"


async def _build(base: str, index: str, sweep: Any = stats_build.build) -> Any:
    """The statistics of `body` (`stats_build.build`), or whatever `sweep` returns (with their tables:
    `stats_build.build_with_lengths`)."""
    async with aiohttp.ClientSession() as session:
        return await sweep(Cluster(session, base), index, "body", {})


def test_probes_and_term_vectors_give_identical_answers_also_after_updates(corpus) -> None:
    engine, index, queries = corpus
    stats = FixedStats({})
    recorder = Recorder(engine.url)
    probed = ProxyThread(recorder.url, stats, tf_probes="on")
    fetched = ProxyThread(engine.url, stats, tf_probes="off")
    try:
        stats.table[(index, "body")] = probed.run(_build(engine.url, index))
        seen: list[str] = []
        sources: list[str] = []  # where the reference path's frequencies came from
        for text in queries:
            a, b = search(probed.url, index, text), search(fetched.url, index, text)
            sources.append(b["_bmx"]["tf"])
            assert "_bmx_tf_" not in json.dumps(a) and all(
                "matched_queries" not in h for h in a["hits"]["hits"]
            )
            same(scores(a), scores(b))
            seen += [i for i, _ in scores(a)[:3]]
        assert set(sources) <= {"termvectors", "cache"} and "termvectors" in sources, sources
        assert fetched.app.state.metrics.cache.labels("miss")._value.get() > 0, "term vectors were read"
        reranker = probed.app.state.rerank
        assert len(reranker.frequencies.lengths) > 0
        tv = [d for r in recorder.requests("_mtermvectors") for d in r.body["docs"]]
        assert {tuple(d["fields"]) for d in tv} == {("body",)}
        assert len(tv) < 100 * len(queries), "only the lengths the length cache missed"
        # Documents change between two searches: longer, with the query's terms more often. Both proxies
        # have them cached at their old versions; each must see the new ones.
        text = queries[0]
        top = [i for i, _ in scores(search(probed.url, index, text))[:5]]
        bulk(
            engine,
            index,
            {i: {"body": " ".join([text] * (n + 2)) + " padding words" * n} for n, i in enumerate(top)},
        )
        for text in queries[:5]:
            a, b = scores(search(probed.url, index, text)), scores(search(fetched.url, index, text))
            same(a, b)
        after = dict(scores(search(probed.url, index, queries[0])))
        assert set(top) <= set(after)
    finally:
        probed.close()
        fetched.close()
        recorder.close()


class _Traced:
    """One search through a proxy in front of a `Recorder`: its answer, whether its first stage
    carried probes, and the ids `_mtermvectors` was asked for."""

    def __init__(
        self, recorder: Recorder, url: str, index: str, text: str, extra: dict | None = None
    ) -> None:
        recorder.clear()
        self.answer = search(url, index, text, extra)
        bodies = [json.dumps(r.body) for r in recorder.requests("_search")]
        self.probed = any("_bmx_tf_" in b for b in bodies)
        self.fetched = [d["_id"] for r in recorder.requests("_mtermvectors") for d in r.body["docs"]]
        self.marker = self.answer["_bmx"]
        self.scores = scores(self.answer)


def test_auto_probes_a_new_window_and_serves_a_repeated_one_from_the_cache(corpus) -> None:
    """`auto` (the default): a new window goes probed, the same window again goes unprobed with its
    frequencies from the cache (kept whole; no `_mtermvectors`), another window over cached documents
    from their entries, a document updated in between and new documents
    in a repeated query's window are fetched; every answer equals the `_mtermvectors` path's."""
    engine, index, queries = corpus
    stats = FixedStats({})
    recorder = Recorder(engine.url)
    auto = ProxyThread(recorder.url, stats)
    fetched = ProxyThread(engine.url, stats, tf_probes="off")
    texts = queries[5:10]
    try:
        # `auto` probes only where the statistics carry a length table (a sweep's, as `stats build` keeps)
        stats.table[(index, "body")], stats.lengths[(index, "body")] = auto.run(
            _build(engine.url, index, stats_build.build_with_lengths)
        )
        for text in texts:
            first = _Traced(recorder, auto.url, index, text)
            assert first.probed and first.marker["tf"] == "probes" and first.marker["tf_probes"] is None
            same(first.scores, scores(search(fetched.url, index, text)))
            again = _Traced(recorder, auto.url, index, text)
            assert not again.probed and again.fetched == []
            assert (again.marker["tf"], again.marker["tf_probes"]) == ("window", "seen"), "kept whole"
            same(again.scores, first.scores)
            # another window over documents the cache holds (probes off): from their entries
            narrow = {"size": 60, "ext": {"bmx": {"field": "body", "window_size": 60}}}
            fewer = search(fetched.url, index, text, narrow)
            assert fewer["_bmx"]["tf"] == "cache", fewer["_bmx"]
            same(scores(fewer), [(i, s) for i, s in again.scores if i in dict(scores(fewer))])
        metrics = auto.app.state.metrics.render().decode()
        assert f'bmx_tf_windows_total{{probes="probed",source="probes"}} {len(texts)}.0' in metrics
        assert f'bmx_tf_windows_total{{probes="seen",source="window"}} {len(texts)}.0' in metrics
        # Another caller's same window is its own: never served from the first caller's kept window.
        other = search(auto.url, index, texts[0], headers={"Authorization": "Basic b3RoZXI6cHc="})
        assert other["_bmx"]["tf"] == "probes", other["_bmx"]
        # An unprobed search (highlight) over documents cached partially for other tokens: they miss.
        text = queries[12]
        highlight = _Traced(recorder, auto.url, index, text, {"highlight": {"fields": {"body": {}}}})
        assert not highlight.probed and highlight.marker["tf_probes"] == "highlight"
        ids = [i for i, _ in highlight.scores]
        assert highlight.marker["tf"] == "termvectors" and sorted(highlight.fetched) == sorted(ids)
        same(
            highlight.scores,
            scores(search(fetched.url, index, text, {"highlight": {"fields": {"body": {}}}})),
        )
        # The same query without highlight is another window request: probed, its lengths all from the
        # length cache that `_mtermvectors` filled just before.
        plain = _Traced(recorder, auto.url, index, text)
        assert plain.probed and plain.fetched == [] and plain.marker["tf"] == "probes"
        same(plain.scores, highlight.scores)
        # A document of a seen window is updated: its new version misses the cache and is fetched.
        text = texts[0]
        top = scores(search(auto.url, index, text))[0][0]
        bulk(engine, index, {top: {"body": f"{text} {text}"}})
        after = _Traced(recorder, auto.url, index, text)
        assert not after.probed and top in after.fetched and after.marker["tf"] == "termvectors"
        assert after.marker["tf_probes"] == "seen", "the window kept whole was of the version before"
        same(after.scores, scores(search(fetched.url, index, text)))
        kept = _Traced(recorder, auto.url, index, text)  # the new versions' window, kept whole since
        assert kept.marker["tf"] == "window" and kept.fetched == [] and kept.scores == after.scores
        # New documents enter a repeated query's window: they are fetched, the others come from the cache.
        text = texts[1]
        new = [f"new-{n}" for n in range(3)]
        bulk(engine, index, {doc_id: {"body": text * (n + 1)} for n, doc_id in enumerate(new)})
        grown = _Traced(recorder, auto.url, index, text)
        ids = [i for i, _ in grown.scores]
        assert set(new) <= set(ids) and set(new) <= set(grown.fetched)
        assert len(grown.fetched) < len(ids), "the rest of the window came from the cache"
        assert not grown.probed and grown.marker["tf"] == "termvectors"
        same(grown.scores, scores(search(fetched.url, index, text)))
    finally:
        auto.close()
        fetched.close()
        recorder.close()


def test_a_kept_window_keeps_its_scores_only_for_the_same_scoring_on_the_same_statistics(
    corpus, monkeypatch
) -> None:
    """A window kept whole keeps its scores (`KeptScores`): the second time it is not scored again.
    Only while nothing that made them changed: the same window scored with other parameters, another
    mode or on refreshed statistics, or asked for an explanation (the kept root alone has no parts), is
    scored again, and answers exactly as the `_mtermvectors` path does with the same statistics."""
    scored: list[int] = []
    score_tree = pipeline.score_tree
    monkeypatch.setattr(pipeline, "score_tree", lambda *a: scored.append(1) or score_tree(*a))
    engine, index, queries = corpus
    stats = FixedStats({})
    auto = ProxyThread(engine.url, stats)
    fetched = ProxyThread(engine.url, stats, tf_probes="off")
    text = queries[20]
    try:
        stats.table[(index, "body")], stats.lengths[(index, "body")] = auto.run(
            _build(engine.url, index, stats_build.build_with_lengths)
        )
        first = search(auto.url, index, text)
        assert first["_bmx"]["tf"] == "probes" and len(scored) == 1
        for _ in range(2):
            again = search(auto.url, index, text)
            assert again["_bmx"]["tf"] == "window" and again["hits"] == first["hits"]
        assert len(scored) == 1, "the kept scores answered"
        explain = {"ext": {"bmx": {"field": "body", "window_size": 100, "explain": True}}}
        explained = search(auto.url, index, text, explain)
        assert explained["_bmx"]["tf"] == "window" and len(scored) == 2, "the kept root has no parts"
        assert search(auto.url, index, text, explain)["hits"] == explained["hits"] and len(scored) == 2
        # (the proxy without probes scores in this process too: compared last)
        assert explained["hits"]["hits"] == search(fetched.url, index, text, explain)["hits"]["hits"]
        # the same window (its digest leaves ext.bmx out) scored otherwise: never the kept scores
        for spec in ({"mode": "bm25"}, {"alpha": 0.9, "beta": 0.2}, {"normalize": "paper"}):
            extra = {"ext": {"bmx": {"field": "body", "window_size": 100, **spec}}}
            other = search(auto.url, index, text, extra)
            assert other["_bmx"]["tf"] == "window", other["_bmx"]
            assert scores(other) != scores(first), spec
            same(scores(other), scores(search(fetched.url, index, text, extra)))
        # refreshed statistics (another object, other numbers) for the same window: scored again
        before = stats.table[(index, "body")]
        stats.table[(index, "body")] = dataclasses.replace(
            before, n_docs=before.n_docs * 2, total_length=before.total_length * 2
        )
        refreshed = search(auto.url, index, text)
        assert refreshed["_bmx"]["tf"] == "window" and scores(refreshed) != scores(first)
        same(scores(refreshed), scores(search(fetched.url, index, text)))
        stats.table[(index, "body")] = before  # the statistics before again: scored as at first
        same(scores(search(auto.url, index, text)), scores(first))
    finally:
        auto.close()
        fetched.close()


def test_auto_with_a_length_table_reranks_a_new_window_without_term_vectors(corpus) -> None:
    """With the length table (and the length cache off, so the table decides), a new window needs no
    `_mtermvectors` at all; a document updated after the table was written is fetched."""
    engine, index, queries = corpus
    hits = engine.ok(
        "POST",
        f"/{index}/_search",
        {"query": {"match_all": {}}, "size": 2000, "_source": False, "seq_no_primary_term": True},
    )["hits"]["hits"]
    docs = [{"_index": index, "_id": h["_id"], "fields": ["body"], **TV} for h in hits]
    vectors = engine.ok("POST", "/_mtermvectors", {"docs": docs})["docs"]
    lengths = [sum(t["term_freq"] for t in v["term_vectors"]["body"]["terms"].values()) for v in vectors]
    table = DocLengths.from_rows(
        [h["_id"] for h in hits],
        [None] * len(hits),
        [h["_seq_no"] for h in hits],
        [h["_primary_term"] for h in hits],
        lengths,
    )
    recorder = Recorder(engine.url)
    stats = FixedStats({})
    fetched = ProxyThread(engine.url, stats, tf_probes="off")
    try:
        stats.table[(index, "body")] = fetched.run(_build(engine.url, index))
        source = FixedStats(stats.table, lengths={(index, "body"): {index: table}})
        auto = ProxyThread(recorder.url, source)
        auto.app.state.rerank.frequencies.lengths = tf_probe.LengthCache(0)
        try:
            for text in queries[10:15]:
                got = _Traced(recorder, auto.url, index, text)
                assert got.probed and got.fetched == [] and got.marker["tf"] == "probes"
                same(got.scores, scores(search(fetched.url, index, text)))
            text = queries[15]
            top = scores(search(fetched.url, index, text))[0][0]
            bulk(engine, index, {top: {"body": f"{text} x"}})
            got = _Traced(recorder, auto.url, index, text)
            assert got.probed and got.fetched == [top], "only the version the table does not hold"
            same(got.scores, scores(search(fetched.url, index, text)))
        finally:
            auto.close()
    finally:
        fetched.close()
        recorder.close()


def test_a_new_query_on_a_standard_field_is_probed_from_its_known_tokens_with_no_analyze(corpus) -> None:
    """On a field of the built-in `standard` analyzer (its mapping and settings read once), a new
    query's tokens are known word by word (rerank/word_tokens.py, `standard_analysis`): its probed first
    stage goes with no `_analyze` call at all, and answers as the term-vector path does. A word of
    another script is still analysed."""
    engine, index, queries = corpus
    recorder = Recorder(engine.url)
    stats = FixedStats({})
    fetched = ProxyThread(engine.url, stats, tf_probes="off")
    knowing = ProxyThread(recorder.url, stats)
    try:
        stats.table[(index, "body")], stats.lengths[(index, "body")] = fetched.run(
            _build(engine.url, index, stats_build.build_with_lengths)
        )
        assert _Traced(recorder, knowing.url, index, queries[16]).probed
        assert recorder.requests("_analyze") and any("/_mapping/" in r.path for r in recorder.received)
        for text in (queries[17], queries[18].upper(), f"{queries[19]} IL-10 U.S. 5mmol/L"):
            got = _Traced(recorder, knowing.url, index, text)
            assert got.probed and got.fetched == [] and got.marker["tf"] == "probes"
            assert recorder.requests("_analyze") == [], text
            same(got.scores, scores(search(fetched.url, index, text)))
        assert _guesses(knowing) == (0, 0, 3)
        text = f"{queries[20]} 細胞"
        other = _Traced(recorder, knowing.url, index, text)
        assert recorder.requests("_analyze"), "a word of another script: analysed"
        same(other.scores, scores(search(fetched.url, index, text)))
    finally:
        knowing.close()
        fetched.close()
        recorder.close()


def test_an_unseen_word_is_guessed_as_the_engines_standard_analyzer_makes_it(engine: EngineClient) -> None:
    """`word_tokens._standard` (the rule an unseen word is guessed by) against the engine's own
    `standard` analyzer, word by word: every SciFact query word and the words of 1,500 of its documents
    with anything but letters and digits in them (hyphens, slashes, periods, apostrophes, underscores,
    URLs, Greek letters, math symbols; ~10,000 words; all of both corpora: benchmarks/word_guesses.py).
    A word the rule takes must come out exactly so; it may leave a word to `_analyze` (another script,
    a pictograph), but few."""
    texts = [q["text"] for q in scifact_records("queries.jsonl")]
    texts += [f"{d['title']} {d['text']}" for d in scifact_records("corpus.jsonl", 1500)]
    words = punctuated(texts)
    assert len(words) > 5000
    guessed = 0
    for word, real in zip(words, standard_tokens(engine.ok, words), strict=True):
        rule = _standard(word)
        if rule is not None:
            guessed += 1
            assert rule == real, word
    assert guessed > 0.98 * len(words), (guessed, len(words))


def test_every_short_word_of_the_rules_classes_comes_out_as_the_engine_makes_it(engine: EngineClient) -> None:
    """`standard_analysis` (the tokens of a text on a field of the built-in `standard` analyzer, with no
    `_analyze`) against the engine: every word of up to three characters of `CLASSES` (~348,000) and of
    four of `JOINING` (~22,600) that the rule takes comes out exactly as the engine makes it, and so do
    texts of two to five such words parted by ASCII whitespace."""
    words = short_words(CLASSES, 3) + short_words(JOINING, 4)
    taken = []
    for word, real in zip(words, standard_tokens(engine.ok, words, batch=3000), strict=True):
        rule = _standard(word)
        if rule is not None:
            taken.append(word)
            assert rule == real, word
    assert len(taken) > 290_000
    pick = random.Random(18)
    texts = [
        "".join(w + pick.choice(" \t\n\r\f\v  ") for w in pick.sample(taken, pick.randint(2, 5)))
        for _ in range(20_000)
    ]
    for text, real in zip(texts, standard_tokens(engine.ok, texts, batch=1000), strict=True):
        assert standard_analysis(text) == real, repr(text)


def test_a_guess_an_analyzer_across_words_breaks_still_answers_exactly(engine: EngineClient) -> None:
    """An analyzer that makes tokens across words (shingles) defeats a word-by-word guess: the probes
    miss a real token, the window's frequencies come from term vectors (exact), and the analyzer is not
    guessed again for a while."""
    index = f"bmxtest-shingle-{uuid.uuid4().hex[:10]}"
    analysis = {
        "filter": {"pairs": {"type": "shingle", "output_unigrams": True}},
        "analyzer": {"pairs": {"tokenizer": "standard", "filter": ["lowercase", "pairs"]}},
    }
    engine.ok(
        "PUT",
        f"/{index}",
        {
            "settings": {"number_of_shards": 1, "analysis": analysis},
            "mappings": {"properties": {"body": {"type": "text", "analyzer": "pairs"}}},
        },
    )
    texts = ["red apple tree", "green apple pie", "tree of red fruit", "apple red green", "pie tree"]
    bulk(engine, index, {f"d{i}": {"body": t} for i, t in enumerate(texts)})
    stats = FixedStats({})
    fetched = ProxyThread(engine.url, stats, tf_probes="off")
    guessing = ProxyThread(engine.url, stats, tf_probes="on")
    try:
        stats.table[(index, "body")] = fetched.run(_build(engine.url, index))
        for text in ("red apple", "tree green"):
            search(guessing.url, index, text)
        got = search(guessing.url, index, "tree")  # a word seen: guessed, and it held
        same(scores(got), scores(search(fetched.url, index, "tree")))
        for text in ("apple red", "green tree"):  # every word known, but "apple red" is a pair of its own
            got = search(guessing.url, index, text)
            same(scores(got), scores(search(fetched.url, index, text)))
        assert _guesses(guessing) == (1, 1, 0), "held once, missed once, then not guessed"
        assert got["_bmx"]["tf"] == "probes", "not guessed: probed from the real tokens"
    finally:
        guessing.close()
        fetched.close()
        engine.call("DELETE", f"/{index}")


def _guesses(proxy: ProxyThread) -> tuple[int, int, int]:
    """(covered, missed) first stages probed from guessed tokens, and windows whose tokens were known."""
    metrics = proxy.app.state.metrics.render().decode()
    out = []
    for outcome in ("covered", "missed", "known"):
        line = [
            s for s in metrics.splitlines() if s.startswith(f'bmx_token_guesses_total{{outcome="{outcome}"}}')
        ]
        out.append(int(float(line[0].split()[-1])) if line else 0)
    return out[0], out[1], out[2]
