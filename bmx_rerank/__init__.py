"""bmx-rerank: rerank Elasticsearch/OpenSearch lexical results with BMX (or exact-statistics BM25)."""

__version__ = "0.1.0"
