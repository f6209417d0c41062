"""What tests and benchmarks share: one helper per job.

- `proxy_thread`: an event loop in a daemon thread (`LoopThread`) and the proxy app served by one
  (`ProxyThread`), next to synchronous tests and clients;
- `proxy_process`: the proxy as a separate process (`bmx-rerank serve`, exactly as deployed), with its
  RSS and file descriptors;
- `fake_cluster`: the fake corpus, a fake Elasticsearch in aiohttp and the proxy in front of it;
- `fuzzing`: bad input for the proxy (hypothesis strategies, raw HTTP), a fake cluster that tags its
  own answers, and the verdict on each answer;
- `engine_client`: plain-HTTP access to a real engine; `corpora`: bulk loading and exact statistics;
  `data`: where the shared test vectors and BEIR datasets lie;
- `recorder`: a recording server between a client and an engine; `faults`: a fault-injecting one;
- `net`: a free loopback port.

Dependencies run one way: test modules and `benchmarks` import `tests.support`; `tests.support`
imports neither test modules nor benchmarks.
"""
