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


def test_an_unseen_word_is_guessed_as_the_standard_analyzer_makes_it_once_it_showed_it_does() -> None:
    from bmx_rerank.rerank.word_tokens import RULE_EVIDENCE

    words = WordTokens()
    seen = [f"Word{i}" for i in range(RULE_EVIDENCE - 2)] + ["U.S."]  # a word with a period: evidence too
    offsets, at = [], 0
    for w in seen:
        offsets.append((w.lower().rstrip("."), at))
        at += len(w) + 1
    words.learn(STANDARD, " ".join(seen), offsets)
    assert words.guess(STANDARD, "Unseen") is None, "not yet enough words"
    words.learn(STANDARD, "IL-10", [("il", 0), ("10", 3)])
    assert words.guess(STANDARD, "(Unseen), H2A.Z Unseen-Word") == ["unseen", "h2a.z", "unseen", "word"]
    assert words.guess(STANDARD, "日本") is None, "another script: its rules are not followed here"
    # a word the analyzer makes another token of (a stemmer): unseen words are not guessed any more
    words.learn(STANDARD, "cells", [("cell", 0)])
    assert words.guess(STANDARD, "cells") == ["cell"]
    assert words.guess(STANDARD, "Unseen") is None


def test_the_standard_analyzers_tokens_of_a_word() -> None:
    from bmx_rerank.rerank.word_tokens import _standard

    cases = {
        "Cells,": ["cells"],
        "(p53)": ["p53"],
        "IL-10": ["il", "10"],
        "5mmol/L.": ["5mmol", "l"],
        "U.S.": ["u.s"],
        "patient's": ["patient's"],
        "they\u2019re": ["they\u2019re"],
        "1,000": ["1,000"],
        "0.05%": ["0.05"],
        "a,b": ["a", "b"],  # a comma joins digits only
        "3.a": ["3", "a"],  # a period joins two letters or two digits, not one of each
        "H2A.Z": ["h2a.z"],
        "a..b": ["a", "b"],
        "NP_001243169.1": ["np_001243169.1"],  # an underscore joins whatever it touches
        "(+)-": [],
        "x\u2013y\u2264z": ["x", "y", "z"],  # an en dash and a math operator separate
        "ΣΟΦΟΣ": ["σοφοσ"],  # lowercased character by character: no final sigma
        "Straße-X": ["straße", "x"],
    }
    for word, tokens in cases.items():
        assert _standard(word) == tokens, word
    for word in (
        "日本",
        "e\u0301t\u00e9",
        "\u00a9",
        "a\u00adb",
        "\u0130x",
        "x\u00b2",
        "___",
        "😀",
        "a" * 256,
    ):
        assert _standard(word) is None, word


def test_the_builtin_standard_analyzers_tokens_of_a_text_are_its_words_tokens_in_turn() -> None:
    from bmx_rerank.rerank.word_tokens import standard_analysis

    assert standard_analysis("The U.S.\tdon't-stop  IL-10\n") == ["the", "u.s", "don't", "stop", "il", "10"]
    assert standard_analysis("") == [] and standard_analysis("-- ,") == []
    assert standard_analysis("cells 細胞") is None, "a word of another script: its rules are not followed"
    assert standard_analysis("a\u202fb") is None, "U+202F joins two letters into one token"
    assert standard_analysis("a\u00a0b") is None, "only ASCII whitespace parts words for sure"


def test_a_text_with_other_whitespace_than_asciis_teaches_no_word() -> None:
    """U+202F (narrow no-break space) joins two letters into one `standard` token: a text with it is
    not its words' tokens in turn."""
    words = WordTokens()
    words.learn(STANDARD, "a\u202fb c", [("a\u202fb", 0), ("c", 4)])
    assert words.guess(STANDARD, "a") is None and words.guess(STANDARD, "c") is None, "nothing learned"
    words.learn(STANDARD, "a b", [("a", 0), ("b", 2)])
    assert words.guess(STANDARD, "b a") == ["b", "a"]


def test_a_fields_search_analyzer_is_the_builtin_standard_only_where_the_index_defines_no_such_name() -> None:
    from bmx_rerank.upstream import FieldAnalyzers

    plain = {"analyzer": "default", "search_analyzer": "default", "search_quote_analyzer": "default"}
    assert FieldAnalyzers.of(plain, []).standard
    assert FieldAnalyzers.of({**plain, "analyzer": "standard", "search_analyzer": "standard"}, []).standard
    assert not FieldAnalyzers.of(plain, ["default"]).standard, "the index's own `default`"
    assert not FieldAnalyzers.of(plain, None).standard, "settings not readable: not known"
    assert not FieldAnalyzers.of({**plain, "search_analyzer": "default_search"}, ["default_search"]).standard
    assert not FieldAnalyzers.of({"analyzer": "english"}, []).standard
    # a mapping read without its defaults names only what it sets
    assert FieldAnalyzers.of({"search_analyzer": "s"}) == FieldAnalyzers(None, "s", "s")
    assert FieldAnalyzers.of({"analyzer": "a", "search_quote_analyzer": "q"}, [], "g") == FieldAnalyzers(
        "a", "a", "q", False, "g"
    )


def test_a_words_standard_tokens_are_worked_out_once() -> None:
    from bmx_rerank.rerank.word_tokens import _standard_known, standard_analysis

    _standard_known.cache_clear()
    assert standard_analysis("IL-10 cells IL-10") == ["il", "10", "cells", "il", "10"]
    assert _standard_known.cache_info().hits == 1, "the second IL-10 is remembered"
    first = standard_analysis("IL-10")
    assert first == ["il", "10"] and _standard_known.cache_info().hits == 2
    first.append("changed")
    assert standard_analysis("IL-10") == ["il", "10"], "a caller's list is its own"
