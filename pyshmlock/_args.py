"""Checking the arguments a lock is opened with: its name, group and mode."""
import grp
import re
from typing import Any, Union

_NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,200}\Z")


def check_name(name: Any) -> str:
    """Return ``name`` if it is a valid lock name, else raise ValueError."""
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ValueError(
            f"invalid lock name {name!r}: use 1-200 characters from [A-Za-z0-9._-]")
    return name


def check_group(group: Union[int, str, None]) -> int:
    """The gid for the ``group`` argument (-1 for None), else ValueError."""
    if group is None:
        return -1
    if isinstance(group, str):
        try:
            return grp.getgrnam(group).gr_gid
        except KeyError:
            raise ValueError(f"no such group {group!r}") from None
    if isinstance(group, int) and not isinstance(group, bool) and 0 <= group < 2**32 - 1:
        return group
    raise ValueError(f"group must be None, a group name or a gid, not {group!r}")


class _Octal(int):
    """An int that shows as octal, so that help() prints ``mode=0o600``."""

    def __repr__(self) -> str:
        return oct(self)


DEFAULT_MODE = _Octal(0o600)
