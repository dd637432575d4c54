"""A simulated server's control endpoint, as frameworks drive servers today:
``POST /pause_generation`` and ``POST /continue_generation`` over HTTP, one
server at a time (the "HTTP fan-out").  Used by ``pyshmlock cluster-demo``.

``python -m pyshmlock_lab.cluster.fanout LOCK PORTFILE``: serves on a free
127.0.0.1 port, written to PORTFILE; a restarted server starts with a fresh,
unpaused lock, like a restarted SGLang server with its in-process flag.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List

from pyshmlock.lock import RWLock, unlink


def main(argv: List[str]) -> int:
    name, portfile = argv[0], argv[1]
    try:
        unlink(name, force=True)            # a restarted server starts afresh
    except FileNotFoundError:
        pass
    lock = RWLock(name)

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a: object) -> None:
            pass

        def _reply(self, body: Dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            n = int(self.headers.get("content-length") or 0)
            if n:
                self.rfile.read(min(n, 65536))
            if self.path == "/pause_generation":
                lock.pause()
                self._reply({"paused": True})
            elif self.path == "/continue_generation":
                self._reply({"resumed": bool(lock.resume(timeout=5))})
            else:
                self.send_error(404)

        def do_GET(self) -> None:
            if self.path == "/health":
                self._reply({"paused": lock.paused, "pid": os.getpid()})
            else:
                self.send_error(404)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    srv.daemon_threads = True
    srv.handle_error = lambda *a: None  # type: ignore[method-assign]  # a client that gave up
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=srv.shutdown).start())
    tmp = portfile + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(srv.server_address[1]))
    os.replace(tmp, portfile)
    srv.serve_forever(poll_interval=0.1)
    lock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
