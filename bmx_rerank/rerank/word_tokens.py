"""A new query's tokens guessed from the words of earlier ones, so that its probes need not wait for
`_analyze`.

Most search analyzers work word by word (split at whitespace and punctuation, lowercase, stem, drop
stop words): the tokens of a text are then its words' tokens in turn. `WordTokens` learns each word's
tokens from the `_analyze` answers the rerank gets anyway (a token's `start_offset` says which word it
comes from) and guesses a text whose every word it has seen, so the first stage with probes starts
while `_analyze` still runs. A word not seen yet is guessed too, as the `standard` analyzer would make
its tokens (`_standard`: Unicode word boundaries, lowercased; "IL-10" -> il, 10; "U.S." -> u.s), where
the analyzer did so with every word it was seen with (RULE_EVIDENCE at least) and the word is of the
scripts and punctuation those rules are followed for here (checked word by word against the engines:
tests/integration/test_tf_probe.py, benchmarks/word_guesses.py). A guess never scores anything: the
rerank scores the real tokens, and checks once they are in that the probes covered every one of them
(`Probe.covers`). If not (an analyzer that works across words: shingles, multi-word synonyms), that
window's frequencies come from term vectors, as without probes, and that analyzer is not guessed for
DISTRUST_SECONDS."""

from __future__ import annotations

import re
import unicodedata
from bisect import bisect_right
from collections.abc import Sequence
from functools import lru_cache

from cachetools import LRUCache, TTLCache

AnalyzerKey = tuple[str, str]  # (index expression, "analyzer:NAME" or "field:NAME"): what analysed
WORDS = 50_000  # words remembered, every analyzer together (~250 bytes each: ~12 MB at most)
DISTRUST_SECONDS = 600.0  # an analyzer whose guess missed is not guessed for this long
_WORD = re.compile(r"\S+")
# Whitespace that may not part two tokens: U+202F joins letters as ExtendNumLet in Unicode word
# boundaries, so a text with any whitespace but ASCII's is not taken word by word
_UNSURE_SPACE = re.compile(r"[^\S \t\n\r\f\v]")
# Words an analyzer must have made the `standard` tokenizer's lowercased tokens of (`_standard`), and
# no word otherwise, before an unseen word is guessed so
RULE_EVIDENCE = 50
# What joins two letters into one token ("u.s", "patient's"), and two digits ("1,000", "0.05"), in
# Unicode word boundaries (MidLetter, MidNum, MidNumLet, Single_Quote); any other punctuation
# always separates tokens ("il-10", "5mmol/l")
BETWEEN_LETTERS = frozenset(".:'\u00b7\u2018\u2019\u2024\u2027")
BETWEEN_DIGITS = frozenset(".,;'\u2018\u2019\u2024")
PICTOGRAPHS = frozenset("\u00a9\u00ae\u203c\u2049")  # Extended_Pictographic below U+2300
MAX_TOKEN = 255  # the standard tokenizer's longest token; a longer word is not guessed


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
        if self.capacity <= 0 or _UNSURE_SPACE.search(text):
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
            rule = _standard(word)
            if rule is not None and ruled >= 0:
                ruled = ruled + 1 if its == rule else -1
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
                its = _standard_known(word)
            if its is None:
                return None
            out.extend(its)
        return out

    def missed(self, analyzer: AnalyzerKey) -> None:
        """A guess of this analyzer left a real token unprobed: stop guessing for it a while."""
        self._distrusted[analyzer] = True


def standard_analysis(text: str) -> list[str] | None:
    """The tokens the built-in `standard` analyzer makes of `text`, where every word is one `_standard`
    reads and ASCII whitespace alone parts them (Unicode word boundaries never join two characters
    across it); else None. Checked against every engine on every word of up to three characters of
    the classes the rule tells apart, and on every punctuated word of two corpora
    (tests/integration/test_tf_probe.py, benchmarks/word_guesses.py)."""
    if _UNSURE_SPACE.search(text):
        return None
    out: list[str] = []
    for word in _WORD.findall(text):
        tokens = _standard_known(word)
        if tokens is None:
            return None
        out.extend(tokens)
    return out


@lru_cache(maxsize=WORDS)
def _standard_known(word: str) -> tuple[str, ...] | None:
    """`_standard`, remembered: a new query's words are mostly words of earlier ones."""
    tokens = _standard(word)
    return None if tokens is None else tuple(tokens)


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


def _standard(word: str) -> list[str] | None:
    """The tokens the `standard` analyzer makes of a word of letters (Latin, Greek, Cyrillic), ASCII
    digits and underscores, with punctuation or symbols among them (Unicode word boundaries: a period,
    apostrophe or colon joins two letters, a period, comma, semicolon or apostrophe two digits, an
    underscore anything, anything else separates), lowercased as Lucene's LowerCaseFilter does; None
    for any other word (another script, a mark, a pictograph), whose rules are not followed here."""
    if len(word) > MAX_TOKEN:
        return None
    out: list[str] = []
    token = ""
    for at, c in enumerate(word):
        if (c.isascii() and c.isalnum()) or (c.isalpha() and ord(c) < 0x530) or c == "_":
            token += c  # "_" joins whatever it touches (ExtendNumLet)
            continue
        if not _separates_or_joins(c):
            return None
        after = word[at + 1 : at + 2]
        before = token[-1:]
        if after and before and _joins(before, c, after):
            token += c
            continue
        if token:
            out.append(token)
        token = ""
    if token:
        out.append(token)
    if any(not t.strip("_") for t in out):
        return None  # underscores alone
    lowered = [_lowered(t) for t in out]
    return None if None in lowered else lowered  # type: ignore[return-value]


def _separates_or_joins(c: str) -> bool:
    """A character the `standard` tokenizer keeps in no token of its own: punctuation, or a symbol of
    ASCII, Latin-1 or the mathematical operators (not a pictograph: those are emoji tokens, as are
    `©`, `®`, `‼`, `⁉`)."""
    category = unicodedata.category(c)
    if c in PICTOGRAPHS or category[0] not in "PS":
        return False
    return ord(c) <= 0xFF or category[0] == "P" and ord(c) < 0x2070 or 0x2200 <= ord(c) < 0x2300


def _joins(before: str, c: str, after: str) -> bool:
    """Whether `c` between these two characters stays inside a token (Unicode word boundaries' rules
    WB6/WB7 and WB11/WB12)."""
    if before.isalpha() and after.isalpha():
        return c in BETWEEN_LETTERS
    if before.isdigit() and after.isdigit():
        return c in BETWEEN_DIGITS
    return False


def _lowered(text: str) -> str | None:
    """`text` lowercased one character at a time (as Java's `Character.toLowerCase`: no context, a
    final sigma stays σ); None where a character lowercases to several."""
    out = [c.lower() for c in text]
    return "".join(out) if all(len(c) == 1 for c in out) else None


def _units(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2
