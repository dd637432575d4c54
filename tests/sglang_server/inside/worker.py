"""One SGLang TokenizerWorker process behind a small FastAPI app.

The worker is built as SGLang's http_server builds it in each
multi-tokenizer worker (init_multi_tokenizer: the shared arguments, a fresh
tokenizer IPC name, get_tokenizer_worker_class(server_args)(server_args,
port_args)), and the handlers build the same request objects and call the
same TokenizerWorker methods as SGLang 0.5.23's http_server handlers of the
same paths.  http_server itself does not import without a GPU.

Usage: worker.py ARGS HTTP_PORT READY {sglang|pyshmlock|hook}.  With
`pyshmlock`, pyshmlock.integrations.sglang.install() runs first (the lock
name comes from PYSHMLOCK_SGLANG_LOCK); with `hook`, nothing is installed:
an SGLang with contrib/sglang/'s patch builds pyshmlock's gate itself
(SGLANG_MODEL_UPDATE_GATE)."""

import os
import sys
import tempfile
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Dict

import boot

STATE: Dict[str, Any] = {}


def build_worker(args: Dict[str, Any]) -> Any:
    from sglang.srt.managers.multi_tokenizer_mixin import get_tokenizer_worker_class
    from sglang.srt.managers.tokenizer_manager import ServerStatus

    server_args, port_args = args["server_args"], args["port_args"]
    boot.publish_args(server_args, role="tokenizer")
    port_args.tokenizer_ipc_name = f"ipc://{tempfile.NamedTemporaryFile(delete=False).name}"
    worker = get_tokenizer_worker_class(server_args)(server_args, port_args)
    worker.max_req_input_len = args["scheduler_info"]["max_req_input_len"]
    worker.set_startup_time(args["scheduler_info"]["startup_time"])
    # --skip-server-warmup: what _wait_and_warmup does then.
    worker.server_status = ServerStatus.Up
    return worker


def make_app(args: Dict[str, Any], ready_path: str, backend: str) -> Any:
    from typing import Annotated

    from fastapi import Body, FastAPI, Request, Response
    from fastapi.responses import ORJSONResponse
    from sglang.srt.managers import io_struct as io

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        STATE["tm"] = build_worker(args)
        gate = getattr(STATE["tm"], "model_update_gate", None)
        if backend == "hook":
            from pyshmlock.integrations import sglang as integration

            assert not integration.installed(), "the hook backend must patch nothing"
            assert type(gate).__name__ == "SharedModelUpdateGate", type(gate)
        boot.write_ready(ready_path, ipc=STATE["tm"].tokenizer_ipc_name, backend=backend,
                         gate=type(gate).__module__ + "." + type(gate).__name__)
        yield

    app = FastAPI(lifespan=lifespan)

    def tm() -> Any:
        return STATE["tm"]

    @app.get("/ready")
    async def ready() -> Response:
        return Response(status_code=200 if tm().is_ready() else 503)

    @app.get("/worker_state")
    async def worker_state() -> Dict[str, Any]:
        lock = tm().model_update_lock
        if hasattr(lock, "info"):        # the shared lock: this process's read holds
            readers = lock.info().readers.get(os.getpid(), 0)
        else:                            # SGLang's RWLock
            readers = lock._readers
        return {"pid": os.getpid(), "is_pause": tm().is_pause, "ready": tm().is_ready(),
                "readers": readers,
                "ipc": tm().tokenizer_ipc_name, "backend": backend,
                "lock": type(lock).__module__ + "." + type(lock).__name__}

    @app.api_route("/generate", methods=["POST", "PUT"])
    async def generate_request(obj: io.GenerateReqInput, request: Request) -> Any:
        try:
            ret = await tm().generate_request(obj, request).__anext__()
            return ORJSONResponse(ret)
        except ValueError as e:
            return ORJSONResponse({"error": {"message": str(e)}}, status_code=400)

    @app.post("/pause_generation")
    async def pause_generation(obj: Annotated[io.PauseGenerationReqInput, Body()],
                               request: Request) -> Any:
        await tm().pause_generation(obj)
        return ORJSONResponse({"message": "Generation paused successfully.", "status": "ok"})

    @app.post("/continue_generation")
    async def continue_generation(obj: Annotated[io.ContinueGenerationReqInput, Body()],
                                  request: Request) -> Any:
        await tm().continue_generation(obj)
        return ORJSONResponse({"message": "Generation continued successfully.",
                               "status": "ok"})

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(obj: Annotated[io.UpdateWeightFromDiskReqInput, Body()],
                                       request: Request) -> Any:
        success, message, num_paused_requests = await tm().update_weights_from_disk(
            obj, request)
        content = {"success": success, "message": message,
                   "num_paused_requests": num_paused_requests}
        return ORJSONResponse(content, status_code=200 if success else 400)

    @app.post("/update_weights_from_tensor")
    async def update_weights_from_tensor(
            obj: Annotated[io.UpdateWeightsFromTensorReqInput, Body()],
            request: Request) -> Any:
        success, message = await tm().update_weights_from_tensor(obj, request)
        return ORJSONResponse({"success": success, "message": message},
                              status_code=200 if success else 400)

    @app.get("/model_info")
    async def model_info() -> Dict[str, Any]:
        # SGLang's /model_info (and deprecated /get_model_info): the fields a
        # client reads the served weights from, read the same way.
        return {"model_path": tm().model_path, "served_model_name": tm().served_model_name,
                "weight_version": tm().config_value("weight_version"),
                "load_format": tm().config_value("load_format")}

    @app.post("/update_weight_version")
    async def update_weight_version(obj: Annotated[io.UpdateWeightVersionReqInput, Body()],
                                    request: Request) -> Any:
        if obj.abort_all_requests:
            tm().abort_request(abort_all=True)
        try:
            await tm().update_weight_version(obj)
            return ORJSONResponse({"success": True, "new_version": obj.new_version,
                                   "message": f"Weight version updated to {obj.new_version}"})
        except Exception as e:
            return ORJSONResponse({"success": False,
                                   "message": f"Failed to update weight version: {e!s}"},
                                  status_code=400)

    @app.post("/begin_weight_update")
    async def begin_weight_update(obj: Annotated[io.BeginWeightUpdateReqInput, Body()],
                                  request: Request) -> Any:
        success, message = await tm().begin_weight_update(obj, request)
        return ORJSONResponse({"success": success, "message": message},
                              status_code=200 if success else 400)

    @app.post("/end_weight_update")
    async def end_weight_update(obj: Annotated[io.EndWeightUpdateReqInput, Body()],
                                request: Request) -> Any:
        success, message = await tm().end_weight_update(obj, request)
        return ORJSONResponse({"success": success, "message": message},
                              status_code=200 if success else 400)

    return app


def main() -> None:
    args_path, port, ready_path, backend = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    if backend == "pyshmlock":
        from pyshmlock.integrations import sglang as integration

        integration.install()
    elif backend == "hook":             # SGLang's own hook picks the gate: nothing patched
        from sglang.srt.managers import model_update_gate  # noqa: F401  (the patched SGLang)
    elif backend != "sglang":
        raise SystemExit(f"unknown backend {backend!r}")
    import uvicorn

    app = make_app(boot.load_args(args_path), ready_path, backend)
    # uvloop, as SGLang runs its workers; a bounded graceful shutdown.
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", loop="uvloop",
                timeout_graceful_shutdown=2)


if __name__ == "__main__":
    main()
