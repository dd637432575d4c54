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
  runs SGLang's own pause (router broadcast, scheduler message, and in
  abort mode the drain, which now sees the requests of every worker);
* ``continue_generation`` first waits while an update or an update session
  holds the pause (``await lock.resume()``), then runs SGLang's own continue;
* every weight-update path runs under ``update_lock``: unpaused it drains the
  requests of every worker, paused it skips the frozen ones and pins the
  pause; an update that carries the fleet's update token (header
  ``X-Pyshmlock-Fence``, from a ``pyshmlock.cluster`` controller) runs under
  ``fenced_update(token)`` and is refused at this host if a newer update is
  known here; ``begin_weight_update`` opens an update session on the lock and
  ``end_weight_update`` closes it, so a continue in between waits.

SGLang's own communicators and bookkeeping are called unchanged; only the
choice of lock differs (docs/sglang.md lists the lines an upstream change
would touch).  ``python -m pyshmlock.integrations.sglang ARGS`` runs
``sglang.launch_server ARGS`` with the integration in every tokenizer process.
"""

import asyncio
import importlib
import logging
import os
import re
import sys
import threading
from typing import Any, Awaitable, Callable, Dict, List, Optional, Tuple

from ..aio import AsyncRWLock
from ..cluster._keys import FENCE_HEADER
from ..errors import FencingError

__all__ = [
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
    "IncompatibleSGLangError",
    "SharedGateCondition",
    "SharedModelUpdateLock",
    "UntestedSGLangError",
    "check_version",
    "install",
    "installed",
    "lock_name",
    "main",
    "sglang_version",
    "uninstall",
]

logger = logging.getLogger(__name__)

#: SGLang releases this integration was tested with (tests/sglang_server/).
TESTED_VERSIONS: Tuple[str, ...] = ("0.5.23",)
#: Set to 1 to install on a release not in TESTED_VERSIONS.
ENV_UNTESTED = "PYSHMLOCK_SGLANG_UNTESTED"
#: The lock's name; default ``sglang-<port>`` (unique per server on a host).
ENV_LOCK_NAME = "PYSHMLOCK_SGLANG_LOCK"
#: The launcher's record of the app SGLang's workers would have imported.
ENV_APP_PATH = "PYSHMLOCK_SGLANG_APP_PATH"
#: An update session's ttl in seconds (default: the lock's, 600 s): a
#: session whose end_weight_update never comes expires after it.
ENV_SESSION_TTL = "PYSHMLOCK_SGLANG_SESSION_TTL"
#: SGLang's own setting: the app each multi-tokenizer worker imports.
SGLANG_APP_PATH = "SGLANG_HTTP_SERVER_APP_PATH"
#: The app SGLang's workers import when that setting is not given.
DEFAULT_APP_PATH = "sglang.srt.entrypoints.http_server:app"
#: The app the launcher points the workers at: install(), then the app above.
INTEGRATED_APP_PATH = "pyshmlock.integrations.sglang_app:app"


class UntestedSGLangError(RuntimeError):
    """The installed SGLang release is not one this integration was tested with."""


class IncompatibleSGLangError(RuntimeError):
    """Something the integration patches is missing from the installed SGLang."""


_TM = "sglang.srt.managers.tokenizer_manager"
_CONTROL = "sglang.srt.managers.tokenizer_control_mixin"
_MULTI = "sglang.srt.managers.multi_tokenizer_mixin"

#: (module, class, attribute) of everything install() replaces.  The
#: attribute must be defined by that class itself, not inherited.
PATCHED: Tuple[Tuple[str, str, str], ...] = (
    (_TM, "TokenizerManager", "init_weight_update"),
    (_TM, "TokenizerManager", "is_pause"),
    (_TM, "TokenizerManager", "pause_generation"),
    (_TM, "TokenizerManager", "continue_generation"),
    (_TM, "TokenizerManager", "update_weights_from_disk"),
    (_CONTROL, "TokenizerControlMixin", "update_weights_from_distributed"),
    (_CONTROL, "TokenizerControlMixin", "update_weights_from_tensor"),
    (_CONTROL, "TokenizerControlMixin", "update_weights_from_ipc"),
    (_CONTROL, "TokenizerControlMixin", "begin_weight_update"),
    (_CONTROL, "TokenizerControlMixin", "end_weight_update"),
    (_MULTI, "TokenizerWorker", "pause_generation"),
    (_MULTI, "TokenizerWorker", "continue_generation"),
)

#: What the patched code calls on a manager: checked to exist before patching.
USED: Tuple[Tuple[str, str, str], ...] = (
    (_TM, "TokenizerManager", "_wait_for_model_update_from_disk"),
    (_TM, "TokenizerManager", "abort_request"),
    (_TM, "TokenizerManager", "auto_create_handle_loop"),
    (_TM, "TokenizerManager", "config_value"),
    (_CONTROL, "TokenizerControlMixin", "_update_weight_version_if_provided"),
)

_originals: Dict[Tuple[type, str], Any] = {}


def installed() -> bool:
    """Whether install() has patched SGLang in this process."""
    return bool(_originals)


def sglang_version() -> str:
    from importlib import metadata

    return metadata.version("sglang")


def lock_name(port: Optional[int]) -> str:
    """The server's lock: ``$PYSHMLOCK_SGLANG_LOCK``, else ``sglang-<port>``."""
    name = os.environ.get(ENV_LOCK_NAME)
    if name:
        return name
    if port is None:
        raise IncompatibleSGLangError(
            f"cannot name the shared lock: no server port; set {ENV_LOCK_NAME}")
    return f"sglang-{int(port)}"


class SharedModelUpdateLock(AsyncRWLock):
    """The server's lock, in the place of SGLang's per-process RWLock.

    ``is_locked()`` answers what SGLang 0.5.23 asks it (its only use is the
    abort-mode drain, "is there still an on-going request"): whether a read
    hold exists in any process.  An update holding the lock is not a
    request; counting it would make an abort-mode pause wait for it."""

    async def is_locked(self) -> bool:
        return not await self.wait_drained(0)


class SharedGateCondition(asyncio.Condition):
    """``is_pause_cond`` for a manager on the shared lock.

    SGLang admits a request after ``await cond.wait_for(lambda: not
    self.is_pause)``; ``is_pause`` reads the shared gate, which other
    processes open without notifying this condition, so ``wait_for`` waits
    on the gate itself (the condition's lock released meanwhile, as
    asyncio.Condition does).  The admission that counts is the read hold
    taken next, which the gate refuses while paused."""

    def __init__(self, lock: AsyncRWLock, recheck: float = 1.0) -> None:
        super().__init__()
        self._shared = lock
        self._recheck = recheck

    async def wait_for(self, predicate: Callable[[], Any]) -> Any:
        result = predicate()
        while not result:
            self.release()
            try:
                await self._shared.wait_resumed(self._recheck)
            finally:
                await self.acquire()
            result = predicate()
        return result


def _shared(manager: Any) -> SharedModelUpdateLock:
    lock = manager.__dict__.get("model_update_lock")
    if not isinstance(lock, SharedModelUpdateLock):
        raise IncompatibleSGLangError(
            "this TokenizerManager has no shared lock: it was built before install()")
    return lock


def _original(module: str, cls: str, attr: str) -> Any:
    return _originals[(_resolve(module, cls), attr)]


def _resolve(module: str, cls: str) -> type:
    owner = getattr(importlib.import_module(module), cls, None)
    if not isinstance(owner, type):
        raise IncompatibleSGLangError(f"{module}.{cls} is missing")
    return owner


# -- the replacements --------------------------------------------------------

def _init_weight_update(self: Any) -> None:
    _original(_TM, "TokenizerManager", "init_weight_update")(self)
    lock = SharedModelUpdateLock(lock_name(_server_port(self)))
    self.model_update_lock = lock
    self.is_pause_cond = SharedGateCondition(lock)
    # A worker stopped while paused must stop: its requests parked at the
    # gate end (LockClosingError) when SIGTERM or Ctrl-C arrives, before
    # uvicorn's handler starts its graceful shutdown.  Only where signal
    # handlers can be set (the main thread: a multi-tokenizer worker builds
    # its manager in the app's lifespan, after uvicorn set its own).
    if threading.current_thread() is threading.main_thread():
        lock.notify_closing_on_signals()


def _server_port(manager: Any) -> Optional[int]:
    args = getattr(manager, "server_args", None)
    port = getattr(args, "port", None)
    if port is None:
        try:
            from sglang.srt.runtime_context import get_serving

            port = get_serving().port
        except Exception:  # no published context: the env var must name the lock
            port = None
    return None if port is None else int(port)


def _is_pause_get(self: Any) -> bool:
    lock = self.__dict__.get("model_update_lock")
    if isinstance(lock, SharedModelUpdateLock):
        return lock.paused
    return bool(self._is_pause)


def _is_pause_set(self: Any, value: bool) -> None:
    # The local flag (and SGLang's engine-state callback) only: a broadcast
    # applied late must never re-pause or open the shared gate.
    _original(_TM, "TokenizerManager", "is_pause").fset(self, value)


def _pause_generation(module: str, cls: str) -> Callable[..., Awaitable[Any]]:
    async def pause_generation(self: Any, obj: Any) -> Any:
        _shared(self).pause()          # no worker admits a request from here on
        # SGLang 0.5.23 starts a worker's handle loop at its first request;
        # without it the router's broadcast is never read and SGLang's own
        # pause waits for it forever.
        self.auto_create_handle_loop()
        return await _original(module, cls, "pause_generation")(self, obj)
    return pause_generation


def _continue_generation(module: str, cls: str) -> Callable[..., Awaitable[Any]]:
    async def continue_generation(self: Any, obj: Any) -> Any:
        # Waits while an update or an update session holds the pause; raises
        # pyshmlock.DataSuspectError while the data is suspect.
        await _shared(self).resume()
        self.auto_create_handle_loop()
        return await _original(module, cls, "continue_generation")(self, obj)
    return continue_generation


def _fence_token(request: Any) -> Optional[int]:
    """The fleet update token a cluster controller sent with this update
    (the X-Pyshmlock-Fence header), or None."""
    headers = getattr(request, "headers", None)
    value = headers.get(FENCE_HEADER) if headers is not None else None
    if value is None:
        return None
    try:
        token = int(value)
    except ValueError:
        raise ValueError(f"{FENCE_HEADER}: not an update token: {value!r}") from None
    if token < 0:
        raise ValueError(f"{FENCE_HEADER}: not an update token: {value!r}")
    return token


def _update_hold(manager: Any, request: Any) -> Any:
    """What an update call runs under: the update hold, fenced when the
    request carries the fleet's update token (a stale one is refused at this
    host: pyshmlock.FencingError, before anything is applied)."""
    lock = _shared(manager)
    token = _fence_token(request)
    return lock.update_lock if token is None else lock.fenced_update(token)


def _merge(results: Any) -> Tuple[bool, str]:
    from sglang.srt.managers.communicator import FanOutCommunicator

    merged: Tuple[bool, str] = FanOutCommunicator.merge_results(results)
    return merged


def _after_update(self: Any, obj: Any, success: bool, message: str) -> str:
    # SGLang's own epilogue of every update path.
    if success and obj.flush_cache and self.mm_processor is not None:
        self.mm_processor.clear_preprocess_cache()
    if success and obj.weight_version is not None:
        self._update_weight_version_if_provided(obj.weight_version)
        message += f" Weight version updated to {obj.weight_version}."
    return message


def _assert_single_dp(what: str) -> None:
    from sglang.srt.runtime_context import get_parallel

    assert get_parallel().dp_size == 1, (
        f"data-parallel replicas are not supported for {what}")


async def _update_weights_from_disk(self: Any, obj: Any, request: Any = None) -> Any:
    self.auto_create_handle_loop()
    if obj.load_format is None:
        obj.load_format = self.config_value("load_format")
    logger.info("Start update_weights. Load format=%s", obj.load_format)
    if obj.abort_all_requests:
        self.abort_request(abort_all=True)
    try:
        async with _update_hold(self, request):
            success, message, num_paused_requests = \
                await self._wait_for_model_update_from_disk(obj)
    except FencingError as e:
        return False, str(e), 0
    return success, _after_update(self, obj, success, message), num_paused_requests


async def _update_weights_from_distributed(self: Any, obj: Any, request: Any = None) -> Any:
    self.auto_create_handle_loop()
    _assert_single_dp("update weights from distributed")
    if obj.abort_all_requests:
        self.abort_request(abort_all=True)
    try:
        async with _update_hold(self, request):
            results = await self.update_weights_from_distributed_communicator(obj)
    except FencingError as e:
        return False, str(e)
    success, message = _merge(results)
    return success, _after_update(self, obj, success, message)


async def _update_weights_from_tensor(self: Any, obj: Any, request: Any = None) -> Any:
    from sglang.srt.utils import normalize_serialized_named_tensor_payloads

    self.auto_create_handle_loop()
    _assert_single_dp("update weights from tensor")
    if obj.abort_all_requests:
        self.abort_request(abort_all=True)
    obj.serialized_named_tensors = normalize_serialized_named_tensor_payloads(
        obj.serialized_named_tensors)
    try:
        async with _update_hold(self, request):
            results = await self.update_weights_from_tensor_communicator(obj)
    except FencingError as e:
        return False, str(e)
    success, message = _merge(results)
    return success, _after_update(self, obj, success, message)


async def _update_weights_from_ipc(self: Any, obj: Any, request: Any = None) -> Any:
    self.auto_create_handle_loop()
    try:
        _assert_single_dp("update weights from IPC")
        logger.info("Starting IPC weight update")
        async with _update_hold(self, request):
            results = await self.update_weights_from_ipc_communicator(obj)
        success, message = _merge(results)
    except FencingError as e:
        return False, str(e)
    except Exception as e:
        message = f"IPC weight update failed: {e!s}"
        logger.error(message)
        success = False
    return success, _after_update(self, obj, success, message)


async def _begin_weight_update(self: Any, obj: Any, request: Any = None) -> Any:
    """Open an update session: drain (unpaused) or skip the frozen requests
    (paused), pause the gate and pin it until end_weight_update, in any worker."""
    self.auto_create_handle_loop()
    lock = _shared(self)
    ttl = os.environ.get(ENV_SESSION_TTL)
    token = await (lock.begin_session(float(ttl)) if ttl else lock.begin_session())
    try:
        results = await self.begin_weight_update_communicator(obj)
        success, message = _merge(results)
    except BaseException:
        lock.end_session(token)
        raise
    if not success:                 # the scheduler opened nothing
        lock.end_session(token)
    return success, message


async def _end_weight_update(self: Any, obj: Any, request: Any = None) -> Any:
    """Close the scheduler's session, then the lock's (whichever worker
    opened it: SGLang's requests carry no token).  The gate stays paused
    until /continue_generation."""
    self.auto_create_handle_loop()
    lock = _shared(self)
    async with lock.update_lock:     # granted at once inside a session
        results = await self.end_weight_update_communicator(obj)
    success, message = _merge(results)
    session = lock.session
    if success and session is not None:
        lock.end_session(session.token)
    elif not success:
        logger.error("end_weight_update failed (%s): the update session stays open "
                     "and the gate paused; it expires after its ttl, data suspect", message)
    return success, message


def _replacements() -> Dict[Tuple[str, str, str], Any]:
    tm_is_pause = (_TM, "TokenizerManager", "is_pause")
    return {
        (_TM, "TokenizerManager", "init_weight_update"): _init_weight_update,
        tm_is_pause: property(_is_pause_get, _is_pause_set),
        (_TM, "TokenizerManager", "pause_generation"): _pause_generation(_TM, "TokenizerManager"),
        (_TM, "TokenizerManager", "continue_generation"):
            _continue_generation(_TM, "TokenizerManager"),
        (_TM, "TokenizerManager", "update_weights_from_disk"): _update_weights_from_disk,
        (_CONTROL, "TokenizerControlMixin", "update_weights_from_distributed"):
            _update_weights_from_distributed,
        (_CONTROL, "TokenizerControlMixin", "update_weights_from_tensor"):
            _update_weights_from_tensor,
        (_CONTROL, "TokenizerControlMixin", "update_weights_from_ipc"): _update_weights_from_ipc,
        (_CONTROL, "TokenizerControlMixin", "begin_weight_update"): _begin_weight_update,
        (_CONTROL, "TokenizerControlMixin", "end_weight_update"): _end_weight_update,
        (_MULTI, "TokenizerWorker", "pause_generation"):
            _pause_generation(_MULTI, "TokenizerWorker"),
        (_MULTI, "TokenizerWorker", "continue_generation"):
            _continue_generation(_MULTI, "TokenizerWorker"),
    }


def check_version(allow_untested: bool = False) -> str:
    """The installed SGLang version; UntestedSGLangError if it is not in
    TESTED_VERSIONS, unless allowed (argument or ``PYSHMLOCK_SGLANG_UNTESTED=1``)."""
    version = sglang_version()
    if version in TESTED_VERSIONS:
        return version
    if allow_untested or os.environ.get(ENV_UNTESTED) == "1":
        logger.warning("pyshmlock: SGLang %s is untested (tested: %s); installing anyway",
                       version, ", ".join(TESTED_VERSIONS))
        return version
    raise UntestedSGLangError(
        f"pyshmlock.integrations.sglang was tested with SGLang {', '.join(TESTED_VERSIONS)}, "
        f"not {version}: to try it anyway, call install(allow_untested=True) or set "
        f"{ENV_UNTESTED}=1 (and run tests/sglang_server against that release)")


def _check_targets() -> List[Tuple[type, str]]:
    """Every patched and used attribute, checked before anything is patched."""
    missing: List[str] = []
    targets: List[Tuple[type, str]] = []
    for module, cls, attr in PATCHED + USED:
        try:
            owner = _resolve(module, cls)
        except (ImportError, IncompatibleSGLangError) as e:
            missing.append(f"{module}.{cls} ({e})")
            continue
        if attr not in vars(owner):
            missing.append(f"{module}.{cls}.{attr}")
        elif (module, cls, attr) in PATCHED:
            targets.append((owner, attr))
    if missing:
        raise IncompatibleSGLangError(
            "pyshmlock.integrations.sglang cannot patch this SGLang "
            f"({sglang_version()}): missing {', '.join(missing)}; nothing was patched")
    is_pause = vars(_resolve(_TM, "TokenizerManager"))["is_pause"]
    if not isinstance(is_pause, property) or is_pause.fset is None:
        raise IncompatibleSGLangError(
            "TokenizerManager.is_pause is not a settable property; nothing was patched")
    return targets


def install(*, allow_untested: bool = False) -> bool:
    """Patch SGLang's tokenizer side in this process; True if this call
    patched, False if it was already installed.  Call it before the
    TokenizerManager (or TokenizerWorker) is built."""
    if _originals:
        return False
    check_version(allow_untested)
    targets = _check_targets()
    replacements = _replacements()
    by_owner = {(_resolve(m, c), a): (m, c, a) for m, c, a in PATCHED}
    for owner, attr in targets:
        _originals[(owner, attr)] = vars(owner)[attr]
    for owner, attr in targets:
        setattr(owner, attr, replacements[by_owner[(owner, attr)]])
    logger.info("pyshmlock: SGLang %s tokenizer side shares one lock per server",
                sglang_version())
    return True


def uninstall() -> bool:
    """Put SGLang's own methods back (managers built meanwhile keep their
    shared lock); True if anything was patched."""
    if not _originals:
        return False
    for (owner, attr), original in list(_originals.items()):
        setattr(owner, attr, original)
    _originals.clear()
    return True


# -- the launcher --------------------------------------------------------------

_PORT_ARG = re.compile(r"^--port(?:=(\d+))?$")


def main(argv: Optional[List[str]] = None) -> None:
    """``python -m pyshmlock.integrations.sglang ARGS``: SGLang's
    ``python -m sglang.launch_server ARGS`` with the integration installed
    in this process (the router, or the single tokenizer manager) and in
    every tokenizer worker.

    SGLang's workers are uvicorn's (or granian's) spawned processes, which
    import the app named by ``SGLANG_HTTP_SERVER_APP_PATH``; the launcher
    points it at ``pyshmlock.integrations.sglang_app:app``, which installs
    the integration and then imports the app that would have run (kept in
    ``PYSHMLOCK_SGLANG_APP_PATH``).  A spawned child inherits the
    environment, so no sitecustomize or .pth file is involved."""
    import runpy

    args = list(sys.argv[1:] if argv is None else argv)
    current = os.environ.get(SGLANG_APP_PATH, DEFAULT_APP_PATH)
    if current != INTEGRATED_APP_PATH:
        os.environ[ENV_APP_PATH] = current
        os.environ[SGLANG_APP_PATH] = INTEGRATED_APP_PATH
    install()
    sys.argv = ["sglang.launch_server", *args]
    runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
