"""The SPIN model of the protocol (verify/shmlock.pml): it mirrors the C
code step for step, the small configurations verify, and every injected
protocol bug is caught.  The large configurations run with `make verify`."""
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKER = re.compile(r"\[model:([A-Z_]+)\]")


def markers(*paths):
    found = set()
    for path in paths:
        with open(os.path.join(ROOT, path)) as f:
            found |= set(MARKER.findall(f.read()))
    return found


CORE_FILES = sorted(os.path.join("csrc", "core", f)
                    for f in os.listdir(os.path.join(ROOT, "csrc", "core")))


def test_model_and_c_name_the_same_steps():
    in_model, in_c = markers("verify/shmlock.pml"), markers(*CORE_FILES)
    assert in_model == in_c, (f"only in the model: {sorted(in_model - in_c)}; "
                              f"only in the C code: {sorted(in_c - in_model)}")
    assert len(in_model) >= 20


@pytest.mark.timeout(400)
@pytest.mark.skipif(shutil.which("spin") is None,
                    reason="spin is not installed (apt-get install spin); .ci/run installs it")
def test_model_checks_and_catches_every_quick_mutant():
    p = subprocess.run([sys.executable, os.path.join(ROOT, "verify", "run.py"), "--quick"],
                       capture_output=True, text=True, timeout=380)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "FAILS" not in p.stdout and "MISSED" not in p.stdout
    sys.path.insert(0, os.path.join(ROOT, "verify"))
    try:
        import run
    finally:
        sys.path.pop(0)
    configs = [c for c in run.CONFIGS if c.quick]
    mutants = [m for m in run.MUTANTS.values() if m.quick and m.caught]
    assert p.stdout.count("HOLDS") == len(configs) >= 11, p.stdout
    assert p.stdout.count("CAUGHT") == len(mutants) >= 22, p.stdout


def test_every_mutant_of_the_model_is_run_by_make_verify():
    """A mutant written into the model but missing from verify/run.py's
    MUTANTS is never run, so it tests nothing."""
    with open(os.path.join(ROOT, "verify", "shmlock.pml")) as f:
        in_model = set(re.findall(r"\bMUTANT_([A-Z_]+)", f.read()))
    sys.path.insert(0, os.path.join(ROOT, "verify"))
    try:
        import run
    finally:
        sys.path.pop(0)
    assert in_model == set(run.MUTANTS), (
        f"in the model only: {sorted(in_model - set(run.MUTANTS))}; "
        f"in run.py only: {sorted(set(run.MUTANTS) - in_model)}")
