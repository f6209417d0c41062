"""Words and how an engine's `standard` analyzer tokenizes them: what `rerank/word_tokens.py` guesses an
unseen word by is checked against it (tests/integration/test_tf_probe.py, benchmarks/word_guesses.py)."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable
from typing import Any

from bmx_rerank.rerank.word_tokens import _WORD

BATCH = 500  # words analysed in one `_analyze` call


def punctuated(texts: Iterable[str]) -> list[str]:
    """The distinct words of `texts` with anything but letters and digits in them, sorted."""
    return sorted({w for t in texts for w in _WORD.findall(t) if not w.isalnum()})


def standard_tokens(ok: Callable[[str, str, Any], Any], words: list[str]) -> list[list[str]]:
    """Each word's tokens by the engine's `standard` analyzer (`ok`: a call that returns the decoded
    answer of a successful request), BATCH words a call: the values of an array are analysed as one
    text, each value one offset past the last."""
    out: list[list[str]] = []
    for at in range(0, len(words), BATCH):
        chunk = words[at : at + BATCH]
        tokens = ok("POST", "/_analyze", {"analyzer": "standard", "text": chunk})["tokens"]
        starts, offset = [], 0
        for w in chunk:
            starts.append(offset)
            offset += len(w.encode("utf-16-le")) // 2 + 1
        made: list[list[str]] = [[] for _ in chunk]
        for token in tokens:
            made[bisect.bisect_right(starts, token["start_offset"]) - 1].append(token["token"])
        out += made
    return out
