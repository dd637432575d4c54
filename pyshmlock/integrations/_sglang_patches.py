"""The code install() puts into SGLang's tokenizer side, and the same
semantics as a ``ModelUpdateGate`` for the hook contrib/sglang/ proposes.

Each replacement is a function of the manager (``self``) standing in for
SGLang's method of the same name; ``_sg()._original(...)`` is SGLang's own,
kept by install() (pyshmlock/integrations/sglang.py, which also says what
each one is for).  Per process and server there is one lock object and one
served-weights record (``_Server``), opened with the first manager and
closed at exit, when the last worker of the server removes both."""

import asyncio
import atexit
import collections
import logging
import os
import threading
from typing import Any, Awaitable, Callable, Deque, Dict, Iterable, Optional, Tuple

from ..aio import AsyncRWLock
from ..cluster._keys import FENCE_HEADER
from ..errors import FencingError, LockInUseError
from . import _sglang_targets as targets
from ._sglang_record import ServedWeights
from ._sglang_targets import CONTROL as _CONTROL
from ._sglang_targets import MULTI as _MULTI
from ._sglang_targets import TM as _TM

logger = logging.getLogger("pyshmlock.integrations.sglang")


def _sg() -> Any:
    """pyshmlock.integrations.sglang (imported when first called: it
    imports this module)."""
    from . import sglang

    return sglang


class SharedModelUpdateLock(AsyncRWLock):
    """The server's lock, in the place of SGLang's per-process RWLock.

    ``is_locked()`` answers what SGLang asks it (its only use is the
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
        raise _sg().IncompatibleSGLangError(
            "this TokenizerManager has no shared lock: it was built before install()")
    return lock






# -- one lock, one record per server ------------------------------------------

class _Server:
    """This process's view of its server: the lock and the served-weights
    record, opened with the first manager and closed at exit."""

    def __init__(self, name: str) -> None:
        self.lock = SharedModelUpdateLock(name)
        self.record = ServedWeights(name, self._attached)
        self.name = name
        atexit.register(self.stop)

    def _attached(self) -> Iterable[int]:
        try:
            return list(self.lock.info().attached_pids)
        except ValueError:          # closed: at exit
            return []

    def stop(self) -> None:
        """At a clean exit: detach, and if no other live process is
        attached, remove the segment and the record (the last worker of the
        server).  A worker that detached first is not counted by the
        later ones, so the last one to get here removes them."""
        try:
            self.lock.close()
        except (LockInUseError, ValueError):
            pass                    # still in use here: unlink counts us out anyway
        from ..lock import unlink

        try:
            unlink(self.name)
        except (LockInUseError, FileNotFoundError, PermissionError):
            return
        except Exception:           # never fail an exit over it
            logger.exception("pyshmlock: could not remove the lock %s", self.name)
            return
        self.record.remove()


_servers: Dict[str, _Server] = {}


def _server(name: str) -> _Server:
    server = _servers.get(name)
    if server is None:
        server = _servers[name] = _Server(name)
    return server


def _record(manager: Any) -> Optional[ServedWeights]:
    server = _servers.get(manager.__dict__.get("_pyshmlock_server", ""))
    return server.record if server is not None else None


# -- the replacements --------------------------------------------------------

def _init_weight_update(self: Any) -> None:
    _sg()._original(_TM, "TokenizerManager", "init_weight_update")(self)
    server = _server(_sg().lock_name(_server_port(self)))
    self._pyshmlock_server = server.name
    self._pyshmlock_pending = collections.deque()
    # One lock object per process (and per server): the managers of a
    # process share it, and its attachment outlives none of them.
    lock = server.lock
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
    _sg()._original(_TM, "TokenizerManager", "is_pause").fset(self, value)


async def _drain(manager: Any, lock: SharedModelUpdateLock) -> None:
    """An abort-mode pause's drain: abort every request, and return the
    moment no read hold is left in any worker.  The abort is sent again
    every ABORT_RESEND_SECONDS while requests remain (one tokenized while
    the first abort travelled reaches the scheduler after it)."""
    while True:
        manager.abort_request(abort_all=True)
        if await lock.wait_drained(_sg().ABORT_RESEND_SECONDS):
            return


async def _manager_pause(self: Any, obj: Any) -> Any:
    """TokenizerManager.pause_generation (one tokenizer process)."""
    lock = _shared(self)
    lock.pause()                    # no worker admits a request from here on
    if obj.mode != "abort":
        return await _sg()._original(_TM, "TokenizerManager", "pause_generation")(self, obj)
    self.is_pause = True            # SGLang's local flag and state callback
    await _drain(self, lock)


async def _manager_continue(self: Any, obj: Any) -> Any:
    # Waits while an update or an update session holds the pause; raises
    # pyshmlock.DataSuspectError while the data is suspect.
    await _shared(self).resume()
    return await _sg()._original(_TM, "TokenizerManager", "continue_generation")(self, obj)


async def _through_router(worker: Any, obj: Any) -> None:
    """Send a pause or continue to the router (it broadcasts to every
    worker and forwards it to the scheduler) and wait for a broadcast to
    come back here.  Each call waits in a queue of its own, resolved one
    broadcast at a time, oldest first: SGLang's one pending future was
    overwritten by a second call, leaving the first waiting for ever."""
    # SGLang starts a worker's handle loop at its first request; without it
    # the router's broadcast is never read.
    worker.auto_create_handle_loop()
    waiting = asyncio.get_running_loop().create_future()
    pending: Deque[asyncio.Future[bool]] = worker._pyshmlock_pending
    pending.append(waiting)
    try:
        worker._dispatch_to_scheduler(obj)
    except BaseException:           # never sent: no broadcast will come for it
        pending.remove(waiting)
        raise
    # A cancelled wait leaves its (cancelled) future queued: the broadcast
    # that reaches it passes it by for the next one.
    await waiting


async def _worker_pause(self: Any, obj: Any) -> Any:
    """TokenizerWorker.pause_generation (multi-tokenizer)."""
    lock = _shared(self)
    lock.pause()                    # no worker admits a request from here on
    await _through_router(self, obj)
    if obj.mode == "abort":
        await _drain(self, lock)


async def _worker_continue(self: Any, obj: Any) -> Any:
    """TokenizerWorker.continue_generation (multi-tokenizer)."""
    await _shared(self).resume()
    await _through_router(self, obj)


async def _apply_pause_continue_broadcast(self: Any, obj: Any) -> None:
    """A broadcast from the router: SGLang's local flag (under its
    condition, as SGLang does), then the oldest waiting call returns."""
    async with self.is_pause_cond:
        self.is_pause = obj.is_pause
        if not obj.is_pause:
            self.is_pause_cond.notify_all()
    pending: Deque[asyncio.Future[bool]] = self.__dict__.get(
        "_pyshmlock_pending", collections.deque())
    while pending:
        waiting = pending.popleft()
        if not waiting.done():
            waiting.set_result(True)
            break


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


def _check_dp(method: str, what: str) -> None:
    """SGLang's own precondition of that update path, as the installed
    release has it: 0.5.21 also allows data-parallel attention, 0.5.22 on
    only dp_size 1 (read from SGLang's own method)."""
    from sglang.srt.runtime_context import get_parallel

    parallel = get_parallel()
    if parallel.dp_size == 1:
        return
    original = _sg()._original(_CONTROL, "TokenizerControlMixin", method)
    if "enable_dp_attention" in targets.code_names(original) and parallel.enable_dp_attention:
        return
    raise AssertionError(f"data-parallel replicas are not supported for {what}")


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
            message = _after_update(self, obj, success, message)
    except FencingError as e:
        return False, str(e), 0
    return success, message, num_paused_requests


async def _update_weights_from_distributed(self: Any, obj: Any, request: Any = None) -> Any:
    self.auto_create_handle_loop()
    _check_dp("update_weights_from_distributed", "update weights from distributed")
    if obj.abort_all_requests:
        self.abort_request(abort_all=True)
    try:
        async with _update_hold(self, request):
            results = await self.update_weights_from_distributed_communicator(obj)
            success, message = _merge(results)
            message = _after_update(self, obj, success, message)
    except FencingError as e:
        return False, str(e)
    return success, message


async def _update_weights_from_tensor(self: Any, obj: Any, request: Any = None) -> Any:
    from sglang.srt.utils import normalize_serialized_named_tensor_payloads

    self.auto_create_handle_loop()
    _check_dp("update_weights_from_tensor", "update weights from tensor")
    if obj.abort_all_requests:
        self.abort_request(abort_all=True)
    obj.serialized_named_tensors = normalize_serialized_named_tensor_payloads(
        obj.serialized_named_tensors)
    try:
        async with _update_hold(self, request):
            results = await self.update_weights_from_tensor_communicator(obj)
            success, message = _merge(results)
            message = _after_update(self, obj, success, message)
    except FencingError as e:
        return False, str(e)
    return success, message


async def _update_weights_from_ipc(self: Any, obj: Any, request: Any = None) -> Any:
    self.auto_create_handle_loop()
    try:
        _check_dp("update_weights_from_ipc", "update weights from IPC")
        logger.info("Starting IPC weight update")
        async with _update_hold(self, request):
            results = await self.update_weights_from_ipc_communicator(obj)
            success, message = _merge(results)
            message = _after_update(self, obj, success, message)
    except FencingError as e:
        return False, str(e)
    except Exception as e:
        message = f"IPC weight update failed: {e!s}"
        logger.error(message)
        success = False
    return success, message


async def _begin_weight_update(self: Any, obj: Any, request: Any = None) -> Any:
    """Open an update session: drain (unpaused) or skip the frozen requests
    (paused), pause the gate and pin it until end_weight_update, in any worker."""
    self.auto_create_handle_loop()
    lock = _shared(self)
    ttl = os.environ.get(_sg().ENV_SESSION_TTL)
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


# -- through SGLang's own hook (contrib/sglang/), without patching -------------

class SharedModelUpdateGate:
    """The server's shared lock as SGLang's ``ModelUpdateGate`` (the hook
    contrib/sglang/ proposes upstream): with that change in SGLang,
    ``SGLANG_MODEL_UPDATE_GATE=pyshmlock.integrations.sglang:SharedModelUpdateGate``
    gives every tokenizer process of a server one lock and one pause, with
    no install() and nothing patched.  The same semantics as install()'s
    patches: admission at the shared gate, a pause that holds everywhere, a
    continue that waits for an update or a session, an event-driven
    abort drain, updates under ``update_lock`` (fenced with the fleet's
    token), update sessions, and the segment removed by the last worker.
    (The served-weights record needs install(): SGLang keeps those values
    outside the gate.)"""

    def __init__(self, manager: Any) -> None:
        self.manager = manager
        server = _server(_sg().lock_name(_server_port(manager)))
        self.model_update_lock: SharedModelUpdateLock = server.lock
        self.is_pause_cond = SharedGateCondition(server.lock)
        if threading.current_thread() is threading.main_thread():
            server.lock.notify_closing_on_signals()

    def is_paused(self, local: bool) -> bool:
        return self.model_update_lock.paused

    async def pause(self) -> None:
        self.model_update_lock.pause()

    async def resume(self) -> None:
        await self.model_update_lock.resume()

    async def drain(self) -> None:
        await _drain(self.manager, self.model_update_lock)

    async def run_update(self, call: Callable[[], Awaitable[Any]], request: Any = None,
                         hold_pause: bool = True) -> Any:
        async with _update_hold(self.manager, request):
            return await call()

    async def begin_update_session(self, call: Callable[[], Awaitable[Any]],
                                   request: Any = None) -> Any:
        lock = self.model_update_lock
        ttl = os.environ.get(_sg().ENV_SESSION_TTL)
        token = await (lock.begin_session(float(ttl)) if ttl else lock.begin_session())
        try:
            results = await call()
        except BaseException:
            lock.end_session(token)
            raise
        if not _merge(results)[0]:       # the scheduler opened nothing
            lock.end_session(token)
        return results

    async def end_update_session(self, call: Callable[[], Awaitable[Any]],
                                 request: Any = None) -> Any:
        lock = self.model_update_lock
        async with lock.update_lock:     # granted at once inside a session
            results = await call()
        session = lock.session
        if _merge(results)[0] and session is not None:
            lock.end_session(session.token)
        return results


# -- the served weights: one record per server --------------------------------

_SHARED_CONFIG = ("weight_version", "load_format", "model_path", "served_model_name")


def _config_value(self: Any, name: str) -> Any:
    if name in _SHARED_CONFIG:
        record = _record(self)
        value = record.get(name) if record is not None else None
        if value is not None:
            return value
    return _sg()._original(_TM, "TokenizerManager", "config_value")(self, name)


def _update_model_path_info(self: Any, model_path: str, load_format: str) -> None:
    _sg()._original(_TM, "TokenizerManager", "_update_model_path_info")(
        self, model_path, load_format)
    record = _record(self)
    if record is not None:
        fields = {"model_path": model_path, "served_model_name": model_path}
        if load_format is not None:
            fields["load_format"] = str(load_format)
        record.publish(**fields)


def _update_weight_version_if_provided(self: Any, weight_version: Optional[str]) -> None:
    _sg()._original(_CONTROL, "TokenizerControlMixin", "_update_weight_version_if_provided")(
        self, weight_version)
    record = _record(self)
    if weight_version is not None and record is not None:
        record.publish(weight_version=str(weight_version))


def _served(field: str) -> property:
    """``model_path`` / ``served_model_name`` on a manager: the server's
    record when it has one, else what this manager was told.  SGLang sets
    them as plain attributes; the setter still puts the value in the
    instance's dict (a property comes first on reads), so after
    uninstall() the manager reads its own value again."""
    def get(self: Any) -> Any:
        record = _record(self)
        value = record.get(field) if record is not None else None
        if value is not None:
            return value
        try:
            return self.__dict__[field]
        except KeyError:
            raise AttributeError(field) from None

    def set_(self: Any, value: Any) -> None:
        self.__dict__[field] = value
    return property(get, set_)


#: Attributes install() adds to TokenizerManager (SGLang sets them on the
#: instance; a property on the class reads the server's record first).
ADDED: Tuple[Tuple[str, str, str], ...] = (
    (_TM, "TokenizerManager", "model_path"),
    (_TM, "TokenizerManager", "served_model_name"),
)


def _replacements() -> Dict[Tuple[str, str, str], Any]:
    return {
        (_TM, "TokenizerManager", "init_weight_update"): _init_weight_update,
        (_TM, "TokenizerManager", "is_pause"): property(_is_pause_get, _is_pause_set),
        (_TM, "TokenizerManager", "pause_generation"): _manager_pause,
        (_TM, "TokenizerManager", "continue_generation"): _manager_continue,
        (_TM, "TokenizerManager", "update_weights_from_disk"): _update_weights_from_disk,
        (_TM, "TokenizerManager", "config_value"): _config_value,
        (_TM, "TokenizerManager", "_update_model_path_info"): _update_model_path_info,
        (_CONTROL, "TokenizerControlMixin", "update_weights_from_distributed"):
            _update_weights_from_distributed,
        (_CONTROL, "TokenizerControlMixin", "update_weights_from_tensor"):
            _update_weights_from_tensor,
        (_CONTROL, "TokenizerControlMixin", "update_weights_from_ipc"): _update_weights_from_ipc,
        (_CONTROL, "TokenizerControlMixin", "begin_weight_update"): _begin_weight_update,
        (_CONTROL, "TokenizerControlMixin", "end_weight_update"): _end_weight_update,
        (_CONTROL, "TokenizerControlMixin", "_update_weight_version_if_provided"):
            _update_weight_version_if_provided,
        (_MULTI, "TokenizerWorker", "pause_generation"): _worker_pause,
        (_MULTI, "TokenizerWorker", "continue_generation"): _worker_continue,
        (_MULTI, "TokenizerWorker", "_apply_pause_continue_broadcast"):
            _apply_pause_continue_broadcast,
    }
