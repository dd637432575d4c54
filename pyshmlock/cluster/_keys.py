"""Where a cluster's state lives in etcd, how it is encoded, and the one
parse of it that the agent, the controllers and ``status`` share.

Values are JSON written by pyshmlock, but read back from the network: every
field is read through ``as_int`` / ``as_bool`` / ``as_dict``, so a value of
the wrong type reads as absent instead of raising in the middle of a pause.
"""
from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Tuple

ROOT = "/pyshmlock/cluster/"

#: The HTTP header that carries a cluster update's fencing token to the code
#: that applies weights at a host (the SGLang integration reads it from its
#: update calls and passes it to ``lock.fenced_update(token)``).
FENCE_HEADER = "X-Pyshmlock-Fence"


def valid_cluster_name(name: str) -> str:
    if not isinstance(name, str) or not name or len(name) > 200 or "/" in name \
            or not name.isprintable():
        raise ValueError(f"invalid cluster name {name!r}: 1-200 printable characters, no '/'")
    return name


def valid_host_id(host_id: str) -> str:
    if not isinstance(host_id, str) or not host_id or "/" in host_id or len(host_id) > 200 \
            or not host_id.isprintable():
        raise ValueError(f"invalid host id {host_id!r}: 1-200 printable characters, no '/'")
    return host_id


class Keys:
    def __init__(self, cluster: str) -> None:
        self.cluster = valid_cluster_name(cluster)
        self.prefix = ROOT + cluster + "/"
        # What the agents watch, apart from the registrations (which only the
        # controllers need): one pause wakes each agent once, not once per host.
        self.ctl = self.prefix + "ctl/"
        self.gate = self.ctl + "gate"           # {"paused", "drain", "mode", "by", "at", ...}
        self.update = self.ctl + "update"       # lease-bound; fencing token = create_revision
        self.generation = self.ctl + "generation"   # the last update that ended
        self.evicted = self.ctl + "evicted/"    # evicted/<id>: kept out until admitted
        self.ackers = self.ctl + "ackers/"      # ackers/<session>: where hosts acknowledge
        self.ackreq = self.ctl + "ackreq"       # {"hosts": [...]}: write your report in etcd
        self.hosts = self.prefix + "hosts/"     # hosts/<id>: lease-bound registration
        self.sessions = self.prefix + "sessions/"  # sessions/<lease>: a live controller

    def host(self, host_id: str) -> str:
        return self.hosts + valid_host_id(host_id)

    def evicted_host(self, host_id: str) -> str:
        return self.evicted + valid_host_id(host_id)


def loads(raw: bytes) -> Dict[str, Any]:
    try:
        v = json.loads(raw.decode() or "{}")
    except (UnicodeDecodeError, ValueError, RecursionError):
        return {}
    return v if isinstance(v, dict) else {}


def dumps(v: Dict[str, Any]) -> str:
    return json.dumps(v, sort_keys=True, separators=(",", ":"))


def as_int(v: Any, default: int = 0) -> int:
    if isinstance(v, bool):
        return default
    if isinstance(v, int):
        return v
    if isinstance(v, str) and v.lstrip("-").isdigit() and len(v) <= 21:
        return int(v)
    return default


def as_bool(v: Any) -> bool:
    return v is True


def as_dict(v: Any) -> Dict[str, Any]:
    return v if isinstance(v, dict) else {}


def as_list(v: Any) -> List[Any]:
    return v if isinstance(v, list) else []


#: A host lock's standing against the fleet's last update (``lock_standing``).
CURRENT, BEHIND, PARTIAL = "current", "behind", "partial"


class State:
    """The cluster's keys at one revision (from a read or a watched mirror)."""

    def __init__(self, keys: Keys, kvs: Dict[str, Dict[str, Any]], revision: int) -> None:
        self.revision = revision
        self.gate: Dict[str, Any] = {}
        self.gate_rev = 0
        self.update: Optional[Dict[str, Any]] = None
        self.update_token = 0
        self.update_lease = 0
        self.generation: Dict[str, Any] = {}
        self.generation_rev = 0
        self.hosts: Dict[str, Dict[str, Any]] = {}
        self.host_create: Dict[str, int] = {}
        self.host_lease: Dict[str, int] = {}
        self.evicted: Dict[str, Dict[str, Any]] = {}
        self.sessions: Dict[int, Dict[str, Any]] = {}
        self.ackers: Dict[str, Dict[str, Any]] = {}
        self.ackreq: Dict[str, Any] = {}
        self.ackreq_rev = 0
        for k, kv in kvs.items():
            v = kv.get("parsed")
            if v is None:
                v = loads(kv["value"])
            if k == keys.gate:
                self.gate = v
                self.gate_rev = kv["mod_revision"]
            elif k == keys.update:
                self.update = v
                self.update_token = kv["create_revision"]
                self.update_lease = kv["lease"]
            elif k == keys.generation:
                self.generation = v
                self.generation_rev = kv["mod_revision"]
            elif k == keys.ackreq:
                self.ackreq = v
                self.ackreq_rev = kv["mod_revision"]
            elif k.startswith(keys.hosts):
                hid = k[len(keys.hosts):]
                self.hosts[hid] = dict(v, _rev=kv["mod_revision"])
                self.host_create[hid] = kv["create_revision"]
                self.host_lease[hid] = kv["lease"]
            elif k.startswith(keys.evicted):
                self.evicted[k[len(keys.evicted):]] = v
            elif k.startswith(keys.ackers):
                self.ackers[k[len(keys.ackers):]] = v
            elif k.startswith(keys.sessions):
                try:
                    self.sessions[int(k[len(keys.sessions):], 16)] = v
                except ValueError:
                    pass

    @property
    def paused(self) -> bool:
        return as_bool(self.gate.get("paused", False))

    @property
    def drain(self) -> bool:
        return self.paused and as_bool(self.gate.get("drain", False))

    @property
    def acks_in_etcd(self) -> bool:
        """The gate's writer cannot be acknowledged directly (a one-shot
        command): hosts write their acknowledgement in etcd at once."""
        return self.gate.get("acks") == "etcd"

    def asked_for_report(self, host_id: str) -> bool:
        """A controller could not hear this host directly and asks it to
        write its report in etcd (``ctl/ackreq``)."""
        hosts = self.ackreq.get("hosts")
        return isinstance(hosts, list) and host_id in hosts

    @property
    def generation_token(self) -> int:
        return max(0, as_int(self.generation.get("token", 0)))

    def lock_standing(self, host_id: str, lock: str, applied: int,
                      registration: int) -> Tuple[str, bool]:
        """A host lock against the fleet's last update (the generation):
        (CURRENT, BEHIND or PARTIAL, whether it is current only by the
        generation's list of hosts, so that the lock should record it).

        * recorded as failed at that host (``u.mark_failed``): BEHIND;
        * its lock holds a later update than the fleet completed (part of an
          update that failed or was lost): PARTIAL;
        * its lock has the update (``fenced_update`` recorded it, or its
          agent did before): CURRENT;
        * listed with this registration (registered from the update's pause
          to its end), or admitted (``"*"``): CURRENT, to be recorded;
        * otherwise (it missed the update): BEHIND."""
        tok = self.generation_token
        failed = as_dict(self.generation.get("failed")).get(host_id)
        if tok and (failed == "*" or (isinstance(failed, list) and lock in failed)):
            return BEHIND, False
        listed = as_dict(self.generation.get("hosts")).get(host_id)
        if listed == "*":
            return CURRENT, applied < tok
        if applied > tok:
            return PARTIAL, False
        if applied == tok:
            return CURRENT, False
        if registration > 0 and as_int(listed, -1) == registration:
            return CURRENT, True
        return BEHIND, False

    def behind(self) -> List[str]:
        return sorted(h for h, reg in self.hosts.items() if as_bool(reg.get("behind")))
