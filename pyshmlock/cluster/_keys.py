"""Where a cluster's state lives in etcd, and how it is encoded."""
from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Tuple

ROOT = "/pyshmlock/cluster/"


def valid_cluster_name(name: str) -> str:
    if not isinstance(name, str) or not name or len(name) > 200 or "/" in name \
            or not name.isprintable():
        raise ValueError(f"invalid cluster name {name!r}: 1-200 printable characters, no '/'")
    return name


class Keys:
    def __init__(self, cluster: str) -> None:
        self.prefix = ROOT + valid_cluster_name(cluster) + "/"
        self.gate = self.prefix + "gate"        # {"paused", "drain", "mode", "by", "at"}
        self.update = self.prefix + "update"    # lease-bound; fencing token = create_revision
        self.hosts = self.prefix + "hosts/"     # hosts/<id>: lease-bound registration

    def host(self, host_id: str) -> str:
        if not host_id or "/" in host_id:
            raise ValueError(f"invalid host id {host_id!r}")
        return self.hosts + host_id


def loads(raw: bytes) -> Dict[str, Any]:
    try:
        v = json.loads(raw.decode() or "{}")
    except (UnicodeDecodeError, ValueError):
        return {}
    return v if isinstance(v, dict) else {}


class Snapshot:
    """One linearizable read of everything under the cluster prefix."""

    def __init__(self, keys: Keys, kvs: List[Dict[str, Any]], revision: int) -> None:
        self.revision = revision
        self.gate: Dict[str, Any] = {}
        self.gate_rev = 0
        self.update: Optional[Dict[str, Any]] = None
        self.update_token = 0
        self.update_lease = 0
        self.hosts: Dict[str, Dict[str, Any]] = {}
        for kv in kvs:
            k = kv["key"]
            if k == keys.gate:
                self.gate = loads(kv["value"])
                self.gate_rev = kv["mod_revision"]
            elif k == keys.update:
                self.update = loads(kv["value"])
                self.update_token = kv["create_revision"]
                self.update_lease = kv["lease"]
            elif k.startswith(keys.hosts):
                reg = loads(kv["value"])
                reg["_rev"] = kv["mod_revision"]
                self.hosts[k[len(keys.hosts):]] = reg

    @property
    def paused(self) -> bool:
        return bool(self.gate.get("paused", False))

    @property
    def drain(self) -> bool:
        return self.paused and bool(self.gate.get("drain", False))


def read(store: Any, keys: Keys) -> Snapshot:
    kvs, rev = store.get(keys.prefix, prefix=True)
    return Snapshot(keys, kvs, rev)


def split(snap: Snapshot) -> Tuple[int, bool]:
    return snap.gate_rev, snap.paused
