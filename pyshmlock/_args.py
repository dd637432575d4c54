"""Checking the arguments a lock is opened with: its name, group and mode;
and where a name's segment lives (:func:`segment_path`)."""
import grp
import os
import re
from typing import Any, Union

from ._shmlock import ffi, lib

_NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,200}\Z")


def check_name(name: Any) -> str:
    """Return ``name`` if it is a valid lock name, else raise ValueError
    (TypeError if it is not a str)."""
    if not isinstance(name, str):
        raise TypeError(f"a lock name is a str, not {type(name).__name__}")
    if not _NAME_RE.match(name):
        raise ValueError(
            f"invalid lock name {name!r}: use 1-200 characters from [A-Za-z0-9._-]")
    return name


def segment_path(name: str, file: bool = True) -> str:
    """The file of the lock ``name`` ("/dev/shm/pyshmlock.<name>"), or with
    ``file=False`` its POSIX shared-memory object's name ("/pyshmlock.<name>").
    The rule is the C core's (shl_segment_path), defined there once."""
    buf = ffi.new("char[]", lib.SHL_PATH_MAX)
    if lib.shl_segment_path(check_name(name).encode(), int(file), buf, lib.SHL_PATH_MAX) < 0:
        raise ValueError(f"invalid lock name {name!r}")
    return str(ffi.string(buf).decode())


# The directory of every lock's file, and the prefix of their names there
# (`pyshmlock ls` lists the directory), from the rule above.
SHM_DIR, _first = os.path.split(segment_path("_"))
SHM_PREFIX = _first[:-1]


def check_group(group: Union[int, str, None]) -> int:
    """The gid for the ``group`` argument (-1 for None), else ValueError."""
    if group is None:
        return -1
    if isinstance(group, bool) or not isinstance(group, (int, str)):
        raise TypeError(f"group must be None, a group name or a gid, not "
                        f"{type(group).__name__}")
    if isinstance(group, str):
        try:
            return grp.getgrnam(group).gr_gid
        except KeyError:
            raise ValueError(f"no such group {group!r}") from None
    if isinstance(group, int) and not isinstance(group, bool) and 0 <= group < 2**32 - 1:
        return group
    raise ValueError(f"group must be None, a group name or a gid, not {group!r}")


def check_mode(mode: Any) -> int:
    """Return ``mode`` if it is a permission number 0..0o777 that gives the
    owner read and write (without them the creator's own next open of the
    lock would fail with EACCES)."""
    if isinstance(mode, bool) or not isinstance(mode, int):
        raise TypeError(f"mode must be an int such as 0o600, not {type(mode).__name__}")
    if not 0 <= mode <= 0o777:
        raise ValueError(f"mode must be a permission number 0..0o777, not {oct(mode)}")
    if mode & 0o600 != 0o600:
        raise ValueError(f"mode {mode:#05o} does not give the lock's owner read and write "
                         f"(0o600): the creator could not open it again; use "
                         f"{mode | 0o600:#05o}")
    return mode


def check_max_processes(n: Any, limit: int) -> int:
    """Return ``n`` if it is a process-slot count 1..limit."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"max_processes must be an int, not {type(n).__name__}")
    if not 1 <= n <= limit:
        raise ValueError(f"max_processes must be 1..{limit}, not {n!r}")
    return n


def check_bool(value: Any, name: str) -> bool:
    """Return ``value`` if it is a bool (True/False), else TypeError."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, not {type(value).__name__}")
    return value


class _Octal(int):
    """An int that shows as octal, so that help() prints ``mode=0o600``."""

    def __repr__(self) -> str:
        return oct(self)


DEFAULT_MODE = _Octal(0o600)
