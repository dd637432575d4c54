"""The C compiles without a warning (``make warnings``, which also requires a
prototype for every non-static core function), and the built core exports
its API and nothing else: the core's cross-file functions are hidden."""
import os
import re
import shutil
import subprocess

import pytest

import pyshmlock._fast as fast
import pyshmlock._shmlock as core

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.timeout(240)
@pytest.mark.skipif(shutil.which("make") is None or shutil.which("gcc") is None,
                    reason="make and gcc are needed")
@pytest.mark.skipif(not os.path.exists(os.path.join(ROOT, "Makefile")),
                    reason="not run from a source tree")
def test_make_warnings_is_clean():
    p = subprocess.run(["make", "-s", "warnings"], cwd=ROOT, capture_output=True, text=True,
                       timeout=220)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]


@pytest.mark.skipif(shutil.which("nm") is None, reason="binutils' nm is needed")
def test_core_exports_only_its_api():
    out = subprocess.run(["nm", "-D", "--defined-only", core.__file__], capture_output=True,
                         text=True, timeout=30, check=True).stdout
    names = {line.split()[-1] for line in out.splitlines()
             if re.match(r"\S+ [TDBRV] ", line)}
    assert "shl_try" in names and "PyInit__shmlock" in names
    with open(os.path.join(ROOT, "csrc", "shmlock.h")) as f:
        api = set(re.findall(r"\b(shl_\w+)\s*\(", f.read()))
    stray = sorted(n for n in names if n not in api and not n.startswith("PyInit_")
                   and not n.startswith(("_init", "_fini", "_edata", "_end", "__bss_start")))
    assert not stray, f"exported beyond the API in shmlock.h: {stray}"


@pytest.mark.skipif(shutil.which("nm") is None, reason="binutils' nm is needed")
def test_fast_path_exports_only_its_init():
    out = subprocess.run(["nm", "-D", "--defined-only", fast.__file__], capture_output=True,
                         text=True, timeout=30, check=True).stdout
    names = {line.split()[-1] for line in out.splitlines() if re.match(r"\S+ [TDBRV] ", line)}
    assert names - {"_init", "_fini", "_edata", "_end", "__bss_start"} == {"PyInit__fast"}, names
