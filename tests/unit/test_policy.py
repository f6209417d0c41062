"""Server-side policies: parsing rules and matching index expressions."""

from __future__ import annotations

import pytest

from bmx_rerank.policy import PolicyError, load_rules, match, parse_rule, parse_rules


def test_rule_with_parameters():
    rule = parse_rule("articles-*=body,window_size=200,normalize=paper,alpha=0.5,explain=true,min_score=null")
    assert rule.pattern == "articles-*"
    spec = rule.spec
    assert (spec.field, spec.window_size, spec.normalize, spec.alpha, spec.explain, spec.min_score) == (
        "body",
        200,
        "paper",
        0.5,
        True,
        None,
    )


def test_rule_with_several_weighted_fields():
    spec = parse_rule("papers=title^2|abstract,window_size=50,combine=rrf").spec
    assert spec.fields == (("title", 2.0), ("abstract", 1.0)) and spec.field == "title"
    assert (spec.window_size, spec.combine) == (50, "rrf")
    assert parse_rule("p=body^3").spec.fields == (("body", 3.0),)
    assert parse_rule("p=body").spec.fields == (("body", 1.0),)


def test_first_matching_rule_wins_and_every_index_must_match():
    rules = parse_rules(["# comment", "", "logs-*=message", "*=body  # catch-all"])
    assert match(rules, "logs-2024").field == "message"
    assert match(rules, "other").field == "body"
    assert match(rules, "logs-1,other").field == "body"
    assert match(parse_rules(["logs-*=message"]), "logs-1,other") is None
    assert match(rules, "") is None


def test_load_rules_from_file(tmp_path):
    path = tmp_path / "policies.txt"
    path.write_text("docs=text,mode=bm25\n")
    [rule] = load_rules(path)
    assert rule.spec.mode == "bm25"


@pytest.mark.parametrize(
    "line",
    [
        "nofield",
        "=body",
        "x=",
        "x=body,window_size",
        "x=body,query=a",
        "x=body,augment=1",
        "x=body,mode=nope",
        "x=body,foo=1",
        "x=body,fields=a",
        "x=a|a",
        "x=a|b*",
        "x=a^x|b",
        "x=a||b",
        "x=body,combine=sum",
    ],
)
def test_bad_rules_name_the_line(line):
    with pytest.raises(PolicyError) as info:
        parse_rule(line)
    assert repr(line) in str(info.value)
