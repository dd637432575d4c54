"""The memory orders of the C sources cannot drift (verify/ordering_lint.py):
every atomic that mirrors a step of the model is seq_cst, every atomic says
its order, and every weaker order says why.  The lint passes on the sources
and fails on a scratch copy with a seq_cst weakened, an order left implicit,
or a relaxed atomic added without a reason."""
import importlib.util
import os
import shutil

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CSRC = os.environ.get("PYSHMLOCK_CSRC", os.path.join(ROOT, "csrc"))
LINT = os.path.join(os.path.dirname(CSRC), "verify", "ordering_lint.py")

pytestmark = pytest.mark.skipif(not os.path.exists(LINT), reason="no checkout beside the tests")


def _lint():
    spec = importlib.util.spec_from_file_location("ordering_lint", LINT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _scratch(tmp_path):
    copy = tmp_path / "csrc"
    shutil.copytree(CSRC, copy)
    return copy


def _edit(path, old, new):
    text = path.read_text()
    assert text.count(old) == 1, old
    path.write_text(text.replace(old, new))


def test_the_sources_pass():
    assert _lint().lint(CSRC) == []


def test_a_weakened_model_step_is_caught(tmp_path):
    copy = _scratch(tmp_path)
    _edit(copy / "core" / "protocol.c",
          "uint32_t s = atomic_load_explicit(&h->hdr->state, memory_order_seq_cst); "
          "/* [model:READ_LOOK] */",
          "uint32_t s = atomic_load_explicit(&h->hdr->state, memory_order_acquire); "
          "/* [model:READ_LOOK] */")
    found = _lint().lint(str(copy))
    assert [f.what for f in found] == [
        "atomic_load_explicit mirrors model step(s) READ_LOOK but is acquire, not seq_cst"]


def test_an_implicit_order_is_caught(tmp_path):
    copy = _scratch(tmp_path)
    _edit(copy / "core" / "stale.c",
          "uint32_t s = atomic_load_explicit(&hd->state, memory_order_seq_cst);",
          "uint32_t s = atomic_load(&hd->state);")
    found = _lint().lint(str(copy))
    assert len(found) == 1 and "implicit order" in found[0].what


def test_a_relaxed_atomic_without_a_reason_is_caught(tmp_path):
    copy = _scratch(tmp_path)
    _edit(copy / "core" / "stale.c",
          "        if (!(s & ST_PAUSED))\n            return 0;",
          "        if (!(s & ST_PAUSED))\n            return 0;\n"
          "        (void)atomic_load_explicit(&hd->drain_seq, memory_order_relaxed);")
    found = _lint().lint(str(copy))
    assert len(found) == 1 and "no comment saying why" in found[0].what
