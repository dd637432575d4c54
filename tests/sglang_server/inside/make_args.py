"""Write the server's arguments for the router, the workers and the
scheduler stand-in: SGLang's own ServerArgs and PortArgs for a tiny local
model, with --tokenizer-worker-num 4 (usage: make_args.py DIR PORT OUT)."""

import pickle
import sys
import time

import boot  # noqa: F401
import tiny_model


def main() -> None:
    model_dir, port, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    from sglang.srt.server_args import PortArgs, ServerArgs

    tiny_model.build(model_dir)
    server_args = ServerArgs(model_path=model_dir, tokenizer_worker_num=4, device="cpu",
                             port=port, skip_server_warmup=True)
    port_args = PortArgs.init_new(server_args)
    scheduler_info = {"max_req_input_len": 4000, "startup_time": {"created": time.time()}}
    with open(out, "wb") as f:
        pickle.dump({"server_args": server_args, "port_args": port_args,
                     "scheduler_info": scheduler_info}, f)
    print(port_args)


if __name__ == "__main__":
    main()
