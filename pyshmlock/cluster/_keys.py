"""Where a cluster's state lives in etcd, how it is encoded, and the one
parse of it that the agent, the controllers and ``status`` share."""
from __future__ import annotations

import json
from typing import Any, Dict, List, Optional

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
        self.generation = self.ctl + "generation"   # the last completed update
        self.evicted = self.ctl + "evicted/"    # evicted/<id>: kept out until admitted
        self.hosts = self.prefix + "hosts/"     # hosts/<id>: lease-bound registration
        self.sessions = self.prefix + "sessions/"  # sessions/<lease>: a live controller

    def host(self, host_id: str) -> str:
        return self.hosts + valid_host_id(host_id)

    def evicted_host(self, host_id: str) -> str:
        return self.evicted + valid_host_id(host_id)


def loads(raw: bytes) -> Dict[str, Any]:
    try:
        v = json.loads(raw.decode() or "{}")
    except (UnicodeDecodeError, ValueError):
        return {}
    return v if isinstance(v, dict) else {}


def dumps(v: Dict[str, Any]) -> str:
    return json.dumps(v, sort_keys=True, separators=(",", ":"))


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
        self.hosts: Dict[str, Dict[str, Any]] = {}
        self.host_create: Dict[str, int] = {}
        self.host_lease: Dict[str, int] = {}
        self.evicted: Dict[str, Dict[str, Any]] = {}
        self.sessions: Dict[int, Dict[str, Any]] = {}
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
            elif k.startswith(keys.hosts):
                hid = k[len(keys.hosts):]
                reg = dict(v, _rev=kv["mod_revision"])
                self.hosts[hid] = reg
                self.host_create[hid] = kv["create_revision"]
                self.host_lease[hid] = kv["lease"]
            elif k.startswith(keys.evicted):
                self.evicted[k[len(keys.evicted):]] = v
            elif k.startswith(keys.sessions):
                try:
                    self.sessions[int(k[len(keys.sessions):], 16)] = v
                except ValueError:
                    pass

    @property
    def paused(self) -> bool:
        return bool(self.gate.get("paused", False))

    @property
    def drain(self) -> bool:
        return self.paused and bool(self.gate.get("drain", False))

    @property
    def generation_token(self) -> int:
        return int(self.generation.get("token", 0) or 0)

    def current(self, host_id: str, applied_update: int = 0,
                registration: Optional[int] = None) -> bool:
        """Whether host ``host_id`` has the fleet's last completed update: it
        was registered (with the same registration) from the update's pause
        to its release, or an admin admitted it, or its lock records the
        update as applied through ``fenced_update``."""
        tok = self.generation_token
        if tok == 0 or applied_update >= tok:
            return True
        present = self.generation.get("hosts", {})
        if not isinstance(present, dict):
            return False
        v = present.get(host_id)
        cr = self.host_create.get(host_id) if registration is None else registration
        return v == "*" or (cr is not None and v == cr)

    def behind(self) -> List[str]:
        return sorted(h for h, reg in self.hosts.items() if reg.get("behind"))
