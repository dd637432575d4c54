"""The integration's install guard and its --check, against the real SGLang
modules of the release under test (usage: guard_checks.py; prints one JSON
line: each check's "ok" or its traceback)."""

import sys
from typing import Any

import boot  # noqa: F401


def untested_version_refused() -> None:
    from pyshmlock.integrations import sglang as integration

    integration.sglang_version = lambda: "0.9.99"  # type: ignore[assignment]
    try:
        integration.install()
    except integration.UntestedSGLangError as e:
        message = str(e)
        assert all(v in message for v in integration.TESTED_VERSIONS), message
        assert "0.9.99" in message, message
        assert "allow_untested=True" in message and "PYSHMLOCK_SGLANG_UNTESTED=1" in message
    else:
        raise AssertionError("an untested SGLang version was accepted")
    assert not integration.installed()
    assert integration.install(allow_untested=True) is True
    assert integration.installed()


def untested_version_allowed_by_env() -> None:
    import os

    from pyshmlock.integrations import sglang as integration

    integration.sglang_version = lambda: "0.9.99"  # type: ignore[assignment]
    os.environ["PYSHMLOCK_SGLANG_UNTESTED"] = "1"
    assert integration.install() is True


def missing_method_fails_loudly() -> None:
    from sglang.srt.managers.tokenizer_control_mixin import TokenizerControlMixin
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

    from pyshmlock.integrations import sglang as integration

    before = dict(vars(TokenizerManager))
    del TokenizerControlMixin.update_weights_from_ipc
    try:
        integration.install()
    except integration.IncompatibleSGLangError as e:
        assert "TokenizerControlMixin.update_weights_from_ipc" in str(e), str(e)
        assert "nothing was patched" in str(e)
    else:
        raise AssertionError("install() patched an SGLang without update_weights_from_ipc")
    assert dict(vars(TokenizerManager)) == before, "a partial patch was left"
    assert not integration.installed()


def install_is_idempotent_and_uninstalls() -> None:
    from sglang.srt.managers.multi_tokenizer_mixin import TokenizerWorker
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

    from pyshmlock.integrations import sglang as integration

    originals = {a: vars(TokenizerManager)[a] for a in ("init_weight_update", "is_pause",
                                                        "pause_generation")}
    worker_pause = vars(TokenizerWorker)["pause_generation"]
    assert "model_path" not in vars(TokenizerManager)
    assert integration.install() is True
    patched = vars(TokenizerManager)["pause_generation"]
    assert patched is not originals["pause_generation"]
    assert isinstance(vars(TokenizerManager)["model_path"], property)
    assert integration.install() is False
    assert vars(TokenizerManager)["pause_generation"] is patched, "a second install re-wrapped"
    assert integration.uninstall() is True
    assert {a: vars(TokenizerManager)[a] for a in originals} == originals
    assert vars(TokenizerWorker)["pause_generation"] is worker_pause
    assert "model_path" not in vars(TokenizerManager), "an added attribute was left"
    assert integration.uninstall() is False


def launcher_points_workers_at_the_integrated_app() -> None:
    """0.5.23: through SGLANG_HTTP_SERVER_APP_PATH; before it, the app name
    SGLang hard-codes in its uvicorn.run call is handed over instead."""
    import os
    import runpy

    import uvicorn

    from pyshmlock.integrations import sglang as integration

    has_setting = integration.check().launcher_setting
    assert has_setting == (integration.sglang_version() >= "0.5.23"), has_setting
    ran = {}
    served = {}
    # What uvicorn would be asked to serve (recorded, not served: SGLang's
    # http_server does not import without a GPU).
    uvicorn.run = lambda app, **kw: served.update(app=app, workers=kw.get("workers"))

    def launch_server(name, **kw):
        ran.update(name=name, argv=list(sys.argv))
        # What SGLang 0.5.21/0.5.22's _setup_and_run_http_server does with
        # --tokenizer-worker-num 4 (0.5.23 reads the setting instead).
        uvicorn.run("sglang.srt.entrypoints.http_server:app", workers=4)
    runpy.run_module = launch_server
    os.environ.pop("SGLANG_HTTP_SERVER_APP_PATH", None)
    integration.main(["--model-path", "/nowhere", "--tokenizer-worker-num", "4"])
    assert os.environ["SGLANG_HTTP_SERVER_APP_PATH"] == integration.INTEGRATED_APP_PATH
    assert os.environ["PYSHMLOCK_SGLANG_APP_PATH"] == integration.DEFAULT_APP_PATH
    assert ran["name"] == "sglang.launch_server", ran
    assert ran["argv"][1:] == ["--model-path", "/nowhere", "--tokenizer-worker-num", "4"]
    assert integration.installed()
    if has_setting:
        from sglang.srt.environ import envs

        assert envs.SGLANG_HTTP_SERVER_APP_PATH.get() == integration.INTEGRATED_APP_PATH
        assert served["app"] == "sglang.srt.entrypoints.http_server:app"  # not rewritten
    else:
        assert served == {"app": integration.INTEGRATED_APP_PATH, "workers": 4}, served


def listed_release_is_accepted_as_tested() -> None:
    """The release under test is listed, every target is there, and its
    replaced bodies are the ones recorded for it."""
    from pyshmlock.integrations import sglang as integration

    found = integration.check()
    assert found.version in integration.TESTED_VERSIONS, found.report()
    assert not found.missing and not found.differing, found.report()
    assert found.tested and found.accepted, found.report()
    assert integration.install() is True


def changed_body_is_refused_as_untested() -> None:
    """A build of a listed release whose replaced method differs (a branch
    build, a backported fix) is refused, naming the method."""
    from sglang.srt.managers.tokenizer_control_mixin import TokenizerControlMixin

    from pyshmlock.integrations import sglang as integration

    async def update_weights_from_ipc(self, obj, request=None):  # an upstream fix
        return await self.update_weights_from_ipc_communicator(obj)
    TokenizerControlMixin.update_weights_from_ipc = update_weights_from_ipc
    try:
        integration.install()
    except integration.UntestedSGLangError as e:
        assert "not the tested release" in str(e), str(e)
        assert "TokenizerControlMixin.update_weights_from_ipc" in str(e), str(e)
    else:
        raise AssertionError("a changed replaced body was accepted")
    assert not integration.installed()
    assert integration.install(allow_untested=True) is True


def every_kind_of_target_missing_is_named() -> None:
    """One target of each kind taken away: check() names each one as
    missing and install() refuses, naming them, patching nothing."""
    import re

    import sglang.srt.managers.io_struct as io
    import sglang.srt.managers.tokenizer_control_mixin as control
    import sglang.srt.utils as utils
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

    from pyshmlock.integrations import _sglang_targets as targets
    from pyshmlock.integrations import sglang as integration

    source = targets._module_source(targets.HTTP)
    targets._sources[targets.HTTP], n = re.subn(
        r"update_weights_from_ipc\(\s*obj, request\s*\)", "update_weights_from_ipc(obj)",
        source)
    assert n == 1, n
    control._COMMUNICATOR_SPECS[:] = [s for s in control._COMMUNICATOR_SPECS
                                      if s[0] != "update_weights_from_tensor"]
    del utils.normalize_serialized_named_tensor_payloads
    io.UpdateWeightsFromIPCReqInput = type("Moved", (), {"__struct_fields__": ("flush_cache",)})

    def init_tokenizer_and_processor(self):      # no mm_processor any more
        self.tokenizer = None
    TokenizerManager.init_tokenizer_and_processor = init_tokenizer_and_processor
    TokenizerManager.is_pause = property(lambda self: False)
    del TokenizerManager.abort_request
    expected = [
        "http_server: update_weights_from_ipc(obj, request)",
        "_COMMUNICATOR_SPECS: update_weights_from_tensor_communicator",
        "sglang.srt.utils.normalize_serialized_named_tensor_payloads",
        "UpdateWeightsFromIPCReqInput.weight_version (request field)",
        "init_tokenizer_and_processor sets self.mm_processor",
        "TokenizerManager.is_pause (settable property)",
        "TokenizerManager.abort_request",
    ]
    found = integration.check()
    missing = {str(f.target) for f in found.missing}
    for name in expected:
        assert any(m.endswith(name) for m in missing), (name, sorted(missing))
    assert len(found.missing) == len(expected), sorted(missing)
    before = dict(vars(TokenizerManager))
    try:
        integration.install(allow_untested=True)
    except integration.IncompatibleSGLangError as e:
        for name in expected:
            assert name in str(e), (name, str(e))
        assert "nothing was patched" in str(e) and "supported: SGLang" in str(e)
    else:
        raise AssertionError("install() patched an SGLang that lacks what it relies on")
    assert dict(vars(TokenizerManager)) == before and not integration.installed()


def check_command_reports_and_exits() -> None:
    """python -m pyshmlock.integrations.sglang --check: every target, and
    the verdict, exit 0 for the release under test."""
    import contextlib
    import io

    from pyshmlock.integrations import _sglang_targets as targets
    from pyshmlock.integrations import sglang as integration

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            integration.main(["--check"])
        except SystemExit as e:
            code = e.code
    text = out.getvalue()
    assert code == 0, text
    assert text.splitlines()[-1] == "install() would accept it", text
    for t in targets.TARGETS:
        assert str(t) in text, (str(t), text)
    assert not integration.installed()


def data_parallel_rule_is_the_releases_own() -> None:
    """With data-parallel attention (dp_size 2): the integration's update
    paths allow it exactly where SGLang's own do (0.5.21), and refuse it
    where SGLang's own assert refuses (0.5.22 on)."""
    import asyncio
    import types

    import sglang.srt.managers.tokenizer_control_mixin as control
    import sglang.srt.runtime_context as runtime_context

    from pyshmlock.integrations import _sglang_patches
    from pyshmlock.integrations import sglang as integration

    def parallel() -> Any:
        return types.SimpleNamespace(dp_size=2, enable_dp_attention=True)
    runtime_context.get_parallel = control.get_parallel = parallel
    fake = types.SimpleNamespace(auto_create_handle_loop=lambda: None)
    integration.install()
    for method in ("update_weights_from_distributed", "update_weights_from_tensor"):
        own = integration._original(control.__name__, "TokenizerControlMixin", method)
        try:        # obj=None: past SGLang's assert, the next line fails on it
            asyncio.run(own(fake, None))
        except AssertionError:
            sglang_allows = False
        except AttributeError:
            sglang_allows = True
        try:
            _sglang_patches._check_dp(method, method)
            allows = True
        except AssertionError:
            allows = False
        assert allows == sglang_allows, (method, allows, sglang_allows)
        expected = integration.sglang_version() == "0.5.21"
        assert sglang_allows == expected, (method, integration.sglang_version())


def branch_build_is_refused_naming_its_bodies() -> None:
    """An SGLang 0.5.23 build that is not the release (here: with
    contrib/sglang/'s patch applied, as a branch build would carry changes):
    --check says install() would refuse it, naming each replaced method
    whose body differs, and exits 1."""
    import contextlib
    import io

    from pyshmlock.integrations import sglang as integration

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            integration.main(["--check"])
        except SystemExit as e:
            code = e.code
    text = out.getvalue()
    assert code == 1, text
    verdict = text.splitlines()[-1]
    assert verdict.startswith("install() would refuse it: this SGLang 0.5.23 build is not "
                              "the tested release"), verdict
    for body in ("TokenizerWorker.pause_generation", "TokenizerWorker.continue_generation",
                 "TokenizerControlMixin.update_weights_from_ipc",
                 "TokenizerManager.update_weights_from_disk"):
        assert body in verdict, (body, verdict)


CHECKS = ("untested_version_refused", "untested_version_allowed_by_env",
          "missing_method_fails_loudly", "install_is_idempotent_and_uninstalls",
          "launcher_points_workers_at_the_integrated_app",
          "listed_release_is_accepted_as_tested", "changed_body_is_refused_as_untested",
          "every_kind_of_target_missing_is_named", "check_command_reports_and_exits",
          "branch_build_is_refused_naming_its_bodies", "data_parallel_rule_is_the_releases_own")


def run_all() -> None:
    """Import SGLang once, then run each check in a forked child (each
    starts unpatched) and print one JSON line of results."""
    import json
    import os
    import traceback

    import sglang.srt.managers.multi_tokenizer_mixin  # noqa: F401

    results = {}
    for check in sys.argv[1:] or CHECKS:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            try:
                globals()[check]()
                out = "ok"
            except BaseException:
                out = traceback.format_exc()
            os.write(write, out.encode())
            os._exit(0)
        os.close(write)
        with os.fdopen(read) as f:
            results[check] = f.read()
        os.waitpid(pid, 0)
    print(json.dumps(results))


if __name__ == "__main__":
    run_all()
