"""Load a BEIR dataset into an index and build its exact statistics, ready for `bmx-rerank eval`.

Indexes `title + " " + text` of `../shared/data/beir/NAME` into the field `text` (as
benchmarks/quality.py does), then builds statistics. Prints the `bmx-rerank eval` command to run next.

  .venv/bin/python -m benchmarks.load_beir --upstream http://127.0.0.1:9200 --dataset scifact
"""

from __future__ import annotations

import argparse
import asyncio

import aiohttp

from bmx_rerank.evaluation.beir import FIELD, load_beir, shared_dataset
from bmx_rerank.upstream import Cluster


async def load(upstream: str, index: str, dataset: str, analyzer: str) -> int:
    root = shared_dataset(dataset)
    if root is None:
        raise SystemExit(f"no shared dataset {dataset} (set BMX_BEIR_DIR)")
    async with aiohttp.ClientSession() as session:
        return await load_beir(Cluster(session, upstream), index, root, analyzer=analyzer)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--upstream", required=True)
    ap.add_argument("--dataset", default="scifact")
    ap.add_argument("--index")
    ap.add_argument("--analyzer", default="standard")
    args = ap.parse_args()
    index = args.index or f"bmxeval-{args.dataset}"
    upstream = args.upstream.rstrip("/")
    n = asyncio.run(load(upstream, index, args.dataset, args.analyzer))
    root = shared_dataset(args.dataset)
    print(f"{index}: {n} documents, statistics built. Next:")
    print(
        f"  .venv/bin/bmx-rerank eval {index} --field {FIELD} --queries {root}/queries.jsonl "
        f"--qrels {root}/qrels/test.tsv --upstream {upstream}"
    )


if __name__ == "__main__":
    main()
