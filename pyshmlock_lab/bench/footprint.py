"""Process footprint after many opens: what an idle process pays, in CPU
and memory, for the locks it opened and closed before.

Each case runs in a fresh child: it opens and closes locks (one name, or a
new name each time) ``cycles`` times, keeps one lock open (so the lease
watchdog runs, as in a server), then sits idle and measures its own CPU
time over ``idle_s`` seconds and its resident memory.  The figure is the
idle cost after many cycles next to the same after a few, in the same run.
"""
import time
from typing import Any, Dict, List

from ._common import CTX, _name


def _rss_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _child(q: Any, cycles: int, idle_s: float, distinct: bool, lease: bool) -> None:
    import pyshmlock
    from pyshmlock.cluster._lease import lease_arm
    base = _name("fp")
    names = []
    for i in range(cycles):
        name = f"{base}-{i}" if distinct else base
        lk = pyshmlock.RWLock(name)
        lk.close()
        if distinct:
            pyshmlock.unlink(name)
        else:
            names = [name]
    keep = pyshmlock.RWLock(base + "-kept")
    if lease:
        lease_arm(keep, 3600)
    time.sleep(0.5)                   # let the process settle
    t0, c0 = time.monotonic(), time.process_time()
    time.sleep(idle_s)
    t1, c1 = time.monotonic(), time.process_time()
    cpu = c1 - c0
    q.put({"cycles": cycles, "cpu_pct": 100.0 * cpu / (t1 - t0), "rss_kb": _rss_kb()})
    keep.close()
    pyshmlock.unlink(base + "-kept")
    for n in names:
        pyshmlock.unlink(n)


def footprint(few: int = 200, many: int = 200_000, idle_s: float = 2.0) -> Dict[str, Any]:
    """Idle CPU and RSS after `few` and after `many` open/close cycles, with
    and without an armed host lease."""
    out: Dict[str, Any] = {}
    for lease in (False, True):
        for cycles in (few, many):
            q = CTX.Queue()
            p = CTX.Process(target=_child, args=(q, cycles, idle_s, True, lease))
            p.start()
            try:
                r = q.get(timeout=600)
            finally:
                p.join(30)
                if p.is_alive():
                    p.kill()
            key = f"{cycles} opens{', lease armed' if lease else ''}"
            out[key] = r
    for tag in ("", ", lease armed"):
        a, b = out[f"{few} opens{tag}"], out[f"{many} opens{tag}"]
        b["rss_vs_few_kb"] = b["rss_kb"] - a["rss_kb"]
    return out


def rows(res: Dict[str, Any]) -> List[Any]:
    return [("process footprint", key, f"idle CPU {r['cpu_pct']:.2f}%, RSS {r['rss_kb']} kB",
             f"{r['rss_vs_few_kb']:+d} kB vs few" if "rss_vs_few_kb" in r else "")
            for key, r in res.items()]
