"""The integration's install guard, against the real SGLang 0.5.23 modules
(usage: guard_checks.py CHECK; exits 0 when the check holds, prints why not)."""

import sys

import boot  # noqa: F401


def untested_version_refused() -> None:
    from pyshmlock.integrations import sglang as integration

    integration.sglang_version = lambda: "0.9.99"  # type: ignore[assignment]
    try:
        integration.install()
    except integration.UntestedSGLangError as e:
        message = str(e)
        assert "0.5.23" in message and "0.9.99" in message, message
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
    assert integration.install() is True
    patched = vars(TokenizerManager)["pause_generation"]
    assert patched is not originals["pause_generation"]
    assert integration.install() is False
    assert vars(TokenizerManager)["pause_generation"] is patched, "a second install re-wrapped"
    assert integration.uninstall() is True
    assert {a: vars(TokenizerManager)[a] for a in originals} == originals
    assert vars(TokenizerWorker)["pause_generation"] is worker_pause
    assert integration.uninstall() is False


def launcher_points_workers_at_the_integrated_app() -> None:
    import os
    import runpy

    from pyshmlock.integrations import sglang as integration

    ran = {}
    runpy.run_module = lambda name, **kw: ran.update(name=name, argv=list(sys.argv))
    os.environ.pop("SGLANG_HTTP_SERVER_APP_PATH", None)
    integration.main(["--model-path", "/nowhere", "--tokenizer-worker-num", "4"])
    assert os.environ["SGLANG_HTTP_SERVER_APP_PATH"] == integration.INTEGRATED_APP_PATH
    assert os.environ["PYSHMLOCK_SGLANG_APP_PATH"] == integration.DEFAULT_APP_PATH
    assert ran["name"] == "sglang.launch_server", ran
    assert ran["argv"][1:] == ["--model-path", "/nowhere", "--tokenizer-worker-num", "4"]
    assert integration.installed()
    from sglang.srt.environ import envs

    assert envs.SGLANG_HTTP_SERVER_APP_PATH.get() == integration.INTEGRATED_APP_PATH


CHECKS = ("untested_version_refused", "untested_version_allowed_by_env",
          "missing_method_fails_loudly", "install_is_idempotent_and_uninstalls",
          "launcher_points_workers_at_the_integrated_app")


def run_all() -> None:
    """Import SGLang once, then run each check in a forked child (each
    starts unpatched) and print one JSON line of results."""
    import json
    import os
    import traceback

    import sglang.srt.managers.multi_tokenizer_mixin  # noqa: F401

    results = {}
    for check in CHECKS:
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
