"""The installed product package, `pyshmlock`, is the lock: the demo server,
the benchmark harness and the cluster test scaffolding live beside it in
`pyshmlock_lab`, and the product reaches them only lazily, from inside the
command's `demo`, `bench` and `cluster-demo` subcommands.

Checked three ways: no showroom module file is under the installed
package; no module of the package imports `pyshmlock_lab` except inside a
function of the command-line modules; and importing the product's public
modules in a fresh interpreter loads nothing of the lab."""
import ast
import os
import re
import subprocess
import sys

import pytest

import pyshmlock

PACKAGE = os.path.dirname(os.path.abspath(pyshmlock.__file__))
LAB = "pyshmlock_lab"
# Where the product may dispatch to the lab: inside a function (a subcommand
# that runs it), never at module level.
LAZY_DISPATCHERS = {"cli.py", os.path.join("cluster", "cli.py")}
# What a showroom module is called: the demo, the bench harness and its
# measurement floors, the local etcd, the simulated hosts and fan-out.
SHOWROOM = re.compile(r"demo|harness|bench|floor|localetcd|simhost|fanout")

pytestmark = pytest.mark.timeout(60)


def _module_files():
    for d, dirs, files in os.walk(PACKAGE):
        dirs[:] = sorted(x for x in dirs if x != "__pycache__")
        for f in sorted(files):
            if f.endswith((".py", ".pyi")):
                yield os.path.relpath(os.path.join(d, f), PACKAGE)


def test_no_showroom_module_is_in_the_installed_package():
    found = [rel for rel in _module_files() if SHOWROOM.search(rel)]
    assert not found, (f"{PACKAGE} holds demo/bench/test-scaffolding modules {found}: "
                       f"they belong in {LAB}/")


def _lab_imports(tree):
    """(node, inside_a_function) for every import of pyshmlock_lab, by
    statement or by importlib/__import__ with a literal name."""
    found = []

    def named(node):
        if isinstance(node, ast.Import):
            return any(a.name.split(".")[0] == LAB for a in node.names)
        if isinstance(node, ast.ImportFrom):
            return node.level == 0 and (node.module or "").split(".")[0] == LAB
        if isinstance(node, ast.Call) and node.args:
            arg = node.args[0]
            return (isinstance(arg, ast.Constant) and isinstance(arg.value, str)
                    and arg.value.split(".")[0] == LAB)
        return False

    def visit(node, in_function):
        if named(node):
            found.append((node, in_function))
        inside = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                  ast.Lambda))
        for child in ast.iter_child_nodes(node):
            visit(child, inside)

    visit(tree, False)
    return found


def test_the_product_imports_the_lab_only_inside_its_subcommands():
    wrong = []
    for rel in _module_files():
        if not rel.endswith(".py"):
            continue
        with open(os.path.join(PACKAGE, rel)) as f:
            tree = ast.parse(f.read(), rel)
        for node, in_function in _lab_imports(tree):
            if rel not in LAZY_DISPATCHERS or not in_function:
                wrong.append(f"pyshmlock/{rel}:{node.lineno}")
    assert not wrong, f"imports of {LAB} outside a subcommand's function: {wrong}"


def test_the_lazy_import_check_sees_each_form():
    tree = ast.parse(f"import {LAB}.demo\n"
                     f"def f():\n    from {LAB}.bench import main\n"
                     f"importlib.import_module('{LAB}.cluster')\n"
                     "from .lock import RWLock\n")
    assert [f for _, f in _lab_imports(tree)] == [False, True, False]


def test_importing_the_product_loads_nothing_of_the_lab():
    probe = ("import sys\n"
             "import pyshmlock, pyshmlock.aio, pyshmlock.cluster, pyshmlock.cli\n"
             "pyshmlock.cli.build_parser()\n"
             "print('\\n'.join(sorted(sys.modules)))\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=50, check=True).stdout.split()
    assert "pyshmlock.cli" in out, out            # the probe did import the product
    lab = [m for m in out if m.split(".")[0] == LAB]
    showroom = [m for m in out if m.startswith("pyshmlock.") and SHOWROOM.search(m)]
    assert not lab and not showroom, f"loaded with the product: {lab + showroom}"
