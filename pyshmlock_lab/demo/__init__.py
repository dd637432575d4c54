"""`pyshmlock demo`: an SGLang-shaped multi-worker server on loopback, driven
through the pause/update races by a real HTTP client.

    pyshmlock demo [--workers N] [--backend shared|local] [--requests N]
                   [--cycles N] [--keep-running]

The server: N uvicorn worker processes accept on one port (plus one private
port each, so a client can address a given worker), and a scheduler process
generates tokens.  `--backend shared` uses one pyshmlock lock for the pause
gate and the model-update lock; `--backend local` runs the same server the way
SGLang does it today (per-worker flags kept in step by a broadcast), so the
same table shows where that breaks.
"""
from .run import SCENARIOS, Row, format_table, run_demo, run_scenarios
from .servers import BACKENDS, DemoServers, Stopped, wait_healthy

__all__ = ["BACKENDS", "SCENARIOS", "DemoServers", "Row", "Stopped", "format_table", "run_demo",
           "run_scenarios", "wait_healthy"]
