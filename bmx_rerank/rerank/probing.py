"""Whether a window's first stage carries term-frequency probes, and taking them back out when the
cluster refuses them. The probes themselves (building, reading) are `tf_probe`'s; this decides.

`auto` probes only a window this caller has not had reranked lately (a repeated one is served by the
term-vector cache, as cheaply as without probes) and only when the lengths will not need
`_mtermvectors` either: a field's statistics carry a length table. (Without one, a new window's
lengths are rarely all in the length cache: probes would then cost the first stage more and still
fetch term vectors; `on` takes that bet.)"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence

import orjson
from cachetools import TTLCache

from bmx_rerank.errors import SearchError, UpstreamError
from bmx_rerank.metrics import Metrics
from bmx_rerank.rerank import tf_probe
from bmx_rerank.rerank.analysis import AnalysisDeclined
from bmx_rerank.rerank.window import Tokens, Window
from bmx_rerank.stats.cache import StatsView
from bmx_rerank.upstream import Cluster, index_path

PROBE_MODES = ("auto", "on", "off")
# Seconds (at most a quarter of --timeout) the first stage may wait for what its probes need (the
# analysis, the once-per-cluster parameter check): past it the search goes without probes, so a slow
# cluster answers within --timeout plus this, not twice the timeout.
PROBE_WAIT = 0.5
# `auto` probes a window this caller has not had reranked within SEEN_TTL seconds: a repeated one goes
# unprobed, its frequencies from the term-vector cache. At most SEEN_WINDOWS (caller, window) pairs.
SEEN_TTL = 600.0
SEEN_WINDOWS = 16384
REFUSED_TTL = 300.0  # seconds an (index expression, fields) whose probes the cluster refused goes unprobed


class Prober:
    """Decides, per window, whether its first stage carries probes; remembers what decides it."""

    def __init__(
        self,
        cluster: Cluster,
        metrics: Metrics,
        *,
        mode: str,
        remember_windows: bool,
        kept: Callable[[tuple[str, str]], bool],
    ) -> None:
        if mode not in PROBE_MODES:
            raise ValueError(f"probes must be one of {PROBE_MODES}, got {mode!r}")
        self.cluster = cluster
        self.metrics = metrics
        self.mode = mode
        self.remember_windows = remember_windows  # no term-vector cache: a seen window costs as a new one
        # whether the term-vector cache still keeps a window (caller, digest): one it let go is probed
        # again, as a new one (its documents have no entries of their own: `SeenWindow.entries`)
        self.kept = kept
        self.seen: TTLCache[tuple[str, str], bool] = TTLCache(maxsize=SEEN_WINDOWS, ttl=SEEN_TTL)
        self._named_scores: bool | None = None  # does the cluster report named query scores?
        # (index expression, fields) whose probes the cluster refused (not text with positions)
        self._refused: TTLCache[tuple[str, tuple[str, ...]], bool] = TTLCache(maxsize=1024, ttl=REFUSED_TTL)

    async def add(self, window: Window, who: str, headers: Mapping[str, str]) -> None:
        """Put the probes in the window's request, or note why not (`window.unprobed_because`)."""
        window.unprobed_because = await self._add(window, who, headers)

    def saw(self, window: Window, who: str) -> None:
        """This caller had this window reranked, its documents cached (`auto` leaves it unprobed)."""
        if self.remember_windows:
            self.seen[(who, window.digest)] = True

    def had(self, window: Window, who: str) -> bool:
        """Whether this caller had this window reranked lately (`saw`)."""
        key = (who, window.digest)
        return self.remember_windows and key in self.seen and self.kept(key)

    def drop(self, window: Window) -> bool:
        """After the cluster refused a first stage with probes: the request without them, to send
        instead (True), remembering the refusal; False when it had none (its answer is the caller's).

        Probes only fit text fields indexed with positions; a keyword field, a field indexed with
        `index_options: freqs`, or an invalid query of the caller's make the probed search a 400."""
        if window.probe is None or window.unprobed is None:
            return False
        self._refused[(window.index_expr, window.probe.fields)] = True
        window.body, window.params = window.unprobed
        window.probe = window.unprobed = None
        window.unprobed_because = "refused"
        return True

    async def _add(self, window: Window, who: str, headers: Mapping[str, str]) -> str | None:
        """What `add` does; what it waits for (the tokens, the parameter check, the statistics) is
        bounded by PROBE_WAIT."""
        body, params = window.body, window.params
        assert window.plan.spec is not None
        if self.mode == "off":
            return "off"
        if window.tokens is None or body is None:
            return "index_pattern"  # tokens are known only once the hits name their index
        if window.plan.spec.augment.provider == "prf":
            return "prf"  # feedback reads every term of the window's documents: their term vectors
        if why := tf_probe.why_not(body, orjson.dumps(body), params):
            return why
        auto = self.mode == "auto"
        if auto and self.had(window, who):
            return "seen"
        tables = auto  # a length cache cannot say before the search whether it holds these hits
        timeout = self.cluster.timeout
        wait = PROBE_WAIT if timeout is None else min(PROBE_WAIT, timeout / 4)
        try:
            inputs = self._inputs(window, headers, tables)
            # all in already: no task for a timeout, and `_inputs` never waits
            tokens, views, guessed = await (
                inputs if self._at_hand(window) else asyncio.wait_for(inputs, wait)
            )
        except (SearchError, asyncio.TimeoutError):
            return "timeout"  # the rerank analyses again on the hits' index, or fails as it would have
        except AnalysisDeclined as declined:
            return declined.reason  # no query tokens: the window is declined once the first stage is in
        if tokens is None:
            return "no_named_scores"
        if tables and not any(v.lengths is not None for v in views):
            return "no_lengths"
        probe = tf_probe.probe_terms(tokens)
        if probe is None:
            return "tokens"  # none, or more than MAX_PROBES
        if (window.index_expr, probe.fields) in self._refused:
            return "refused"
        window.probe, window.unprobed = probe, (body, params)
        window.probes_guessed = guessed
        window.body = tf_probe.with_probes(body, probe)
        window.params = {**params, tf_probe.PARAM: "true"}
        return None

    def _at_hand(self, window: Window) -> bool:
        """Whether what `_inputs` waits for is in already (then it answers without a wait): the
        cluster's named scores known, the tokens and every field's statistics done (known words,
        statistics in memory)."""
        tasks = [window.tokens, *window.stats.values()]
        return self._named_scores is not None and all(t is not None and t.done() for t in tasks)

    async def _inputs(
        self, window: Window, headers: Mapping[str, str], tables: bool
    ) -> tuple[Tokens | None, Sequence[StatsView], bool]:
        """The query's tokens when the cluster takes probes (else None) and, with `tables`, the
        statistics views that could be had; whether the tokens are the window's guess (`guessed`,
        taken while the analysis is not in: the search need not wait for it). The shared tasks are
        shielded: giving up on probes never cancels them, and a failed statistics lookup fails the
        rerank later, as without probes."""
        if not await self._reports_named_scores(window.index_expr, headers):
            return None, [], False
        assert window.tokens is not None
        guessed = window.guessed is not None and not window.tokens.done()
        tokens = window.guessed if guessed else await asyncio.shield(window.tokens)
        if not tables:
            return tokens, [], guessed
        stats = window.stats.values()
        if all(t.done() for t in stats):  # as they are: a gather would wait a loop step for them
            views = [t.result() for t in stats if not t.cancelled() and t.exception() is None]
        else:
            views = await asyncio.gather(*(asyncio.shield(t) for t in stats), return_exceptions=True)
        return tokens, [v for v in views if isinstance(v, StatsView)], guessed

    async def _reports_named_scores(self, index: str, headers: Mapping[str, str]) -> bool:
        """Whether the cluster accepts `include_named_queries_score` (Elasticsearch >= 8.8, OpenSearch
        >= 2.13): asked once with an empty search, with the caller's credentials. Only the cluster's
        refusal of the parameter is remembered; any other failure means no probes for this search."""
        if self._named_scores is None:
            path = f"/{index_path(index)}/_search?{tf_probe.PARAM}=true"
            try:
                await self.metrics.timed(
                    "probe_check",
                    self.cluster.request("POST", path, tf_probe.MATCH_NONE, headers, retried=True),
                )
                self._named_scores = True
            except UpstreamError as exc:
                if exc.status == 400 and tf_probe.PARAM in exc.reason:
                    self._named_scores = False
                return False
            except SearchError:  # unreachable, slow, or not JSON: no probes; the search decides
                return False
        return self._named_scores
