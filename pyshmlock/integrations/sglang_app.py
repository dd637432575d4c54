"""The app SGLang's multi-tokenizer workers import under the launcher
(``SGLANG_HTTP_SERVER_APP_PATH=pyshmlock.integrations.sglang_app:app``):
installs the integration in the worker, then hands over the app that would
have run (``PYSHMLOCK_SGLANG_APP_PATH``, default SGLang's own)."""

import importlib
import os
from typing import Any

from .sglang import DEFAULT_APP_PATH, ENV_APP_PATH, INTEGRATED_APP_PATH, install

install()

_target = os.environ.get(ENV_APP_PATH) or DEFAULT_APP_PATH
if _target == INTEGRATED_APP_PATH:
    _target = DEFAULT_APP_PATH
_module, _, _attr = _target.partition(":")
app: Any = getattr(importlib.import_module(_module), _attr or "app")
