"""Measurement floors for the benchmarks, compiled at run time.

The floors are not part of the installed lock: its shared objects export
only the ``shl_*`` API.  ``pyshmlock bench`` and ``bench/`` build them on
first use from ``csrc/floor.c`` (two cffi calls doing one atomic operation
each; a raw futex wait/broadcast) and ``csrc/floor_capi.c`` (a METH_NOARGS
no-op: the bare C-API call) into a cache directory under the temporary
directory, keyed by a hash of the sources and the interpreter.

Without a C compiler, or without the sources (an installed wheel carries no
``csrc/``), :func:`cffi_floor`/:func:`capi_floor` raise
:class:`FloorUnavailable` and the benchmarks report the floor as skipped.
"""
import hashlib
import importlib.util
import os
import shutil
import sys
import sysconfig
import tempfile
from types import ModuleType
from typing import Any, Dict, List, Optional

# The floor sources: at the top of the checkout this package sits in (an
# editable install: pyshmlock_lab/bench/floors.py, two folders up), or
# wherever PYSHMLOCK_CSRC points (an installed package run from a checkout,
# as CI's tests do).
CSRC = os.environ.get("PYSHMLOCK_CSRC") or os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "csrc")

_loaded: Dict[str, ModuleType] = {}


class FloorUnavailable(ImportError):
    """A floor cannot be built here; ``name`` says why."""


def _sources(files: List[str]) -> List[str]:
    paths = [os.path.join(CSRC, f) for f in files]
    missing = [p for p in paths if not os.path.exists(p)]
    if missing:
        raise FloorUnavailable("floor sources not found", name="floor sources (csrc/)")
    if shutil.which(sysconfig.get_config_var("CC").split()[0] if sysconfig.get_config_var("CC")
                    else "cc") is None:
        raise FloorUnavailable("no C compiler", name="a C compiler")
    return paths


def _cache_dir(tag: str, paths: List[str]) -> str:
    h = hashlib.sha256(sys.version.encode())
    for p in paths:
        with open(p, "rb") as f:
            h.update(f.read())
    return os.path.join(tempfile.gettempdir(),
                        f"pyshmlock-floor-{tag}-{os.getuid()}-{h.hexdigest()[:16]}")


def _load(modname: str, directory: str) -> Optional[ModuleType]:
    if not os.path.isdir(directory):
        return None
    for f in os.listdir(directory):
        if f.startswith(modname + ".") and f.endswith(".so"):
            spec = importlib.util.spec_from_file_location(modname, os.path.join(directory, f))
            assert spec is not None and spec.loader is not None
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            return mod
    return None


def _build_once(tag: str, modname: str, paths: List[str], build: Any) -> ModuleType:
    if tag in _loaded:
        return _loaded[tag]
    final = _cache_dir(tag, paths)
    mod = _load(modname, final)
    if mod is None:
        work = tempfile.mkdtemp(prefix=f"pyshmlock-floor-{tag}-")
        try:
            build(work)
            try:
                os.rename(work, final)       # atomic: a racing builder's copy wins
            except OSError:
                shutil.rmtree(work, ignore_errors=True)
        except Exception as e:
            shutil.rmtree(work, ignore_errors=True)
            raise FloorUnavailable(f"building the floor failed: {e}",
                                   name=f"floor build ({e.__class__.__name__})") from e
        mod = _load(modname, final)
        if mod is None:
            raise FloorUnavailable("floor build produced no module", name="floor build")
    _loaded[tag] = mod
    return mod


def cffi_floor() -> Any:
    """The cffi module of csrc/floor.c: ``.ffi`` and ``.lib.floor_*``."""
    paths = _sources(["floor.c", "floor.h"])

    def build(work: str) -> None:
        from cffi import FFI
        ffi = FFI()
        with open(paths[1]) as f:
            ffi.cdef("\n".join(line for line in f.read().splitlines()
                               if not line.lstrip().startswith("#")))
        ffi.set_source("_pyshmlock_floor", '#include "floor.h"', sources=[paths[0]],
                       include_dirs=[CSRC], extra_compile_args=["-std=gnu11", "-O2"])
        ffi.compile(tmpdir=work)
    return _build_once("cffi", "_pyshmlock_floor", paths, build)


def capi_floor() -> Any:
    """The module of csrc/floor_capi.c: ``noop()`` is the bare C-API call."""
    paths = _sources(["floor_capi.c"])

    def build(work: str) -> None:
        from setuptools import Distribution, Extension
        ext = Extension("_pyshmlock_capi_floor", sources=paths, py_limited_api=True,
                        define_macros=[("Py_LIMITED_API", "0x03090000")],
                        extra_compile_args=["-O2"])
        dist = Distribution({"name": "floor", "ext_modules": [ext]})
        cmd = dist.get_command_obj("build_ext")
        cmd.build_lib = work
        cmd.build_temp = os.path.join(work, "tmp")
        cmd.ensure_finalized()
        cmd.run()
        shutil.rmtree(cmd.build_temp, ignore_errors=True)
    return _build_once("capi", "_pyshmlock_capi_floor", paths, build)
