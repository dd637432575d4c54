"""CLI wiring for ``pyshmlock agent`` and ``pyshmlock cluster
pause|resume|status|evict|admit|break-update`` (kept apart from
pyshmlock/cli.py; it only calls ``add_parsers``).  Exit codes: 0 done,
1 error (bad argument, certificate, authentication, lost update lock, a
missing expected host), 3 timed out (also: etcd unreachable in time)."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Dict, List

EXIT_OK, EXIT_ERROR, EXIT_TIMEOUT = 0, 1, 3


def _timeout(v: str) -> float:
    t = float(v)
    if not (0 <= t <= 1e6):
        raise argparse.ArgumentTypeError("timeout must be between 0 and 1e6 seconds")
    return t


def _ttl(v: str) -> float:
    t = float(v)
    if not (1 <= t <= 3600):
        raise argparse.ArgumentTypeError("ttl must be between 1 and 3600 seconds")
    return t


def _etcd_args(s: Any) -> None:
    s.add_argument("--etcd", required=True, help="etcd endpoints, comma-separated URLs")
    s.add_argument("--cacert", "--ca", dest="cacert", default=None,
                   help="CA bundle that signed etcd's certificates (etcdctl's --cacert)")
    s.add_argument("--cert", default=None, help="client certificate (etcd --client-cert-auth)")
    s.add_argument("--key", default=None, help="client certificate's key")
    s.add_argument("--user", default=None, help="etcd user (auth enabled); the password "
                                               "from --password-file or "
                                               "$PYSHMLOCK_ETCD_PASSWORD")
    s.add_argument("--password-file", default=None, help="file holding the etcd password")


def add_parsers(sub: Any) -> None:
    from .agent import DEFAULT_TTL
    s = sub.add_parser("agent", help="mirror a cluster gate in etcd into this host's locks "
                                     "(one agent per host)")
    _etcd_args(s)
    s.add_argument("--cluster", required=True, help="cluster name (the etcd key prefix)")
    s.add_argument("--lock", required=True, action="append",
                   help="a local lock of this host (one per engine); repeat it, or give "
                        "several separated by commas")
    s.add_argument("--host-id", default=None, help="registration id (default: the hostname); "
                                                   "unique in the cluster")
    s.add_argument("--ttl", type=_ttl, default=DEFAULT_TTL,
                   help=f"lease seconds: a silent host pauses itself within 3/4 of it "
                        f"(default {DEFAULT_TTL:g})")
    s.set_defaults(fn=cmd_agent)

    s = sub.add_parser("cluster-demo", help="the cross-host races on a local 3-member etcd: "
                                            "pyshmlock.cluster next to the HTTP fan-out")
    s.add_argument("--hosts", type=int, default=3, choices=range(3, 9), metavar="N",
                   help="simulated hosts, 3-8 (default 3)")
    s.add_argument("--workers", type=int, default=2, choices=range(1, 9), metavar="N",
                   help="worker processes per host, 1-8 (default 2)")
    s.set_defaults(fn=cmd_cluster_demo)

    c = sub.add_parser("cluster", help="drive a cluster gate in etcd")
    csub = c.add_subparsers(dest="cluster_command", required=True,
                            help="pause, resume, status, evict, admit or break-update")
    for name, hlp in (("pause", "pause every host; returns once each acknowledged or was lost"),
                      ("resume", "open the gate once no cluster update holds it"),
                      ("status", "gate (who paused, alive?, since), update lock, hosts"),
                      ("evict", "drop a host now (a pause stops waiting for it); it stays "
                                "out, paused, until admitted"),
                      ("admit", "let an evicted host back, counting it as up to date"),
                      ("break-update", "revoke the update lock of a dead controller")):
        s = csub.add_parser(name, help=hlp)
        _etcd_args(s)
        s.add_argument("name", help="cluster name")
        if name in ("evict", "admit"):
            s.add_argument("host", help="host id")
        s.add_argument("--timeout", type=_timeout, default=30.0 if name != "status" else 10.0,
                       help="seconds (default 30; status 10)")
        if name == "resume":
            s.add_argument("--wait", action="store_true",
                           help="also wait until every host has reopened")
        if name == "pause":
            s.add_argument("--drain", action="store_true",
                           help="also wait until no read is held on any host")
            s.add_argument("--expect", default=None,
                           help="comma-separated host ids that must all be registered")
        if name == "break-update":
            s.add_argument("--token", type=int, default=None,
                           help="only the update with this token")
            s.add_argument("--force", action="store_true",
                           help="even if its controller looks alive")
        s.add_argument("--etcd-timeout", type=_timeout, default=10.0,
                       help="give up on an unreachable etcd after S seconds (default 10)")
        s.add_argument("--json", action="store_true", help="machine-readable output")
        s.set_defaults(fn=cmd_cluster)


def cmd_cluster_demo(args: Any) -> int:
    from pyshmlock_lab.cluster.crosshost_demo import run_cluster_demo
    return EXIT_OK if run_cluster_demo(hosts=args.hosts, workers=args.workers) else EXIT_ERROR


def cmd_agent(args: Any) -> int:
    from .agent import main
    return main(args)


def _ago(t: Any) -> str:
    if not t:
        return "-"
    s = max(0.0, time.time() - float(t))
    return f"{s:.0f} s ago" if s < 120 else f"{s / 60:.0f} min ago"


def _alive(v: Any) -> str:
    return {True: "alive", False: "not alive", None: "a one-shot command"}[v]


def _host_lines(hid: str, reg: Dict[str, Any], gate_revision: int) -> List[str]:
    """A host's line, and one per lock that needs a word (the status a host
    last wrote in etcd: a host acknowledges controllers directly, and writes
    its status about a second after it settles)."""
    from ._keys import CURRENT, as_dict, as_int
    seen = as_int(reg.get("mirrored"), -1) >= gate_revision
    notes = [("paused" if reg.get("paused") is True else "open")]
    if reg.get("drained") is True:
        notes.append("drained")
    locks = {k: v for k, v in as_dict(reg.get("locks")).items() if isinstance(v, dict)}
    names = sorted(locks) or [str(reg.get("lock"))]
    lines = [f"  {hid:<24} mirrored {reg.get('mirrored')} "
             f"{'(current)' if seen else '(not yet)'} {' '.join(notes)} "
             f"pid {reg.get('pid')} locks {','.join(names)}"]
    if not locks:                      # an agent of an earlier release
        locks = {names[0]: {"standing": "behind" if reg.get("behind") is True else CURRENT,
                            "suspect": reg.get("suspect"), "users": reg.get("users")}}
    for lk, v in sorted(locks.items()):
        words = []
        standing = v.get("standing", CURRENT)
        if standing == "behind":
            words.append("BEHIND the last update (stays paused)")
        elif standing == "partial":
            words.append("holds PART of an update that did not complete (stays paused)")
        if v.get("suspect") is True:
            words.append("DATA SUSPECT (stays paused)")
        if as_int(v.get("users"), 1) == 0:
            words.append("UNUSED (no process but the agent)")
        if words:
            lines.append(f"    lock {lk}: {'; '.join(words)}")
    return lines


def status_text(name: str, st: Any) -> str:
    if st.paused:
        head = (f"cluster {name}: PAUSED by {st.paused_by or '-'} "
                f"({_alive(st.paused_by_alive)}) for {st.paused_for or 0:.0f} s, "
                f"mode {st.gate.get('mode', '-')}, gate revision {st.gate_revision}")
    else:
        head = f"cluster {name}: open (gate revision {st.gate_revision}, " \
               f"resumed by {st.gate.get('by', '-')} {_ago(st.gate.get('at'))})"
    lines = [head]
    if st.update:
        lines.append(f"update lock: held by {st.update.get('by')} "
                     f"({_alive(st.update_by_alive)}), token {st.update_token}, "
                     f"since {_ago(st.update.get('at'))}")
    else:
        lines.append("update lock: free")
    gen = st.generation
    if gen.get("token"):
        how = "" if gen.get("completed", True) else " (its block RAISED: the fleet stayed paused)"
        lines.append(f"last update: token {gen['token']} by {gen.get('by')} "
                     f"{_ago(gen.get('at'))}{how}")
    for hid, reg in sorted(st.hosts.items()):
        lines.extend(_host_lines(hid, reg, st.gate_revision))
    if not st.hosts:
        lines.append("  no host registered")
    for hid, ev in sorted(st.evicted.items()):
        lines.append(f"  {hid:<24} EVICTED by {ev.get('by')} {_ago(ev.get('at'))}")
    return "\n".join(lines)


def cmd_cluster(args: Any) -> int:
    from ._errors import ClusterError, ClusterTimeout
    from ._sync import Cluster
    from .agent import _password
    c = None
    try:
        c = Cluster(args.etcd, args.name, op_timeout=args.etcd_timeout, session=False,
                    ca=args.cacert, cert=args.cert, key=args.key, user=args.user,
                    password=_password(args), who=f"cli:{os.uname().nodename}:{os.getpid()}")
        cmd = args.cluster_command
        if cmd == "pause":
            expect = [h for h in (args.expect or "").split(",") if h] or None
            r = c.pause(timeout=args.timeout, drain=args.drain, expect=expect)
            out: Any = {"revision": r.revision, "acknowledged": r.acknowledged, "lost": r.lost,
                        "drained": r.drained, "seconds": round(r.seconds, 4),
                        "unused": r.unused, "behind": r.behind, "closing": r.closing}
            lost = ", ".join(f"{h} (closed within {r.closing.get(h, 0):.1f} s by its lease)"
                             for h in r.lost)
            text = (f"paused at revision {r.revision} in {r.seconds * 1000:.0f} ms; "
                    f"acknowledged: {', '.join(r.acknowledged) or '-'}; "
                    f"lost: {lost or '-'}")
        elif cmd == "resume":
            rev = c.resume(timeout=args.timeout, wait=args.wait)
            out, text = {"revision": rev}, f"resumed at revision {rev}"
        elif cmd == "evict":
            c.evict(args.host, timeout=args.timeout)
            out, text = {"evicted": args.host}, f"evicted {args.host}"
        elif cmd == "admit":
            c.admit(args.host, timeout=args.timeout)
            out, text = {"admitted": args.host}, f"admitted {args.host}"
        elif cmd == "break-update":
            st = c.status(timeout=args.timeout)
            if st.update is not None and st.update_by_alive and not args.force:
                print(f"pyshmlock: the update (token {st.update_token}) is held by "
                      f"{st.update.get('by')}, which is alive; --force to break it anyway",
                      file=sys.stderr)
                return EXIT_ERROR
            tok = c.break_update(args.token, timeout=args.timeout)
            out = {"broken": tok}
            text = (f"broke the update with token {tok}: its lock is released, its token "
                    "is refused; the gate stays paused (cluster resume opens it)"
                    if tok else "no update lock is held")
        else:
            st = c.status(timeout=args.timeout)
            out, text = st.to_dict(), status_text(args.name, st)
    except ClusterTimeout as e:
        print(f"pyshmlock: {e} (took effect: {e.took_effect})", file=sys.stderr)
        return EXIT_TIMEOUT
    except (ClusterError, ValueError, OSError) as e:
        print(f"pyshmlock: {e}", file=sys.stderr)
        return EXIT_ERROR
    finally:
        if c is not None:
            c.close()
    print(json.dumps(out, indent=2, sort_keys=True) if args.json else text)
    return EXIT_OK
