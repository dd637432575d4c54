"""The `pyshmlock` command (also `python -m pyshmlock`).

    pyshmlock ls                      locks present on this host
    pyshmlock status NAME [--format text|json|prometheus]   who pauses, holds and waits
    pyshmlock watch NAME              status, refreshed live
    pyshmlock pause NAME              close the gate
    pyshmlock resume NAME [--timeout S] [--force]
    pyshmlock session end NAME [TOKEN]  end an update session (without TOKEN: as lost)
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

Longer than the size guide: the parser and one function per verb, kept
together; what the command says lives in `_cli_text.py`.
"""
import argparse
import json
import math
import os
import sys
import time
from typing import List, Optional, Tuple, Union

from ._args import check_group, check_mode, check_name, segment_path
from ._cli_text import (
    format_status,
    owner_prefix,
    pauser_text,
    refusal_text,
    session_text,
    unreadable_text,
)
from .errors import (
    LayoutVersionError,
    PyshmlockError,
    SessionError,
    UninitializedSegmentError,
    cli_message,
    refusal_of,
)
from .lock import SHM_DIR, SHM_PREFIX, LockInfo, RWLock, inspect, unlink

EXIT_OK, EXIT_ERROR, EXIT_TIMEOUT, EXIT_USAGE = 0, 1, 3, 2
EXIT_INTERRUPTED = 130   # 128 + SIGINT, as a shell reports Ctrl-C
EXIT_PIPE = 141          # 128 + SIGPIPE: the reader of our output stopped (`| head`)

EXIT_CODES = """exit codes:
  0      success
  1      error: no such lock, permission denied, lock in use, a segment that
         is not a usable lock, a failed demo scenario, a removed lock (watch)
  2      usage: bad command line
  3      timeout: `resume` found the pause still pinned by an update hold or
         an update session (it says which, whose, and what to do)
  141    the reader of the output stopped early (`pyshmlock status NAME | head`),
         as a shell reports a command stopped by SIGPIPE; nothing is printed
  128+N  `demo` stopped by signal N: 130 Ctrl-C, 143 SIGTERM, 129 SIGHUP"""

NAME_HELP = ("the lock name: 1-200 characters of [A-Za-z0-9._-]; the lock is "
             "/dev/shm/pyshmlock.NAME (see `pyshmlock ls`)")


def _open(args: argparse.Namespace) -> RWLock:
    """The operator's handle for pause, resume and session end: no process
    slot (it works on a full lock), never among the attached, never resets a
    stale pause; --group and --mode are RWLock's trust opt-ins."""
    name = args.name
    try:
        return RWLock._operator(name, mode=args.mode or (0o660 if args.group else 0o600),
                                group=args.group)
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


def _token(text: str) -> int:
    """argparse type: an update session's token (a whole number)."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a session token: {text!r}") from None
    if not 0 < v < 1 << 64:
        raise argparse.ArgumentTypeError(f"not a session token: {text!r}")
    return v


def _count(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, not {text!r}")
    return v


def _demo_workers(text: str) -> int:
    """argparse type: the demo's worker count (its locks' slots bound it)."""
    from pyshmlock_lab.demo.servers import MAX_WORKERS
    v = _count(text)
    if not 2 <= v <= MAX_WORKERS:
        raise argparse.ArgumentTypeError(f"the demo runs 2 to {MAX_WORKERS} workers, not {v}")
    return v


class _Fail(Exception):
    def __init__(self, message: str, code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.code = code


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
            r = refusal_of(e) if isinstance(e, PermissionError) else None
            why = unreadable_text(r) if r and r.uid >= 0 else f"unreadable: {cli_message(e)}"
            print(f"{name:40} ({why})")
            continue
        ex = (f"write pid {i.writer_pid}" if i.writer_pid else
              f"update pid {i.updater_pid}" if i.updater_pid else "-")
        print(f"{name:40} {'yes' if i.paused else 'no':7} {ex:18} "
              f"{sum(i.readers.values()):<6} {len(i.attached_pids)}"
              f"{' (stale)' if i.stale else ''}")
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    fmt = "json" if args.json else args.format
    if fmt == "prometheus":
        # What a scrape reports (LockCollector): a lock that is there but
        # cannot be read is `pyshmlock_lock_readable 0` with the error and
        # its reason, and the textfile is still written (exit 0).
        from .metrics import Unreadable, exposition
        try:
            looked: Union[LockInfo, Unreadable] = _inspect(args.name)
        except PyshmlockError as e:
            _print(cli_message(e))
            looked = Unreadable(args.name, True, type(e).__name__,
                                str(getattr(e, "reason", "") or ""))
        sys.stdout.write(exposition([looked]))
        return EXIT_OK
    info = _inspect(args.name)
    if fmt == "json":
        print(json.dumps(info.to_dict(), indent=2, sort_keys=True))
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
    with _open(args).attached() as lk:
        changed = lk.pause()
    print(f"{args.name}: {'paused' if changed else 'was already paused'}")
    return EXIT_OK


def _what_pins(lk: RWLock, name: str) -> str:
    """Why a resume still waits: the update session or update hold that
    pins the pause, whose process, and what the operator can do."""
    info = lk.info()
    if info.session is not None:
        se = info.session
        fix = (f"its process is gone: `pyshmlock resume --force {name}` ends it (the data is "
               f"then marked suspect) and opens the gate; `pyshmlock session end {name}` "
               "ends it alone" if not se.alive else
               f"its process still runs: wait for its end, or end it anyway with "
               f"`pyshmlock session end {name}` (the data is then marked suspect)")
        return f"update session {session_text(info)}, pins the pause; {fix}"
    if info.updater_pid:
        state = "held" if info.exclusive_granted else "claimed, waiting for readers"
        return (f"an update hold of pid {info.updater_pid} ({state}) pins the pause; "
                "resuming cannot overtake it: check that process (see "
                f"`pyshmlock status {name}`)")
    return f"something pinned the pause (see `pyshmlock status {name}`)"


def _end_orphaned_session(lk: RWLock) -> Optional[str]:
    """resume --force: an update session whose process is gone is ended as
    lost (the data marked suspect, which the forced resume then clears).
    What was done, or None."""
    se = lk.info().session
    if se is None or se.alive:
        return None
    try:
        lk.end_session(se.token, lost=True)
    except SessionError:
        return None                      # it ended (or expired) meanwhile
    return f"ended update session {se.token} of pid {se.pid} (exited)"


def cmd_resume(args: argparse.Namespace) -> int:
    with _open(args).attached() as lk:
        done = _end_orphaned_session(lk) if args.force else None
        if done:
            print(f"{args.name}: {done}")
        if not lk.resume(args.timeout, force=args.force):
            raise _Fail(f"{args.name}: still paused after {args.timeout:g} s: "
                        f"{_what_pins(lk, args.name)}", EXIT_TIMEOUT)
    print(f"{args.name}: running")
    return EXIT_OK


def cmd_session_end(args: argparse.Namespace) -> int:
    name = args.name
    with _open(args).attached() as lk:
        if args.token is not None:
            lk.end_session(args.token)
            print(f"{name}: update session {args.token} ended; the gate stays paused: "
                  f"`pyshmlock resume {name}` opens it")
            return EXIT_OK
        info = lk.info()
        se = info.session
        if se is None:
            raise _Fail(f"{name}: no update session pins the pause (see "
                        f"`pyshmlock status {name}`)")
        lk.end_session(se.token, lost=True)
    running = (f"; its process (pid {se.pid}) still runs, and its own end will get "
               "'no current update session'" if se.alive else "")
    print(f"{name}: update session {se.token} of pid {se.pid} ended as lost{running}. The "
          f"data is marked suspect and the gate stays paused: redo the update, or "
          f"`pyshmlock resume --force {name}` once you vouch for the data")
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
                        f"`{owner_prefix(name)}pyshmlock rm --force {name}` removes it") from None
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
    who = owner_prefix(name)
    if others and not args.force:
        raise _Fail(f"lock {name!r}: {len(others)} live process(es) attached (pid {pids}); "
                    f"`{who}pyshmlock rm --force {name}` removes it anyway")
    if info and others:
        what = []
        if info.paused:
            what.append(f"paused by {pauser_text(info)}")
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
                raise _Fail(msg + f" `{who}pyshmlock rm --force --confirm-split {name}` "
                            "removes it anyway.")
            print(f"pyshmlock: warning: {msg}", file=sys.stderr)
    try:
        unlink(name, force=args.force)
    except FileNotFoundError:
        raise _Fail(f"no lock named {name!r} on this host") from None
    print(f"{name}: removed")
    return EXIT_OK


def _output_file(text: str) -> str:
    """argparse type: a file to write, in a directory that exists (a
    benchmark run takes minutes: a path it cannot write is refused first,
    and no directory is ever created)."""
    where = os.path.dirname(os.path.abspath(text)) or "/"
    if not os.path.isdir(where):
        raise argparse.ArgumentTypeError(f"no such directory: {where}")
    if not os.access(where, os.W_OK):
        raise argparse.ArgumentTypeError(f"cannot write in {where}")
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text} is a directory")
    return text


def cmd_bench(args: argparse.Namespace) -> int:
    from pyshmlock_lab.bench import main as bench_main
    bench_main(args.quick, args.json, args.png)
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    try:
        from pyshmlock_lab.demo import Stopped, run_demo
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


def _mode(text: str) -> int:
    """argparse type: a permission mode, octal (0660, 0o660)."""
    try:
        return check_mode(int(text, 8))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e) if text.strip("0o").isdigit() else
                                         f"not an octal mode: {text!r}") from None


def _group(text: str) -> Union[int, str]:
    """argparse type: a group name, or a gid."""
    group: Union[int, str] = int(text) if text.isdigit() else text
    try:
        check_group(group)
    except (TypeError, ValueError) as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return group


def _opt_in(s: argparse.ArgumentParser) -> None:
    """--group and --mode: RWLock(name, mode=..., group=...)'s trust opt-ins,
    for a lock shared between users (DESIGN.md, "Trust model")."""
    s.add_argument("--group", type=_group, default=None, metavar="GROUP",
                   help="accept the lock of another user if its group is GROUP (a name or "
                        "gid): the group opt-in of RWLock(name, group=GROUP); implies "
                        "--mode 0660")
    s.add_argument("--mode", type=_mode, default=0, metavar="MODE",
                   help="accept a segment that grants group/other write up to MODE "
                        "(octal, default 0600; 0660 with --group)")


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
    _opt_in(s)
    s.set_defaults(fn=cmd_pause)
    s = command("resume", "open the gate once no update holds it")
    s.add_argument("name", type=_lock_name, help=NAME_HELP)
    _opt_in(s)
    s.add_argument("--timeout", type=_seconds, default=10.0, metavar="S",
                   help="give up (exit 3) after S seconds; inf waits forever (default 10)")
    s.add_argument("--force", action="store_true",
                   help="resume although the data is marked suspect (clears the mark) or "
                        "a cluster agent manages the lock; an update session whose "
                        "process is gone is ended first")
    s.set_defaults(fn=cmd_resume)
    s = command("session", "update sessions: `session end NAME [TOKEN]`")
    ss = s.add_subparsers(dest="session_command", required=True, metavar="ACTION",
                          help="end: end the update session that pins the pause")
    e = ss.add_parser("end", help="end the update session that pins the pause",
                      description="End the update session that pins the pause. With its "
                                  "TOKEN: its normal end (what end_session(token) does). "
                                  "Without: ended as lost, as an expiry (for a session "
                                  "whose process died): the data is marked suspect. The "
                                  "gate stays paused either way (`pyshmlock resume`).",
                      formatter_class=fmt, epilog=EXIT_CODES)
    e.add_argument("name", type=_lock_name, help=NAME_HELP)
    e.add_argument("token", type=_token, nargs="?", default=None,
                   help="the session's token (`pyshmlock status NAME` shows it)")
    _opt_in(e)
    e.set_defaults(fn=cmd_session_end)
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
    s.add_argument("--json", type=_output_file, default="pyshmlock-bench.json",
                   help="where to write results (its directory must exist)")
    s.add_argument("--png", type=_output_file, default=None,
                   help="also draw a chart (needs matplotlib; its directory must exist)")
    s.set_defaults(fn=cmd_bench)
    s = command("demo", "an SGLang-shaped multi-worker server, driven through "
                        "the pause/update races")
    s.add_argument("--workers", type=_demo_workers, default=4,
                   help="tokenizer workers, 2 or more (default 4)")
    s.add_argument("--backend", choices=["shared", "local"], default="shared",
                   help="shared: pyshmlock; local: per-worker flags + broadcast (SGLang today)")
    s.add_argument("--requests", type=_count, default=16,
                   help="concurrent requests sent while paused (default 16)")
    s.add_argument("--cycles", type=_count, default=1000,
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


def names_after_options(parser: argparse.ArgumentParser, argv: List[str]) -> List[str]:
    """argv with every lock name that starts with '-' moved after a '--'.

    argparse takes `-name` for an option; a lock name may start with '-'
    (`[A-Za-z0-9._-]`).  So an argument of a command that is not one of
    that command's options (nor an abbreviation of one, nor an option's
    value) but is a valid lock name is moved to the end, after '--', where
    argparse reads it as the positional it is.  Anything else (an unknown
    option that is not a valid name) is left for argparse to refuse."""
    if "--" in argv:
        return argv
    sub, i = parser, -1
    while True:          # down to the command itself (`cluster status` is two levels)
        subs = next((a.choices for a in sub._actions
                     if isinstance(a, argparse._SubParsersAction)), None)
        if not subs:
            break
        i = next((k for k in range(i + 1, len(argv)) if not argv[k].startswith("-")), -1)
        if i < 0 or argv[i] not in subs:
            return argv
        sub = subs[argv[i]]
    takes_value = {opt: a.nargs != 0 for a in sub._actions for opt in a.option_strings}
    head, rest, names = argv[:i + 1], [], []
    k = i + 1
    while k < len(argv):
        a = argv[k]
        known = a.split("=", 1)[0]
        matches = [o for o in takes_value if o == known or
                   (known.startswith("--") and o.startswith(known))]
        if a.startswith("-") and not matches and a != "-" and _is_name(a):
            names.append(a)
        else:
            rest.append(a)
            if len(matches) == 1 and "=" not in a and takes_value[matches[0]] \
                    and k + 1 < len(argv):
                k += 1
                rest.append(argv[k])      # the option's value, whatever it looks like
        k += 1
    return head + rest + (["--", *names] if names else [])


def _is_name(text: str) -> bool:
    try:
        check_name(text)
    except ValueError:
        return False
    return True


def _print(text: str) -> None:
    print(f"pyshmlock: {text}", file=sys.stderr)


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of the `pyshmlock` console script."""
    parser = build_parser()
    given = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(names_after_options(parser, given))
    try:
        require_extra(args.command)
        code = int(args.fn(args))
        sys.stdout.flush()            # here, so that a closed pipe is caught below
        return code
    except BrokenPipeError:
        # The reader stopped early (`pyshmlock status NAME | head -1`): say
        # nothing, and keep the interpreter's last flush from failing too.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_PIPE
    except _Fail as e:
        _print(str(e))
        return e.code
    except PermissionError as e:
        # Whose the lock is, its mode, and a command line that works; a
        # refusal that is not about a lock's segment gets the path.
        r = refusal_of(e)
        _print(f"permission denied: {refusal_text(r, given) if r else cli_message(e)}")
        return EXIT_ERROR
    except (PyshmlockError, OSError, ValueError) as e:
        _print(cli_message(e))
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
