"""Beyond one host: a cluster-wide pause gate and update lock on etcd,
mirrored into each host's pyshmlock lock by a host agent (issue 17).

See docs/DESIGN.md, "Beyond one host", for the guarantees and their proofs.
Needs the ``cluster`` extra (etcd3gw) and a reachable etcd v3.4+.  Names are
imported lazily, so ``pyshmlock --help`` works without the extra.
"""
from typing import Any

__all__ = [
    "Agent",
    "AsyncCluster",
    "Cluster",
    "ClusterStatus",
    "ClusterTimeout",
    "EtcdError",
    "FencingError",
    "PauseResult",
]


def __getattr__(name: str) -> Any:
    if name == "Agent":
        from .agent import Agent
        return Agent
    if name in __all__:
        from . import _controller
        return getattr(_controller, name)
    raise AttributeError(f"module 'pyshmlock.cluster' has no attribute {name!r}")
