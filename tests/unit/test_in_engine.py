"""The in-engine rerank's pure pieces (rerank/in_engine.py): the script's parameters give the scoring
core's BMX, what an index's mapping and settings allow, and which searches are the sidecar's; its answers
on real engines are tests/integration/test_in_engine.py's."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from bmx_rerank.rerank import in_engine
from bmx_rerank.rerank.augment import Augment
from bmx_rerank.rerank.plan import Plan
from bmx_rerank.rerank.query import Combine, Text
from bmx_rerank.rerank.rescore import score_tree
from bmx_rerank.rerank.spec import RerankSpec
from bmx_rerank.scoring import Candidates, Request
from bmx_rerank.stats.corpus import CorpusStats


def _script(params: dict, tf: dict[str, np.ndarray], length: np.ndarray) -> np.ndarray:
    """What `in_engine.SCRIPT` computes for each document, line by line, in float64."""
    lnorm = params["alpha"] * length / params["avgdl"] + params["alpha_ebar"]
    tf_part, entropy, matched = np.zeros(len(length)), np.zeros(len(length)), np.zeros(len(length))
    for i, term in enumerate(params["terms"]):
        t = tf[term]
        hit = t > 0
        tf_part += np.where(hit, params["count"][i] * params["idf1"][i] * t / (t + lnorm), 0.0)
        entropy += np.where(hit, params["weighted_entropy"][i], 0.0)
        matched += np.where(hit, params["count"][i], 0.0)
    return params["boost"] * (tf_part + params["beta"] * (matched / params["m"]) * entropy)


@pytest.mark.parametrize("request_", [Request(), Request(alpha=0.8, beta=0.3)], ids=["defaults", "given"])
def test_the_scripts_parameters_give_the_cores_bmx(request_: Request) -> None:
    """Tokens repeated and one no document holds, a boost: the script's score is `score_tree`'s."""
    terms = np.array(["a", "b", "c", "d"])
    corpus = CorpusStats(500, 40_000, terms, np.array([10, 200, 3, 50]), np.array([4.0, 90.0, 1.5, 20.0]))
    rng = np.random.default_rng(7)
    n = 60
    tf = {t: rng.integers(0, 4, n).astype(float) for t in ("a", "b", "c", "d", "zz")}
    tf["zz"][:] = 0
    length = rng.integers(5, 200, n).astype(float)
    tokens = ["b", "a", "zz", "b", "c"]
    leaf = Text("body", "b a zz b c", boost=1.7)
    features = lambda f, vocabulary: Candidates(np.column_stack([tf[v] for v in vocabulary]), length)  # noqa: E731
    core = score_tree(leaf, {"body": corpus}, features, n, {("body", leaf.text): tokens}, [], [1.0], request_)
    params = in_engine.script_params(corpus, tokens, request_, "body", leaf.boost)
    assert params is not None and params["terms"] == ["a", "b", "c"] and params["count"] == [1.0, 2.0, 1.0]
    np.testing.assert_allclose(_script(params, tf, length), core.scores, rtol=1e-12)
    assert in_engine.script_params(corpus, ["zz", "yy"], request_, "body", 1.0) is None, "nothing to score"
    assert f"'{in_engine.NO_LENGTH}'" in in_engine.SCRIPT, (
        "what the script throws is what a refusal is read by"
    )
    thrown = (
        None,
        b'{"error":{"root_cause":[{"type":"script_exception","reason":"bmx: a document has no length"}]}}',
    )
    assert in_engine.refusal(thrown) == "no_length"


def test_a_refusal_or_a_partial_answer_says_why_the_sidecar_scores_the_window() -> None:
    """The script refused (no painless, scripts off) keeps the index from the engine a while; the
    search refused as the caller sent it does not. A scored answer with a failed shard or timed out is
    not the window's whole: a shard that threw on a document without a length says so."""
    off = (
        None,
        b'{"error":{"type":"illegal_argument_exception","reason":"cannot execute [inline] scripts"}}',
    )
    assert in_engine.refusal(off) == "refused"
    totals = b'{"error":{"reason":"[rest_total_hits_as_int] cannot be used if the tracking of total hits is not accurate"}}'
    assert in_engine.refusal((None, totals)) == "search_refused"
    whole = {"timed_out": False, "_shards": {"total": 3, "successful": 3, "failed": 0}, "hits": {"hits": []}}
    assert in_engine.incomplete(whole) is None
    assert in_engine.incomplete({**whole, "timed_out": True}) == "timed_out"
    failure = {
        "shard": 1,
        "reason": {"type": "script_exception", "caused_by": {"reason": in_engine.NO_LENGTH}},
    }
    failed = {**whole, "_shards": {"total": 3, "successful": 2, "failed": 1, "failures": [failure]}}
    assert in_engine.incomplete(failed) == "no_length"
    failed["_shards"]["failures"] = [{"shard": 1, "reason": {"type": "node_not_connected_exception"}}]
    assert in_engine.incomplete(failed) == "shard_failed"


def _mapping(length: dict | None, analyzer: str | None = "standard") -> dict:
    body = {"type": "text", **({"analyzer": analyzer} if analyzer else {})}
    fields = {"body": {"full_name": "body", "mapping": {"body": body}}}
    if length is not None:
        fields["body.len"] = {"full_name": "body.len", "mapping": {"len": length}}
    return {"i": {"mappings": fields}}


def _with_text(mapping: dict, **more: Any) -> dict:
    """`mapping` with more of the text field's own options."""
    text = mapping["i"]["mappings"]["body"]["mapping"]["body"]
    return {"i": {"mappings": {**mapping["i"]["mappings"], "body": {"mapping": {"body": {**text, **more}}}}}}


def _settings(shards: int = 1, **more: str) -> dict:
    """An index's flat settings, as `stats.scan.index_settings` reads them."""
    return {"index.number_of_shards": str(shards), **more}


COUNTS = {"type": "token_count", "analyzer": "standard", "enable_position_increments": False}


@pytest.mark.parametrize(
    ("mapping", "settings", "reason"),
    [
        (_mapping(COUNTS), _settings(), None),
        (_mapping(COUNTS, analyzer=None), _settings(), None),  # the field's analyzer is the default
        (_mapping(COUNTS), _settings(3), None),  # its window's edge searched first (`edged`)
        (_mapping(COUNTS), {}, "settings"),
        (_mapping(COUNTS), None, "refused"),  # settings the caller may not read
        ({**_mapping(COUNTS), "j": _mapping(COUNTS)["i"]}, _settings(), "indices"),
        (_mapping(None), _settings(), "no_length_field"),
        (_mapping({**COUNTS, "type": "integer"}), _settings(), "no_length_field"),
        (_mapping({**COUNTS, "analyzer": "english"}), _settings(), "length_field_differs"),
        (_mapping({**COUNTS, "doc_values": False}), _settings(), "length_field_differs"),  # no other mapping
        (
            _mapping({k: v for k, v in COUNTS.items() if k != "enable_position_increments"}),
            _settings(),
            "length_field_differs",
        ),  # a removed stop word would count as a hole
        (_with_text(_mapping(COUNTS), index_options="docs"), _settings(), "no_frequencies"),
        (_with_text(_mapping(COUNTS), index_options="freqs", norms=False), _settings(), None),
        # the index's own default analyzer analyses a field that names none
        (
            _mapping(COUNTS, analyzer=None),
            _settings(**{"index.analysis.analyzer.default.type": "simple"}),
            "length_field_differs",
        ),
    ],
)
def test_what_an_index_lets_the_engine_score(
    mapping: dict, settings: dict | None, reason: str | None
) -> None:
    assert in_engine.layout("body", mapping, settings).reason == reason


@pytest.mark.parametrize(
    ("params", "settings", "reached"),
    [
        ({}, _settings(), "one"),
        ({}, _settings(3), "several"),
        ({"routing": "tenant-7"}, _settings(3), "one"),
        ({"routing": "a,b"}, _settings(3), "several"),  # two values: up to two shards
        ({"routing": ""}, _settings(3), "several"),
        ({"routing": "tenant-7"}, _settings(3, **{"index.routing_partition_size": "2"}), "several"),
        ({"preference": "_shards:2"}, _settings(3), "one"),
        ({"preference": "_shards:2|_local"}, _settings(3), "one"),
        ({"preference": "_shards:1,2"}, _settings(3), "several"),
        ({"preference": "_local"}, _settings(3), "several"),
        (
            {"preference": "_local|_shards:2"},
            _settings(3),
            "several",
        ),  # the engines take `_shards` first only
        ({"routing": "a,b", "preference": "_shards:0"}, _settings(3), "one"),
    ],
)
def test_a_search_that_may_reach_several_shards_has_its_windows_edge_searched_first(
    params: dict, settings: dict, reached: str
) -> None:
    """A `rescore` window is each shard's: it is the global window only for a search that reaches one."""
    layout = in_engine.layout("body", _mapping(COUNTS), settings)
    assert layout.reason is None
    assert layout.edged(params) == (reached == "several")


def test_the_windows_edge_and_the_rescore_that_keeps_to_it() -> None:
    """The edge's search reads nothing but scores: from the window's last hit, two hits, no stored field,
    no total, no aggregation; what picks hits stays. A cutoff where the next hit does not tie with it
    (compared as float32), none where no hit follows, and none to draw on a tie or a partial answer."""
    plan = replace(
        _plan(window_size=40),
        body={
            "query": {"match": {"body": "lung cancer"}},
            "post_filter": {"term": {"kind": "a"}},
            "aggs": {"n": {"value_count": {"field": "_seq_no"}}},
            "_source": ["title"],
            "highlight": {"fields": {"body": {}}},
            "track_total_hits": True,
            "size": 100,
        },
    )
    assert in_engine.edge_search(plan) == {
        "query": {"match": {"body": "lung cancer"}},
        "post_filter": {"term": {"kind": "a"}},
        "from": 39,
        "size": 2,
        "_source": False,
        "stored_fields": "_none_",
        "track_total_hits": False,
    }

    def answer(*scores: Any, **more: Any) -> dict:
        return {"_shards": {"failed": 0}, "hits": {"hits": [{"_score": x} for x in scores]}, **more}

    assert in_engine.window_edge(answer(5.25, 5.0)) == (5.25, None)
    assert in_engine.window_edge(answer(5.25)) == (None, None)  # the window holds every hit
    assert in_engine.window_edge(answer()) == (None, None)
    assert in_engine.window_edge(answer(5.25, 5.25)) == (None, "edge_tied")
    # the shortest decimals of two doubles that are one float32
    assert in_engine.window_edge(answer(0.1, 0.10000000149011612)) == (None, "edge_tied")
    assert in_engine.window_edge(answer(5.25, 5.0, timed_out=True)) == (None, "edge_partial")
    assert in_engine.window_edge({"_shards": {"failed": 1}, "hits": {"hits": []}}) == (None, "edge_partial")
    assert in_engine.window_edge(answer(None, 1.0)) == (None, "edge_partial")

    params = {"terms": ["lung"]}
    one = in_engine.rescored(plan, params)["rescore"]["query"]["rescore_query"]["script_score"]
    assert one["query"] == {"match_all": {}} and one["script"]["source"] == in_engine.SCRIPT
    cut = in_engine.rescored(plan, params, 5.25)["rescore"]
    assert cut["window_size"] == 40
    scored = cut["query"]["rescore_query"]["script_score"]
    assert scored["query"] == {"match": {"body": "lung cancer"}}, "the caller's query gives `_score`"
    assert scored["script"]["source"] == in_engine.CUTOFF + in_engine.SCRIPT
    assert scored["script"]["params"] == {"terms": ["lung"], "cutoff": 5.25}


def test_a_first_page_asked_for_beside_the_edge_stands_when_its_hits_are_within_the_window() -> None:
    """Each shard's window rescored, the caller's query named: its hits' named scores are their
    first-stage scores, compared with the edge's cutoff as float32, and never shown to the caller.
    Not for a later page, a window whose shards' windows hold many more hits, a caller's own named
    query, or `dfs_query_then_fetch`."""
    plan = replace(_plan(window_size=40), body={"query": {"match": {"body": "lung cancer"}}, "size": 10})
    assert in_engine.speculates(plan, {}, 3)
    assert not in_engine.speculates(replace(plan, from_=10), {}, 3)
    assert not in_engine.speculates(plan, {"search_type": "dfs_query_then_fetch"}, 3)
    named = {"query": {"match": {"body": {"query": "lung", "_name": "mine"}}}}
    assert not in_engine.speculates(replace(plan, body=named), {}, 3)
    # each shard's window scored whole: not where that is many more hits than the global window
    assert in_engine.speculates(plan, {}, 1 + in_engine.SPECULATED_HITS // 40)
    assert not in_engine.speculates(plan, {}, 2 + in_engine.SPECULATED_HITS // 40)
    body = in_engine.speculated(plan, {"terms": ["lung"]})
    assert body["query"] == {"bool": {"must": [{"match": {"body": "lung cancer"}}], "_name": in_engine.FIRST}}
    rescore = body["rescore"]["query"]["rescore_query"]["script_score"]
    assert rescore["query"] == {"match_all": {}} and rescore["script"]["source"] == in_engine.SCRIPT

    def answer(*firsts: Any) -> dict:
        hits = [
            {"_id": str(i), "_score": 9.0, "matched_queries": {in_engine.FIRST: x}}
            for i, x in enumerate(firsts)
        ]
        return {"hits": {"hits": hits}}

    for firsts, cutoff, held in [
        ((7.5, 5.25), 5.25, True),
        ((7.5, 5.0), 5.25, False),  # a hit below the edge outranks the window's
        ((7.5, 0.10000000149011612), 0.1, True),  # one float32
        ((7.5, 1.0), None, True),  # no hit after the window's last: every hit is in it
        ((7.5, None), None, False),
    ]:
        data = answer(*firsts)
        assert in_engine.within(data, cutoff) is held, (firsts, cutoff)
        assert all("matched_queries" not in h for h in data["hits"]["hits"])
    assert in_engine.within({"hits": {"hits": [{"_id": "a", "_score": 1.0}]}}, None) is False


def _plan(tree: Text | Combine | None = None, **spec: Any) -> Plan:
    body = {"query": {"match": {"body": "lung cancer"}}, "size": 100}
    scored = tree or Text("body", "lung cancer")
    return Plan(body, {}, RerankSpec("body", **spec), "lung cancer", 0, 10, scoring=scored)


def test_which_searches_the_engine_may_score() -> None:
    """One unquoted text, BMX replaced, nothing the script does not compute, a page within the window."""
    assert in_engine.declined(_plan()) is None
    assert in_engine.declined(_plan(Text("body", "lung cancer", quoted=True))) == "shape"
    assert in_engine.declined(_plan(Combine("sum", (Text("a", "x"), Text("b", "x"))))) == "shape"
    assert in_engine.declined(_plan(combine="rrf")) == "options"
    assert in_engine.declined(_plan(explain=True)) == "options"
    assert in_engine.declined(_plan(min_score=1.0)) == "options"
    assert in_engine.declined(_plan(scoring=Request(mode="bm25"))) == "scoring"
    assert in_engine.declined(_plan(scoring=Request(normalize="paper"))) == "scoring"
    assert in_engine.declined(_plan(augment=Augment(queries=("lung",), weights=(0.5,)))) == "augment"
    assert in_engine.declined(_plan(augment=Augment(provider="prf"))) == "augment"
    assert in_engine.declined(replace(_plan(), from_=95)) == "request", "a page past the window"
    assert in_engine.declined(replace(_plan(), body={"rescore": {}})) == "request", "the caller's own"
