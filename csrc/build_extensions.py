"""Build script for the pyshmlock C core (cffi, out-of-line API mode) and
for the fast-path extension pyshmlock._fast (csrc/fastpath/).

The C declarations are read from ``csrc/shmlock.h`` itself, minus its
preprocessor guard and includes, so the binding can never drift from the
header.  ``setup.py`` names this module in ``cffi_modules``; running it
directly (``python csrc/build_extensions.py [OUTDIR]``) builds both
extensions in place (or under OUTDIR).  It lives beside the C sources, not in
the package: it builds the package and is never installed with it.

The fast module is compiled from csrc/fastpath/ alone: it reaches the core
through function pointers handed over at import (pyshmlock/_fastpath.py),
so a process holds one copy of the core's code and static state.
"""
import os
import re

from cffi import FFI

CSRC = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(CSRC)

# PYSHMLOCK_SANITIZE=1 builds the core with AddressSanitizer and UBSan.
SANITIZE = os.environ.get("PYSHMLOCK_SANITIZE") == "1"


# The lock core's API.  (The benchmark floors, csrc/floor.c and
# csrc/floor_capi.c, are not built here: pyshmlock_lab/bench/floors.py compiles them
# at run time.)
HEADERS = ("shmlock.h",)
# The core: every C file of csrc/core/, one concern each (see its internal.h).
CORE = os.path.join(CSRC, "core")
SOURCES = tuple(sorted(os.path.join("core", f) for f in os.listdir(CORE) if f.endswith(".c")))
# The fast-path extension: every C file of csrc/fastpath/.
FAST = os.path.join(CSRC, "fastpath")
FAST_SOURCES = tuple(sorted(os.path.join("fastpath", f) for f in os.listdir(FAST)
                            if f.endswith(".c")))
# The stable ABI of CPython 3.9: one binary for 3.9 and later.
LIMITED_API = "0x03090000"


def _declarations():
    kept = []
    for header in HEADERS:
        with open(os.path.join(CSRC, header)) as f:
            kept += [line for line in f.read().splitlines()
                     if not re.match(r"\s*#\s*(ifndef|endif|include|define\s+PYSHMLOCK_\w+_H\b)",
                                     line)]
    return "\n".join(kept)


_cflags = ["-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror=implicit-function-declaration"]
_ldflags = ["-pthread"]
if SANITIZE:
    _cflags += ["-O1", "-g", "-fsanitize=address,undefined", "-fno-omit-frame-pointer"]
    _ldflags += ["-fsanitize=address,undefined"]



def make_ffi(absolute_paths=False):
    """The FFI builder.  setuptools wants source paths relative to the
    project; a direct build into another directory wants them absolute."""
    path = (lambda p: p) if absolute_paths else (lambda p: os.path.relpath(p, ROOT))
    ffi = FFI()
    ffi.cdef(_declarations())
    ffi.set_source(
        "pyshmlock._shmlock",
        "".join(f'#include "{h}"\n' for h in HEADERS),
        sources=[path(os.path.join(CSRC, c)) for c in SOURCES],
        include_dirs=[path(CSRC), path(CORE)],
        extra_compile_args=_cflags,
        extra_link_args=_ldflags,
        libraries=["rt"],
    )
    return ffi


def fast_extension(absolute_paths=False):
    """The setuptools Extension of pyshmlock._fast (abi3)."""
    from setuptools import Extension
    path = (lambda p: p) if absolute_paths else (lambda p: os.path.relpath(p, ROOT))
    return Extension(
        "pyshmlock._fast",
        sources=[path(os.path.join(CSRC, c)) for c in FAST_SOURCES],
        include_dirs=[path(CSRC), path(FAST)],
        define_macros=[("Py_LIMITED_API", LIMITED_API)],
        py_limited_api=True,
        extra_compile_args=_cflags,
        extra_link_args=[f for f in _ldflags if f != "-pthread"],
    )


def build_fast(outdir):
    """Compile pyshmlock._fast into OUTDIR/pyshmlock (what setup.py does)."""
    import tempfile

    from setuptools import Distribution
    dist = Distribution({"name": "pyshmlock", "ext_modules": [fast_extension(True)]})
    cmd = dist.get_command_obj("build_ext")
    cmd.build_lib = outdir
    with tempfile.TemporaryDirectory() as tmp:
        cmd.build_temp = tmp
        cmd.ensure_finalized()
        cmd.run()


ffibuilder = make_ffi()

if __name__ == "__main__":
    # python csrc/build_extensions.py [OUTDIR]: build pyshmlock/_shmlock*.so under
    # OUTDIR (default: the source tree, for development).
    import sys
    outdir = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else ROOT
    make_ffi(absolute_paths=True).compile(tmpdir=outdir, verbose=True)
    build_fast(outdir)
