"""Processes of one SGLang server under test: SGLang's MultiTokenizerRouter,
the scheduler stand-in, and TokenizerWorker processes (4, plus any a
scenario starts), each in the SGLang venv, each with its own HTTP port.

Every wait is bounded; stop() ends exactly the processes started here (by
pid), removes the pyshmlock segment and the IPC files, and runs even when a
start failed half-way."""

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Dict, List, Optional

import httpx

INSIDE = Path(__file__).resolve().parent / "inside"
START_TIMEOUT = 240.0
NAMES = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Proc:
    def __init__(self, name: str, popen: "subprocess.Popen[bytes]", ready: Path,
                 log: Path, port: Optional[int] = None) -> None:
        self.name, self.popen, self.ready, self.log, self.port = name, popen, ready, log, port

    @property
    def pid(self) -> int:
        return self.popen.pid

    def ready_info(self) -> Dict[str, Any]:
        info: Dict[str, Any] = json.loads(self.ready.read_text())
        return info

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""


class Server:
    """One server: backend "sglang" (SGLang's own locks), "pyshmlock"
    (pyshmlock.integrations.sglang installed in every worker) or "hook"
    (an SGLang with contrib/sglang/'s patch, its SGLANG_MODEL_UPDATE_GATE
    naming pyshmlock's gate; nothing installed, nothing patched)."""

    GATE = "pyshmlock.integrations.sglang:SharedModelUpdateGate"

    def __init__(self, backend: str, venv: Path) -> None:
        self.backend = backend
        self.python = str(venv / "bin" / "python")
        self.dir = Path(tempfile.mkdtemp(prefix=f"sglang-{backend}-"))
        self.lock_name = f"sglang-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.procs: List[Proc] = []
        self.workers: List[Proc] = []
        self.standin: Optional[Proc] = None
        self.port_args: Any = None
        self.timings: Dict[str, float] = {}
        self.ended: set = set()          # pids ended on purpose

    @property
    def shared(self) -> bool:
        """Whether the workers share pyshmlock's lock (installed or through the hook)."""
        return self.backend in ("pyshmlock", "hook")

    # -- processes -----------------------------------------------------

    def _env(self) -> Dict[str, str]:
        env = dict(os.environ)
        # tests/conftest.py sets PYTHONSAFEPATH for the main suite; these
        # scripts import their neighbours (boot, gpu_stubs) from sys.path[0].
        env.pop("PYTHONSAFEPATH", None)
        env.update(PYTHONUNBUFFERED="1", PYSHMLOCK_SGLANG_LOCK=self.lock_name,
                   CUDA_VISIBLE_DEVICES="", TOKENIZERS_PARALLELISM="false",
                   HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                   PYTHONWARNINGS="ignore",
                   # SGLang names its IPC sockets with NamedTemporaryFile: keep
                   # them, and the ones it creates and drops, in this server's dir.
                   TMPDIR=str(self.dir))
        if self.backend == "hook":
            env["SGLANG_MODEL_UPDATE_GATE"] = self.GATE
        return env

    def _spawn(self, name: str, script: str, *args: str, port: Optional[int] = None,
               env: Optional[Dict[str, str]] = None) -> Proc:
        ready = self.dir / f"{name}.ready"
        log = self.dir / f"{name}.log"
        with open(log, "wb") as out:
            popen = subprocess.Popen([self.python, str(INSIDE / script), *args],
                                     stdout=out, stderr=subprocess.STDOUT, cwd=INSIDE,
                                     env={**self._env(), **(env or {})},
                                     stdin=subprocess.DEVNULL)
        proc = Proc(name, popen, ready, log, port)
        self.procs.append(proc)
        return proc

    def _wait_ready(self, procs: List[Proc], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for proc in procs:
            while not proc.ready.exists():
                if proc.popen.poll() is not None:
                    raise RuntimeError(f"{proc.name} exited ({proc.popen.returncode}):\n"
                                       f"{proc.log_tail()}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{proc.name} not ready in {timeout:.0f} s:\n"
                                       f"{proc.log_tail()}")
                time.sleep(0.1)

    def start(self, workers: int = 4) -> None:
        t0 = time.monotonic()
        args = str(self.dir / "args.pkl")
        done = subprocess.run([self.python, str(INSIDE / "make_args.py"), str(self.dir / "model"),
                               str(free_port()), args], cwd=INSIDE, env=self._env(),
                              capture_output=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"make_args failed:\n{done.stdout[-3000:]!r}\n"
                               f"{done.stderr[-3000:]!r}")
        self.args = args
        self.timings["args_s"] = time.monotonic() - t0
        t1 = time.monotonic()
        router = self._spawn("router", "router.py", args, str(self.dir / "router.ready"))
        self.standin_port = free_port()
        self.standin = self._spawn("standin", "standin.py", args, str(self.standin_port),
                                   str(self.dir / "standin.ready"))
        self._wait_ready([router, self.standin], START_TIMEOUT)
        for _ in range(workers):
            self.start_worker(wait=False)
        self._wait_ready(self.workers, START_TIMEOUT)
        self.timings["workers_start_s"] = time.monotonic() - t1
        # A TokenizerWorker reads the router's pause/continue broadcasts only
        # once its handle loop runs, which SGLang 0.5.23 starts at the first
        # request it serves: a worker that served none never applies a pause
        # and hangs in /pause_generation.  A served server is what the
        # scenarios are about, so every worker serves one request first.
        for w in self.workers:
            self.warm_up(w)

    def start_worker(self, wait: bool = True, lock_name: Optional[str] = None) -> Proc:
        """Start one more worker; `lock_name` gives it a lock of its own
        (PYSHMLOCK_SGLANG_LOCK) instead of the server's."""
        index = len(self.workers)
        port = free_port()
        name = f"worker-{NAMES[index]}"
        env = None if lock_name is None else {"PYSHMLOCK_SGLANG_LOCK": lock_name}
        proc = self._spawn(name, "worker.py", self.args, str(port),
                           str(self.dir / f"{name}.ready"), self.backend, port=port, env=env)
        self.workers.append(proc)
        if wait:
            self._wait_ready([proc], START_TIMEOUT)
        return proc

    def stop_worker(self, worker: Proc, timeout: float = 8.0) -> None:
        """End a worker a scenario started (it stays in the list, dead):
        SIGTERM, then SIGKILL after `timeout` seconds."""
        self.ended.add(worker.pid)
        if worker.popen.poll() is None:
            worker.popen.terminate()
            try:
                worker.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill(worker)

    def name_of(self, worker: Proc) -> str:
        return NAMES[self.workers.index(worker)]

    def warm_up(self, worker: Proc) -> None:
        r = httpx.post(self.url(worker, "/generate"), timeout=30,
                       json={"text": "hello", "sampling_params": {"max_new_tokens": 1}})
        r.raise_for_status()

    def url(self, worker: Proc, path: str) -> str:
        return f"http://127.0.0.1:{worker.port}{path}"

    def kill(self, proc: Proc) -> None:
        self.ended.add(proc.pid)
        if proc.popen.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.popen.wait(timeout=10)

    def stop(self) -> None:
        for proc in self.procs:          # a process that died by itself: show why
            if proc.popen.poll() is not None and proc.pid not in self.ended:
                sys.stderr.write(f"--- {proc.name} exited {proc.popen.returncode}:\n"
                                 f"{proc.log_tail()}\n")
        for proc in reversed(self.procs):
            if proc.popen.poll() is None:
                proc.popen.terminate()
        deadline = time.monotonic() + 8
        for proc in self.procs:
            try:
                proc.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill(proc)
        self._remove_files()

    def _remove_files(self) -> None:
        ipcs: List[str] = []
        for proc in self.procs:
            try:
                ipc = proc.ready_info().get("ipc")
            except (OSError, ValueError):
                ipc = None
            if ipc:
                ipcs.append(ipc)
        # The router's and the stand-in's sockets (PortArgs) are in self.dir
        # (TMPDIR), removed with it below.
        for ipc in ipcs:
            try:
                os.unlink(ipc[len("ipc://"):])
            except OSError:
                pass
        try:
            import pyshmlock

            pyshmlock.unlink(self.lock_name, force=True)
        except (FileNotFoundError, OSError):
            pass
        import shutil

        if os.environ.get("PYSHMLOCK_SGLANG_KEEP_LOGS") == "1":
            sys.stderr.write(f"logs kept in {self.dir}\n")
            return
        shutil.rmtree(self.dir, ignore_errors=True)
