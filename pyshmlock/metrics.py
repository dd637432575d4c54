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
nothing (see :func:`pyshmlock.inspect`), so a scraper never takes a
process slot and never shows up among the lock's processes.

A fleet controller (``pyshmlock.cluster.Cluster``) keeps histograms of its
own calls in :class:`ClusterMetrics` (``fleet.metrics``): how long each
pause took until every host was paused (``drain="false"``) or drained
(``drain="true"``), how long each update took to hold the fleet, and how
long it held it; ``fleet.metrics.exposition()`` renders them, and
:class:`ClusterCollector` hands them to ``prometheus_client``::

      REGISTRY.register(ClusterCollector(fleet))
"""
import threading
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
    Union,
)

from ._args import check_name
from .lock import LockInfo

__all__ = ["CLUSTER_BUCKETS", "LOCK_METRICS", "METRICS", "ClusterCollector", "ClusterMetrics",
           "Histogram", "LockCollector", "Metric", "Unreadable", "exposition", "look", "samples"]


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


def _age(i: LockInfo, now: float) -> float:
    return max(0.0, now - i.paused_at) if i.paused and i.paused_at else 0.0


METRICS: Tuple[Metric, ...] = (
    Metric("pyshmlock_lock_present", "gauge",
           "1 if the lock exists on this host (0: no such lock: nothing else is reported)",
           _one(lambda i, now: 1)),
    Metric("pyshmlock_lock_readable", "gauge",
           "1 if the lock could be read (0: see the error label: foreign, corrupt, "
           "other-layout or unreadable segment; the reason label says what a corrupt one "
           "holds)", _one(lambda i, now: 1)),
    Metric("pyshmlock_paused", "gauge", "1 while the pause gate is closed",
           _one(lambda i, now: i.paused)),
    Metric("pyshmlock_paused_seconds", "gauge",
           "How long the current pause has lasted (0 when not paused)", _one(_age)),
    Metric("pyshmlock_pauser_alive", "gauge",
           "While paused: 1 if the process that paused still runs, 0 if it is gone "
           "(someone must resume); 1 when not paused",
           _one(lambda i, now: 1 if not i.paused or i.paused_by_alive else 0)),
    Metric("pyshmlock_pauses", "counter", "Pauses since the lock was created",
           _one(lambda i, now: i.pause_count)),
    Metric("pyshmlock_readers", "gauge", "Read holds, over every process",
           _one(lambda i, now: sum(i.readers.values()))),
    Metric("pyshmlock_waiters", "gauge", "Threads or helper threads asleep waiting on the lock",
           _one(lambda i, now: sum(i.waiters.values()))),
    Metric("pyshmlock_exclusive_held", "gauge",
           "1 while a write or update hold is granted (not merely claimed)", _exclusive),
    Metric("pyshmlock_update_session", "gauge", "1 while an update session pins the pause",
           _one(lambda i, now: i.session is not None)),
    Metric("pyshmlock_recoveries", "counter",
           "Holds reclaimed from processes that died holding them",
           _one(lambda i, now: i.recovery_count)),
    Metric("pyshmlock_data_suspect", "gauge",
           "1 after an exclusive holder died mid-section or an update session expired, "
           "until a completed update (resume refuses meanwhile)",
           _one(lambda i, now: i.data_suspect)),
    Metric("pyshmlock_dead_holders", "gauge",
           "Processes that died attached and are not reclaimed yet",
           _one(lambda i, now: len(i.dead_pids))),
    Metric("pyshmlock_stale", "gauge",
           "1 when no live process is attached and state of gone ones is left",
           _one(lambda i, now: i.stale)),
    Metric("pyshmlock_attached_processes", "gauge", "Live processes attached to the lock",
           _one(lambda i, now: len(i.attached_pids))),
    Metric("pyshmlock_max_processes", "gauge",
           "Process slots of the lock (fixed by its creator)",
           _one(lambda i, now: i.max_processes)),
)

#: The metrics that describe a lock that could be read (all but the first two).
LOCK_METRICS = METRICS[2:]


class Sample(NamedTuple):
    metric: Metric
    labels: Dict[str, str]
    value: float


class Unreadable(NamedTuple):
    """A lock a scrape could not read: present (or not) and why (the error's
    name, and for a corrupt segment what the validation found)."""

    name: str
    present: bool
    error: str
    reason: str = ""


Looked = Union[LockInfo, Unreadable]


def samples(infos: Iterable[Looked], now: Optional[float] = None) -> Iterator[Sample]:
    """Every sample of every metric for the given snapshots, metric by metric.
    A lock that could not be read gets only lock_present and lock_readable
    (with the error's name as a label)."""
    infos = list(infos)
    now = time.time() if now is None else now
    for m in METRICS:
        for info in infos:
            if isinstance(info, Unreadable):
                if m.name == "pyshmlock_lock_present":
                    yield Sample(m, {"lock": info.name}, float(info.present))
                elif m.name == "pyshmlock_lock_readable" and info.present:
                    yield Sample(m, {"lock": info.name, "error": info.error,
                                     "reason": info.reason}, 0.0)
                continue
            for labels, value in m.value(info, now):
                if m.name == "pyshmlock_lock_readable":
                    labels = {**labels, "error": "", "reason": ""}
                yield Sample(m, {"lock": info.name, **labels}, value)


def look(name: str, snapshot: Optional[Callable[[str], LockInfo]] = None) -> Looked:
    """The snapshot of ``name``, or why there is none; never raises."""
    from .lock import inspect
    try:
        return (snapshot or inspect)(name)
    except FileNotFoundError:
        return Unreadable(name, False, "FileNotFoundError")
    except Exception as e:       # a scrape must never fail: the sample says why
        return Unreadable(name, True, type(e).__name__, str(getattr(e, "reason", "") or ""))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _sample_name(m: Metric) -> str:
    return m.name + "_total" if m.kind == "counter" else m.name


def exposition(infos: Sequence[Looked], now: Optional[float] = None) -> str:
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

    Each scrape takes a fresh read-only snapshot of every lock.  A collector
    never raises: a lock that does not exist (yet, or any more) reports
    ``pyshmlock_lock_present 0``, and one that cannot be read (a foreign,
    corrupt or other-layout segment, no permission) reports
    ``pyshmlock_lock_readable{error="..."} 0``; the other locks and the
    application's own metrics flow as usual.

    ``names`` is an iterable of lock names, checked here, once: a ``str``
    (which would watch one lock per character) or a non-str name is a
    TypeError, an invalid name a ValueError, so that no scrape can fail
    because of them.
    """

    def __init__(self, names: Iterable[str],
                 snapshot: Optional[Callable[[str], LockInfo]] = None) -> None:
        if isinstance(names, (str, bytes)):
            raise TypeError(f"names is an iterable of lock names, not one "
                            f"{type(names).__name__}: LockCollector([{names!r}])")
        self.names = [check_name(n) for n in names]
        self._snapshot = snapshot

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
        families: Dict[str, Any] = {}
        looked = [look(name, self._snapshot) for name in self.names]
        for s in samples(looked):
            label_names = sorted(s.labels)
            key = s.metric.name + "|" + ",".join(label_names)
            fam = families.get(key)
            if fam is None:
                cls = CounterMetricFamily if s.metric.kind == "counter" else GaugeMetricFamily
                fam = families[key] = cls(s.metric.name, s.metric.help, labels=label_names)
            fam.add_metric([s.labels[k] for k in label_names], s.value)
        merged: Dict[str, Any] = {}
        for key, fam in families.items():      # one family per name, whatever its labels
            name = key.split("|")[0]
            if name in merged:
                merged[name].samples.extend(fam.samples)
            else:
                merged[name] = fam
        yield from merged.values()

    def describe(self) -> Iterator[Any]:
        """No families up front: prometheus_client then calls collect() on
        registration only to learn names, which costs one snapshot."""
        return iter(())


# ------------------------------------------------------------- a fleet's calls
#: Seconds: from a few milliseconds (a pause of a quiet fleet) to ten minutes
#: (an update of a large model).
CLUSTER_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                   120.0, 300.0, 600.0)


class Histogram:
    """One Prometheus histogram family: cumulative buckets, sum and count
    per label set.  Observed from the controller's loop thread, read by a
    scraper's: a plain lock keeps a scrape consistent (never taken in a
    finaliser)."""

    def __init__(self, name: str, help: str, labels: Sequence[str],
                 buckets: Sequence[float] = CLUSTER_BUCKETS) -> None:
        self.name, self.help, self.labels = name, help, tuple(labels)
        self.buckets = tuple(sorted(buckets))
        self._mu = threading.Lock()
        self._series: Dict[Tuple[str, ...], List[float]] = {}

    def observe(self, seconds: float, *values: str) -> None:
        with self._mu:
            s = self._series.setdefault(tuple(values), [0.0] * (len(self.buckets) + 2))
            for i, le in enumerate(self.buckets):
                if seconds <= le:
                    s[i] += 1
            s[-2] += seconds
            s[-1] += 1

    def series(self) -> List[Tuple[Dict[str, str], List[Tuple[str, float]], float, float]]:
        """(labels, [(le, cumulative count)...] with "+Inf" last, sum, count)."""
        with self._mu:
            items = sorted(self._series.items())
            out = []
            for values, s in items:
                buckets = [(repr(le), s[i]) for i, le in enumerate(self.buckets)]
                buckets.append(("+Inf", s[-1]))
                out.append((dict(zip(self.labels, values)), buckets, s[-2], s[-1]))
            return out


class ClusterMetrics:
    """The histograms of one controller (``fleet.metrics``), labelled with
    its cluster's name."""

    def __init__(self, cluster: str) -> None:
        self.cluster = cluster
        self.pause = Histogram(
            "pyshmlock_cluster_pause_seconds",
            "pause(): from the call until every host acknowledged the pause (drain=\"true\": "
            "and drained its reads)", ["drain"])
        self.update_acquire = Histogram(
            "pyshmlock_cluster_update_acquire_seconds",
            "update(): from the call until the update lock was held and every host paused "
            "and drained", [])
        self.update_hold = Histogram(
            "pyshmlock_cluster_update_hold_seconds",
            "update(): how long the update lock held the fleet (outcome=\"failed\": the "
            "block raised; the fleet stayed paused)", ["outcome"])
        self.resume = Histogram(
            "pyshmlock_cluster_resume_seconds",
            "resume(wait=True): from the call until every current host reopened", [])
        self.families = (self.pause, self.update_acquire, self.update_hold, self.resume)

    def exposition(self) -> str:
        """The Prometheus text exposition format (version 0.0.4)."""
        out: List[str] = []
        for h in self.families:
            rows = h.series()
            if not rows:
                continue
            out.append(f"# HELP {h.name} {h.help}")
            out.append(f"# TYPE {h.name} histogram")
            for labels, buckets, total, count in rows:
                base = [("cluster", self.cluster), *labels.items()]
                text = ",".join(f'{k}="{_escape(v)}"' for k, v in base)
                for le, n in buckets:
                    out.append(f'{h.name}_bucket{{{text},le="{le}"}} {_num(n)}')
                out.append(f"{h.name}_sum{{{text}}} {total!r}")
                out.append(f"{h.name}_count{{{text}}} {_num(count)}")
        return "\n".join(out) + "\n"


def _num(v: float) -> str:
    return str(int(v)) if v == int(v) else repr(v)


class ClusterCollector:
    """A ``prometheus_client`` collector of a controller's histograms
    (``REGISTRY.register(ClusterCollector(fleet))``; ``fleet`` is a Cluster
    or an AsyncCluster)."""

    def __init__(self, fleet: Any) -> None:
        self.metrics: ClusterMetrics = fleet.metrics

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import HistogramMetricFamily
        for h in self.metrics.families:
            rows = h.series()
            if not rows:
                continue
            fam = HistogramMetricFamily(h.name, h.help, labels=["cluster", *h.labels])
            for labels, buckets, total, _count in rows:
                fam.add_metric([self.metrics.cluster, *labels.values()], buckets, total)
            yield fam

    def describe(self) -> Iterator[Any]:
        return iter(())
