"""Beyond one host: a cluster-wide pause gate and update lock on etcd,
mirrored into each host's pyshmlock lock by a host agent.

See docs/DESIGN.md, "Beyond one host", for the guarantees and their proofs,
and docs/OPERATIONS.md, "A cluster", for the runbook.  Needs a reachable
etcd v3.4+ (its HTTP/JSON gateway) and nothing outside the standard library.
Names are imported lazily.
"""
from typing import Any

from ._keys import FENCE_HEADER

__all__ = [
    "DEFAULT_TTL",
    "DEFAULT_UPDATE_TTL",
    "FENCE_HEADER",
    "Agent",
    "AsyncCluster",
    "AuthenticationError",
    "CertificateError",
    "Cluster",
    "ClusterError",
    "ClusterStatus",
    "ClusterTimeout",
    "DuplicateHostError",
    "EtcdError",
    "EtcdUnavailable",
    "FencingError",
    "MissingHostsError",
    "PauseResult",
    "QuotaError",
    "UpdateLostError",
]

_ERRORS = {"AuthenticationError", "CertificateError", "ClusterError", "ClusterTimeout",
           "DuplicateHostError", "EtcdError", "EtcdUnavailable", "FencingError",
           "MissingHostsError", "QuotaError", "UpdateLostError"}


def __getattr__(name: str) -> Any:
    if name in ("Agent", "DEFAULT_TTL"):
        from . import agent
        return getattr(agent, name)
    if name in _ERRORS:
        from . import _errors
        return getattr(_errors, name)
    if name in ("Cluster", "ClusterUpdate"):
        from . import _sync
        return getattr(_sync, name)
    if name in __all__:
        from . import _controller
        return getattr(_controller, name)
    raise AttributeError(f"module 'pyshmlock.cluster' has no attribute {name!r}")
