"""Timeouts: the one rule that turns a ``timeout`` in seconds into the C
core's absolute CLOCK_MONOTONIC deadline (the C fast path hands its edge
cases back to :func:`deadline_ns`, so there is one rule)."""
import math
import numbers
import time
from typing import Any

# Any wait this long or longer is "forever": 2**62 ns is 146 years, and a
# deadline of now + 2**62 ns cannot overflow int64 (CLOCK_MONOTONIC starts
# near boot).
_FOREVER_S = float(1 << 62) / 1e9


def deadline_ns(timeout: Any) -> int:
    """Convert a timeout in seconds to an absolute CLOCK_MONOTONIC deadline.

    None, ``float("inf")`` and any finite timeout of 146 years or more wait
    forever (-1); 0 tries once.  Negative or NaN is a ValueError; anything
    but None or a real number (a str, a bool) is a TypeError.
    """
    if timeout is None:
        return -1
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise TypeError(f"timeout must be None or a number of seconds, not "
                        f"{type(timeout).__name__} {timeout!r}")
    try:
        t = float(timeout)
    except OverflowError:        # an int too large for a float
        t = math.inf if timeout > 0 else -math.inf  # type: ignore[operator]
    if math.isnan(t) or t < 0:
        raise ValueError(f"timeout must be None or >= 0, not {timeout!r}")
    if t >= _FOREVER_S:
        return -1
    if t == 0:
        return 0
    return time.monotonic_ns() + int(t * 1e9)

