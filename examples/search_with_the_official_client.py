"""The official Elasticsearch client, unchanged, pointed at the proxy instead of the cluster.

    bmx-rerank stats build bmx-demo-python-docs --field content --upstream http://127.0.0.1:9200
    bmx-rerank serve --upstream http://127.0.0.1:9200 --listen 127.0.0.1:9280
    python examples/search_with_the_official_client.py

(`bash scripts/demo.sh` creates that index; with OpenSearch use `opensearchpy.OpenSearch` the same way.)
"""

from elasticsearch import Elasticsearch

es = Elasticsearch("http://127.0.0.1:9280")  # the proxy; credentials, if any, are passed on as they are

answer = es.search(
    index="bmx-demo-python-docs",
    query={"match": {"content": "copy a directory tree"}},
    size=5,
    ext={
        "bmx": {
            "field": "content",
            "window_size": 100,  # rerank the engine's top 100
            "normalize": "paper",  # scores comparable across queries (they can exceed 1)
            # WQA: augmentations, e.g. written by an LLM with the prompt in the BMX paper's appendix A
            "augment": {
                "queries": ["shutil copytree recursive copy", "duplicate folder"],
                "weights": [0.6, 0.3],
            },
            "explain": True,  # a per-term breakdown in each hit's `_bmx_explanation`
        }
    },
)
print("rerank marker:", answer["_bmx"])
for hit in answer["hits"]["hits"]:
    print(f"{hit['_score']:.3f}  {hit['_id']}")
