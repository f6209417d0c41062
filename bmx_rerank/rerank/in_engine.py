"""BMX scored inside the cluster: the window rescored by a Painless script that carries the exact
corpus statistics as its parameters, so no hit's term frequencies or length cross the wire.

Opt-in (`serve --in-engine`), and only where it gives what the sidecar's own rerank gives:

- OpenSearch 2.10+ with painless (`termFreq` in a `script_score`);
- a search that reaches one shard: an index of one, or one of several searched with one `routing`
  value (an index without `routing_partition_size`) or `preference=_shards:N` (a `rescore` window is
  per shard: over several it is not the global window);
- a `token_count` sub-field `<field>.len` with the field's own analyzer and every token counted
  (`enable_position_increments: false`): each document's length from doc values (`bmx-rerank lengths
  add` makes and fills it);
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

from bmx_rerank import scoring
from bmx_rerank.rerank.plan import Plan
from bmx_rerank.rerank.query import Text
from bmx_rerank.stats.corpus import CorpusStats

SUFFIX = "len"  # the length sub-field: `<field>.len`
DEFAULT_ANALYZER = "index.analysis.analyzer.default."  # a flat setting's prefix: the index defines one
NO_LENGTH = "bmx: a document has no length"  # what the script throws (its search goes the sidecar's way)
# Each document's BMX score from `script_params`'s parameters, on one field and its length sub-field.
SCRIPT = """
if (doc[params.length].size() == 0) { throw new IllegalArgumentException('bmx: a document has no length'); }
double lnorm = params.alpha * doc[params.length].value / params.avgdl + params.alpha_ebar;
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
    df, raw = stats.lookup(list(tokens))
    live = df > 0
    if not live.any():
        return None
    df, raw = df[live], raw[live]
    entropy = raw / raw.max() if raw.max() > 0 else np.zeros_like(raw)
    terms, first, inverse = np.unique(np.array(tokens)[live], return_index=True, return_inverse=True)
    alpha = scoring.default_alpha(stats.avgdl) if request.alpha is None else request.alpha
    beta = scoring.default_beta(stats.n_docs) if request.beta is None else request.beta
    return {
        "field": field,
        "length": f"{field}.{SUFFIX}",
        "terms": terms.tolist(),
        "idf1": (scoring.idf(stats.n_docs, df[first]) * (alpha + 1)).tolist(),
        "count": np.bincount(inverse).astype(float).tolist(),  # also each term's tokens' summed weight
        "weighted_entropy": np.bincount(inverse, weights=entropy).tolist(),
        "alpha": alpha,
        "avgdl": stats.avgdl,
        "alpha_ebar": alpha * float(entropy.mean()),
        "beta": beta,
        "m": int(live.sum()),
        "boost": boost,
    }


def rescored(plan: Plan, params: Mapping[str, Any]) -> dict[str, Any]:
    """The caller's page as a search whose window (`window_size` best of the one shard) is rescored by
    the script, its scores replaced, not added to."""
    assert plan.spec is not None and plan.body is not None
    script = {"source": SCRIPT, "lang": "painless", "params": dict(params)}
    query = {"script_score": {"query": {"match_all": {}}, "script": script}}
    weights = {"query_weight": 0.0, "rescore_query_weight": 1.0}
    return {
        **plan.body,
        "from": plan.from_,
        "size": plan.size,
        "rescore": {"window_size": plan.spec.window_size, "query": {**weights, "rescore_query": query}},
    }


@dataclass(frozen=True)
class Layout:
    """What the index lets the engine score (`reason` None), else why not; over several `shards`, only
    a search that reaches one of them (`reason_for`)."""

    reason: str | None
    shards: int = 1
    partition: int = 1  # `index.routing_partition_size`: how many shards one routing value spreads over

    def reason_for(self, params: Mapping[str, str]) -> str | None:
        """Why a search with these query parameters is not scored in the engine (None: it is)."""
        if self.reason is not None or self.shards == 1 or one_shard(params, self.partition):
            return self.reason
        return "shards"


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
        return Layout("shards")
    fields = found.get("mappings", {})
    text = fields.get(field, {}).get("mapping", {}).get(field.rsplit(".", 1)[-1], {})
    length = fields.get(f"{field}.{SUFFIX}", {}).get("mapping", {}).get(SUFFIX, {})
    if text.get("type") != "text" or length.get("type") != "token_count":
        return Layout("no_length_field")
    if length != length_mapping(field_analyzer(text, settings)):
        return Layout("length_field_differs")
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


def no_length(error: Any) -> bool:
    """Whether a refused search's error is the script's own: a document without a length."""
    return NO_LENGTH in str(error)
