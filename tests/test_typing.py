"""The type stub matches the header, and the tree stays clean under mypy
--strict (library) and ruff: regressions fail the suite, not a later CI."""
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(not os.path.exists(os.path.join(ROOT, "pyproject.toml")),
                                 reason="needs the source tree")]


def run(*cmd):
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=280)


def test_stub_is_generated_from_the_header():
    p = run(sys.executable, os.path.join("csrc", "make_stub.py"), "--check")
    assert p.returncode == 0, p.stderr


def test_mypy_strict_is_clean():
    pytest.importorskip("mypy")
    p = run(sys.executable, "-m", "mypy", "--no-incremental")   # config: pyproject.toml
    assert p.returncode == 0, p.stdout + p.stderr


def test_ruff_is_clean():
    ruff = shutil.which("ruff") or os.path.join(os.path.dirname(sys.executable), "ruff")
    if not os.path.exists(ruff):
        pytest.skip("ruff is not installed (pip install '.[test]')")
    p = run(ruff, "check", ".")                    # config: pyproject.toml
    assert p.returncode == 0, p.stdout + p.stderr


def test_the_linter_and_type_checker_are_the_pinned_ones():
    """ruff and mypy are pinned exactly in the test extra, so every machine
    checks the same rules: the ones installed are those versions."""
    import re
    from importlib import metadata
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        pins = dict(re.findall(r'"(ruff|mypy)==([^"]+)"', f.read()))
    assert set(pins) == {"ruff", "mypy"}, pins
    for tool, version in sorted(pins.items()):
        try:
            installed = metadata.version(tool)
        except metadata.PackageNotFoundError:
            pytest.skip(f"{tool} is not installed (pip install '.[test]')")
        assert installed == version, f"{tool} {installed} installed, {version} pinned"


def test_no_c_constant_is_copied_by_hand():
    """Bits of the state word and other C constants reach Python from
    shmlock.h through the binding (lib.SHL_*), never as literals: a copy
    would silently disagree after a layout change."""
    import re
    pattern = re.compile(r"^\s*_?[A-Z][A-Z0-9_]*\s*=\s*(0[xX][0-9a-fA-F]+|\d+\s*<<)", re.M)
    found = []
    for top, _dirs, files in os.walk(os.path.join(ROOT, "pyshmlock")):
        for f in files:
            if f.endswith(".py"):
                with open(os.path.join(top, f)) as src:
                    found += [f"{f}: {m.group(0).strip()}" for m in pattern.finditer(src.read())]
    assert not found, found


def test_no_import_cycles_in_the_package():
    """Module-level imports inside pyshmlock/ go one way: aio
    imports the lock side, never the reverse (hooks invert the two calls
    that go back); imports under ``if TYPE_CHECKING:`` do not count."""
    import ast
    pkg_dir = os.path.join(ROOT, "pyshmlock")
    mods = {}
    for top, _dirs, files in os.walk(pkg_dir):
        for f in files:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(top, f), ROOT)[:-3].replace(os.sep, ".")
                mods[rel[:-9] if rel.endswith(".__init__") else rel] = os.path.join(top, f)
    edges = {m: set() for m in mods}
    for m, path in mods.items():
        with open(path) as src:
            tree = ast.parse(src.read())
        pkg = m if path.endswith("__init__.py") else m.rsplit(".", 1)[0]
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.level:
                base = pkg.split(".")[:len(pkg.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
                if node.module and target in mods:
                    edges[m].add(target)
                edges[m] |= {target + "." + a.name for a in node.names} & set(mods)
    cycles = []

    def walk(m, path):
        for n in edges[m]:
            if n in path:
                cycles.append(path[path.index(n):] + [n])
            else:
                walk(n, path + [n])

    for m in mods:
        walk(m, [m])
    assert not cycles, cycles[:3]


def test_the_name_to_path_rule_is_written_once():
    """A lock's name becomes its segment's path in one place, the C core's
    shl_segment_path (pyshmlock._args.segment_path asks it); a second
    spelling of the rule could drift from it."""
    import re
    # a path made in code: a C format, an f-string, a prefix literal, a join
    made = re.compile(r"""pyshmlock\.%s|/pyshmlock\.\{|["']/?pyshmlock\.["']|"""
                      r"""["']/dev/shm["'],\s*["']pyshmlock""")
    found = []
    for sub in ("pyshmlock", "csrc", "verify"):
        for top, _dirs, files in os.walk(os.path.join(ROOT, sub)):
            for f in files:
                if f.endswith((".py", ".c", ".h")):
                    path = os.path.join(top, f)
                    with open(path) as src:
                        for n, line in enumerate(src, 1):
                            if made.search(line):
                                found.append(f"{os.path.relpath(path, ROOT)}:{n}: {line.strip()}")
    # the definition itself, and nothing else
    assert len(found) == 1 and "core/segment.c" in found[0], found
