"""Weighted query augmentation (WQA): where the augmented queries come from, behind one interface.

`ext.bmx.augment.provider` picks the source (also usable in a policy and in `bmx-rerank eval`):

- `given` (default): the caller's own `queries` and `weights`;
- `prf`: pseudo-relevance feedback, RM3-style. The window is scored with the original query, the top
  `docs` documents' term vectors (which the rerank already holds: no extra call to the cluster, except
  the statistics of the new terms in the estimated mode) give `terms` expansion terms, each a one-token
  augmentation weighted `weight * rm(t) / max rm`, where rm(t) = sum over the feedback documents of
  p(d) tf(t, d) / |d|, times the term's idf (the standard analyzer keeps stopwords, which plain RM1 would
  pick first), counting only terms found in at least two feedback documents;
- `llm`: `count` augmented queries from an OpenAI-compatible chat-completions endpoint with the paper's
  prompt (appendix A), each weighted `weight`; they widen the first stage like given queries. When the
  LLM fails (down, slow, junk), the search is reranked with the original query alone and the `_bmx`
  marker's `augment.note` says why: a search never fails because of its augmentation."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import aiohttp
import numpy as np
import orjson
from cachetools import LRUCache

from bmx_rerank.errors import SearchError, bad_request
from bmx_rerank.singleflight import SingleFlight
from bmx_rerank.stats.corpus import CorpusStats
from bmx_rerank.upstream import DocTerms

log = logging.getLogger("bmx_rerank.augment")

PROVIDERS = ("given", "prf", "llm")
OPTION_LIMITS = {"docs": (1, 1000), "terms": (1, 100), "count": (1, 20)}
WEIGHT_RANGE = (0.0, 100.0)  # of each augmented query, and of the generated ones: no score overflows


@dataclass(frozen=True)
class Augment:
    """Augmented queries (WQA), their weights, and the provider that finds them.

    `docs`/`terms` tune `prf`, `count` tunes `llm`, `weight` is the weight of what a provider adds;
    `note` says what the provider did when it could not deliver (for the `_bmx` marker)."""

    queries: tuple[str, ...] = ()
    weights: tuple[float, ...] = ()
    provider: str = "given"
    docs: int = 10
    terms: int = 10
    count: int = 5
    weight: float = 0.3
    note: str | None = None

    def marker(self) -> dict[str, Any] | None:
        """What the `_bmx` marker says about the augmentation (None when there is none)."""
        if self.provider == "given" and not self.queries:
            return None
        out: dict[str, Any] = {"provider": self.provider, "queries": len(self.queries)}
        if self.note:
            out["note"] = self.note
        return out


# --- reading `ext.bmx.augment` -----------------------------------------------------------------------


def parse_augment(raw: Any, where: str) -> Augment:
    """`augment` of `ext.bmx`: an object, or a provider's name alone (`"prf"`, as a policy writes it)."""
    if isinstance(raw, str):
        raw = {"provider": raw}
    if not isinstance(raw, Mapping):
        raise _parse_error(f"[{where}] [augment] expected an object, got {type(raw).__name__}")
    known = ("queries", "weights", "provider", "docs", "terms", "count", "weight")
    unknown = [k for k in raw if k not in known]
    if unknown:
        raise _parse_error(f"[{where}.augment] unknown field [{unknown[0]}]")
    provider = raw.get("provider", "given")
    if provider not in PROVIDERS:
        raise bad_request(
            f"[{where}] [augment.provider] must be one of [{', '.join(PROVIDERS)}], got [{provider}]"
        )
    queries = raw.get("queries", [])
    if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
        raise _parse_error(f"[{where}] [augment.queries] expected an array of strings")
    if queries and provider != "given":
        raise bad_request(f"[{where}] [augment.queries] come from the caller only with provider [given]")
    weights = raw.get("weights")
    if weights is None:
        weights = [1.0] * len(queries)
    if not isinstance(weights, list) or not all(_is_number(w) for w in weights):
        raise _parse_error(f"[{where}] [augment.weights] expected an array of numbers")
    if len(weights) != len(queries):
        raise bad_request(
            f"[{where}] [augment.weights] must have one weight per query: "
            f"{len(weights)} weights for {len(queries)} queries"
        )
    low, high = WEIGHT_RANGE
    if any(not low <= w <= high for w in weights):  # also refuses NaN and infinities
        raise bad_request(f"[{where}] [augment.weights] must be numbers in [{low:g}, {high:g}]")
    values: dict[str, Any] = {}
    for name, (low, high) in OPTION_LIMITS.items():
        if name in raw:
            value = raw[name]
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise bad_request(f"[{where}] [augment.{name}] must be an integer in [{low}, {high}]")
            values[name] = value
    if "weight" in raw:
        value = raw["weight"]
        if not _is_number(value) or not WEIGHT_RANGE[0] <= value <= WEIGHT_RANGE[1]:
            raise bad_request(
                f"[{where}] [augment.weight] must be a number in [{WEIGHT_RANGE[0]:g}, {WEIGHT_RANGE[1]:g}]"
            )
        values["weight"] = float(value)
    return Augment(tuple(queries), tuple(float(w) for w in weights), provider, **values)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _parse_error(reason: str) -> SearchError:
    return bad_request(reason, "x_content_parse_exception")


# --- PRF: expansion terms from the window --------------------------------------------------------------


def feedback_terms(
    corpus: CorpusStats,
    docs: Sequence[DocTerms],
    scores: np.ndarray,
    exclude: Sequence[str],
    augment: Augment,
) -> list[tuple[str, float]]:
    """RM3-style expansion terms of the `augment.docs` best-scored documents, with their weights.

    Pure: the window's term vectors and first-pass scores in, (term, weight) pairs out, best first."""
    order = np.argsort(-scores, kind="stable")[: augment.docs]
    top = [docs[i] for i in order if docs[i].length > 0]
    if not top:
        return []
    mass = np.clip(scores[order[: len(top)]], 0.0, None)
    prior = mass / mass.sum() if mass.sum() > 0 else np.full(len(top), 1.0 / len(top))
    rm: dict[str, float] = {}
    seen: dict[str, int] = {}
    for p, doc in zip(prior, top, strict=True):
        length = doc.length
        for term, tf in doc.tf.items():
            rm[term] = rm.get(term, 0.0) + float(p) * tf / length
            seen[term] = seen.get(term, 0) + 1
    skip = set(exclude)
    need = min(2, len(top))
    candidates = [t for t in rm if t not in skip and seen[t] >= need]
    if not candidates:
        return []
    stats = corpus.term_stats(candidates)
    df = stats.df.astype(np.float64)
    n = float(corpus.n_docs)
    idf = np.log(1.0 + (n - df + 0.5) / (df + 0.5))
    value = np.array([rm[t] for t in candidates]) * np.where(df > 0, idf, 0.0)
    best = np.argsort(-value, kind="stable")[: augment.terms]
    best = [i for i in best if value[i] > 0]
    if not best:
        return []
    top_value = float(value[best[0]])
    return [(candidates[i], augment.weight * float(value[i]) / top_value) for i in best]


# --- LLM: augmented queries from a chat-completions endpoint ----------------------------------------------

PROMPT = (
    "You are an intelligent query augmentation tool. Your task is to augment each query with {size} "
    'similar queries and output JSONL format, like {{"query": "original query", "augmented_queries": '
    '["augmented query 1", "augmented query 2", ...]}}\n\nInput query: {query}\n\nOutput:'
)  # the paper's prompt (arXiv 2408.06643, appendix A, table 9)


@dataclass(frozen=True)
class LLMConfig:
    """Where the LLM is: any server speaking OpenAI's chat-completions protocol."""

    base_url: str  # e.g. https://api.openai.com/v1, http://127.0.0.1:8000/v1 (vLLM), .../v1 (Ollama)
    model: str
    api_key: str | None = None
    timeout: float = 10.0  # seconds per attempt
    attempts: int = 2  # bounded: a down LLM costs at most attempts * timeout per distinct query
    cache_size: int = 10_000  # distinct (query, count) answers remembered

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> LLMConfig | None:
        """From BMX_LLM_BASE_URL, BMX_LLM_MODEL, BMX_LLM_API_KEY (None when no URL is set)."""
        url = env.get("BMX_LLM_BASE_URL")
        if not url:
            return None
        return cls(
            base_url=url.rstrip("/"),
            model=env.get("BMX_LLM_MODEL", "gpt-4o-mini"),
            api_key=env.get("BMX_LLM_API_KEY") or None,
            timeout=float(env.get("BMX_LLM_TIMEOUT", "10")),
        )


class LLMError(Exception):
    """The LLM gave no usable answer (down, slow, 5xx, or a reply without the queries)."""


def parse_reply(text: str, query: str, count: int) -> list[str]:
    """The augmented queries in an LLM reply: the first JSON object with `augmented_queries` (code fences,
    prose or several JSONL lines around it are fine), else a JSON array of strings; at most `count`,
    blank ones and the original query dropped."""
    found: list[Any] | None = None
    for candidate in _json_candidates(text):
        if isinstance(candidate, dict) and isinstance(candidate.get("augmented_queries"), list):
            found = candidate["augmented_queries"]
            break
        if isinstance(candidate, list) and found is None:
            found = candidate
    if found is None:
        raise LLMError("no augmented_queries in the reply")
    out: list[str] = []
    for item in found:
        if isinstance(item, str) and item.strip() and item.strip() != query.strip() and item not in out:
            out.append(item.strip())
    if not out:
        raise LLMError("the reply's augmented_queries hold no query")
    return out[:count]


def _json_candidates(text: str):
    """Every JSON value that starts at a `{` or `[` of the text, in order."""
    decoder = json.JSONDecoder()
    for match in re.finditer(r"[\[{]", text):
        try:
            value, _ = decoder.raw_decode(text, match.start())
        except ValueError:
            continue
        yield value


class LLMProvider:
    """Augmented queries from an LLM: timeouts, bounded retries, a bounded cache, and one call for
    concurrent identical queries (they await the same task)."""

    def __init__(self, config: LLMConfig, session: aiohttp.ClientSession | None = None) -> None:
        self.config = config
        self._session = session
        self._own_session = session is None
        self._cache: LRUCache[tuple[str, int], tuple[str, ...]] = LRUCache(maxsize=config.cache_size)
        self._inflight: SingleFlight[tuple[str, int], tuple[str, ...]] = SingleFlight()
        self.calls = 0  # HTTP calls made (tests and metrics)

    async def queries(self, query: str, count: int) -> tuple[str, ...]:
        """`count` augmented queries for `query`; raises LLMError when the LLM cannot give them."""
        key = (query, count)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        result = await self._inflight.run(key, lambda: self._fetch(query, count))
        self._cache[key] = result
        return result

    async def _fetch(self, query: str, count: int) -> tuple[str, ...]:
        last: Exception | None = None
        for attempt in range(self.config.attempts):
            try:
                return tuple(parse_reply(await self._complete(query, count), query, count))
            except LLMError as exc:
                last = exc
                if not getattr(exc, "retry", True):
                    break
            if attempt + 1 < self.config.attempts:
                await asyncio.sleep(0.2 * (attempt + 1))
        raise LLMError(str(last))

    async def _complete(self, query: str, count: int) -> str:
        body = {
            "model": self.config.model,
            "messages": [{"role": "user", "content": PROMPT.format(size=count, query=query)}],
            "temperature": 0,
        }
        headers = {"Content-Type": "application/json"}
        if self.config.api_key:
            headers["Authorization"] = f"Bearer {self.config.api_key}"
        session = self._session_()
        self.calls += 1
        try:
            async with session.post(
                f"{self.config.base_url}/chat/completions",
                data=orjson.dumps(body),
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=self.config.timeout),
            ) as resp:
                payload = await resp.read()
                if resp.status >= 500 or resp.status == 429:
                    raise LLMError(f"LLM answered {resp.status}")
                if resp.status >= 400:
                    err = LLMError(f"LLM answered {resp.status}")
                    err.retry = False  # type: ignore[attr-defined]  # a 4xx will not get better
                    raise err
        except asyncio.TimeoutError as exc:
            raise LLMError(f"LLM took longer than {self.config.timeout}s") from exc
        except aiohttp.ClientError as exc:
            raise LLMError(f"LLM unreachable: {exc.__class__.__name__}") from exc
        try:
            return orjson.loads(payload)["choices"][0]["message"]["content"]
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError) as exc:
            raise LLMError("LLM answer is not a chat completion") from exc

    def _session_(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
            self._own_session = True
        return self._session

    async def close(self) -> None:
        if self._own_session and self._session is not None:
            await self._session.close()


async def resolve_llm(augment: Augment, query: str, llm: LLMProvider | None) -> Augment:
    """The augmentation with the LLM's queries filled in, or with a note saying why there are none."""
    if llm is None:
        return replace(augment, note="no LLM configured (BMX_LLM_BASE_URL): original query only")
    if not query.strip():
        return augment
    try:
        found = await llm.queries(query, augment.count)
    except LLMError as exc:
        log.warning("LLM augmentation failed", extra={"fields": {"reason": str(exc)[:200]}})
        return replace(augment, note=f"LLM unavailable ({exc}): original query only")
    return replace(augment, queries=found, weights=tuple(augment.weight for _ in found))
