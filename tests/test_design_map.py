"""DESIGN.md's map states the order of the code, and the code keeps it: no
Python module imports one the map lists below it, every module of the
package (and of the lab beside it, `pyshmlock_lab`) is in the map, and the
C core's files call only within their tier of the map or below it."""
import ast
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("pyshmlock", "pyshmlock_lab")
CORE = os.path.join(ROOT, "csrc", "core")
# The package's face, above every row: it imports the public names.
FACE = {"pyshmlock", "pyshmlock.__main__", "pyshmlock_lab"}


def _section(title):
    with open(os.path.join(ROOT, "docs", "DESIGN.md")) as f:
        text = f.read()
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end]


def _table_rows(text, header):
    """The cells of each row of the markdown table whose header row starts
    `header` (cell 0 is the text before the first bar)."""
    lines = text.splitlines()
    i = next(n for n, ln in enumerate(lines) if ln.startswith(f"| {header}"))
    rows = []
    for ln in lines[i + 2:]:
        if not ln.startswith("|"):
            break
        rows.append(ln.split("|"))
    return rows


def python_rows(package="pyshmlock"):
    """The map's Python rows for `package`, top to bottom: each a set of
    dotted prefixes (`lock.py` is pyshmlock.lock; `cluster/` is
    pyshmlock.cluster and all below it; `_fast` is the extension module)."""
    rows = []
    for cells in _table_rows(_section("Map"), f"module (`{package}/`)"):
        cell = cells[1]
        names = set()
        for token in re.findall(r"`([^`]+)`", cell):
            if token.endswith(".h") or " " in token:
                continue
            token = token[:-3] if token.endswith(".py") else token.rstrip("/")
            names.add(f"{package}." + token.replace("/", "."))
        assert names, f"a map row names no module: {cell!r}"
        rows.append(names)
    return rows


def _module_name(path):
    rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
    return rel[: -len(".__init__")] if rel.endswith(".__init__") else rel


def _modules(package="pyshmlock"):
    for d, dirs, files in os.walk(os.path.join(ROOT, package)):
        dirs[:] = sorted(x for x in dirs if x != "__pycache__")
        for f in sorted(files):
            if f.endswith(".py"):
                yield os.path.join(d, f)


def _is_type_checking(node):
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test)


def imports_of(path):
    """Every pyshmlock module `path` imports, at the top or inside a
    function, except under `if TYPE_CHECKING:` (annotations only)."""
    module = _module_name(path)
    package = module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]
    with open(path) as f:
        tree = ast.parse(f.read())
    found = set()

    def visit(node):
        if _is_type_checking(node):
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] in PACKAGES)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] in PACKAGES:
                # `from . import x`: x may be a module, or a name of the package
                found.update(f"{target}.{a.name}" for a in node.names)
                found.add(target)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _row_of(name, rows):
    """The index of the row that owns module `name` (None: not a module the
    map places, such as a plain name imported from a package)."""
    best = None
    for i, row in enumerate(rows):
        for prefix in row:
            covers = name == prefix or name.startswith(prefix + ".")
            if covers and (best is None or len(prefix) > best[1]):
                best = (i, len(prefix))
    return None if best is None else best[0]


@pytest.mark.parametrize("package", PACKAGES)
def test_the_map_places_every_module_of_the_package(package):
    rows = python_rows(package)
    missing = [_module_name(p) for p in _modules(package)
               if _module_name(p) not in FACE and _row_of(_module_name(p), rows) is None]
    assert not missing, f"DESIGN.md's map does not place {missing}"


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_imports_one_the_map_lists_below_it(package):
    rows = python_rows(package)
    upward = []
    for path in _modules(package):
        me = _module_name(path)
        if me in FACE:
            continue
        mine = _row_of(me, rows)
        if mine is None:
            continue        # not placed: the test above names it
        for name in sorted(imports_of(path)):
            theirs = _row_of(name, rows)
            if theirs is not None and theirs > mine:
                upward.append(f"{me} imports {name}")
    assert not upward, "against DESIGN.md's map (a module imports one below it): " \
                       + "; ".join(upward)


def test_the_import_check_sees_imports_inside_functions(tmp_path):
    """The check reads lazy imports too (a function-level import is still a
    dependency), and ignores the annotation-only ones."""
    probe = tmp_path / "pyshmlock" / "probe.py"
    probe.parent.mkdir()
    probe.write_text("from typing import TYPE_CHECKING\n"
                     "from . import _fastpath\n"
                     "if TYPE_CHECKING:\n    from .lock import RWLock\n"
                     "def f():\n    from .errors import error_for\n")
    global ROOT
    saved, ROOT = ROOT, str(tmp_path)
    try:
        found = imports_of(str(probe))
    finally:
        ROOT = saved
    assert {"pyshmlock._fastpath", "pyshmlock.errors"} <= found
    assert "pyshmlock.lock" not in found


# ----------------------------------------------------------------- the C core

def _strip_c(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    return re.sub(r'"(\\.|[^"\\])*"', '""', text)


_DEFINITION = re.compile(r"^(?!static\b)[A-Za-z_][\w \*]*?\b([a-z_][a-z0-9_]*)\s*\([^;{]*\)\s*\{",
                         re.M)
_INLINE = re.compile(r"^static inline [\w \*]*?\b([a-z_][a-z0-9_]*)\s*\([^;{]*\)\s*\{", re.M)


def _body(text, start):
    depth, i = 0, text.index("{", start)
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return text[i:]


def c_calls():
    """{file: the other files of the core whose functions it calls}, calls
    through internal.h's inline functions included."""
    sources = {f[:-2] + ".c": _strip_c(open(os.path.join(CORE, f)).read())
               for f in sorted(os.listdir(CORE)) if f.endswith(".c")}
    owner = {}
    for name, text in sources.items():
        for m in _DEFINITION.finditer(text):
            owner.setdefault(m.group(1), name)
    header = _strip_c(open(os.path.join(CORE, "internal.h")).read())
    inline = {}
    for m in _INLINE.finditer(header):
        body = _body(header, m.start())
        inline[m.group(1)] = {owner[f] for f in owner if re.search(rf"\b{f}\s*\(", body)}
    calls = {}
    for name, text in sources.items():
        out = {owner[f] for f in owner if owner[f] != name and re.search(rf"\b{f}\s*\(", text)}
        for f, files in inline.items():
            if re.search(rf"\b{f}\s*\(", text):
                out |= files - {name}
        calls[name] = out
    return calls


def c_tiers():
    """The tiers DESIGN.md's map states for the C core, top to bottom."""
    tiers = []
    for cells in _table_rows(_section("Map"), "tier (`csrc/core/`)"):
        tiers.append(set(re.findall(r"`([a-z_]+\.c)`", cells[2])))
    return tiers


def test_the_map_places_every_file_of_the_c_core():
    placed = set().union(*c_tiers())
    assert placed == set(c_calls()), \
        f"DESIGN.md's C tiers: missing {set(c_calls()) - placed}, extra {placed - set(c_calls())}"


def test_c_files_call_only_within_their_tier_or_below():
    tiers = c_tiers()
    tier = {f: i for i, files in enumerate(tiers) for f in files}
    upward = [f"{f} calls {g}" for f, gs in sorted(c_calls().items()) for g in sorted(gs)
              if tier[g] < tier[f]]
    assert not upward, "against DESIGN.md's map (a C file calls a tier above it): " \
                       + "; ".join(upward)


def test_the_lowest_c_tier_calls_no_other_file_of_the_core():
    calls = c_calls()
    leaves = c_tiers()[-1]
    assert leaves and all(not calls[f] for f in leaves), \
        {f: sorted(calls[f]) for f in leaves}


@pytest.mark.parametrize("claim", [("slots.c", "session.c"), ("session.c", "slots.c"),
                                   ("lease.c", "gate.c"), ("watcher.c", "wait.c")])
def test_the_calls_the_map_names_are_real(claim):
    """The prose names these calls (slots.c and session.c call each other;
    the lease watchdog pauses through gate.c); the call finder sees them."""
    caller, callee = claim
    assert callee in c_calls()[caller]
