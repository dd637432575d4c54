"""Start of every process of the harness that imports SGLang: the GPU-only
imports stubbed (gpu_stubs), and the pickled server arguments."""

import os
import pickle
import sys
from typing import Any, Dict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import gpu_stubs  # noqa: F401  (before any SGLang import)


def load_args(path: str) -> Dict[str, Any]:
    with open(path, "rb") as f:
        args: Dict[str, Any] = pickle.load(f)
    return args


def publish_args(server_args: Any, role: str) -> None:
    from sglang.srt.runtime_context import publish

    publish(server_args, role=role)


def write_ready(path: str, **fields: Any) -> None:
    import json

    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"pid": os.getpid(), **fields}, f)
    os.replace(tmp, path)
