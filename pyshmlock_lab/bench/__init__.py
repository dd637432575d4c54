"""`pyshmlock bench`: the multi-process benchmark harness.

Every figure is measured in one run next to the peers a Python user picks
today, and printed as one table with ratios; the same data goes to JSON (and
to a PNG chart when matplotlib is installed).

Sections:
  uncontended calls   one process, no contention: a pyshmlock read pair,
                      `with reader_lock`, write/update pairs, `paused`, next
                      to posix_ipc.Semaphore and multiprocessing.Lock pairs
                      and two floors (two cffi calls; two bare C-API calls)
  instructions        the same cases counted in instructions per call by
                      valgrind's callgrind (exact on any machine; skipped,
                      saying so, without valgrind)
  read throughput     N processes loop acquire_read/release_read
  writer starvation   3 readers with overlapping 1 ms holds, 1 writer looping
                      acquire / release / sleep 2 ms
  pause-to-wake       N processes blocked at the gate; time from the release
                      call to the last one running (median, p99 over rounds)
  kill-to-recovery    SIGKILL a holder; time until a blocked waiter gets in
  process footprint   idle CPU and memory after 200 and after 200,000
                      open/close cycles (what history costs a process)

Peers are optional: a peer whose package is missing is reported as such.

One module per figure (``uncontended``, ``instructions``, ``throughput``,
``starvation``, ``wake``, ``recovery``, ``footprint``), the peers' adapters
(``adapters``), the measurement floors compiled at run time (``floors``)
and the report (``report``: the table, JSON, chart and ``main``); this
package's face re-exports the figures.  Not the pytest-benchmark
microbenchmarks, which live in the source tree's top-level ``bench/``.
"""
from .instructions import instructions
from .recovery import kill_to_recovery
from .report import format_report, machine, main, run, save_chart
from .starvation import writer_starvation
from .throughput import read_throughput
from .uncontended import uncontended
from .wake import pause_to_wake

__all__ = ["format_report", "instructions", "kill_to_recovery", "machine", "main",
           "pause_to_wake", "read_throughput", "run", "save_chart", "uncontended",
           "writer_starvation"]
