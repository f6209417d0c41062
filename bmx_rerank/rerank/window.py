"""The window in flight: one rerank's first-stage request and the calls started beside it.

A window is opened before the first stage is sent (its analysis and statistics lookups overlap with
the search) and closed, whatever happens, when the rerank ends: `close` cancels what still runs."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from bmx_rerank.rerank import tf_probe
from bmx_rerank.rerank.plan import Plan
from bmx_rerank.stats.cache import StatsView

if TYPE_CHECKING:
    from bmx_rerank.rerank.lean import Ahead

Pair = tuple[str, str]  # (field, text): one text analysed with one field's search analyzer
Tokens = dict[Pair, list[str]]


@dataclass
class Window:
    """One rerank's window: what the first stage asks for (`body`, `params`) and the calls under way.

    `probe` is set when the first stage carries term-frequency probes; otherwise `unprobed_because`
    says why not (the marker's `tf_probes`): "not_tried" for a first stage that never asks (an
    `_msearch` item)."""

    index_expr: str
    plan: Plan
    digest: str  # what identifies the window request (see `window_digest`)
    body: dict[str, Any] | None
    params: dict[str, str]
    tokens: asyncio.Task[Tokens] | None  # the query's analysis, when the index is known up front
    stats: dict[str, asyncio.Future[StatsView]]  # one statistics lookup per scored field (done: in memory)
    probe: tf_probe.Probe | None = None
    unprobed_because: str | None = "not_tried"
    unprobed: tuple[dict[str, Any] | None, dict[str, str]] | None = None  # the request without probes
    # set when the first stage is lean (`lean`): what the page fetch asks each hit to show (body, params)
    page_fetch: tuple[dict[str, Any], dict[str, str]] | None = None
    # a lean window over one index of several shards: searched shard by shard (`rerank/shards.py`)
    shards: int = 1
    # the tokens guessed word by word at open (`rerank/word_tokens.py`), and whether the probes were
    # built from them (the analysis was not in yet): the rerank then checks they covered the real ones
    guessed: Tokens | None = None
    probes_guessed: bool = False
    # holds the analysis back until the first stage is sent (`analyse`), where its tokens were guessed
    analysis_gate: asyncio.Event | None = None
    # a lean window's likely page, fetched while it is scored (`lean.ahead`)
    ahead: Ahead | None = None
    # the caller had this lean window before and the page cache keeps its page: the page is read from
    # there (what is missing fetched after), none guessed
    page_kept: bool = False

    @property
    def lean(self) -> bool:
        return self.page_fetch is not None

    def analyse(self) -> None:
        """Let the analysis go, held back until now (the first stage just started) if it was."""
        if self.analysis_gate is not None:
            self.analysis_gate.set()

    def close(self) -> None:
        """Cancel the calls still running; retrieve the failures of those that ended (so asyncio does
        not warn about them)."""
        ahead = self.ahead.task if self.ahead is not None else None
        for task in (self.tokens, *self.stats.values(), ahead):
            drop(task)

    def msearch_header(self, header: Mapping[str, Any], url_preference: str | None = None) -> dict[str, Any]:
        """An `_msearch` item header with the window's preference, unless the caller set one (in the
        header, or for every item in the `_msearch` URL)."""
        if "preference" in header or url_preference is not None:
            return dict(header)
        return {**header, "preference": self.params["preference"]}


def drop(task: asyncio.Future[Any] | None) -> None:
    """A call no longer needed: cancelled while it runs, else its failure retrieved (so asyncio does not
    warn about it; whoever needs the cluster meets a failing one again)."""
    if task is None:
        return
    if not task.done():
        task.cancel()
        # a task may still end with its own failure (a timeout of the same deadline, raised as the
        # cancel arrived): retrieved then
        task.add_done_callback(_retrieved)
    else:
        _retrieved(task)


def _retrieved(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


def window_digest(index_expr: str, plan: Plan) -> str:
    """What identifies a window request: the index expression, the first-stage body (which asks for
    0..window_size, the same for every page of one query) and the parameters, the caller's
    `preference` included."""
    return hashlib.sha256(
        orjson.dumps([index_expr, plan.body, sorted(plan.params.items())], option=orjson.OPT_SORT_KEYS)
    ).hexdigest()


def window_request(
    index_expr: str, plan: Plan, digest: str | None = None
) -> tuple[dict[str, Any] | None, dict[str, str]]:
    """The first-stage body and query parameters for the window.

    - `preference`: the caller's if given, else one derived from the index and the window request
      (which is the same for every page of one query: it asks for 0..window_size): pages 0, 10, 20 are
      served by the same shard copies, so they neither repeat nor skip hits.
    - `version: true`: the term vectors of a hit are used only if their `_version` is the hit's (see
      `frequencies`); the field is removed from the answer unless the caller asked for it."""
    params = dict(plan.params)
    body = None if plan.body is None else {**plan.body, "version": True}
    if "preference" not in params:
        params["preference"] = f"bmx-{(digest or window_digest(index_expr, plan))[:16]}"
    return body, params


def known_index(index_expr: str) -> bool:
    """An expression `_analyze` accepts before the hits say which indices they come from."""
    return bool(index_expr) and not any(c in index_expr for c in "*,") and not index_expr.startswith("_")
