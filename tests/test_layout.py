"""The tree is the map: each C file of the core states its one concern in a
head comment, the README's layout table and DESIGN.md's map name every file
of the core, and no source file grows past the size guide without saying
why in its head comment."""
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORE = os.path.join(ROOT, "csrc", "core")
CORE_FILES = sorted(f for f in os.listdir(CORE) if f.endswith((".c", ".h")))
FAST_FILES = sorted(f for f in os.listdir(os.path.join(ROOT, "csrc", "fastpath"))
                    if f.endswith((".c", ".h")))
C_FILES = [("core", f) for f in CORE_FILES] + [("fastpath", f) for f in FAST_FILES]
SIZE_GUIDE = 650      # lines: "about 600", with room for a head comment


def _read(*parts):
    with open(os.path.join(ROOT, *parts)) as f:
        return f.read()


def test_the_c_sources_have_their_files():
    assert {"fastpath.h", "calls.c", "lock.c", "hold.c", "module.c"} <= set(FAST_FILES)
    assert {"internal.h", "protocol.c", "wait.c", "slots.c", "process.c", "segment.c",
            "lease.c", "info.c", "watcher.c", "stale.c"} <= set(CORE_FILES)


@pytest.mark.parametrize("folder,name", C_FILES)
def test_c_file_states_its_concern_first(folder, name):
    text = _read("csrc", folder, name)
    head = re.match(r"/\*\n \* (\S+) - (.+)", text)
    assert head, f"{name} must open with '/*' and ' * {name} - <its concern>'"
    assert head.group(1) == name


@pytest.mark.parametrize("folder,name", C_FILES)
def test_c_file_is_named_in_readme_and_design(folder, name):
    assert f"`{name}`" in _read("docs", "layout.md"), f"the site's layout page misses {name}"
    assert f"`{folder}/{name}`" in _read("docs", "DESIGN.md"), f"DESIGN.md's map misses {name}"


def _sources():
    for top in ("csrc", "pyshmlock", "pyshmlock_lab"):
        for d, dirs, files in os.walk(os.path.join(ROOT, top)):
            dirs[:] = [x for x in dirs if x not in ("__pycache__", "demo")]
            for f in files:
                if f.endswith((".c", ".h", ".py")) and f != "_shmlock.c":
                    yield os.path.relpath(os.path.join(d, f), ROOT)


@pytest.mark.parametrize("path", sorted(_sources()))
def test_no_source_file_is_long_without_a_reason(path):
    text = _read(path)
    n = text.count("\n")
    if n > SIZE_GUIDE:
        head = text[:3000]
        assert "Longer than" in head, (
            f"{path} has {n} lines; split it by concern, or justify the size in its head "
            "comment (a sentence starting 'Longer than')")


def test_glibc_private_fields_are_named_in_one_file():
    """Only slots.c names glibc's private mutex fields, under static asserts."""
    users = [f for f in CORE_FILES if "__data." in _read("csrc", "core", f)]
    assert users == ["slots.c"], users
    assert "_Static_assert(offsetof(pthread_mutex_t, __data.__lock)" in _read("csrc", "core",
                                                                               "slots.c")
