"""Benchmarks, each run from the checkout's root as `python -m benchmarks.NAME` (results and their
commands in benchmarks/RESULTS.md). What they share with the tests comes from `tests.support`."""
