"""A scheduler stand-in on SGLang's real ZMQ sockets and message types.

It receives what the router forwards (tokenized requests, aborts, pause and
continue, weight updates and update sessions) with SGLang's sock_recv, and
answers as SGLang's scheduler does: tokens stream back as BatchStrOutput to
the router's detokenizer-side socket, control outputs carry the request's
http_worker_ipc.  Tokens come at TOKENS_PER_SECOND per request.

It keeps the evidence the tests judge: for every generated token, the weight
version in effect and whether an update (or an update session) was loading
weights at that moment; for every request, when it was admitted.  A token
generated on half-loaded weights, or a request that saw two versions, is
there to be found.

Usage: standin.py ARGS CONTROL_PORT READY.  GET /stats, POST /reset and
POST /config (update durations) on 127.0.0.1:CONTROL_PORT."""

import json
import sys
import threading
import time
from array import array
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Optional

import boot

TOKENS_PER_SECOND = 100.0


class Request:
    def __init__(self, rid: str, ipc: str, max_new_tokens: int, prompt_tokens: int) -> None:
        self.rid = rid
        self.ipc = ipc
        self.max_new_tokens = max_new_tokens
        self.prompt_tokens = prompt_tokens
        self.generated = 0
        self.versions: List[int] = []
        self.mid_update = 0
        self.retractions = 0
        self.admitted_at = time.time()
        self.next_token_at = time.monotonic()


class Scheduler:
    def __init__(self, args: Dict[str, Any]) -> None:
        import zmq
        from sglang.srt.utils.network import get_zmq_socket

        port_args = args["port_args"]
        self.context = zmq.Context(2)
        self.recv = get_zmq_socket(self.context, zmq.PULL, port_args.scheduler_input_ipc_name,
                                   False)
        self.send = get_zmq_socket(self.context, zmq.PUSH, port_args.tokenizer_ipc_name, False)
        self.mu = threading.Lock()
        self.update_seconds = 0.5
        self.step_seconds = 0.3
        self.reset()

    def reset(self) -> None:
        with self.mu:
            self.running: Dict[str, Request] = {}
            self.finished: List[Dict[str, Any]] = []
            self.paused: Optional[str] = None
            self.version = 0
            self.loading = 0           # updates loading weights now (0 or 1)
            self.session: Optional[Dict[str, Any]] = None
            self.pending: List[Any] = []   # (due, callback)
            self.events: List[Any] = []
            self.tokens_while_loading = 0

    # -- evidence --------------------------------------------------------

    def stats(self) -> Dict[str, Any]:
        with self.mu:
            return {
                "version": self.version, "paused": self.paused,
                "loading": self.loading, "session": self.session is not None,
                "running": [self._record(r) for r in self.running.values()],
                "finished": list(self.finished),
                "events": list(self.events),
                "tokens_while_loading": self.tokens_while_loading,
            }

    @staticmethod
    def _record(r: Request) -> Dict[str, Any]:
        return {"rid": r.rid, "ipc": r.ipc, "admitted_at": r.admitted_at,
                "tokens": r.generated, "versions": sorted(set(r.versions)),
                "mid_update": r.mid_update, "retractions": r.retractions}

    def _event(self, what: str, **fields: Any) -> None:
        self.events.append({"t": time.time(), "what": what, **fields})

    # -- the loop --------------------------------------------------------

    def run(self) -> None:
        import zmq
        from sglang.srt.managers.io_struct import sock_recv

        poller = zmq.Poller()
        poller.register(self.recv, zmq.POLLIN)
        while True:
            if dict(poller.poll(timeout=2)):
                while True:
                    try:
                        obj = sock_recv(self.recv, zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    with self.mu:
                        self.handle(obj)
            with self.mu:
                self.run_due()
                self.generate()

    def reply(self, output: Any, request: Any) -> None:
        from sglang.srt.managers.io_struct import sock_send

        output.http_worker_ipc = request.http_worker_ipc
        sock_send(self.send, output)

    def handle(self, obj: Any) -> None:
        from sglang.srt.managers import io_struct as io

        if isinstance(obj, io.TokenizedGenerateReqInput):
            self.admit(obj)
        elif isinstance(obj, io.BatchTokenizedGenerateReqInput):
            for one in obj.batch:
                self.admit(one)
        elif isinstance(obj, io.AbortReq):
            self.abort(obj)
        elif isinstance(obj, io.PauseGenerationReqInput):
            self.paused = obj.mode
            self._event("pause", mode=obj.mode)
            if obj.mode == "retract":
                for r in self.running.values():
                    r.retractions += 1
        elif isinstance(obj, io.ContinueGenerationReqInput):
            self.paused = None
            self._event("continue")
            now = time.monotonic()
            for r in self.running.values():
                r.next_token_at = now
        elif isinstance(obj, io.UpdateWeightFromDiskReqInput):
            self.load_weights(obj, self.update_seconds, io.UpdateWeightFromDiskReqOutput,
                              whole=True)
        elif isinstance(obj, io.UpdateWeightVersionReqInput):
            # SGLang's scheduler records the label for the tokens it stamps
            # and answers; the tokenizer side records it on its own.
            self._event("weight_version", new_version=obj.new_version)
            self.reply(io.UpdateWeightVersionReqOutput(), obj)
        elif isinstance(obj, io.BeginWeightUpdateReqInput):
            if self.session is not None:
                self.reply(io.BeginWeightUpdateReqOutput(
                    success=False, message="a weight-update session is already open"), obj)
                return
            # Opening a session restores packed weights: from here until the
            # end, the weights are not a servable version.
            self.session = {"steps": 0}
            self._event("begin")
            self.reply(io.BeginWeightUpdateReqOutput(success=True, message="Success"), obj)
        elif isinstance(obj, io.UpdateWeightsFromTensorReqInput):
            if self.session is None:
                self.reply(io.UpdateWeightsFromTensorReqOutput(
                    success=False, message="update_weights_from_tensor must run between "
                    "begin_weight_update() and end_weight_update()"), obj)
                return
            self.load_weights(obj, self.step_seconds, io.UpdateWeightsFromTensorReqOutput,
                              whole=False)
        elif isinstance(obj, io.EndWeightUpdateReqInput):
            if self.session is None:
                self.reply(io.EndWeightUpdateReqOutput(
                    success=False, message="no weight-update session is open"), obj)
                return
            self.session = None
            self.version += 1
            self._event("end", version=self.version)
            self.reply(io.EndWeightUpdateReqOutput(success=True, message="Success"), obj)
        else:
            self._event("ignored", type=type(obj).__name__)

    def load_weights(self, obj: Any, seconds: float, output: Any, whole: bool) -> None:
        self.loading += 1
        self._event("load_start", whole=whole, ipc=obj.http_worker_ipc)

        def done() -> None:
            self.loading -= 1
            if whole:
                self.version += 1
            else:
                self.session["steps"] += 1  # type: ignore[index]
            self._event("load_end", whole=whole, version=self.version)
            kwargs: Dict[str, Any] = {"success": True, "message": "Succeeded to update weights."}
            self.reply(output(**kwargs), obj)

        self.pending.append((time.monotonic() + seconds, done))

    def run_due(self) -> None:
        now = time.monotonic()
        due = [p for p in self.pending if p[0] <= now]
        self.pending = [p for p in self.pending if p[0] > now]
        for _, callback in due:
            callback()

    def admit(self, obj: Any) -> None:
        params = obj.sampling_params
        max_new = int(getattr(params, "max_new_tokens", None) or 16)
        req = Request(obj.rid, obj.http_worker_ipc, max_new, len(obj.input_ids or ()))
        self.running[obj.rid] = req
        self._event("admit", rid=obj.rid, paused=self.paused)

    def abort(self, obj: Any) -> None:
        rids = list(self.running) if obj.abort_all else (
            [r for r in self.running if r.startswith(obj.rid)] if obj.rid else [])
        finished = [self.running.pop(rid) for rid in rids]
        reason = {"type": "abort", "message": "Abort in waiting queue", "status_code": 400,
                  "err_type": None}
        self.emit(finished, [reason] * len(finished), tokens=False)

    def generate(self) -> None:
        if self.paused is not None or not self.running:
            return
        now = time.monotonic()
        step, done, reasons = [], [], []
        for r in list(self.running.values()):
            if r.next_token_at > now:
                continue
            r.next_token_at += 1.0 / TOKENS_PER_SECOND
            r.generated += 1
            r.versions.append(self.version)
            if self.loading or self.session is not None:
                r.mid_update += 1
                self.tokens_while_loading += 1
            step.append(r)
            if r.generated >= r.max_new_tokens:
                self.running.pop(r.rid)
                done.append(r)
        finished_rids = {r.rid for r in done}
        reasons = [{"type": "length", "length": r.generated} if r.rid in finished_rids else None
                   for r in step]
        self.emit(step, reasons, tokens=True)

    def emit(self, reqs: List[Request], reasons: List[Any], tokens: bool) -> None:
        from sglang.srt.managers.io_struct import BatchStrOutput, sock_send

        if not reqs:
            return
        for r, reason in zip(reqs, reasons):
            if reason is not None:
                record = self._record(r)
                record.update(finished_at=time.time(), reason=reason["type"])
                self.finished.append(record)
        n = len(reqs)
        none = [None] * n
        out = BatchStrOutput(
            rids=[r.rid for r in reqs], http_worker_ipcs=[r.ipc for r in reqs],
            finished_reasons=reasons,
            output_strs=[" token" if tokens else "" for _ in reqs],
            output_ids=[array("l", [7] if tokens else []) for _ in reqs],
            prompt_tokens=[r.prompt_tokens for r in reqs],
            completion_tokens=[r.generated for r in reqs],
            reasoning_tokens=[0] * n, cached_tokens=[0] * n,
            input_token_logprobs_val=none, input_token_logprobs_idx=none,
            output_token_logprobs_val=none, output_token_logprobs_idx=none,
            input_top_logprobs_val=none, input_top_logprobs_idx=none,
            output_top_logprobs_val=none, output_top_logprobs_idx=none,
            input_token_ids_logprobs_val=none, input_token_ids_logprobs_idx=none,
            output_token_ids_logprobs_val=none, output_token_ids_logprobs_idx=none,
            output_token_entropy_val=None, output_token_sampling_mask=None,
            output_hidden_states=none, routed_experts=None, indexer_topk=None,
            placeholder_tokens_idx=None, placeholder_tokens_val=None,
            retraction_counts=[r.retractions for r in reqs],
        )
        sock_send(self.send, out)


def serve_control(scheduler: Scheduler, port: int) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _json(self, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._json(scheduler.stats())

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            if self.path == "/reset":
                scheduler.reset()
            elif self.path == "/config":
                with scheduler.mu:
                    scheduler.update_seconds = float(body.get("update_seconds",
                                                              scheduler.update_seconds))
                    scheduler.step_seconds = float(body.get("step_seconds",
                                                            scheduler.step_seconds))
            self._json({"ok": True})

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main() -> None:
    args = boot.load_args(sys.argv[1])
    boot.publish_args(args["server_args"], role="scheduler")
    scheduler = Scheduler(args)
    serve_control(scheduler, int(sys.argv[2]))
    boot.write_ready(sys.argv[3])
    scheduler.run()


if __name__ == "__main__":
    main()
