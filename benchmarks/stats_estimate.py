"""How far the estimated mode's rankings are from exact ones, on SciFact and NFCorpus.

    .venv/bin/python -m benchmarks.stats_estimate

Offline and deterministic: documents (`title + " " + text`) and queries are tokenized like the
standard analyzer (lowercase, Unicode word characters), exact statistics come from every document
(`CorpusStats.from_documents`), and the estimated ones keep N, avgdl and df exact while the raw
entropy is estimated from (df, ttf) with each estimator of `bmx_rerank.estimate`. This isolates the
entropy estimator (the proxy's estimated mode also estimates avgdl and ttf from one shard; with one
shard those are exact). For each test query it compares BMX's top 100 over the whole corpus:
overlap@10, overlap@100, Kendall's tau-b of the estimated scores over the exact top 100, and nDCG@10
of both against the qrels.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter, defaultdict

import numpy as np

from bmx_rerank import scoring
from bmx_rerank.stats import estimate
from bmx_rerank.stats.corpus import CorpusStats
from tests.support.data import BEIR

DATA = BEIR
TOKEN = re.compile(r"\w+", re.UNICODE)


def tokenize(text: str) -> list[str]:
    return TOKEN.findall(text.lower())


def load(name: str) -> tuple[list[str], list[Counter], dict[str, list[str]], dict[str, dict[str, int]]]:
    ids, docs = [], []
    for line in (DATA / name / "corpus.jsonl").open():
        d = json.loads(line)
        ids.append(d["_id"])
        docs.append(Counter(tokenize(f"{d['title']} {d['text']}")))
    qrels: dict[str, dict[str, int]] = defaultdict(dict)
    with (DATA / name / "qrels" / "test.tsv").open() as fh:
        next(fh)
        for line in fh:
            q, d, s = line.split("\t")
            qrels[q][d] = int(s)
    queries = {}
    for line in (DATA / name / "queries.jsonl").open():
        q = json.loads(line)
        if q["_id"] in qrels:
            queries[q["_id"]] = tokenize(q["text"])
    return ids, docs, queries, qrels


def kendall_tau_b(x: np.ndarray, y: np.ndarray) -> float:
    dx = np.sign(x[:, None] - x[None, :])
    dy = np.sign(y[:, None] - y[None, :])
    iu = np.triu_indices(len(x), 1)
    dx, dy = dx[iu], dy[iu]
    num = float((dx * dy).sum())
    den = math.sqrt(float((dx != 0).sum()) * float((dy != 0).sum()))
    return num / den if den else 1.0


def ndcg10(ranked: list[str], rels: dict[str, int]) -> float:
    dcg = sum(rels.get(d, 0) / math.log2(i + 2) for i, d in enumerate(ranked[:10]))
    ideal = sorted(rels.values(), reverse=True)[:10]
    idcg = sum(r / math.log2(i + 2) for i, r in enumerate(ideal))
    return dcg / idcg if idcg else 0.0


def run(name: str) -> dict[str, dict[str, float]]:
    ids, docs, queries, qrels = load(name)
    exact = CorpusStats.from_documents(docs)
    postings: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for i, doc in enumerate(docs):
        for t, f in doc.items():
            postings[t].append((i, f))
    ttf = np.array([sum(f for _, f in postings[t]) for t in exact.terms.tolist()], dtype=np.float64)
    lengths = np.array([sum(d.values()) for d in docs], dtype=np.float64)
    variants = {"exact": exact}
    for est_name, fn in estimate.ESTIMATORS.items():
        variants[est_name] = CorpusStats(
            exact.n_docs, exact.total_length, exact.terms, exact.df, fn(exact.df, ttf)
        )
    common = exact.df >= 5  # rarer terms are almost always held once by each holder: exact anyway
    rel_err = {
        k: float(np.mean(np.abs(v.entropy - exact.entropy)[common] / exact.entropy[common]))
        for k, v in variants.items()
        if k != "exact"
    }
    out: dict[str, dict[str, list[float]]] = {k: defaultdict(list) for k in variants}
    for qid, tokens in queries.items():
        vocab = sorted(set(tokens))
        col = {t: j for j, t in enumerate(vocab)}
        cand = sorted({i for t in vocab for i, _ in postings.get(t, [])})
        if not cand:
            continue
        row = {d: r for r, d in enumerate(cand)}
        tf = np.zeros((len(cand), len(vocab)))
        for t in vocab:
            for i, f in postings.get(t, []):
                tf[row[i], col[t]] = f
        cands = scoring.Candidates(tf, lengths[cand])
        query = [scoring.Query([col[t] for t in tokens])]
        scores = {k: scoring.score(v.term_stats(vocab), cands, query) for k, v in variants.items()}
        cand_ids = np.array(cand)

        def top(s: np.ndarray, k: int = 100, cand_ids: np.ndarray = cand_ids) -> np.ndarray:
            order = np.lexsort((cand_ids, -s))  # ties broken by document position: deterministic
            return order[:k]

        exact_top = top(scores["exact"])
        for k, s in scores.items():
            t = top(s)
            out[k]["overlap@10"].append(len(set(t[:10]) & set(exact_top[:10])) / max(1, min(10, len(t))))
            out[k]["overlap@100"].append(len(set(t) & set(exact_top)) / max(1, len(t)))
            out[k]["kendall_tau_top100"].append(kendall_tau_b(scores["exact"][exact_top], s[exact_top]))
            out[k]["ndcg@10"].append(ndcg10([ids[cand[i]] for i in t if ids[cand[i]] != qid], qrels[qid]))
    result = {k: {m: round(float(np.mean(v)), 4) for m, v in ms.items()} for k, ms in out.items()}
    for k, e in rel_err.items():
        result[k]["mean_rel_entropy_error_df5"] = round(e, 4)
    result["exact"]["queries"] = len(queries)
    return result


def main() -> None:
    for name in ("scifact", "nfcorpus"):
        print(name, json.dumps(run(name)))


if __name__ == "__main__":
    main()
