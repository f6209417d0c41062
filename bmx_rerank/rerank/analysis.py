"""The query's tokens as the cluster analyses them: each scored text with its field's search analyzer.

Tokens are remembered for a while (`AnalysisCache`), so a repeated query costs no `_analyze` round trip:
the first stage waits for them when it carries probes (they are made of the tokens). Keyed by (caller,
index, analyzer or field, text): a caller never gets tokens analysed with another's credentials, and an
analyzer change (a mapping update, a reopened index) is seen within the cache's `ttl`."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence

from cachetools import TTLCache

from bmx_rerank.errors import UpstreamError
from bmx_rerank.identity import caller
from bmx_rerank.metrics import Metrics
from bmx_rerank.rerank.plan import Plan
from bmx_rerank.rerank.query import Node, Text, fields, leaves
from bmx_rerank.rerank.rescore import leaf_queries
from bmx_rerank.rerank.window import Tokens
from bmx_rerank.rerank.word_tokens import AnalyzerKey, WordTokens, standard_analysis
from bmx_rerank.upstream import Cluster, FieldAnalyzers

AnalysisKey = tuple[str, str, str, str]
_UNREAD = object()  # a field whose mapping was not read
# a field no index maps, or whose mapping the caller may not read: `_analyze` with the field
UNMAPPED = FieldAnalyzers(None, None, None)
ANALYZER_TTL = 60.0  # seconds a field's search analyzer is remembered (mappings change rarely)
ANALYZER_CACHE = 4096  # (index, field) pairs remembered at most


class AnalysisCache:
    """A bounded TTL map from `AnalysisKey` to the tokens `_analyze` gave."""

    def __init__(self, capacity: int = 10_000, ttl: float = 60.0) -> None:
        self.capacity = capacity
        self._items: TTLCache[AnalysisKey, tuple[str, ...]] = TTLCache(maxsize=max(1, capacity), ttl=ttl)

    async def tokens(self, key: AnalysisKey, analyze: Callable[[], Awaitable[list[str]]]) -> list[str]:
        """The cached tokens of `key`, else `analyze()`'s (remembered when it succeeds)."""
        if self.capacity > 0:
            found = self._items.get(key)
            if found is not None:
                return list(found)
        tokens = await analyze()
        if self.capacity > 0:
            self._items[key] = tuple(tokens)
        return tokens

    def __len__(self) -> int:
        return len(self._items)


class Analysis:
    """Analyses a plan's texts on one cluster, with the caller's credentials."""

    def __init__(
        self,
        cluster: Cluster,
        metrics: Metrics,
        *,
        cache: AnalysisCache | None = None,
        identity_headers: Sequence[str],
        words: WordTokens | None = None,
    ) -> None:
        self.cluster = cluster
        self.metrics = metrics
        self.cache = cache if cache is not None else AnalysisCache()
        self.identity_headers = tuple(identity_headers)
        self._analyzers: TTLCache[tuple[str, str], FieldAnalyzers | None] = TTLCache(
            ANALYZER_CACHE, ANALYZER_TTL
        )
        self.words = words if words is not None else WordTokens()

    async def tokens(
        self, index: str, plan: Plan, headers: Mapping[str, str], *, searched: str | None = None
    ) -> Tokens:
        """Every leaf's text and every augmentation, analysed on `index` with the search analyzer of its
        field in every index `searched` names (default: `index`). Raises `AnalysisDeclined` where no
        one analyzer makes a field's query tokens."""
        assert plan.spec is not None
        tree = plan.scored
        names = fields(tree)
        searched = searched or index
        found_analyzers = await asyncio.gather(*(self.field_analyzers(searched, f, headers) for f in names))
        by_field = {f: _searched_with(f, a, tree) for f, a in zip(names, found_analyzers, strict=True)}
        pairs = list(
            dict.fromkeys(p for leaf in leaves(tree) for p in leaf_queries(leaf, plan.spec.augment.queries))
        )
        who = caller(headers, self.identity_headers)

        def cached(f: str, text: str) -> Awaitable[list[str]]:
            key = (who, *_analyzer(index, f, by_field[f]), text)
            return self.cache.tokens(key, lambda: self._analyze(index, f, text, headers, by_field[f]))

        found = await asyncio.gather(*(cached(f, t) for f, t in pairs))
        return dict(zip(pairs, found, strict=True))

    def guess(self, index: str, plan: Plan) -> Tokens | None:
        """`tokens`' answer guessed from the words of earlier analyses (`WordTokens`), None unless every
        text's every word was seen with its field's analyzer (which must be known already)."""
        assert plan.spec is not None
        out: Tokens = {}
        for leaf in leaves(plan.scored):
            for f, text in leaf_queries(leaf, plan.spec.augment.queries):
                analyzer = self._known_analyzer(index, f)
                guessed = None if analyzer is None else self.words.guess(analyzer, text)
                if guessed is None:
                    return None
                out[(f, text)] = guessed
        return out

    def missed(self, index: str, fields: Sequence[str]) -> None:
        """A guess on these fields left a real token unprobed (see `WordTokens`)."""
        for f in fields:
            if (analyzer := self._known_analyzer(index, f)) is not None:
                self.words.missed(analyzer)

    def known(self, index: str, plan: Plan) -> Tokens | None:
        """`tokens`' answer known without `_analyze`, else None: where every field's search analyzer is
        the built-in `standard` one, as its mapping read earlier says, and every text one whose tokens
        `standard_analysis` knows."""
        assert plan.spec is not None
        out: Tokens = {}
        for leaf in leaves(plan.scored):
            resolved = self._analyzers.get((index, leaf.field))
            if not isinstance(resolved, FieldAnalyzers) or not resolved.standard or not resolved.vectors:
                return None
            if _quoted_apart(leaf, resolved):
                return None
            for f, text in leaf_queries(leaf, plan.spec.augment.queries):
                tokens = standard_analysis(text)
                if tokens is None:
                    return None
                out[(f, text)] = tokens
        return out

    def _known_analyzer(self, index: str, field: str) -> AnalyzerKey | None:
        """What analyses the field's query texts, if its mapping was read already and names one
        (None: not yet, or not one)."""
        known = self._analyzers.get((index, field), _UNREAD)
        if known is _UNREAD or known is None or not known.vectors:  # type: ignore[union-attr]
            return None
        return _analyzer(index, field, known)  # type: ignore[arg-type]

    async def field_analyzers(
        self, index: str, field: str, headers: Mapping[str, str]
    ) -> FieldAnalyzers | None:
        """The field's analyzers as its mapping resolves them (`UNMAPPED`: none read), None when the
        indices `index` names resolve them differently.

        A mapping read is remembered for ANALYZER_TTL seconds and shared by every caller: it is the
        index's, not the caller's, and who may search the index learns nothing else from it (each caller
        still runs `_analyze` and the search with its own credentials). A failed read is not
        remembered: one caller without view_index_metadata (or a missing index) must not decide the
        analyzer of the others, nor fill the memory with names of indices that do not exist."""
        key = (index, field)
        known = self._analyzers.get(key, _UNREAD)
        if known is not _UNREAD:
            return known  # type: ignore[return-value]
        try:
            found = await self.metrics.timed("mapping", self.cluster.field_analyzers(index, field, headers))
        except UpstreamError as exc:
            # Reading mappings needs view_index_metadata, which a search-only user may lack: analyze
            # with the field then, which is exact unless the mapping or the index's settings set a
            # search analyzer.
            if exc.status not in (400, 401, 403, 404, 405):
                raise
            return UNMAPPED
        resolved = None if len(found) > 1 else next(iter(found), UNMAPPED)
        self._analyzers[key] = resolved
        return resolved

    async def _analyze(
        self, index: str, field: str, text: str, headers: Mapping[str, str], analyzers: FieldAnalyzers
    ) -> list[str]:
        if not text.strip():
            return []
        found = await self.metrics.timed(
            "analyze", self.cluster.analyze(index, field, text, headers, _search_name(analyzers))
        )
        self.words.learn(_analyzer(index, field, analyzers), text, found)
        return [token for token, _ in found]


class AnalysisDeclined(Exception):
    """No one analyzer makes a field's query tokens: the window is not reranked, for `reason`."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _searched_with(field: str, analyzers: FieldAnalyzers | None, tree: Node) -> FieldAnalyzers:
    """The analyzers of the field's query texts, where one analyzer makes them."""
    if analyzers is None:
        raise AnalysisDeclined("analyzers_differ")  # the indices searched analyse the field differently
    if not analyzers.vectors:  # no hit's frequencies or length can be read (`upstream.readable`)
        raise AnalysisDeclined("no_term_vectors")
    if any(_quoted_apart(leaf, analyzers) for leaf in leaves(tree) if leaf.field == field):
        raise AnalysisDeclined("search_quote_analyzer")
    return analyzers


def _quoted_apart(leaf: Text, analyzers: FieldAnalyzers) -> bool:
    """A phrase on a field whose `search_quote_analyzer` is not its search analyzer: its text is not
    analysed as the field's other texts are (one set of tokens per field and text)."""
    return leaf.quoted and analyzers.quote != analyzers.search


def _search_name(analyzers: FieldAnalyzers) -> str | None:
    """The search analyzer by name, where it is not the index analyzer `_analyze` with `field` applies."""
    return analyzers.search if analyzers.search != analyzers.index else None


def _analyzer(index: str, field: str, analyzers: FieldAnalyzers) -> AnalyzerKey:
    """What analyses a field's query texts: its search analyzer by name, else the field's own; in the
    generation of the index's settings it was read in (a recreated index, changed analysis settings:
    another key)."""
    name = _search_name(analyzers)
    what = f"analyzer:{name}" if name else f"field:{field}"
    return (index, what if analyzers.generation is None else f"{what}@{analyzers.generation}")
