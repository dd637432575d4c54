"""The `pyshmlock` command (also `python -m pyshmlock`).

    pyshmlock ls                      locks present on this host
    pyshmlock status NAME [--json]    who pauses, holds and waits
    pyshmlock watch NAME              status, refreshed live
    pyshmlock pause NAME              close the gate
    pyshmlock resume NAME [--timeout S]
    pyshmlock rm NAME [--force]
    pyshmlock bench [--quick]         benchmarks next to the usual peers
    pyshmlock demo [--workers N] [--backend shared|local] [--keep-running]

Expected failures (missing lock, permission denied, timeout, lock in use)
print one line on stderr and exit non-zero, without a traceback.
"""
import argparse
import datetime
import json
import os
import sys
import time
from typing import List, Optional

from .errors import PyshmlockError
from .lock import SHM_DIR, SHM_PREFIX, LockInfo, RWLock, unlink

EXIT_OK, EXIT_ERROR, EXIT_TIMEOUT, EXIT_USAGE = 0, 1, 3, 2


def _open(name: str) -> RWLock:
    try:
        return RWLock(name, create=False)
    except FileNotFoundError:
        raise _Fail(f"no lock named {name!r} on this host (see `pyshmlock ls`)") from None


class _Fail(Exception):
    def __init__(self, message: str, code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.code = code


def _when(ts: Optional[float]) -> str:
    if not ts:
        return "-"
    dt = datetime.datetime.fromtimestamp(ts)
    return f"{dt:%Y-%m-%d %H:%M:%S} ({time.time() - ts:.1f} s ago)"


def format_status(info: LockInfo) -> str:
    """The human-readable form of a LockInfo."""
    lines = [f"lock {info.name}"]
    if info.paused:
        lines.append(f"  paused        yes, by pid {info.paused_by_pid or '?'} since "
                     f"{_when(info.paused_at)}")
    else:
        lines.append("  paused        no")
    if info.writer_pid or info.updater_pid:
        kind = "write" if info.writer_pid else "update"
        pid = info.writer_pid or info.updater_pid
        state = "held" if info.exclusive_granted else "claimed, waiting for readers"
        lines.append(f"  exclusive     {kind} by pid {pid} ({state})")
    else:
        lines.append("  exclusive     none")
    reads = ", ".join(f"pid {p}: {n}" for p, n in sorted(info.readers.items())) or "none"
    lines.append(f"  read holds    {reads}")
    waits = ", ".join(f"pid {p}: {n}" for p, n in sorted(info.waiters.items())) or "none"
    lines.append(f"  waiting       {waits}")
    if info.queued_readers:
        q = ", ".join(f"pid {p}: {n}" for p, n in sorted(info.queued_readers.items()))
        lines.append(f"  queued reads  {q}")
    lines.append(f"  attached      {len(info.attached_pids)} of {info.max_processes} "
                 f"process slots ({', '.join(map(str, info.attached_pids))})")
    lines.append(f"  epoch         {info.epoch}   pauses so far: {info.pause_count}")
    if info.data_suspect:
        lines.append("  DATA SUSPECT  an exclusive holder died mid-update; cleared by the "
                     "next completed write/update")
    if info.recoveries:
        lines.append(f"  recoveries    {info.recovery_count} (latest shown)")
        for r in info.recoveries:
            lines.append(f"    pid {r.pid} died holding {', '.join(r.lost)}"
                         f"{f' ({r.reads} reads)' if r.reads else ''} at {_when(r.when)}")
    return "\n".join(lines)


def list_locks() -> List[str]:
    """Names of the pyshmlock segments present on this host."""
    try:
        entries = os.listdir(SHM_DIR)
    except OSError:
        return []
    return sorted(e[len(SHM_PREFIX):] for e in entries if e.startswith(SHM_PREFIX))


def cmd_ls(args: argparse.Namespace) -> int:
    names = list_locks()
    if not names:
        print("no pyshmlock locks on this host")
        return EXIT_OK
    print(f"{'NAME':40} {'PAUSED':7} {'EXCLUSIVE':18} {'READS':6} ATTACHED")
    for name in names:
        try:
            with RWLock(name, create=False) as lk:
                i = lk.info()
        except (PyshmlockError, OSError) as e:
            print(f"{name:40} (unreadable: {e})")
            continue
        ex = (f"write pid {i.writer_pid}" if i.writer_pid else
              f"update pid {i.updater_pid}" if i.updater_pid else "-")
        others = [p for p in i.attached_pids if p != os.getpid()]
        print(f"{name:40} {'yes' if i.paused else 'no':7} {ex:18} "
              f"{sum(i.readers.values()):<6} {len(others)}")
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    with _open(args.name) as lk:
        info = lk.info()
    if args.json:
        print(json.dumps(info.to_dict(), indent=2, sort_keys=True))
    else:
        print(format_status(info))
    return EXIT_OK


def cmd_watch(args: argparse.Namespace) -> int:
    with _open(args.name) as lk:
        try:
            for _ in range(args.count) if args.count else iter(int, 1):
                text = format_status(lk.info())
                if sys.stdout.isatty():
                    sys.stdout.write("\x1b[H\x1b[2J")
                print(f"{text}\n  (every {args.interval} s; Ctrl-C to stop)", flush=True)
                time.sleep(args.interval)
        except KeyboardInterrupt:
            pass
    return EXIT_OK


def cmd_pause(args: argparse.Namespace) -> int:
    with _open(args.name) as lk:
        changed = lk.pause()
    print(f"{args.name}: {'paused' if changed else 'was already paused'}")
    return EXIT_OK


def cmd_resume(args: argparse.Namespace) -> int:
    with _open(args.name) as lk:
        if not lk.resume(args.timeout):
            raise _Fail(f"{args.name}: still paused after {args.timeout} s: an update "
                        "holds the pause (see `pyshmlock status`)", EXIT_TIMEOUT)
    print(f"{args.name}: running")
    return EXIT_OK


def cmd_rm(args: argparse.Namespace) -> int:
    try:
        unlink(args.name, force=args.force)
    except FileNotFoundError:
        raise _Fail(f"no lock named {args.name!r} on this host") from None
    print(f"{args.name}: removed")
    return EXIT_OK


def cmd_bench(args: argparse.Namespace) -> int:
    from .benchmark import main as bench_main
    bench_main(args.quick, args.json, args.png)
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    try:
        from .demo import run_demo
    except ImportError as e:
        raise _Fail(f"the demo needs {e.name}: pip install 'pyshmlock[demo]'") from None
    ok = run_demo(workers=args.workers, backend=args.backend, requests=args.requests,
                  cycles=args.cycles, keep_running=args.keep_running)
    return EXIT_OK if ok else EXIT_ERROR


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pyshmlock",
                                description="Inspect and drive pyshmlock locks on this host.")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("ls", help="list locks on this host").set_defaults(fn=cmd_ls)
    s = sub.add_parser("status", help="show who pauses, holds and waits")
    s.add_argument("name")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(fn=cmd_status)
    s = sub.add_parser("watch", help="status, refreshed live")
    s.add_argument("name")
    s.add_argument("--interval", type=float, default=0.5)
    s.add_argument("--count", type=int, default=0, help="stop after N refreshes (0: never)")
    s.set_defaults(fn=cmd_watch)
    s = sub.add_parser("pause", help="close the gate (never blocks)")
    s.add_argument("name")
    s.set_defaults(fn=cmd_pause)
    s = sub.add_parser("resume", help="open the gate once no update holds it")
    s.add_argument("name")
    s.add_argument("--timeout", type=float, default=10.0, help="seconds (default 10)")
    s.set_defaults(fn=cmd_resume)
    s = sub.add_parser("rm", help="remove a lock")
    s.add_argument("name")
    s.add_argument("--force", action="store_true", help="even if processes are attached")
    s.set_defaults(fn=cmd_rm)
    s = sub.add_parser("bench", help="multi-process benchmarks next to the usual peers")
    s.add_argument("--quick", action="store_true", help="a run under a minute")
    s.add_argument("--json", default="pyshmlock-bench.json", help="where to write results")
    s.add_argument("--png", default=None, help="also draw a chart (needs matplotlib)")
    s.set_defaults(fn=cmd_bench)
    s = sub.add_parser("demo", help="an SGLang-shaped multi-worker server, driven through "
                                     "the pause/update races")
    s.add_argument("--workers", type=int, default=4, help="tokenizer workers (default 4)")
    s.add_argument("--backend", choices=["shared", "local"], default="shared",
                   help="shared: pyshmlock; local: per-worker flags + broadcast (SGLang today)")
    s.add_argument("--requests", type=int, default=16,
                   help="concurrent requests sent while paused (default 16)")
    s.add_argument("--cycles", type=int, default=1000,
                   help="pause/continue cycles sent to random workers (default 1000)")
    s.add_argument("--keep-running", action="store_true",
                   help="leave the server up afterwards (for curl and the CLI)")
    s.set_defaults(fn=cmd_demo)
    from .cluster.cli import add_parsers   # `agent` and `cluster` (issue 17)
    add_parsers(sub)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of the `pyshmlock` console script."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.fn(args))
    except _Fail as e:
        print(f"pyshmlock: {e}", file=sys.stderr)
        return e.code
    except PermissionError as e:
        print(f"pyshmlock: permission denied: {e.filename or ''}", file=sys.stderr)
        return EXIT_ERROR
    except (PyshmlockError, OSError, ValueError) as e:
        print(f"pyshmlock: {e}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
