"""Child processes that die with their parent (PR_SET_PDEATHSIG), so a demo
or test run killed by any signal leaves no agent, worker or etcd behind."""
from __future__ import annotations

import ctypes
import signal
import subprocess
from typing import Any, Optional

_PR_SET_PDEATHSIG = 1
_libc: Optional[ctypes.CDLL]
try:
    _libc = ctypes.CDLL(None, use_errno=True)
except OSError:   # pragma: no cover
    _libc = None


def _die_with_parent() -> None:
    if _libc is not None:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def spawn(args: Any, **kw: Any) -> subprocess.Popen[Any]:
    return subprocess.Popen(args, preexec_fn=_die_with_parent, **kw)
