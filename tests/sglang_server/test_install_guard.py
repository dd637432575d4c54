"""install()'s guard and --check against the real SGLang modules of the
release under test.  They only import in the SGLang venv: one interpreter
there imports them once and runs each check in a forked child, so each
check starts from an unpatched SGLang.  And the one clear error when SGLang
is missing (this interpreter has none) or does not import (the venv
without the GPU-only stand-ins)."""

import importlib.util
import json
import subprocess
import sys

import pytest

from .conftest import HOOK
from .servers import INSIDE

pytestmark = pytest.mark.timeout(900)   # the first test may build the venv

CHECKS = ["untested_version_refused", "untested_version_allowed_by_env",
          "missing_method_fails_loudly", "install_is_idempotent_and_uninstalls",
          "launcher_points_workers_at_the_integrated_app",
          "listed_release_is_accepted_as_tested", "changed_body_is_refused_as_untested",
          "every_kind_of_target_missing_is_named", "check_command_reports_and_exits",
          "data_parallel_rule_is_the_releases_own"]
# The venv's SGLang carries contrib/sglang/'s patch (PYSHMLOCK_SGLANG_HOOK=1):
# a build of 0.5.23 that is not the release, which install() refuses.
if HOOK:
    CHECKS = ["branch_build_is_refused_naming_its_bodies"]


@pytest.fixture(scope="module")
def guard_results(sglang_venv):
    done = subprocess.run([str(sglang_venv / "bin" / "python"), str(INSIDE / "guard_checks.py"),
                           *CHECKS],
                          cwd=INSIDE, capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "PYTHONWARNINGS": "ignore",
                               "HOME": str(sglang_venv.parent)})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("check", CHECKS)
def test_install_guard(guard_results, check):
    assert guard_results[check] == "ok", guard_results[check]


def _run(python, code, **env):
    # A clean environment, started away from the checkout: from its root,
    # `python -c` would put the checkout first on sys.path, and a fresh
    # clone's pyshmlock/ has no compiled core (CI installs, it does not build
    # in place).
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True,
                          timeout=300, cwd="/",
                          env={"PATH": "/usr/bin:/bin", "PYTHONWARNINGS": "ignore",
                               "PYTHONSAFEPATH": "1", **env})


RAISES = ("from pyshmlock.integrations import sglang as s\n"
          "try:\n    s.install()\n"
          "except s.IncompatibleSGLangError as e:\n"
          "    print(type(e).__name__, type(e.__cause__).__name__, '|', e)\n")


def test_without_sglang_install_and_the_launcher_say_so_and_help_works():
    """This interpreter has no SGLang: install() raises
    IncompatibleSGLangError naming the supported versions (the
    PackageNotFoundError chained), the launcher exits with that one line,
    --help works, --check says it would refuse."""
    pytest.importorskip("pyshmlock")
    if importlib.util.find_spec("sglang") is not None:
        pytest.skip("this interpreter has SGLang installed")
    from pyshmlock.integrations import sglang as integration

    done = _run(sys.executable, RAISES)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("IncompatibleSGLangError PackageNotFoundError |"), done.stdout
    assert "not installed" in done.stdout
    assert all(v in done.stdout for v in integration.TESTED_VERSIONS), done.stdout
    launcher = [sys.executable, "-m", "pyshmlock.integrations.sglang"]
    helped = subprocess.run(launcher + ["--help"], capture_output=True, text=True, timeout=60)
    assert helped.returncode == 0 and "usage:" in helped.stdout and "--check" in helped.stdout
    assert not helped.stderr, helped.stderr
    launched = subprocess.run(launcher + ["--model-path", "x"], capture_output=True, text=True,
                              timeout=60)
    assert launched.returncode == 1 and "Traceback" not in launched.stderr, launched.stderr
    assert "SGLang is not installed" in launched.stderr, launched.stderr
    checked = subprocess.run(launcher + ["--check"], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 1 and "would refuse" in checked.stdout, checked.stdout


def test_sglang_that_does_not_import_gives_one_clear_error(sglang_venv):
    """SGLang installed but its tokenizer side failing to import (here: no
    triton, as on a CPU box without the harness's stand-ins): install()
    raises IncompatibleSGLangError with the import error chained."""
    done = _run(sglang_venv / "bin" / "python", RAISES, HOME=str(sglang_venv.parent))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("IncompatibleSGLangError "), done.stdout
    cause = done.stdout.split()[1]
    assert cause in ("ModuleNotFoundError", "ImportError"), done.stdout
    assert "does not import" in done.stdout and "supported: SGLang" in done.stdout, done.stdout


def test_check_refuses_a_release_it_was_not_tested_with_naming_what_differs():
    """--check against SGLang 0.5.20 (its own venv; the releases before
    0.5.21 lack begin/end_weight_update): it exits 1, and its last line
    says install() would refuse it, naming the missing targets and the
    supported versions."""
    from . import sglang_venv as venv_module

    if HOOK:
        pytest.skip("run once, with the releases' venvs")
    venv = venv_module.ensure(venv_module.UNSUPPORTED)
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-c",
         "import boot, sys; sys.argv[1:] = ['--check']; "
         "from pyshmlock.integrations import sglang; sglang.main()"],
        cwd=INSIDE, capture_output=True, text=True, timeout=300,
        env={"PATH": "/usr/bin:/bin", "PYTHONWARNINGS": "ignore", "PYTHONPATH": str(INSIDE),
             "HOME": str(venv.parent)})
    print(done.stdout)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    verdict = done.stdout.strip().splitlines()[-1]
    assert verdict.startswith(f"install() would refuse it: SGLang {venv_module.UNSUPPORTED} "
                              "lacks what the integration relies on"), verdict
    for missing in ("TokenizerControlMixin.begin_weight_update",
                    "TokenizerControlMixin.end_weight_update"):
        assert missing in verdict, (missing, verdict)
    assert "supported: SGLang 0.5.21, 0.5.22, 0.5.23" in verdict, verdict
