"""The weights a server serves, one value for all its tokenizer processes.

SGLang keeps ``weight_version``, ``model_path``, ``served_model_name`` and
``load_format`` per process: an update recorded by the worker that handled
it leaves its siblings answering the old values (SGLang #39520).  The
integration keeps them in one small record per server, next to the lock:

    /dev/shm/pyshmlock-sglang.<lock name>/served.json

a directory of this user's only (mode 0700, refused otherwise), holding
one JSON object of those fields (strings).  A writer changes it under an
``flock`` of ``served.lock`` in the same directory (read, merge, write a
temporary file, rename over), so two updates never lose each other's
field and a reader never sees half a file.  A reader looks at the file's
identity (inode, size, change time) at every read and parses it again only
when that changed: one ``stat`` a read.

A record outlives a server only if the server did not stop cleanly (the
last worker to stop removes the directory with the lock's segment).  So
that a server restarted after a crash does not answer with the weights of
the one before, the record carries the pids attached to the lock when it
was written, and is used only while one of them is still attached.

The record is input from another process: anything but a JSON object of
strings is ignored (logged once), never raised into a request."""

import errno
import fcntl
import json
import logging
import os
import shutil
import stat
import tempfile
from typing import Any, Callable, Dict, Iterable, Optional, Tuple

logger = logging.getLogger(__name__)

#: The fields the record shares (SGLang's names).
FIELDS = ("weight_version", "model_path", "served_model_name", "load_format")
SHM_DIR = "/dev/shm"
_ATTACHED = "attached_pids"


def directory(lock_name: str) -> str:
    return os.path.join(SHM_DIR, f"pyshmlock-sglang.{lock_name}")


class ServedWeights:
    """The record of one server (``lock_name``).  ``attached`` returns the
    pids attached to the server's lock now (the lock's ``info()``)."""

    def __init__(self, lock_name: str, attached: Callable[[], Iterable[int]]) -> None:
        self.dir = directory(lock_name)
        self.path = os.path.join(self.dir, "served.json")
        self._attached = attached
        self._seen: Optional[Tuple[int, int, int]] = None
        self._values: Dict[str, str] = {}
        self._complained = False

    # -- reading -------------------------------------------------------------

    def get(self, name: str) -> Optional[str]:
        """The shared value of ``name``, or None (no record, or not that field)."""
        return self.values().get(name)

    def values(self) -> Dict[str, str]:
        try:
            st = os.stat(self.path)
        except OSError:
            self._seen, self._values = None, {}
            return self._values
        identity = (st.st_ino, st.st_size, st.st_ctime_ns)
        if identity != self._seen:
            self._values = self._load(st)
            self._seen = identity
        return self._values

    def _load(self, st: os.stat_result) -> Dict[str, str]:
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            return self._ignore(f"owned by uid {st.st_uid}, mode {stat.filemode(st.st_mode)}")
        try:
            with open(self.path, encoding="utf-8") as f:
                raw = json.load(f)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            return self._ignore(f"unreadable ({e})")
        if not isinstance(raw, dict):
            return self._ignore("not a JSON object")
        pids = raw.get(_ATTACHED)
        if not isinstance(pids, list) or not all(isinstance(p, int) for p in pids):
            return self._ignore(f"no list of pids in {_ATTACHED!r}")
        values = {k: v for k, v in raw.items() if k in FIELDS}
        if not all(isinstance(v, str) for v in values.values()):
            return self._ignore("a field that is not a string")
        if not set(pids) & set(self._attached()):
            return {}          # written by a server whose processes are all gone
        return values

    def _ignore(self, why: str) -> Dict[str, str]:
        if not self._complained:
            logger.warning("pyshmlock: ignoring the served-weights record %s: %s; each "
                           "worker reports its own values", self.path, why)
            self._complained = True
        return {}

    # -- writing -------------------------------------------------------------

    def publish(self, **fields: str) -> None:
        """Merge ``fields`` into the record, for every process of the server."""
        unknown = set(fields) - set(FIELDS)
        if unknown:
            raise ValueError(f"not a served-weights field: {sorted(unknown)}")
        self._make_dir()
        with open(os.path.join(self.dir, "served.lock"), "a") as guard:
            fcntl.flock(guard, fcntl.LOCK_EX)    # released when closed
            current = dict(self.values())
            current.update(fields)
            record: Dict[str, Any] = dict(current)
            record[_ATTACHED] = sorted(set(self._attached()) | {os.getpid()})
            fd, tmp = tempfile.mkstemp(prefix=".served.", dir=self.dir)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    json.dump(record, f)
                os.replace(tmp, self.path)
            except BaseException:
                _unlink_quietly(tmp)
                raise

    def _make_dir(self) -> None:
        try:
            os.mkdir(self.dir, 0o700)
        except FileExistsError:
            pass
        st = os.lstat(self.dir)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise PermissionError(
                errno.EPERM, f"{self.dir} is not a private directory of this user "
                f"(uid {st.st_uid}, mode {stat.filemode(st.st_mode)}): the served weights "
                "are not shared; remove it if it is left from another user's server")

    def remove(self) -> None:
        """Remove the record (the last worker of a server, stopping)."""
        shutil.rmtree(self.dir, ignore_errors=True)


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
