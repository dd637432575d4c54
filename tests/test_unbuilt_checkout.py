"""A source checkout whose C extensions were never built: `python -c
"import pyshmlock"` started in it imports the checkout's own package dir
(it shadows any installed pyshmlock), and must fail with an ImportError that
names the missing compiled module and says how to get it (install, or build
in place), not with Python's misleading "circular import"."""
import os
import shutil
import subprocess
import sys

import pytest

import pyshmlock._shmlock as core

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.timeout(120)


def _copy_package(dest, keep=()):
    """The package's sources under dest/pyshmlock, without the compiled
    extensions and the generated cffi module (``keep``: built files of the
    installed package to put back)."""
    src = os.path.dirname(core.__file__)
    shutil.copytree(src, dest / "pyshmlock",
                    ignore=shutil.ignore_patterns("*.so", "*.o", "_shmlock.c", "__pycache__"))
    for path in keep:
        shutil.copy(path, dest / "pyshmlock")
    return dest


def _import_there(cwd, path=()):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
    # -S: no site-packages (an editable install there would hand out the
    # compiled modules of another tree); ``path``: directories the child
    # needs all the same, put after the working directory
    if path:
        env["PYTHONPATH"] = os.pathsep.join(path)
    p = subprocess.run([sys.executable, "-S", "-c", "import pyshmlock"], cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1, (p.stdout, p.stderr)
    return p.stderr.strip().splitlines()[-1], p.stderr


def test_a_checkout_never_built_says_how_to_build_it(tmp_path):
    last, err = _import_there(_copy_package(tmp_path))
    assert last.startswith("ImportError"), err
    assert "pyshmlock._shmlock" in last and "not built" in last, err
    for how in ("pip install .", "pip install -e .", "python setup.py build_ext --inplace"):
        assert how in last, (how, err)
    assert "circular import" not in err


def test_a_half_built_checkout_names_the_module_it_lacks(tmp_path):
    """The cffi core is there, the fast-path extension is not."""
    import _cffi_backend  # what the cffi core needs, from site-packages
    last, err = _import_there(_copy_package(tmp_path, keep=[core.__file__]),
                              path=[os.path.dirname(_cffi_backend.__file__)])
    assert last.startswith("ImportError"), err
    assert "pyshmlock._fast" in last and "pyshmlock._shmlock" not in last, err
    assert "pip install -e ." in last and "build_ext --inplace" in last, err
    assert "circular import" not in err
