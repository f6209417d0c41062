"""What tests and benchmarks share: one helper per job.

- `proxy_thread`: an event loop in a daemon thread (`LoopThread`) and the proxy app served by one
  (`ProxyThread`), next to synchronous tests and clients;
- `proxy_process`: the proxy as a separate process (`bmx-rerank serve`, exactly as deployed), with its
  RSS and file descriptors;
- `fake_cluster`: the fake corpus, fake Elasticsearch clusters in aiohttp (`FakeCluster` for the unit
  tests, `TaggingCluster` for fuzzing) and the proxy in front of them;
- `fuzzing` (the proxy in a thread, raw requests, the verdict, fixed cases) and `fuzz_strategies`
  (the hypothesis generator);
- `engine_client`: plain-HTTP access to a real engine; `clients`: the official clients;
  `corpora`: bulk loading, the test vectors' and SciFact's indices, exact statistics;
  `data`: where the shared test vectors and BEIR datasets lie, SciFact's records;
- `reranked`: reranked answers sent and compared; `naive`: the naive scorer the core is checked against;
- `recorder`: a recording server between a client and an engine; `faults`: a fault-injecting one;
- `benchmark_runs`: a benchmark run as CI runs its small version; `net`: a free loopback port.

Dependencies run one way: test modules and `benchmarks` import `tests.support`; `tests.support`
imports neither test modules nor benchmarks.
"""
