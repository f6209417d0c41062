"""Guessing a query's tokens word by word from earlier analyses (rerank/word_tokens.py); on real
engines, tests/integration/test_tf_probe.py checks a guessed first stage answers as an analysed one."""

from __future__ import annotations

from bmx_rerank.rerank.word_tokens import WordTokens

STANDARD = ("idx", "field:body")


def test_words_learned_from_whole_texts_guess_a_new_text_of_those_words() -> None:
    words = WordTokens()
    # as the standard analyzer answers "The U.S. don't-stop", offsets in the text
    words.learn(STANDARD, "The U.S. don't-stop", [("the", 0), ("u.s", 4), ("don't", 9), ("stop", 15)])
    words.learn(STANDARD, "of Cells", [("of", 0), ("cells", 3)])
    assert words.guess(STANDARD, "Cells  of The don't-stop U.S.") == [
        "cells",
        "of",
        "the",
        "don't",
        "stop",
        "u.s",
    ]
    assert words.guess(STANDARD, "Cells of mice") is None, "a word never seen: no guess"
    assert words.guess(("idx", "field:title"), "of Cells") is None, "another analyzer: its own words"


def test_a_stop_word_is_a_word_with_no_tokens() -> None:
    words = WordTokens()
    words.learn(STANDARD, "the cells", [("cell", 4)])
    assert words.guess(STANDARD, "cells the") == ["cell"]


def test_offsets_are_utf16_code_units_as_the_cluster_counts_them() -> None:
    words = WordTokens()
    # "😀" is one code point but two UTF-16 units: "cells" starts at unit 3, not 2
    words.learn(STANDARD, "😀 cells", [("😀", 0), ("cells", 3)])
    assert words.guess(STANDARD, "cells") == ["cells"]
    assert words.guess(STANDARD, "😀") == ["😀"]


def test_a_token_outside_every_word_teaches_nothing() -> None:
    words = WordTokens()
    words.learn(STANDARD, "a b", [("a", 0), ("?", 1)])
    assert words.guess(STANDARD, "a") is None


def test_an_analyzer_whose_guess_missed_is_not_guessed_for_a_while() -> None:
    words = WordTokens()
    words.learn(STANDARD, "new york", [("new", 0), ("york", 4)])
    words.missed(STANDARD)
    assert words.guess(STANDARD, "new york") is None
    assert WordTokens(capacity=0).guess(STANDARD, "new") is None


def test_an_unseen_plain_word_is_one_lowercased_token_once_the_analyzer_showed_it_makes_them_so() -> None:
    from bmx_rerank.rerank.word_tokens import RULE_EVIDENCE

    words = WordTokens()
    seen = [f"Word{i}" for i in range(RULE_EVIDENCE - 1)] + ["U.S."]  # "U.S." is no evidence: not plain
    offsets, at = [], 0
    for w in seen:
        offsets.append((w.lower().rstrip("."), at))
        at += len(w) + 1
    words.learn(STANDARD, " ".join(seen), offsets)
    assert words.guess(STANDARD, "Unseen") is None, "not yet enough plain words"
    words.learn(STANDARD, "Tree", [("tree", 0)])
    assert words.guess(STANDARD, "(Unseen), U.S.") == ["unseen", "u.s"]
    assert words.guess(STANDARD, "Unseen-Word") is None, "punctuation inside: only once seen"
    # a plain word the analyzer makes another token of (a stemmer): unseen words are not guessed any more
    words.learn(STANDARD, "cells", [("cell", 0)])
    assert words.guess(STANDARD, "cells") == ["cell"]
    assert words.guess(STANDARD, "Unseen") is None
