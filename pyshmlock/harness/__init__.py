"""The multi-process benchmark harness behind ``pyshmlock bench`` (imported
as ``pyshmlock.benchmark``): one module per figure, each measured next to
the peers in the same run, and the report.  Not the pytest-benchmark
microbenchmarks, which live in the source tree's top-level ``bench/``."""
