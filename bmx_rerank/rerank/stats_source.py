from bmx_rerank.stats.source import StatsSource  # noqa: F401  (pipeline.py, proxy.py, client.py import it here)
