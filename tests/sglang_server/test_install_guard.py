"""install()'s guard against the real SGLang modules.  They only import in
the SGLang venv: one interpreter there imports them once and runs each
check in a forked child, so each check starts from an unpatched SGLang."""

import json
import subprocess

import pytest

from .servers import INSIDE

pytestmark = pytest.mark.timeout(900)   # the first test may build the venv

CHECKS = ["untested_version_refused", "untested_version_allowed_by_env",
          "missing_method_fails_loudly", "install_is_idempotent_and_uninstalls",
          "launcher_points_workers_at_the_integrated_app"]


@pytest.fixture(scope="module")
def guard_results(sglang_venv):
    done = subprocess.run([str(sglang_venv / "bin" / "python"), str(INSIDE / "guard_checks.py")],
                          cwd=INSIDE, capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "PYTHONWARNINGS": "ignore",
                               "HOME": str(sglang_venv.parent)})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("check", CHECKS)
def test_install_guard(guard_results, check):
    assert guard_results[check] == "ok", guard_results[check]
