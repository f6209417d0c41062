"""Words and how an engine's `standard` analyzer tokenizes them: what `rerank/word_tokens.py` guesses an
unseen word by is checked against it (tests/integration/test_tf_probe.py, benchmarks/word_guesses.py)."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Iterable
from typing import Any

from bmx_rerank.rerank.word_tokens import _WORD, _units

BATCH = 500  # words analysed in one `_analyze` call
# Characters of every class `word_tokens._standard` tells apart: letters (Latin, Latin-1, Greek,
# Cyrillic; a titlecase, a modifier and an "other" letter; ones Python and Java lowercase alike or not),
# ASCII digits, the underscore, and the punctuation and symbols of ASCII, Latin-1, General Punctuation
# and the mathematical operators, those that join two letters or digits and those that do not
CLASSES = (
    "aZéßΣжǅʰªſİ07"
    + "".join(chr(c) for c in range(0x21, 0x7F) if not chr(c).isalnum())
    + "¡§«·¿×÷°±¬¦©®\u2010\u2014\u2018\u2019\u2024\u2026\u2027\u2032\u203c∀−≈"
)
# The characters whose neighbours decide whether they join (Unicode word boundaries look two
# characters ahead and behind): four-character words of these
JOINING = "aΣ07_.,:;'\u2019-"


def punctuated(texts: Iterable[str]) -> list[str]:
    """The distinct words of `texts` with anything but letters and digits in them, sorted."""
    return sorted({w for t in texts for w in _WORD.findall(t) if not w.isalnum()})


def short_words(alphabet: str, longest: int) -> list[str]:
    """Every word of 1 to `longest` characters of `alphabet`."""
    return ["".join(w) for n in range(1, longest + 1) for w in itertools.product(alphabet, repeat=n)]


def standard_tokens(
    ok: Callable[[str, str, Any], Any], words: list[str], batch: int = BATCH
) -> list[list[str]]:
    """Each word's tokens by the engine's `standard` analyzer (`ok`: a call that returns the decoded
    answer of a successful request), `batch` words a call (their tokens at most the engine's
    `index.analyze.max_token_count`, 10,000): the values of an array are analysed as one text, each
    value one offset past the last."""
    out: list[list[str]] = []
    for at in range(0, len(words), batch):
        chunk = words[at : at + batch]
        tokens = ok("POST", "/_analyze", {"analyzer": "standard", "text": chunk})["tokens"]
        starts, offset = [], 0
        for w in chunk:
            starts.append(offset)
            offset += _units(w) + 1
        made: list[list[str]] = [[] for _ in chunk]
        for token in tokens:
            made[bisect.bisect_right(starts, token["start_offset"]) - 1].append(token["token"])
        out += made
    return out
