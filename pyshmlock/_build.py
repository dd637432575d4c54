"""cffi build script for the pyshmlock C core (out-of-line API mode).

The C declarations are read from ``csrc/shmlock.h`` itself, minus its
preprocessor guard and includes, so the binding can never drift from the
header.  ``setup.py`` names this module in ``cffi_modules``; running it
directly (``python pyshmlock/_build.py``) builds the extension in place.
"""
import os
import re

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CSRC = os.path.join(ROOT, "csrc")

# PYSHMLOCK_SANITIZE=1 builds the core with AddressSanitizer and UBSan.
SANITIZE = os.environ.get("PYSHMLOCK_SANITIZE") == "1"


HEADERS = ("shmlock.h", "floor.h")     # the lock core, and the benchmark floors
SOURCES = ("shmlock.c", "floor.c")


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
        include_dirs=[path(CSRC)],
        extra_compile_args=_cflags,
        extra_link_args=_ldflags,
        libraries=["rt"],
    )
    return ffi


ffibuilder = make_ffi()

if __name__ == "__main__":
    # python pyshmlock/_build.py [OUTDIR]: build pyshmlock/_shmlock*.so under
    # OUTDIR (default: the source tree, for development).
    import sys
    outdir = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else ROOT
    make_ffi(absolute_paths=True).compile(tmpdir=outdir, verbose=True)
