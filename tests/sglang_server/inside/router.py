"""SGLang's MultiTokenizerRouter, alone in its process, as in a server
with --tokenizer-worker-num > 1 (usage: router.py ARGS READY)."""

import signal
import sys
import threading

import boot


def main() -> None:
    args = boot.load_args(sys.argv[1])
    boot.publish_args(args["server_args"], role="tokenizer")
    from sglang.srt.managers.multi_tokenizer_mixin import MultiTokenizerRouter

    router = MultiTokenizerRouter(args["server_args"], args["port_args"])
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    boot.write_ready(sys.argv[2], router=type(router).__name__)
    stop.wait()
    router.socket_mapping.clear_all_sockets()


if __name__ == "__main__":
    main()
