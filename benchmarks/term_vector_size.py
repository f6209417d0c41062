"""What stored term vectors cost on disk: SciFact (title + text in one field) indexed twice, with
`term_vector: no` and `yes`, force-merged to one segment; the primaries' store size of each.

    .venv/bin/python -m benchmarks.term_vector_size [--upstream http://127.0.0.1:9200]
"""

from __future__ import annotations

import argparse
import json
import uuid

from benchmarks.proxy_latency import Http
from tests.support.data import scifact_records


def store_size(engine: Http, docs: list[dict], term_vector: str) -> int:
    index = f"bmxtest-tv-{term_vector}-{uuid.uuid4().hex[:6]}"
    mapping = {"properties": {"body": {"type": "text", "term_vector": term_vector}}}
    engine.ok(
        "PUT",
        f"/{index}",
        {"settings": {"number_of_shards": 1, "number_of_replicas": 0}, "mappings": mapping},
    )
    try:
        for start in range(0, len(docs), 1000):
            lines = []
            for doc in docs[start : start + 1000]:
                lines.append(json.dumps({"index": {"_index": index, "_id": doc["_id"]}}))
                lines.append(json.dumps({"body": f"{doc.get('title', '')} {doc['text']}"}))
            assert not engine.ok("POST", "/_bulk", ndjson="\n".join(lines) + "\n")["errors"]
        # every document in a segment before the merge (a force merge of an unrefreshed shard merges
        # nothing, and a store read then can count no segment at all: 227 bytes once in CI), on disk
        # after it
        engine.ok("POST", f"/{index}/_refresh")
        engine.ok("POST", f"/{index}/_forcemerge?max_num_segments=1")
        engine.ok("POST", f"/{index}/_flush")
        engine.ok("POST", f"/{index}/_refresh")
        counted = engine.ok("GET", f"/{index}/_count")["count"]
        assert counted == len(docs), f"{counted} of {len(docs)} documents searchable"
        return engine.ok("GET", f"/{index}/_stats/store")["_all"]["primaries"]["store"]["size_in_bytes"]
    finally:
        engine.call("DELETE", f"/{index}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--upstream", default="http://127.0.0.1:9200")
    parser.add_argument("--docs", type=int, default=0, help="0: the whole corpus")
    args = parser.parse_args()
    engine, docs = Http(args.upstream), scifact_records("corpus.jsonl", args.docs)
    without, with_tv = store_size(engine, docs, "no"), store_size(engine, docs, "yes")
    print(
        f"{len(docs)} documents: term_vector no {without:,} bytes, yes {with_tv:,} bytes, +{with_tv / without - 1:.0%}"
    )


if __name__ == "__main__":
    main()
