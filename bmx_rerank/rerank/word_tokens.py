"""A new query's tokens guessed from the words of earlier ones, so that its probes need not wait for
`_analyze`.

Most search analyzers work word by word (split at whitespace and punctuation, lowercase, stem, drop
stop words): the tokens of a text are then its words' tokens in turn. `WordTokens` learns each word's
tokens from the `_analyze` answers the rerank gets anyway (a token's `start_offset` says which word it
comes from) and guesses a text whose every word it has seen, so the first stage with probes starts
while `_analyze` still runs. A plain word not seen yet is guessed too, as the one lowercased token the
`standard` analyzer makes of it, where the analyzer did so with every plain word it was seen with
(RULE_EVIDENCE at least). A guess never scores anything: the rerank scores the real tokens, and
checks once they are in that the probes covered every one of them (`Probe.covers`). If not (an
analyzer that works across words: shingles, multi-word synonyms), that window's frequencies come from
term vectors, as without probes, and that analyzer is not guessed for DISTRUST_SECONDS."""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Sequence

from cachetools import LRUCache, TTLCache

AnalyzerKey = tuple[str, str]  # (index expression, "analyzer:NAME" or "field:NAME"): what analysed
WORDS = 50_000  # words remembered, every analyzer together (~250 bytes each: ~12 MB at most)
DISTRUST_SECONDS = 600.0  # an analyzer whose guess missed is not guessed for this long
_WORD = re.compile(r"\S+")
# A plain word: letters and digits, punctuation at most around them ("cells,", "(p53)"), which the
# `standard` analyzer makes one lowercased token of; a word with punctuation inside ("u.s.", "don't",
# "covid-19") is guessed only once seen
PLAIN = re.compile(r"\W*(\w+)\W*")
RULE_EVIDENCE = 50  # plain words an analyzer must have made one lowercased token of, and none otherwise


class WordTokens:
    """Each word's tokens per analyzer, learned from whole texts' analyses."""

    def __init__(self, capacity: int = WORDS) -> None:
        self.capacity = capacity
        self._words: LRUCache[tuple[str, str, str], tuple[str, ...]] = LRUCache(maxsize=max(1, capacity))
        self._distrusted: TTLCache[AnalyzerKey, bool] = TTLCache(maxsize=1024, ttl=DISTRUST_SECONDS)
        # per analyzer, the plain words it made one lowercased token of (-1: one it did not)
        self._ruled: LRUCache[AnalyzerKey, int] = LRUCache(maxsize=1024)

    def learn(self, analyzer: AnalyzerKey, text: str, tokens: Sequence[tuple[str, int]]) -> None:
        """Remember the words of `text` with their tokens (`tokens`: each with its `start_offset`, in
        UTF-16 code units as the cluster counts them); nothing when a token starts outside a word."""
        if self.capacity <= 0:
            return
        words = _words(text)
        starts = [start for start, _, _ in words]
        found: list[list[str]] = [[] for _ in words]
        for token, offset in tokens:
            i = bisect_right(starts, offset) - 1
            if i < 0 or offset >= words[i][1]:
                return
            found[i].append(token)
        ruled = self._ruled.get(analyzer, 0)
        for (_, _, word), its in zip(words, found, strict=True):
            self._words[(*analyzer, word)] = tuple(its)
            plain = _plain(word)
            if plain is not None and ruled >= 0:
                ruled = ruled + 1 if its == plain else -1
        self._ruled[analyzer] = ruled

    def guess(self, analyzer: AnalyzerKey, text: str) -> list[str] | None:
        """The tokens of `text` if each of its words was seen (and the analyzer is trusted), else None."""
        if self.capacity <= 0 or analyzer in self._distrusted:
            return None
        out: list[str] = []
        ruled = self._ruled.get(analyzer, 0) >= RULE_EVIDENCE
        for word in _WORD.findall(text):
            its = self._words.get((*analyzer, word))
            if its is None and ruled:
                its = _plain(word)
            if its is None:
                return None
            out.extend(its)
        return out

    def missed(self, analyzer: AnalyzerKey) -> None:
        """A guess of this analyzer left a real token unprobed: stop guessing for it a while."""
        self._distrusted[analyzer] = True


def _words(text: str) -> list[tuple[int, int, str]]:
    """Each word of `text` with its (start, end) in UTF-16 code units (a Java string's offsets)."""
    out = []
    at, units = 0, 0
    for m in _WORD.finditer(text):
        start = units + _units(text[at : m.start()])
        units = start + _units(m.group())
        at = m.end()
        out.append((start, units, m.group()))
    return out


def _plain(word: str) -> list[str] | None:
    """The standard analyzer's token of a plain word, None for another word."""
    m = PLAIN.fullmatch(word)
    return None if m is None else [m.group(1).lower()]


def _units(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2
