"""Prometheus metrics for pyshmlock locks.

One table, :data:`METRICS`, says which metrics exist; both outputs read it:

- :func:`exposition` renders the Prometheus text format (what
  ``pyshmlock status NAME --format prometheus`` prints).  It needs no extra
  package.
- :class:`LockCollector` is a ``prometheus_client`` collector (extra
  ``pyshmlock[metrics]``), so a server registers it beside its own metrics::

      from prometheus_client import REGISTRY
      from pyshmlock.metrics import LockCollector
      REGISTRY.register(LockCollector(["model-weights"]))

Every sample carries a ``lock="NAME"`` label.  Looking at a lock attaches
nothing (see :func:`pyshmlock.lock.inspect`), so a scraper never takes a
process slot and never shows up among the lock's processes.
"""
import time
from typing import (
    Any,
    Callable,
    Dict,
    Iterable,
    Iterator,
    List,
    NamedTuple,
    Optional,
    Sequence,
    Tuple,
)

from .lock import LockInfo

__all__ = ["METRICS", "LockCollector", "Metric", "exposition", "samples"]


class Metric(NamedTuple):
    """One metric family: how to compute it from a LockInfo."""

    name: str                 # without the _total suffix of a counter
    kind: str                 # "gauge" or "counter"
    help: str
    value: Callable[[LockInfo, float], List[Tuple[Dict[str, str], float]]]


def _one(fn: Callable[[LockInfo, float], float]) -> Callable[[LockInfo, float],
                                                              List[Tuple[Dict[str, str], float]]]:
    return lambda info, now: [({}, float(fn(info, now)))]


def _exclusive(info: LockInfo, now: float) -> List[Tuple[Dict[str, str], float]]:
    held = info.exclusive_granted
    return [({"kind": "write"}, float(held and info.writer_pid is not None)),
            ({"kind": "update"}, float(held and info.updater_pid is not None))]


METRICS: Tuple[Metric, ...] = (
    Metric("pyshmlock_paused", "gauge", "1 while the pause gate is closed",
           _one(lambda i, now: i.paused)),
    Metric("pyshmlock_paused_seconds", "gauge",
           "How long the current pause has lasted (0 when not paused)",
           _one(lambda i, now: max(0.0, now - i.paused_at) if i.paused and i.paused_at else 0.0)),
    Metric("pyshmlock_pauses", "counter", "Pauses since the lock was created",
           _one(lambda i, now: i.pause_count)),
    Metric("pyshmlock_readers", "gauge", "Read holds, over every process",
           _one(lambda i, now: sum(i.readers.values()))),
    Metric("pyshmlock_waiters", "gauge", "Threads or helper threads asleep waiting on the lock",
           _one(lambda i, now: sum(i.waiters.values()))),
    Metric("pyshmlock_exclusive_held", "gauge",
           "1 while a write or update hold is granted (not merely claimed)", _exclusive),
    Metric("pyshmlock_recoveries", "counter",
           "Holds reclaimed from processes that died holding them",
           _one(lambda i, now: i.recovery_count)),
    Metric("pyshmlock_data_suspect", "gauge",
           "1 after an exclusive holder died mid-section, until the next completed write/update",
           _one(lambda i, now: i.data_suspect)),
    Metric("pyshmlock_attached_processes", "gauge", "Live processes attached to the lock",
           _one(lambda i, now: len(i.attached_pids))),
)


class Sample(NamedTuple):
    metric: Metric
    labels: Dict[str, str]
    value: float


def samples(infos: Iterable[LockInfo], now: Optional[float] = None) -> Iterator[Sample]:
    """Every sample of every metric for the given snapshots, metric by metric."""
    infos = list(infos)
    now = time.time() if now is None else now
    for m in METRICS:
        for info in infos:
            for labels, value in m.value(info, now):
                yield Sample(m, {"lock": info.name, **labels}, value)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _sample_name(m: Metric) -> str:
    return m.name + "_total" if m.kind == "counter" else m.name


def exposition(infos: Sequence[LockInfo], now: Optional[float] = None) -> str:
    """The Prometheus text exposition format (version 0.0.4) for the locks."""
    out: List[str] = []
    seen = set()
    for s in samples(infos, now):
        name = _sample_name(s.metric)
        if name not in seen:
            seen.add(name)
            out.append(f"# HELP {name} {s.metric.help}")
            out.append(f"# TYPE {name} {s.metric.kind}")
        labels = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(s.labels.items()))
        out.append(f"{name}{{{labels}}} {s.value!r}")
    return "\n".join(out) + "\n"


class LockCollector:
    """A ``prometheus_client`` collector for one or more locks, by name.

    Each scrape takes a fresh read-only snapshot of every lock; a lock that
    does not exist (yet, or any more) is left out of that scrape.
    """

    def __init__(self, names: Iterable[str],
                 snapshot: Optional[Callable[[str], LockInfo]] = None) -> None:
        from .lock import inspect
        self.names = list(names)
        self._snapshot = snapshot or inspect

    def _infos(self) -> List[LockInfo]:
        infos = []
        for name in self.names:
            try:
                infos.append(self._snapshot(name))
            except FileNotFoundError:
                continue
        return infos

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
        families: Dict[str, Any] = {}
        for s in samples(self._infos()):
            fam = families.get(s.metric.name)
            label_names = sorted(s.labels)
            if fam is None:
                cls = CounterMetricFamily if s.metric.kind == "counter" else GaugeMetricFamily
                fam = families[s.metric.name] = cls(s.metric.name, s.metric.help,
                                                    labels=label_names)
            fam.add_metric([s.labels[k] for k in label_names], s.value)
        yield from families.values()

    def describe(self) -> Iterator[Any]:
        """No families up front: prometheus_client then calls collect() on
        registration only to learn names, which costs one snapshot."""
        return iter(())
