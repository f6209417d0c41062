"""How an unseen word is guessed (`rerank/word_tokens.py`, `_standard`) against the engine's own
`standard` analyzer, on every word of SciFact and NFCorpus (queries and documents) with anything but
letters and digits in it: how many words the rule takes, how many of those come out exactly as the
engine makes them (the rest would be a guess that misses: its window reads term vectors), and how
many probes a guess would add beyond the engine's tokens; then every word of up to three characters of
the character classes the rule tells apart, and of four of those that join two others. CI checks
~10,000 of the corpora's words and every short word on every engine (tests/integration/test_tf_probe.py).

    .venv/bin/python -m benchmarks.word_guesses [--upstream http://127.0.0.1:9200] [--docs N]
"""

from __future__ import annotations

import argparse
import collections

from benchmarks.proxy_latency import Http
from bmx_rerank.rerank.word_tokens import _standard
from tests.support.data import beir_records
from tests.support.words import BATCH, CLASSES, JOINING, punctuated, short_words, standard_tokens


def texts(dataset: str, docs: int) -> list[str]:
    """The corpus's queries and its first `docs` documents (0: all), title and text."""
    queries = [str(q.get("text", "")) for q in beir_records(dataset, "queries.jsonl")]
    corpus = beir_records(dataset, "corpus.jsonl", docs)
    return queries + [f"{d.get('title', '')} {d.get('text', '')}" for d in corpus]


def row(engine: Http, name: str, words: list[str], batch: int) -> collections.Counter[str]:
    """Print the table's row of `words` (the rule against the engine, word by word); the characters of
    the words the rule leaves to `_analyze`, counted."""
    taken = exact = extra = 0
    left: collections.Counter[str] = collections.Counter()
    for word, real in zip(words, standard_tokens(engine.ok, words, batch), strict=True):
        rule = _standard(word)
        if rule is None:
            left.update(c for c in word if not c.isalnum())
            continue
        taken += 1
        exact += rule == real
        extra += len(set(rule) - set(real))
    print(f"| {name} | {len(words):,} | {taken:,} | {exact:,} | {taken - exact} | {extra} |")
    return left


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--upstream", default="http://127.0.0.1:9200")
    parser.add_argument("--docs", type=int, default=0, help="documents of each corpus (0: all)")
    args = parser.parse_args()
    engine = Http(args.upstream)
    # the node's version from `_nodes`: Elasticsearch's integ-test zip has no `GET /`
    node = next(iter(engine.ok("GET", "/_nodes/_local")["nodes"].values()))
    print(f"{args.upstream}: version {node['version']}")
    print(
        "| corpus | punctuated words | taken by the rule | exactly the engine's tokens | not | extra probes |"
    )
    print("|---|---|---|---|---|---|")
    for dataset in ("scifact", "nfcorpus"):
        left = row(engine, dataset, punctuated(texts(dataset, args.docs)), BATCH)
        print(f"  left to `_analyze`, most common characters: {left.most_common(12)}")
    # every short word of the classes the rule tells apart (tests/support/words.py)
    row(engine, "short words: 1-3 characters of CLASSES", short_words(CLASSES, 3), 3000)
    row(engine, "short words: 4 characters of JOINING", short_words(JOINING, 4), 3000)


if __name__ == "__main__":
    main()
