"""The host-level cluster setting: which local locks belong to a cluster.

One small JSON file per lock, ``<dir>/<lock>.json``, in
``/etc/pyshmlock/cluster.d`` (``PYSHMLOCK_CLUSTER_DIR`` overrides it), with
the cluster's name, its etcd endpoints and the host id.  The agent writes it
at start (and checks it names the same cluster); provisioning can write it
before anything runs (a new pod, a fresh image).

Servers read it when they open a lock: a lock named there is opened
*fail-closed*: if the open creates the segment (an empty ``/dev/shm``
after a reboot), it starts paused with its host lease already expired, so
nothing is admitted before an agent mirrors the cluster, whichever process
starts first.  A setting that exists but cannot be read, and a directory
that exists but cannot be listed, count as "a member": fail closed.
"""
from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Dict, Optional

__all__ = ["DEFAULT_DIR", "ENV", "fail_closed_for", "read_setting", "setting_dir",
           "setting_path", "write_setting"]

ENV = "PYSHMLOCK_CLUSTER_DIR"
DEFAULT_DIR = "/etc/pyshmlock/cluster.d"


def setting_dir() -> str:
    return os.environ.get(ENV) or DEFAULT_DIR


def setting_path(lock: str) -> str:
    return os.path.join(setting_dir(), f"{lock}.json")


class _Unreadable(Exception):
    pass


def _load(lock: str) -> Optional[Dict[str, Any]]:
    d = setting_dir()
    if not os.path.lexists(d):
        return None
    try:
        names = os.listdir(d)
    except OSError as e:
        raise _Unreadable(f"{d}: {e}") from None
    if f"{lock}.json" not in names:
        return None
    p = os.path.join(d, f"{lock}.json")
    try:
        with open(p) as f:
            v = json.load(f)
    except (OSError, ValueError) as e:
        raise _Unreadable(f"{p}: {e}") from None
    if not isinstance(v, dict) or not isinstance(v.get("cluster"), str):
        raise _Unreadable(f"{p}: not a pyshmlock cluster setting")
    return v


def read_setting(lock: str) -> Optional[Dict[str, Any]]:
    """The lock's setting, None if it is not declared; ``{"unreadable": why}``
    if it is declared (or may be) but cannot be read."""
    try:
        return _load(lock)
    except _Unreadable as e:
        return {"unreadable": str(e)}


def fail_closed_for(lock: str) -> bool:
    """Whether a process creating this lock's segment must create it paused."""
    return read_setting(lock) is not None


def write_setting(lock: str, cluster: str, endpoints: Any, host_id: str,
                  pid: Optional[int] = None) -> str:
    """Write (atomically) the setting for ``lock``; returns its path."""
    d = setting_dir()
    os.makedirs(d, mode=0o755, exist_ok=True)
    data = {"cluster": cluster, "lock": lock, "host_id": host_id,
            "etcd": list(endpoints) if not isinstance(endpoints, str) else endpoints,
            "agent_pid": pid}
    fd, tmp = tempfile.mkstemp(prefix=f".{lock}.", dir=d)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, sort_keys=True)
        os.chmod(tmp, 0o644)
        os.replace(tmp, setting_path(lock))
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return setting_path(lock)
