"""BMX scored inside the cluster: the window rescored by a Painless script that carries the exact
corpus statistics as its parameters, so no hit's term frequencies or length cross the wire.

Opt-in (`serve --in-engine`), and only where it gives what the sidecar's own rerank gives:

- OpenSearch 2.10+ with painless (`termFreq` in a `script_score`);
- one index. A `rescore` window is per shard: each shard rescores its own best `window_size`. So a
  search that reaches one shard (an index of one, or one of several searched with one `routing` value,
  where the index has no `routing_partition_size`, or `preference=_shards:N`) is one search; one that
  reaches several is two: the first (`edge_search`) finds the first-stage score of the global window's
  last hit. A first page is asked for beside it, each shard's window rescored, the caller's query
  named (`speculated`): it stands when each of its hits' first-stage score (the name's) is within the
  global window, as it is unless a hit below the window outranks the window's best (`within`). Else the
  rescore goes after the edge, and the script scores 0 for a hit below it (`CUTOFF`), so that of each
  shard's window only the global window's hits are ranked. A window whose edge ties with the next hit
  (the cluster's tie-break draws that edge, no cutoff can) is the sidecar's;
- a `token_count` sub-field `<field>.len` with the field's own analyzer and every token counted
  (`enable_position_increments: false`): each document's length from doc values (`bmx-rerank lengths
  add` makes and fills it); a field that indexes its frequencies (not `index_options: docs`);
- a search scoring one text on that field with BMX, the scores replaced (no `combine`, augmentation,
  explanation, `min_score` or normalization).

Everywhere else, and whenever the cluster refuses the script (a document without a length makes it
throw), the sidecar's own rerank answers. Scores are the engine's float32 (the sidecar's are float64:
a relative gap of about 1e-7), and hits of equal score come in the engine's order (by document, where
the sidecar keeps the first stage's order)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from bmx_rerank import scoring
from bmx_rerank.rerank.plan import Plan
from bmx_rerank.rerank.query import Text
from bmx_rerank.stats.corpus import CorpusStats

SUFFIX = "len"  # the length sub-field: `<field>.len`
DEFAULT_ANALYZER = "index.analysis.analyzer.default."  # a flat setting's prefix: the index defines one
NO_LENGTH = "bmx: a document has no length"  # what the script throws (its search goes the sidecar's way)
# Each document's BMX score from `script_params`'s parameters, on one field and its length sub-field.
# A field of several values has a length for each (`token_count` indexes each value): the document's is
# their sum, as its norm counts every token.
SCRIPT = """
def lengths = doc[params.length];
int values = lengths.size();
if (values == 0) { throw new IllegalArgumentException('bmx: a document has no length'); }
double dl = lengths.value;
for (int j = 1; j < values; ++j) { dl += lengths.get(j); }
double lnorm = params.alpha * dl / params.avgdl + params.alpha_ebar;
double tf_part = 0; double entropy = 0; double matched = 0;
for (int i = 0; i < params.terms.length; ++i) {
  double tf = termFreq(params.field, params.terms[i]);
  if (tf > 0) {
    tf_part += params.count[i] * params.idf1[i] * tf / (tf + lnorm);
    entropy += params.weighted_entropy[i];
    matched += params.count[i];
  }
}
return params.boost * (tf_part + params.beta * (matched / params.m) * entropy);
"""


def declined(plan: Plan) -> str | None:
    """Why this search is not scored in the engine (None: it can be): its shape alone."""
    spec, leaf = plan.spec, plan.scored
    if spec is None or not isinstance(leaf, Text) or leaf.quoted:
        return "shape"
    request = spec.scoring_request()
    if request.mode != "bmx" or request.normalize != "none":
        return "scoring"
    if spec.combine not in (None, "replace") or spec.explain or spec.min_score is not None:
        return "options"
    if spec.augment.queries or spec.augment.provider != "given":
        return "augment"
    if plan.body is None or "rescore" in plan.body or plan.from_ + plan.size > spec.window_size:
        return "request"
    return None


def script_params(
    stats: CorpusStats, tokens: Sequence[str], request: scoring.Request, field: str, boost: float
) -> dict[str, Any] | None:
    """The script's parameters for a text's analysed tokens (duplicates kept, each weighing 1), as
    `scoring.bmx` reads them; None when no document holds any of them (every hit would score 0)."""
    df, raw = (column.tolist() for column in stats.lookup(list(tokens)))
    live = [i for i, d in enumerate(df) if d > 0]
    if not live:
        return None
    top = max(raw[i] for i in live)
    entropy = {i: raw[i] / top if top > 0 else 0.0 for i in live}
    # per distinct term (sorted): its df, its tokens' count (each weighs 1) and their summed entropy; a
    # few tokens, so plain Python (numpy's unique and bincount cost more here)
    terms: dict[str, list[float]] = {}
    for i in live:
        term = terms.setdefault(tokens[i], [df[i], 0.0, 0.0])
        term[1] += 1.0
        term[2] += entropy[i]
    order = sorted(terms)
    alpha = scoring.default_alpha(stats.avgdl) if request.alpha is None else request.alpha
    beta = scoring.default_beta(stats.n_docs) if request.beta is None else request.beta
    idf = scoring.idf(stats.n_docs, np.array([terms[t][0] for t in order]))
    return {
        "field": field,
        "length": f"{field}.{SUFFIX}",
        "terms": order,
        "idf1": (idf * (alpha + 1)).tolist(),
        "count": [terms[t][1] for t in order],  # also each term's tokens' summed weight
        "weighted_entropy": [terms[t][2] for t in order],
        "alpha": alpha,
        "avgdl": stats.avgdl,
        "alpha_ebar": alpha * sum(entropy.values()) / len(live),
        "beta": beta,
        "m": len(live),
        "boost": boost,
    }


# Over several shards the rescore wraps the caller's query, whose score (`_score`) places a hit in the
# global window or below it. Compared as float32, as the engine scores: the cutoff comes back from JSON
# as the shortest decimal of a float32, which as a double may lie above it.
CUTOFF = "if ((float) _score < (float) params.cutoff) { return 0; }\n"
FIRST = "_bmx_first_stage"  # the caller's query's name in a `speculated` search
# A `speculated` search scores every hit of each shard's window, (shards - 1) x window_size more than
# the search that keeps to the edge, whose script stops at once below it; past this many the engine's
# extra work costs more than the edge's wait saves (SciFact, 3 shards, OpenSearch 2.19: a first sight
# of a window of 100, 200 extra hits, 5.71 ms beside against 6.05-6.12 after; of 1,000, 13.86 against
# 10.55-10.72)
SPECULATED_HITS = 400
# What the search of the window's edge leaves out of the caller's: nothing that picks or scores hits.
NOT_EDGE = frozenset(
    "aggs aggregations _source stored_fields docvalue_fields fields script_fields highlight explain "
    "version seq_no_primary_term track_total_hits profile suggest from size".split()
)


def edge_search(plan: Plan) -> dict[str, Any]:
    """The caller's search from its window's last hit, two hits, reading no stored field and counting
    no total: the first-stage score of the global window's edge, and of the hit after it."""
    assert plan.spec is not None and plan.body is not None
    body = {k: v for k, v in plan.body.items() if k not in NOT_EDGE}
    return {
        **body,
        "from": plan.spec.window_size - 1,
        "size": 2,
        "_source": False,
        "stored_fields": "_none_",
        "track_total_hits": False,
    }


def window_edge(data: Mapping[str, Any]) -> tuple[float | None, str | None]:
    """From `edge_search`'s answer: the cutoff (None when no hit follows the window's last: every hit
    is in the window, and in its shard's), or why there is none to draw: the next hit ties with the
    edge (`edge_tied`), or the search was not whole (`edge_partial`: timed out, a shard failed,
    terminated early)."""
    if incomplete(data) is not None or data.get("terminated_early"):
        return None, "edge_partial"
    scores = [h.get("_score") for h in (data.get("hits") or {}).get("hits") or []]
    if not all(isinstance(x, (int, float)) for x in scores):
        return None, "edge_partial"
    if len(scores) == 2 and np.float32(scores[0]) == np.float32(scores[1]):
        return None, "edge_tied"
    return (float(scores[0]) if len(scores) == 2 else None), None


def speculates(plan: Plan, params: Mapping[str, str], shards: int) -> bool:
    """Whether a search over several shards is asked for beside its edge (`speculated`): a first page
    (every hit before it checked too), a window whose extra hits (`SPECULATED_HITS`) cost less than the
    edge's wait, no query name of the caller's (whose `matched_queries` the name would change), the
    engine's own statistics (under `dfs_query_then_fetch` a hit's named score may be its shard's)."""
    assert plan.body is not None and plan.spec is not None
    if plan.from_ or (shards - 1) * plan.spec.window_size > SPECULATED_HITS:
        return False
    dfs = params.get("search_type") == "dfs_query_then_fetch"
    return not dfs and b'"_name"' not in orjson.dumps(plan.body)


def speculated(plan: Plan, params: Mapping[str, Any]) -> dict[str, Any]:
    """`rescored` with each shard's window (no cutoff), the caller's query named `FIRST`: each page
    hit's `matched_queries` score (`tf_probe.PARAM`) is its first-stage score, for `within`."""
    assert plan.body is not None
    query = plan.body.get("query", {"match_all": {}})
    return {**rescored(plan, params), "query": {"bool": {"must": [query], "_name": FIRST}}}


def within(data: Mapping[str, Any], cutoff: float | None) -> bool:
    """Whether every hit of a `speculated` answer is in the global window: its first-stage score at
    or above `cutoff` (None: every hit is), compared as float32. Each hit's `FIRST` score is taken out
    of it either way (the caller named no query: `speculates`)."""
    held = True
    for hit in (data.get("hits") or {}).get("hits") or []:
        named = hit.pop("matched_queries", None)
        score = named.get(FIRST) if isinstance(named, dict) else None
        if not isinstance(score, (int, float)):
            held = False
        elif cutoff is not None and np.float32(score) < np.float32(cutoff):
            held = False
    return held


def rescored(plan: Plan, params: Mapping[str, Any], cutoff: float | None = None) -> dict[str, Any]:
    """The caller's page as a search whose window (`window_size` best of each shard) is rescored by the
    script, its scores replaced, not added to. With a `cutoff` (`window_edge`), a hit whose first-stage
    score is below it scores 0: only the global window's hits are ranked."""
    assert plan.spec is not None and plan.body is not None
    inner: Any = {"match_all": {}}
    script = {"source": SCRIPT, "lang": "painless", "params": dict(params)}
    if cutoff is not None:
        inner = plan.body.get("query", inner)
        script = {**script, "source": CUTOFF + SCRIPT, "params": {**params, "cutoff": cutoff}}
    query = {"script_score": {"query": inner, "script": script}}
    weights = {"query_weight": 0.0, "rescore_query_weight": 1.0}
    return {
        **plan.body,
        "from": plan.from_,
        "size": plan.size,
        "rescore": {"window_size": plan.spec.window_size, "query": {**weights, "rescore_query": query}},
    }


@dataclass(frozen=True)
class Layout:
    """What the index lets the engine score (`reason` None), else why not; and its shards."""

    reason: str | None
    shards: int = 1
    partition: int = 1  # `index.routing_partition_size`: how many shards one routing value spreads over

    def edged(self, params: Mapping[str, str]) -> bool:
        """Whether a search with these query parameters may reach several shards: its window's edge is
        searched first (`edge_search`)."""
        return self.shards > 1 and not one_shard(params, self.partition)


def one_shard(params: Mapping[str, str], partition: int) -> bool:
    """Whether a search reaches one shard at most: one `routing` value (where a value routes to one
    shard), or a `preference` of one `_shards:N` (with or without `|` and another preference)."""
    routing = params.get("routing", "")
    if routing.strip() and "," not in routing and partition == 1:
        return True
    shards, _, _ = params.get("preference", "").partition("|")
    return shards.startswith("_shards:") and shards.removeprefix("_shards:").strip().isdigit()


def layout(field: str, mapping: Mapping[str, Any], settings: Mapping[str, Any] | None) -> Layout:
    """From `GET <index>/_mapping/field/<field>,<field>.len` and the index's flat settings
    (`stats.scan.index_settings`, None where the caller may not read them): one index, its shards, and
    a length sub-field that counts every token of the field's analyzer."""
    if len(mapping) != 1:
        return Layout("indices")
    if settings is None:
        return Layout("refused")
    (found,) = mapping.values()
    try:
        shards = int(settings.get("index.number_of_shards", ""))
        partition = int(settings.get("index.routing_partition_size", 1))
    except (TypeError, ValueError):
        return Layout("settings")
    fields = found.get("mappings", {})
    text = fields.get(field, {}).get("mapping", {}).get(field.rsplit(".", 1)[-1], {})
    length = fields.get(f"{field}.{SUFFIX}", {}).get("mapping", {}).get(SUFFIX, {})
    if text.get("type") != "text" or length.get("type") != "token_count":
        return Layout("no_length_field")
    if length != length_mapping(field_analyzer(text, settings)):
        return Layout("length_field_differs")
    if text.get("index_options") == "docs":  # no frequencies: `termFreq` reads 1, the sidecar the text's
        return Layout("no_frequencies")
    return Layout(None, shards, partition)


def length_mapping(analyzer: str) -> dict[str, Any]:
    """The length sub-field's mapping: the field's analyzer, every token counted (a removed stop word
    leaves no hole in the count, as the sidecar counts)."""
    return {"type": "token_count", "analyzer": analyzer, "enable_position_increments": False}


def field_analyzer(text: Mapping[str, Any], settings: Mapping[str, Any]) -> str:
    """The analyzer a text field indexes with: its own, else the index's `default` (in its flat
    `settings`), else `standard`."""
    if "analyzer" in text:
        return str(text["analyzer"])
    return "default" if any(k.startswith(DEFAULT_ANALYZER) for k in settings) else "standard"


def incomplete(data: Mapping[str, Any]) -> str | None:
    """Why a scored answer is not its whole window (None: it is): a shard failed, on a document without
    a length (`no_length`: that shard's hits are missing) or otherwise (`shard_failed`), or the search
    timed out (`timed_out`)."""
    shards = data.get("_shards") or {}
    if shards.get("failed"):
        return "no_length" if NO_LENGTH in str(shards.get("failures")) else "shard_failed"
    return "timed_out" if data.get("timed_out") else None


def refusal(error: Any) -> str:
    """Why the cluster refused a search carrying the script, from its error: a document without a
    length (`no_length`), the script itself (`refused`: scripts off, no painless), or the search as the
    caller sent it (`search_refused`: the caller's own search gets the same answer from the sidecar's
    way). The first two keep the index from the engine for a while; the last does not."""
    text = str(error)
    if NO_LENGTH in text:
        return "no_length"
    return "refused" if "script" in text.lower() else "search_refused"
