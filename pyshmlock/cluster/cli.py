"""CLI wiring for ``pyshmlock agent`` and ``pyshmlock cluster
pause|resume|status`` (kept apart from pyshmlock/cli.py; it only calls
``add_parsers``).  Exit codes: 0 done, 1 error (etcd unreachable, bad
argument, lost update lock), 3 timed out."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

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


def add_parsers(sub: Any) -> None:
    s = sub.add_parser("agent", help="mirror a cluster gate in etcd into this host's lock "
                                     "(one per host)")
    s.add_argument("--etcd", required=True, help="etcd endpoints, comma-separated URLs")
    s.add_argument("--cluster", required=True, help="cluster name (the etcd key prefix)")
    s.add_argument("--lock", required=True, help="this host's local lock name")
    s.add_argument("--host-id", default=None, help="registration id (default: hostname-lock)")
    s.add_argument("--ttl", type=_ttl, default=2.0,
                   help="lease seconds: a silent host pauses itself within it (default 2)")
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
                            help="pause, resume or status")
    for name, hlp in (("pause", "pause every host; returns once each acknowledged or was lost"),
                      ("resume", "open the gate once no cluster update holds it"),
                      ("status", "gate, update lock and host registrations")):
        s = csub.add_parser(name, help=hlp)
        s.add_argument("--etcd", required=True, help="etcd endpoints, comma-separated URLs")
        s.add_argument("name", help="cluster name")
        if name != "status":
            s.add_argument("--timeout", type=_timeout, default=30.0, help="seconds (default 30)")
        if name == "pause":
            s.add_argument("--drain", action="store_true",
                           help="also wait until no read is held on any host")
        s.add_argument("--etcd-timeout", type=_timeout, default=10.0,
                       help="give up on an unreachable etcd after S seconds (default 10)")
        s.add_argument("--json", action="store_true", help="machine-readable output")
        s.set_defaults(fn=cmd_cluster)


def cmd_cluster_demo(args: Any) -> int:
    from .demo import run_cluster_demo
    return EXIT_OK if run_cluster_demo(hosts=args.hosts, workers=args.workers) else EXIT_ERROR


def cmd_agent(args: Any) -> int:
    from .agent import main
    return main(args)


def cmd_cluster(args: Any) -> int:
    from ._controller import Cluster, ClusterTimeout, EtcdError, FencingError
    try:
        c = Cluster(args.etcd, args.name, op_timeout=args.etcd_timeout)
        if args.cluster_command == "pause":
            r = c.pause(timeout=args.timeout, drain=args.drain)
            out: Any = {"revision": r.revision, "acknowledged": r.acknowledged, "lost": r.lost,
                        "drained": r.drained, "seconds": round(r.seconds, 4)}
            text = (f"paused at revision {r.revision} in {r.seconds * 1000:.0f} ms; "
                    f"acknowledged: {', '.join(r.acknowledged) or '-'}; "
                    f"lost: {', '.join(r.lost) or '-'}")
        elif args.cluster_command == "resume":
            rev = c.resume(timeout=args.timeout)
            out, text = {"revision": rev}, f"resumed at revision {rev}"
        else:
            st = c.status()
            out = st.to_dict()
            lines = [f"cluster {args.name}: {'PAUSED' if st.paused else 'open'} "
                     f"(gate revision {st.gate_revision}, by {st.gate.get('by', '-')}, "
                     f"mode {st.gate.get('mode', '-')})",
                     "update lock: " + (f"held by {st.update.get('by')} token {st.update_token}"
                                         if st.update else "free")]
            for hid, reg in sorted(st.hosts.items()):
                ok = reg.get("mirrored", -1) >= st.gate_revision
                lines.append(f"  {hid:<24} mirrored {reg.get('mirrored')} "
                             f"{'(current)' if ok else '(behind)'} "
                             f"{'paused' if reg.get('paused') else 'open'}"
                             f"{' drained' if reg.get('drained') else ''} "
                             f"pid {reg.get('pid')}")
            if not st.hosts:
                lines.append("  no host registered")
            text = "\n".join(lines)
    except ClusterTimeout as e:
        print(f"pyshmlock: {e}", file=sys.stderr)
        return EXIT_TIMEOUT
    except (EtcdError, FencingError, ValueError) as e:
        print(f"pyshmlock: {e}", file=sys.stderr)
        return EXIT_ERROR
    print(json.dumps(out, indent=2, sort_keys=True) if args.json else text)
    return EXIT_OK
