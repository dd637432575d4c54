"""The `pyshmlock` command (also `python -m pyshmlock`).

    pyshmlock ls                      locks present on this host
    pyshmlock status NAME [--format text|json|prometheus]   who pauses, holds and waits
    pyshmlock watch NAME              status, refreshed live
    pyshmlock pause NAME              close the gate
    pyshmlock resume NAME [--timeout S]
    pyshmlock rm NAME [--force]
    pyshmlock bench [--quick]         benchmarks next to the usual peers
    pyshmlock demo [--workers N] [--backend shared|local] [--keep-running]

Expected failures (missing lock, permission denied, timeout, lock in use)
print one line on stderr and exit non-zero, without a traceback.

`ls`, `status` and `watch` only observe: they read copies of the segment
(read permission is enough), take no process slot (they work on a lock whose
slots are all taken) and never appear among the attached processes.
`pause` and `resume` attach with the stale policy "keep": an operator's tool
never clears a pause implicitly.
"""
import argparse
import datetime
import json
import math
import os
import sys
import time
from typing import List, Optional, Tuple

from ._args import check_name, segment_path
from .errors import (
    LayoutVersionError,
    LockInUseError,
    PyshmlockError,
    UninitializedSegmentError,
)
from .lock import SHM_DIR, SHM_PREFIX, LockInfo, RWLock, inspect, unlink

EXIT_OK, EXIT_ERROR, EXIT_TIMEOUT, EXIT_USAGE = 0, 1, 3, 2
EXIT_INTERRUPTED = 130   # 128 + SIGINT, as a shell reports Ctrl-C

EXIT_CODES = """exit codes:
  0      success
  1      error: no such lock, permission denied, lock in use, a segment that
         is not a usable lock, a failed demo scenario, a removed lock (watch)
  2      usage: bad command line
  3      timeout: `resume` found the pause still pinned by an update hold
  128+N  `demo` stopped by signal N: 130 Ctrl-C, 143 SIGTERM, 129 SIGHUP"""

NAME_HELP = ("the lock name: 1-200 characters of [A-Za-z0-9._-]; the lock is "
             "/dev/shm/pyshmlock.NAME (see `pyshmlock ls`)")


def _open(name: str) -> RWLock:
    """The operator's handle for pause and resume: no process slot (it works
    on a full lock), never among the attached, never resets a stale pause."""
    try:
        return RWLock._operator(name)
    except FileNotFoundError:
        raise _Fail(f"no lock named {name!r} on this host (see `pyshmlock ls`)") from None


def _inspect(name: str) -> LockInfo:
    try:
        return inspect(name)
    except FileNotFoundError:
        raise _Fail(f"no lock named {name!r} on this host (see `pyshmlock ls`)") from None


def _lock_name(text: str) -> str:
    """argparse type: a valid lock name (a bad one is a usage error, exit 2)."""
    try:
        return check_name(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _seconds(text: str) -> float:
    """argparse type: a finite or infinite number of seconds >= 0."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if math.isnan(v) or v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 seconds, not {text!r}")
    return v


def _interval(text: str) -> float:
    v = _seconds(text)
    if v <= 0 or math.isinf(v):
        raise argparse.ArgumentTypeError(f"must be a positive, finite number of seconds, "
                                         f"not {text!r}")
    return v


def _count(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, not {text!r}")
    return v


class _Fail(Exception):
    def __init__(self, message: str, code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.code = code


def _when(ts: Optional[float]) -> str:
    if not ts:
        return "-"
    dt = datetime.datetime.fromtimestamp(ts)
    return f"{dt:%Y-%m-%d %H:%M:%S} ({time.time() - ts:.1f} s ago)"


def _pauser(info: LockInfo) -> str:
    pid = info.paused_by_pid
    if not pid:
        return "an unknown pid"
    if pid in info.attached_pids:
        return f"pid {pid} (attached)"
    if info.paused_by_alive:
        return f"pid {pid} (running, not attached)"
    return f"pid {pid} (exited)"


def format_status(info: LockInfo) -> str:
    """The human-readable form of a LockInfo."""
    dead = set(info.dead_pids)

    def who(pid: int) -> str:
        return f"pid {pid}{' (dead)' if pid in dead else ''}"

    lines = [f"lock {info.name}"]
    if info.paused:
        lines.append(f"  paused        yes, by {_pauser(info)} since {_when(info.paused_at)}")
    else:
        lines.append("  paused        no")
    if info.writer_pid or info.updater_pid:
        kind = "write" if info.writer_pid else "update"
        pid = info.writer_pid or info.updater_pid or 0
        n = sum(info.readers.values())
        state = ("held" if info.exclusive_granted else
                 f"claimed, waiting for {n} reader{'' if n == 1 else 's'}" if n else
                 "claimed, waiting for readers")
        lines.append(f"  exclusive     {kind} by {who(pid)} ({state})")
    else:
        lines.append("  exclusive     none")
    reads = ", ".join(f"{who(p)}: {n}" for p, n in sorted(info.readers.items())) or "none"
    lines.append(f"  read holds    {reads}")
    waits = ", ".join(f"pid {p}: {n}" for p, n in sorted(info.waiters.items())) or "none"
    lines.append(f"  waiting       {waits}")
    if info.queued_readers:
        q = ", ".join(f"{who(p)}: {n}" for p, n in sorted(info.queued_readers.items()))
        lines.append(f"  queued reads  {q}")
    lines.append(f"  attached      {len(info.attached_pids)} of {info.max_processes} "
                 f"process slots ({', '.join(map(str, info.attached_pids))})")
    exiting = [p.pid for p in info.processes if p.exiting]
    if exiting:
        lines.append(f"  exiting       {', '.join(map(str, exiting))} (their keeper thread is "
                     "gone, the process still runs: their holds stand until it is gone)")
    if info.dead_pids:
        lines.append(f"  died attached {', '.join(map(str, info.dead_pids))} (their holds "
                     "count until an attached process reclaims them)")
    if info.stale:
        lines.append(f"  STALE         {stale_text(info)}")
    lines.append(f"  epoch         {info.epoch}   pauses so far: {info.pause_count}")
    if info.data_suspect:
        lines.append("  DATA SUSPECT  an exclusive holder died mid-update; cleared by the "
                     "next completed write/update")
    if not info.crash_recovery:
        lines.append("  CRASH RECOVERY off: this platform has no robust futexes (as under "
                     "qemu-user); a process that dies holding the lock is never reclaimed")
    if info.recoveries:
        lines.append(f"  recoveries    {info.recovery_count} (latest shown)")
        for r in info.recoveries:
            lines.append(f"    pid {r.pid} died holding {', '.join(r.lost)}"
                         f"{f' ({r.reads} reads)' if r.reads else ''} at {_when(r.when)}")
    return "\n".join(lines)


def stale_text(info: LockInfo) -> str:
    """What a stale lock left behind and what the next opener does about it
    (one definition for status, OPERATIONS and the metrics)."""
    left, will = [], []
    if "pause" in info.stale_left:
        left.append(f"a pause by {_pauser(info)}")
        if info.session is not None:
            will.append("the pause stays: an update session pins it until its end or expiry")
        elif info.lease_remaining is not None:
            will.append("the pause stays: a host lease is armed (its cluster agent decides)")
        else:
            will.append("with stale='reset' (the default) it also clears the pause")
    if "holds of dead processes" in info.stale_left:
        pids = ", ".join(map(str, info.dead_pids)) or "?"
        left.append(f"holds or claims of dead pid {pids}")
    return (f"nobody is attached; left behind: {' and '.join(left)}. Dead processes' holds "
            "are reclaimed by the first attached process that waits on them or looks "
            "(info(), status of an attached tool)" + (f"; the next opener: {will[0]}"
                                                         if will else ""))


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
            i = inspect(name)
        except FileNotFoundError:
            continue      # removed since the listing
        except (PyshmlockError, OSError) as e:
            print(f"{name:40} (unreadable: {e})")
            continue
        ex = (f"write pid {i.writer_pid}" if i.writer_pid else
              f"update pid {i.updater_pid}" if i.updater_pid else "-")
        print(f"{name:40} {'yes' if i.paused else 'no':7} {ex:18} "
              f"{sum(i.readers.values()):<6} {len(i.attached_pids)}"
              f"{' (stale)' if i.stale else ''}")
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    info = _inspect(args.name)
    fmt = "json" if args.json else args.format
    if fmt == "json":
        print(json.dumps(info.to_dict(), indent=2, sort_keys=True))
    elif fmt == "prometheus":
        from .metrics import exposition
        sys.stdout.write(exposition([info]))
    else:
        print(format_status(info))
    return EXIT_OK


def _segment_id(name: str) -> Optional[Tuple[int, int]]:
    try:
        st = os.stat(segment_path(name))
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino)


def cmd_watch(args: argparse.Namespace) -> int:
    first = _segment_id(args.name)
    _inspect(args.name)                      # a clear error if it is not there
    try:
        for _ in range(args.count) if args.count else iter(int, 1):
            # The segment watched is the one present at the start: a removed
            # (or removed and re-created) lock ends the watch.
            now = _segment_id(args.name)
            if now != first:
                anew = now is not None
                raise _Fail(f"lock {args.name!r} was removed"
                            f"{' (a new lock of that name exists now)' if anew else ''}")
            try:
                text = format_status(inspect(args.name))
            except FileNotFoundError:
                raise _Fail(f"lock {args.name!r} was removed") from None
            if sys.stdout.isatty():
                sys.stdout.write("\x1b[H\x1b[2J")
            print(f"{text}\n  (every {args.interval} s; Ctrl-C to stop)", flush=True)
            time.sleep(args.interval)
    except KeyboardInterrupt:
        pass
    return EXIT_OK


def cmd_pause(args: argparse.Namespace) -> int:
    with _open(args.name).attached() as lk:
        changed = lk.pause()
    print(f"{args.name}: {'paused' if changed else 'was already paused'}")
    return EXIT_OK


def cmd_resume(args: argparse.Namespace) -> int:
    with _open(args.name).attached() as lk:
        if not lk.resume(args.timeout, force=args.force):
            raise _Fail(f"{args.name}: still paused after {args.timeout} s: an update "
                        "holds the pause (see `pyshmlock status`)", EXIT_TIMEOUT)
    print(f"{args.name}: running")
    return EXIT_OK


def cmd_rm(args: argparse.Namespace) -> int:
    name = args.name
    try:
        info: Optional[LockInfo] = inspect(name)
    except FileNotFoundError:
        raise _Fail(f"no lock named {name!r} on this host") from None
    except UninitializedSegmentError:
        if not args.force:
            raise _Fail(f"lock {name!r} was never initialised (its creator died?); "
                        f"`pyshmlock rm --force {name}` removes it") from None
        info = None
    except LayoutVersionError:
        # Another release's lock: unlink() removes it when none of its
        # processes runs, and names them otherwise.
        info = None
    except (PyshmlockError, OSError):
        if not args.force:
            raise
        info = None
    others = [p for p in info.attached_pids if p != os.getpid()] if info else []
    pids = ", ".join(map(str, others))
    if others and not args.force:
        raise _Fail(f"lock {name!r}: {len(others)} live process(es) attached (pid {pids}); "
                    f"`pyshmlock rm --force {name}` removes it anyway")
    if info and others:
        what = []
        if info.paused:
            what.append(f"paused by {_pauser(info)}")
        if info.writer_pid or info.updater_pid:
            what.append(f"{'write' if info.writer_pid else 'update'}-held by pid "
                        f"{info.writer_pid or info.updater_pid}")
        if info.readers:
            what.append("read-held by pid " + ", ".join(map(str, sorted(info.readers))))
        if what:
            msg = (f"lock {name!r} is {' and '.join(what)}, with {len(others)} live "
                   f"process(es) attached (pid {pids}). Removing it splits the lock: they "
                   "keep the old one, while every new opener gets a fresh, unpaused, "
                   "unheld lock of that name.")
            if not args.confirm_split:
                raise _Fail(msg + " Add --confirm-split to remove it anyway.")
            print(f"pyshmlock: warning: {msg}", file=sys.stderr)
    try:
        unlink(name, force=args.force)
    except FileNotFoundError:
        raise _Fail(f"no lock named {name!r} on this host") from None
    except LockInUseError as e:
        raise _Fail(f"{e}; `pyshmlock rm --force {name}` removes it anyway") from None
    print(f"{name}: removed")
    return EXIT_OK


def cmd_bench(args: argparse.Namespace) -> int:
    from .benchmark import main as bench_main
    bench_main(args.quick, args.json, args.png)
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    try:
        from .demo import Stopped, run_demo
    except ImportError as e:
        raise _Fail(f"the demo needs {e.name}: pip install 'pyshmlock[demo]'") from None
    try:
        ok = run_demo(workers=args.workers, backend=args.backend, requests=args.requests,
                      cycles=args.cycles, keep_running=args.keep_running)
    except KeyboardInterrupt:
        print("pyshmlock demo: interrupted; every child stopped", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Stopped as e:
        print(f"pyshmlock demo: {e}; every child stopped", file=sys.stderr)
        return 128 + e.signum
    return EXIT_OK if ok else EXIT_ERROR


class _Version(argparse.Action):
    """--version: the package's version, then the SGLang releases the
    integration was tested with (its TESTED_VERSIONS, imported only when
    asked: the integration is not loaded for every command)."""

    def __init__(self, option_strings: List[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="print the version, and the SGLang releases the integration "
                              "was tested with, and exit")

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: Optional[str] = None) -> None:
        from . import __version__
        from .integrations.sglang import TESTED_VERSIONS
        sys.stdout.write(f"pyshmlock {__version__}\n"
                         f"SGLang integration: tested with SGLang "
                         f"{', '.join(TESTED_VERSIONS)}\n")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    p = argparse.ArgumentParser(prog="pyshmlock", formatter_class=fmt, epilog=EXIT_CODES,
                                description="Inspect and drive pyshmlock locks on this host.")
    p.add_argument("--version", action=_Version)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, description=help[0].upper() + help[1:] + ".",
                              formatter_class=fmt, epilog=EXIT_CODES)

    command("ls", "list locks on this host (observes only)").set_defaults(fn=cmd_ls)
    s = command("status", "show who pauses, holds and waits (observes only)")
    s.add_argument("name", type=_lock_name, help=NAME_HELP)
    s.add_argument("--format", choices=["text", "json", "prometheus"], default="text",
                   help="text (default), json, or the Prometheus text exposition format "
                        "(metrics with a lock label, for a node exporter's textfile or a scrape)")
    s.add_argument("--json", action="store_true", help="the same as --format json")
    s.set_defaults(fn=cmd_status)
    s = command("watch", "status, refreshed live until Ctrl-C (observes only)")
    s.add_argument("name", type=_lock_name, help=NAME_HELP)
    s.add_argument("--interval", type=_interval, default=0.5, metavar="S",
                   help="seconds between refreshes, > 0 (default 0.5)")
    s.add_argument("--count", type=_count, default=0, metavar="N",
                   help="stop after N refreshes (default 0: never)")
    s.set_defaults(fn=cmd_watch)
    s = command("pause", "close the gate (never blocks); the pause stays after this "
                         "command exits")
    s.add_argument("name", type=_lock_name, help=NAME_HELP)
    s.set_defaults(fn=cmd_pause)
    s = command("resume", "open the gate once no update holds it")
    s.add_argument("name", type=_lock_name, help=NAME_HELP)
    s.add_argument("--timeout", type=_seconds, default=10.0, metavar="S",
                   help="give up (exit 3) after S seconds; inf waits forever (default 10)")
    s.add_argument("--force", action="store_true",
                   help="resume although the data is marked suspect (clears the mark) or "
                        "a cluster agent manages the lock")
    s.set_defaults(fn=cmd_resume)
    s = command("rm", "remove a lock; processes still attached keep the old one")
    s.add_argument("name", type=_lock_name, help=NAME_HELP)
    s.add_argument("--force", action="store_true",
                   help="remove it even if live processes are attached")
    s.add_argument("--confirm-split", action="store_true",
                   help="with --force: remove it even while it is paused or held by "
                        "attached processes (they keep the paused/held old lock, new "
                        "openers get a fresh one)")
    s.set_defaults(fn=cmd_rm)
    s = command("bench", "multi-process benchmarks next to the usual peers")
    s.add_argument("--quick", action="store_true", help="a run under a minute")
    s.add_argument("--json", default="pyshmlock-bench.json", help="where to write results")
    s.add_argument("--png", default=None, help="also draw a chart (needs matplotlib)")
    s.set_defaults(fn=cmd_bench)
    s = command("demo", "an SGLang-shaped multi-worker server, driven through "
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
    from .cluster.cli import add_parsers  # the `agent` and `cluster` commands
    add_parsers(sub)
    return p


#: Commands that need an optional extra: command -> (extra, its modules).
#: (`agent`, `cluster` and `cluster-demo` need none: the cluster's etcd
#: client is the standard library's asyncio.)
EXTRAS = {
    "demo": ("demo", ("fastapi", "uvicorn", "httpx")),
}


def _missing_modules(modules: Tuple[str, ...]) -> List[str]:
    import importlib.util
    missing = []
    for m in modules:
        try:
            found = importlib.util.find_spec(m) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(m)
    return missing


def require_extra(command: str) -> None:
    """One line naming the extra to install, before a command that needs it
    starts anything (no tracebacks from its children)."""
    extra, modules = EXTRAS.get(command, ("", ()))
    missing = _missing_modules(modules)
    if missing:
        raise _Fail(f"`pyshmlock {command}` needs the '{extra}' extra (missing: "
                    f"{', '.join(missing)}): pip install 'pyshmlock[{extra}]'")


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of the `pyshmlock` console script."""
    args = build_parser().parse_args(argv)
    try:
        require_extra(args.command)
        return int(args.fn(args))
    except _Fail as e:
        print(f"pyshmlock: {e}", file=sys.stderr)
        return e.code
    except PermissionError as e:
        # The library's own message names the owner, the mode and what to do;
        # a bare system refusal gets the path.
        msg = e.strerror or str(e)
        if e.filename and str(e.filename) not in msg:
            msg = f"{msg}: {e.filename}"
        print(f"pyshmlock: permission denied: {msg}", file=sys.stderr)
        return EXIT_ERROR
    except (PyshmlockError, OSError, ValueError) as e:
        print(f"pyshmlock: {e}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
