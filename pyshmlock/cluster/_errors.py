"""The one exception family of pyshmlock.cluster.

Every error a cluster call raises is a :class:`ClusterError`.  Each carries
``took_effect``: ``True`` when the call's change is known to be written in
etcd (a ``pause()`` that timed out waiting for acknowledgements has paused
the fleet), ``False`` when it is known not to be, ``None`` when a write was
sent and its answer never came (it may have been applied).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

from ..errors import FencingError

__all__ = [
    "AuthenticationError",
    "CertificateError",
    "ClusterError",
    "ClusterTimeout",
    "DuplicateHostError",
    "EtcdError",
    "EtcdUnavailable",
    "FencingError",
    "MissingHostsError",
    "QuotaError",
    "UpdateLostError",
]


class ClusterError(Exception):
    """Base of every pyshmlock.cluster error; ``took_effect`` says whether the
    call's change was written (True), was not (False) or may have been (None)."""

    def __init__(self, msg: str, *, took_effect: Optional[bool] = False) -> None:
        super().__init__(msg)
        self.took_effect = took_effect


class ClusterTimeout(ClusterError, TimeoutError):
    """The call's timeout passed; ``pending`` names what it still waited for."""

    def __init__(self, msg: str, pending: Sequence[str] = (), *,
                 took_effect: Optional[bool] = False) -> None:
        super().__init__(msg, took_effect=took_effect)
        self.pending = list(pending)


class EtcdError(ClusterError):
    """etcd refused a request or could not be used (see the subclasses)."""


class EtcdUnavailable(ClusterTimeout, EtcdError):
    """No etcd member answered within the call's time (majority down, all
    members unreachable, no leader)."""


class CertificateError(EtcdError):
    """A TLS problem: the server's certificate is not trusted by the given
    CA, or the server wants a client certificate that was not given or that
    it does not trust."""


class AuthenticationError(EtcdError):
    """etcd's authentication refused the call: no user given while auth is
    enabled, a wrong user or password, or a user without permission."""


class QuotaError(EtcdError):
    """etcd raised its space-quota alarm (NOSPACE): it refuses every write
    until it is compacted, defragmented and the alarm is disarmed."""


# ``FencingError`` is ``pyshmlock.FencingError`` itself (imported above), the
# one class for "this update token is refused": a host's
# ``lock.fenced_update(token)`` raises it for a token older than the newest
# that host has seen, so ``except pyshmlock.cluster.FencingError`` catches a
# host's refusal as well as the cluster's (below).


class UpdateLostError(ClusterError, FencingError):
    """The cluster update lock was lost (its lease expired, or it was
    broken): its fencing token is refused.  A ``FencingError`` (so both
    ``except pyshmlock.FencingError`` and ``except
    pyshmlock.cluster.FencingError`` catch it) and a ``ClusterError``."""


class DuplicateHostError(ClusterError):
    """Another live agent is registered under this host id."""


class MissingHostsError(ClusterError):
    """Hosts the controller expects are not registered; ``missing`` names
    them, ``result`` is the call's result for the hosts that are."""

    def __init__(self, msg: str, missing: Sequence[str], result: Any = None, *,
                 took_effect: Optional[bool] = True) -> None:
        super().__init__(msg, took_effect=took_effect)
        self.missing = list(missing)
        self.result = result
