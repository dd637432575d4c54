"""Which kernel features the running kernel (or emulator) really offers, asked
of it directly, for the tests that need them: robust futexes (the kernel
marks a dead owner's mutex, which crash recovery rests on) and futex_waitv
(Linux 5.16+: a waiter also sleeps on its peers' mutex words, the death
watch).  qemu-user, which runs the aarch64 job (.ci/arm64), has neither;
nor do kernels before 5.16 have futex_waitv.

Each probe makes the system call itself (ctypes), so a test skips for what
this machine lacks, named with the errno that showed it, and never because
of a list of test names or a guess from the architecture.  conftest.py turns
the answers into the ``needs_robust_futex`` and ``needs_futex_waitv``
markers.  A third probe, ``emulated``, says whether a user-mode emulator
runs this process (its CPU is not the machine's): the
``needs_native_execution`` marker skips a test that such an emulator itself
cannot run reliably."""
import ctypes
import errno
import functools
import os
import platform
from typing import Optional

# System call numbers: x86-64's own table, and the generic one that aarch64
# uses.  futex_waitv came after the tables were unified: 449 on both.
_SYS_GET_ROBUST_LIST = {"x86_64": 274, "aarch64": 100}
_SYS_FUTEX_WAITV = {"x86_64": 449, "aarch64": 449}

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _syscall(table, *args) -> Optional[int]:
    """errno of the call (0 on success); None on an architecture not in
    ``table``."""
    nr = table.get(platform.machine())
    if nr is None:
        return None
    ctypes.set_errno(0)
    rc = _libc.syscall(ctypes.c_long(nr), *args)
    return 0 if rc >= 0 else ctypes.get_errno()


@functools.cache
def robust_futexes_missing() -> Optional[str]:
    """Why the kernel would not mark a dead owner's robust mutex, or None
    when it would.  get_robust_list(0, ...) reads this thread's registration:
    it succeeds wherever the kernel keeps robust lists (glibc registers one
    for every thread), and is ENOSYS where it does not (qemu-user)."""
    head = ctypes.c_void_p()
    size = ctypes.c_size_t()
    err = _syscall(_SYS_GET_ROBUST_LIST, ctypes.c_int(0), ctypes.byref(head),
                   ctypes.byref(size))
    if err is None:
        return f"robust futexes not probed on {platform.machine()}"
    if err == 0:
        return None
    return (f"no robust futexes here: get_robust_list returned {errno.errorcode.get(err, err)} "
            f"({os.strerror(err)}), so a dead owner's mutex is never marked "
            "(qemu-user has none)")


@functools.cache
def futex_waitv_missing() -> Optional[str]:
    """Why futex_waitv is not there, or None when it is.  An empty vector is
    EINVAL from a kernel that has the call (Linux 5.16+) and ENOSYS from one
    that does not, or from qemu-user; it never sleeps.  The core's switch
    PYSHMLOCK_NO_FUTEX_WAITV=1 (the path of kernels before 5.16) counts as
    missing too."""
    if os.environ.get("PYSHMLOCK_NO_FUTEX_WAITV") == "1":
        return ("futex_waitv turned off (PYSHMLOCK_NO_FUTEX_WAITV=1: the path of kernels "
                "before 5.16), so waiters have no death watch")
    err = _syscall(_SYS_FUTEX_WAITV, None, ctypes.c_uint(0), ctypes.c_uint(0), None,
                   ctypes.c_int(0))
    if err is None:
        return f"futex_waitv not probed on {platform.machine()}"
    if err == errno.EINVAL:
        return None
    return (f"no futex_waitv here: it returned {errno.errorcode.get(err, err)} "
            f"({os.strerror(err)}; Linux 5.16+, not in qemu-user), so waiters have no "
            "death watch")


# What /proc/cpuinfo shows of each architecture's CPUs (the kernel's own
# text: x86 names a vendor_id, arm64 a "CPU implementer").
_CPUINFO_MARK = {"x86_64": "vendor_id", "aarch64": "CPU implementer"}


@functools.cache
def emulated() -> Optional[str]:
    """Why this process runs under a user-mode emulator, or None when it runs
    on the machine's own CPU: the kernel's /proc/cpuinfo describes CPUs of
    another architecture than the one this interpreter was built for (qemu-user
    passes the host's /proc/cpuinfo through on aarch64)."""
    mine = platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
    except OSError:
        return None
    for arch, mark in _CPUINFO_MARK.items():
        if arch != mine and mark in text and _CPUINFO_MARK.get(mine, "\0") not in text:
            return (f"runs emulated: this is {mine} code, the kernel's CPUs are {arch} "
                    "(a user-mode emulator such as qemu-user)")
    return None


if __name__ == "__main__":
    print(f"{platform.machine()} kernel {platform.release()}")
    print("robust futexes:", robust_futexes_missing() or "yes")
    print("futex_waitv:", futex_waitv_missing() or "yes")
    print("native:", emulated() or "yes")
