"""One shared lock per SGLang server: every tokenizer process uses it.

``install()`` patches SGLang's tokenizer side in the calling process:

* ``TokenizerManager.init_weight_update`` gives each manager the server's
  shared :class:`SharedModelUpdateLock` as ``model_update_lock`` and an
  ``is_pause_cond`` that waits at the shared gate, so request admission
  (``async with self.model_update_lock.reader_lock``) stops in every worker
  the moment any worker pauses;
* ``is_pause`` (read by ``/ready``, the health paths and the gRPC bridge)
  reports the shared gate, so a worker started while paused says so;
* ``pause_generation`` pauses the shared gate before anything else, then
  sends SGLang's pause (router broadcast, scheduler message); in abort mode
  it aborts and waits with ``wait_drained()`` until no request of any
  worker is left, returning the moment the last one ends;
* ``continue_generation`` first waits while an update or an update session
  holds the pause (``await lock.resume()``), then sends SGLang's continue;
* a multi-tokenizer worker waits for the router's broadcast of each of its
  pause and continue calls in a queue of its own, so a pause and a
  continue that land together both return (SGLang #33696);
* every weight-update path runs under ``update_lock``: unpaused it drains the
  requests of every worker, paused it skips the frozen ones and pins the
  pause; an update that carries the fleet's update token (header
  ``X-Pyshmlock-Fence``, from a ``pyshmlock.cluster`` controller) runs under
  ``fenced_update(token)`` and is refused at this host if a newer update is
  known here; ``begin_weight_update`` opens an update session on the lock and
  ``end_weight_update`` closes it, so a continue in between waits;
* the weights a server serves (``weight_version``, ``model_path``,
  ``served_model_name``, ``load_format``) are one shared record, so every
  worker reports the last update's (SGLang #39520);
* the last worker of a server to stop cleanly removes the lock's segment
  and that record.

SGLang's own communicators and bookkeeping are called unchanged; only the
choice of lock differs.  ``python -m pyshmlock.integrations.sglang ARGS``
runs ``sglang.launch_server ARGS`` with the integration in every tokenizer
process; ``--check`` says whether the installed SGLang would be accepted.
contrib/sglang/ holds the upstream change that makes this patching
unnecessary (a pluggable lock in SGLang itself).
"""

import importlib
import logging
import os
import re
import sys
from typing import Any, Dict, List, Optional, Tuple

from . import _sglang_targets as targets
from ._sglang_patches import (
    ADDED,
    SharedGateCondition,
    SharedModelUpdateGate,
    SharedModelUpdateLock,
    _replacements,
    _served,
)
from ._sglang_targets import MULTI as _MULTI

__all__ = [
    "ABORT_RESEND_SECONDS",
    "DEFAULT_APP_PATH",
    "ENV_APP_PATH",
    "ENV_LOCK_NAME",
    "ENV_SESSION_TTL",
    "ENV_UNTESTED",
    "INTEGRATED_APP_PATH",
    "PATCHED",
    "SGLANG_APP_PATH",
    "TESTED_VERSIONS",
    "USED",
    "Check",
    "IncompatibleSGLangError",
    "SharedGateCondition",
    "SharedModelUpdateGate",
    "SharedModelUpdateLock",
    "UntestedSGLangError",
    "check",
    "check_version",
    "install",
    "installed",
    "lock_name",
    "main",
    "sglang_version",
    "uninstall",
]

logger = logging.getLogger(__name__)

#: SGLang releases this integration was tested with (tests/sglang_server/,
#: run against each by .ci/run).
TESTED_VERSIONS: Tuple[str, ...] = ("0.5.21", "0.5.22", "0.5.23")
#: (module, class, attribute) of everything install() replaces; each must be
#: defined by that class itself.
PATCHED: Tuple[Tuple[str, str, str], ...] = targets.PATCHED
#: The methods the replacements call on a manager (checked like PATCHED;
#: ``--check`` lists every other target too).
USED: Tuple[Tuple[str, str, str], ...] = tuple(
    (t.module, t.owner, t.name) for t in targets.TARGETS
    if t.kind == "method" and (t.module, t.owner, t.name) not in targets.PATCHED)
#: Set to 1 to install on a release not in TESTED_VERSIONS.
ENV_UNTESTED = "PYSHMLOCK_SGLANG_UNTESTED"
#: The lock's name; default ``sglang-<port>`` (unique per server on a host).
ENV_LOCK_NAME = "PYSHMLOCK_SGLANG_LOCK"
#: The launcher's record of the app SGLang's workers would have imported.
ENV_APP_PATH = "PYSHMLOCK_SGLANG_APP_PATH"
#: An update session's ttl in seconds (default: the lock's, 600 s): a
#: session whose end_weight_update never comes expires after it.
ENV_SESSION_TTL = "PYSHMLOCK_SGLANG_SESSION_TTL"
#: SGLang's own setting (0.5.23 on): the app each multi-tokenizer worker imports.
SGLANG_APP_PATH = "SGLANG_HTTP_SERVER_APP_PATH"
#: The app SGLang's workers import when that setting is not given (and
#: always, before 0.5.23).
DEFAULT_APP_PATH = "sglang.srt.entrypoints.http_server:app"
#: The app the launcher points the workers at: install(), then the app above.
INTEGRATED_APP_PATH = "pyshmlock.integrations.sglang_app:app"
#: An abort-mode pause sends its abort again this often while requests
#: remain (one admitted while the first abort travelled); it returns as
#: soon as none remains, whatever this is.
ABORT_RESEND_SECONDS = 1.0


class IncompatibleSGLangError(RuntimeError):
    """SGLang is missing, does not import, or lacks something the
    integration relies on (the message names it and the supported versions)."""


class UntestedSGLangError(IncompatibleSGLangError):
    """The installed SGLang is not a release this integration was tested
    with (another version, or a build whose replaced methods differ)."""


def _supported() -> str:
    return f"supported: SGLang {', '.join(TESTED_VERSIONS)}"


_originals: Dict[Tuple[type, str], Any] = {}


def installed() -> bool:
    """Whether install() has patched SGLang in this process."""
    return bool(_originals)


def sglang_version() -> str:
    """The installed SGLang's version; IncompatibleSGLangError if none is."""
    from importlib import metadata

    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError as e:
        raise IncompatibleSGLangError(
            f"SGLang is not installed in this environment ({sys.executable}); "
            f"{_supported()}") from e


def _import_sglang() -> None:
    """Import the tokenizer side once, turning any failure (a missing GPU
    package, a half-installed SGLang) into IncompatibleSGLangError."""
    version = sglang_version()
    try:
        importlib.import_module(_MULTI)
    except Exception as e:
        raise IncompatibleSGLangError(
            f"SGLang {version} is installed but its tokenizer side does not import "
            f"({type(e).__name__}: {e}); {_supported()}") from e


def lock_name(port: Optional[int]) -> str:
    """The server's lock: ``$PYSHMLOCK_SGLANG_LOCK``, else ``sglang-<port>``."""
    name = os.environ.get(ENV_LOCK_NAME)
    if name:
        return name
    if port is None:
        raise IncompatibleSGLangError(
            f"cannot name the shared lock: no server port; set {ENV_LOCK_NAME}")
    return f"sglang-{int(port)}"


def _original(module: str, cls: str, attr: str) -> Any:
    return _originals[(_resolve(module, cls), attr)]


def _resolve(module: str, cls: str) -> type:
    owner = getattr(importlib.import_module(module), cls, None)
    if not isinstance(owner, type):
        raise IncompatibleSGLangError(f"{module}.{cls} is missing")
    return owner


# -- the check ---------------------------------------------------------------

class Check:
    """What ``check()`` found: each target present or not, the installed
    version and replaced bodies against the tested ones, and the verdict."""

    def __init__(self, version: str, found: List[targets.Found],
                 bodies: Dict[str, str], allow_untested: bool) -> None:
        self.version = version
        self.found = found
        self.bodies = bodies
        self.missing = [f for f in found if f.target.needed and not f.present]
        tested = targets.FINGERPRINTS.get(version)
        self.listed = version in TESTED_VERSIONS
        self.differing = ([k for k, v in bodies.items() if tested.get(k) != v]
                          if tested is not None else [])
        self.nearest: Optional[str] = None
        if not self.listed or tested is None:
            self.nearest, self.differing = _nearest(bodies)
        self.tested = self.listed and tested is not None and not self.differing
        self.launcher_setting = any(f.present for f in found if f.target.kind == "setting")
        self.allowed_untested = allow_untested and not self.tested
        self.accepted = not self.missing and (self.tested or allow_untested)

    def reason(self) -> str:
        """Why install() refuses ("" if it accepts)."""
        if self.missing:
            return (f"SGLang {self.version} lacks what the integration relies on: "
                    f"{'; '.join(_describe(f) for f in self.missing)}; nothing was "
                    f"patched; {_supported()}")
        if self.tested or self.accepted:
            return ""
        what = (f"SGLang {self.version} is not a tested release" if not self.listed else
                f"this SGLang {self.version} build is not the tested release")
        if self.differing:
            what += (f"; the methods the integration replaces differ from "
                     f"{self.nearest or 'every tested release'} in: "
                     f"{', '.join(self.differing)}")
        return (f"{what} ({_supported()}): to try it anyway, call "
                f"install(allow_untested=True) or set {ENV_UNTESTED}=1 (and run "
                f"tests/sglang_server against it)")

    def report(self) -> str:
        lines = [f"SGLang {self.version}"]
        for f in self.found:
            mark = "present" if f.present else ("absent " if not f.target.needed else "MISSING")
            lines.append(f"  {mark}  {f.target}" + (f"  ({f.detail})" if f.detail else ""))
        for name, digest in self.bodies.items():
            same = "" if name not in self.differing else "  (differs)"
            lines.append(f"  body     {name} {digest}{same}")
        lines.append("  launcher: " + (
            f"points {SGLANG_APP_PATH} at {INTEGRATED_APP_PATH}" if self.launcher_setting else
            f"no {SGLANG_APP_PATH}: hands {INTEGRATED_APP_PATH} to uvicorn/granian in "
            "the place of SGLang's hard-coded app"))
        verdict = self.reason()
        lines.append("install() would accept it" + (
            " (untested: allowed)" if self.allowed_untested else "")
            if not verdict else f"install() would refuse it: {verdict}")
        return "\n".join(lines)


def _describe(found: targets.Found) -> str:
    return f"{found.target}" + (f" ({found.detail})" if found.detail else "")


def _nearest(bodies: Dict[str, str]) -> Tuple[Optional[str], List[str]]:
    """The tested release whose replaced bodies are most like these, and
    the ones that differ from it."""
    best: Optional[str] = None
    best_diff = list(bodies)
    for version in TESTED_VERSIONS:
        tested = targets.FINGERPRINTS.get(version, {})
        diff = [k for k, v in bodies.items() if tested.get(k) != v]
        if best is None or len(diff) < len(best_diff):
            best, best_diff = version, diff
    return best, best_diff


def check(allow_untested: bool = False) -> Check:
    """Look at the installed SGLang without patching it.
    IncompatibleSGLangError if it is missing or does not import."""
    _import_sglang()
    version = sglang_version()
    lookup = (lambda m, c, a: _original(m, c, a)) if _originals else None
    return Check(version, targets.check_all(), targets.fingerprints(lookup),
                 allow_untested or os.environ.get(ENV_UNTESTED) == "1")


def check_version(allow_untested: bool = False) -> str:
    """The installed SGLang version if install() would accept it; else
    IncompatibleSGLangError, or UntestedSGLangError for a release (or build)
    not tested, unless allowed (argument or ``PYSHMLOCK_SGLANG_UNTESTED=1``)."""
    found = check(allow_untested)
    if found.missing:
        raise IncompatibleSGLangError(found.reason())
    if not found.accepted:
        raise UntestedSGLangError(found.reason())
    if found.allowed_untested:
        logger.warning("pyshmlock: SGLang %s is untested (%s); installing anyway",
                       found.version, _supported())
    return found.version


def install(*, allow_untested: bool = False) -> bool:
    """Patch SGLang's tokenizer side in this process; True if this call
    patched, False if it was already installed.  Call it before the
    TokenizerManager (or TokenizerWorker) is built."""
    if _originals:
        return False
    check_version(allow_untested)
    owners = {(m, c, a): _resolve(m, c) for m, c, a in PATCHED + ADDED}
    replacements = _replacements()
    for (m, c, a), owner in owners.items():
        if (m, c, a) in replacements:
            _originals[(owner, a)] = vars(owner)[a]
    for (m, c, a), owner in owners.items():
        if (m, c, a) in replacements:
            setattr(owner, a, replacements[(m, c, a)])
    for m, c, a in ADDED:
        _originals[(owners[(m, c, a)], a)] = None
        setattr(owners[(m, c, a)], a, _served(a))
    logger.info("pyshmlock: SGLang %s tokenizer side shares one lock per server",
                sglang_version())
    return True


def uninstall() -> bool:
    """Put SGLang's own methods back (managers built meanwhile keep their
    shared lock); True if anything was patched."""
    if not _originals:
        return False
    for (owner, attr), original in list(_originals.items()):
        if original is None:
            delattr(owner, attr)
        else:
            setattr(owner, attr, original)
    _originals.clear()
    return True


# -- the launcher --------------------------------------------------------------

_PORT_ARG = re.compile(r"^--port(?:=(\d+))?$")

USAGE = f"""usage: python -m pyshmlock.integrations.sglang [--check] | SGLANG_ARGS...

Runs `python -m sglang.launch_server SGLANG_ARGS...` with
pyshmlock.integrations.sglang installed in the launching process and in
every tokenizer worker: one shared lock per server (named sglang-<port>,
or ${ENV_LOCK_NAME}).

  --check     print what the integration relies on in the installed SGLang,
              which of it is present, and whether install() would accept it
              (exit 0 if it would, 1 if not)
  -h, --help  this text (SGLang's own options: python -m sglang.launch_server --help)

Tested with SGLang {', '.join(TESTED_VERSIONS)}; {ENV_UNTESTED}=1 allows another.
"""


def _hand_workers_the_integrated_app() -> None:
    """SGLang before 0.5.23 names its workers' app in the code
    (``uvicorn.run("sglang.srt.entrypoints.http_server:app", workers=N)``,
    and Granian's ``target``): in this process, both are handed the
    integrated app instead, which installs the integration in each worker
    and then imports that same app."""
    import uvicorn

    run = uvicorn.run

    def integrated_run(app: Any, *args: Any, **kwargs: Any) -> Any:
        if app == DEFAULT_APP_PATH:
            app = INTEGRATED_APP_PATH
        return run(app, *args, **kwargs)
    uvicorn.run = integrated_run
    try:
        import granian
    except ImportError:
        return
    granian_class = granian.Granian

    class IntegratedGranian(granian_class):  # type: ignore[misc, valid-type]
        def __init__(self, target: Any, *args: Any, **kwargs: Any) -> None:
            if target == DEFAULT_APP_PATH:
                target = INTEGRATED_APP_PATH
            super().__init__(target, *args, **kwargs)
    granian.Granian = IntegratedGranian


def main(argv: Optional[List[str]] = None) -> None:
    """``python -m pyshmlock.integrations.sglang ARGS``: SGLang's
    ``python -m sglang.launch_server ARGS`` with the integration installed
    in this process (the router, or the single tokenizer manager) and in
    every tokenizer worker.

    SGLang's workers are uvicorn's (or granian's) spawned processes, which
    import the app named by ``SGLANG_HTTP_SERVER_APP_PATH`` (0.5.23), or the
    app hard-coded in SGLang before it; the launcher points the setting,
    or the hard-coded name as this process passes it on, at
    ``pyshmlock.integrations.sglang_app:app``, which installs the
    integration and then imports the app that would have run (kept in
    ``PYSHMLOCK_SGLANG_APP_PATH``).  A spawned child inherits the
    environment, so no sitecustomize or .pth file is involved."""
    import runpy

    args = list(sys.argv[1:] if argv is None else argv)
    if "-h" in args or "--help" in args:
        sys.stdout.write(USAGE)
        return
    if args[:1] == ["--check"]:
        try:
            found = check()
        except IncompatibleSGLangError as e:
            sys.stdout.write(f"install() would refuse it: {e}\n")
            raise SystemExit(1) from None
        sys.stdout.write(found.report() + "\n")
        raise SystemExit(0 if found.accepted else 1)
    try:
        install()
        found = check()
    except IncompatibleSGLangError as e:
        raise SystemExit(f"pyshmlock.integrations.sglang: {e}") from None
    current = os.environ.get(SGLANG_APP_PATH, DEFAULT_APP_PATH)
    if current != INTEGRATED_APP_PATH:
        os.environ[ENV_APP_PATH] = current
        os.environ[SGLANG_APP_PATH] = INTEGRATED_APP_PATH
    if not found.launcher_setting:
        _hand_workers_the_integrated_app()
    sys.argv = ["sglang.launch_server", *args]
    runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    # `python -m` runs a second copy of this file as __main__: hand over to
    # the module itself, so that its state (install()'s originals) is one.
    from pyshmlock.integrations import sglang as _module

    _module.main()
