"""Everything pyshmlock.integrations.sglang relies on in SGLang, and how
each is checked without running SGLang.

A target is one thing the integration replaces, calls, reads or counts on:
a method a class defines itself, a settable property, a module function, a
communicator built from ``_COMMUNICATOR_SPECS``, an attribute a method
sets, a request field, an argument ``http_server`` passes, a setting of
SGLang's.  ``check_all()`` looks at each one (importing the tokenizer side,
never ``http_server``: that is parsed, since it does not import on a
machine without a GPU) and says whether it is there.

Replaced bodies are also fingerprinted: a hash of the source of each method
the integration replaces whole, per tested release (``FINGERPRINTS``).  A
build whose version is listed but whose bodies differ (a branch build, a
patched wheel) is told apart from the release: an upstream fix to a
replaced body would be silently dropped, so it is refused like an untested
release."""

import ast
import hashlib
import importlib
import importlib.util
import inspect
import textwrap
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Set, Tuple

TM = "sglang.srt.managers.tokenizer_manager"
CONTROL = "sglang.srt.managers.tokenizer_control_mixin"
MULTI = "sglang.srt.managers.multi_tokenizer_mixin"
IO = "sglang.srt.managers.io_struct"
HTTP = "sglang.srt.entrypoints.http_server"


class Target(NamedTuple):
    kind: str       # method | property | function | communicator | sets | field | passes | setting
    module: str
    owner: str      # a class name, or "" for a module-level name
    name: str
    needed: bool = True     # False: only chooses how the launcher works

    def __str__(self) -> str:
        where = f"{self.module}.{self.owner}" if self.owner else self.module
        if self.kind == "sets":
            method, stored = self.name.split(":")
            return f"{where}.{method} sets self.{stored}"
        return where + {
            "communicator": f"._COMMUNICATOR_SPECS: {self.name}_communicator",
            "field": f".{self.name} (request field)",
            "passes": f": {self.name}(obj, request)",
            "setting": f".envs.{self.name}",
            "property": f".{self.name} (settable property)",
        }.get(self.kind, f".{self.name}")


def _methods(module: str, owner: str, *names: str) -> List[Target]:
    return [Target("method", module, owner, n) for n in names]


#: Methods install() replaces (whole, or around SGLang's own).
PATCHED: Tuple[Tuple[str, str, str], ...] = (
    (TM, "TokenizerManager", "init_weight_update"),
    (TM, "TokenizerManager", "is_pause"),
    (TM, "TokenizerManager", "pause_generation"),
    (TM, "TokenizerManager", "continue_generation"),
    (TM, "TokenizerManager", "update_weights_from_disk"),
    (TM, "TokenizerManager", "config_value"),
    (TM, "TokenizerManager", "_update_model_path_info"),
    (CONTROL, "TokenizerControlMixin", "update_weights_from_distributed"),
    (CONTROL, "TokenizerControlMixin", "update_weights_from_tensor"),
    (CONTROL, "TokenizerControlMixin", "update_weights_from_ipc"),
    (CONTROL, "TokenizerControlMixin", "begin_weight_update"),
    (CONTROL, "TokenizerControlMixin", "end_weight_update"),
    (CONTROL, "TokenizerControlMixin", "_update_weight_version_if_provided"),
    (MULTI, "TokenizerWorker", "pause_generation"),
    (MULTI, "TokenizerWorker", "continue_generation"),
    (MULTI, "TokenizerWorker", "_apply_pause_continue_broadcast"),
)

#: Of those, the ones whose body the integration replaces whole (the rest
#: run SGLang's own body and add around it): fingerprinted per release.
REPLACED: Tuple[Tuple[str, str, str], ...] = (
    (TM, "TokenizerManager", "update_weights_from_disk"),
    (CONTROL, "TokenizerControlMixin", "update_weights_from_distributed"),
    (CONTROL, "TokenizerControlMixin", "update_weights_from_tensor"),
    (CONTROL, "TokenizerControlMixin", "update_weights_from_ipc"),
    (CONTROL, "TokenizerControlMixin", "begin_weight_update"),
    (CONTROL, "TokenizerControlMixin", "end_weight_update"),
    (MULTI, "TokenizerWorker", "pause_generation"),
    (MULTI, "TokenizerWorker", "continue_generation"),
    (MULTI, "TokenizerWorker", "_apply_pause_continue_broadcast"),
)

_UPDATE_FIELDS = ("abort_all_requests", "flush_cache", "weight_version")

TARGETS: Tuple[Target, ...] = tuple(
    [Target("property" if a == "is_pause" else "method", m, c, a) for m, c, a in PATCHED]
    # what the replacements call on a manager
    + _methods(TM, "TokenizerManager", "_wait_for_model_update_from_disk", "abort_request",
               "auto_create_handle_loop", "record_config_updates")
    + _methods(MULTI, "TokenizerWorker", "_handle_pause_continue_broadcast")
    + [Target("method", TM, "TokenizerManager", "_dispatch_to_scheduler"),
       Target("function", "sglang.srt.runtime_context", "", "get_parallel"),
       Target("function", "sglang.srt.runtime_context", "", "get_serving"),
       Target("method", "sglang.srt.managers.communicator", "FanOutCommunicator",
              "merge_results"),
       Target("function", "sglang.srt.utils", "", "normalize_serialized_named_tensor_payloads")]
    + [Target("communicator", CONTROL, "", n) for n in (
        "update_weights_from_distributed", "update_weights_from_tensor",
        "update_weights_from_ipc", "begin_weight_update", "end_weight_update")]
    + [Target("sets", TM, "TokenizerManager", "init_tokenizer_and_processor:mm_processor"),
       Target("sets", TM, "TokenizerManager", "init_model_config:model_path"),
       Target("sets", TM, "TokenizerManager", "init_model_config:served_model_name")]
    # the request fields the update bodies read
    + [Target("field", IO, "UpdateWeightFromDiskReqInput", f)
       for f in _UPDATE_FIELDS + ("load_format", "model_path")]
    + [Target("field", IO, "UpdateWeightsFromDistributedReqInput", f) for f in _UPDATE_FIELDS]
    + [Target("field", IO, "UpdateWeightsFromTensorReqInput", f)
       for f in _UPDATE_FIELDS + ("serialized_named_tensors",)]
    + [Target("field", IO, "UpdateWeightsFromIPCReqInput", f)
       for f in ("flush_cache", "weight_version")]
    + [Target("field", IO, "PauseGenerationReqInput", "mode"),
       Target("field", IO, "PauseContinueBroadcastReq", "is_pause")]
    # http_server hands the request to every update call (the fence header)
    + [Target("passes", HTTP, "", n) for n in (
        "update_weights_from_disk", "update_weights_from_distributed",
        "update_weights_from_tensor", "update_weights_from_ipc",
        "begin_weight_update", "end_weight_update")]
    + [Target("setting", "sglang.srt.environ", "", "SGLANG_HTTP_SERVER_APP_PATH", needed=False)]
)


class Found(NamedTuple):
    target: Target
    present: bool
    detail: str = ""


def _class(module: str, owner: str) -> type:
    cls = getattr(importlib.import_module(module), owner, None)
    if not isinstance(cls, type):
        raise LookupError(f"no class {owner}")
    return cls


def code_names(fn: Any) -> Set[str]:
    """Every name a function's code (and the code nested in it) refers to."""
    code = getattr(inspect.unwrap(fn), "__code__", None)
    names: Set[str] = set()
    stack = [code] if code is not None else []
    while stack:
        c = stack.pop()
        names.update(c.co_names)
        stack.extend(k for k in c.co_consts if hasattr(k, "co_names"))
    return names


def _passes_request(source: str, method: str) -> str:
    """"" if ``http_server`` calls ``<x>.method(..., request)``, else why not."""
    called = False
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == method):
            called = True
            if any(isinstance(a, ast.Name) and a.id == "request" for a in node.args):
                return ""
    return "called without the request" if called else "not called"


_sources: Dict[str, str] = {}


def _module_source(module: str) -> str:
    if module not in _sources:
        spec = importlib.util.find_spec(module)
        if spec is None or spec.origin is None:
            raise LookupError(f"no module {module}")
        with open(spec.origin, encoding="utf-8") as f:
            _sources[module] = f.read()
    return _sources[module]


def _look(t: Target) -> Found:
    if t.kind == "passes":
        why = _passes_request(_module_source(t.module), t.name)
        return Found(t, not why, why)
    if t.kind == "function":
        ok = callable(getattr(importlib.import_module(t.module), t.name, None))
        return Found(t, ok)
    if t.kind == "setting":
        envs = getattr(importlib.import_module(t.module), "envs", None)
        return Found(t, hasattr(envs, t.name))
    if t.kind == "communicator":
        specs = getattr(importlib.import_module(t.module), "_COMMUNICATOR_SPECS", None)
        ok = any(isinstance(s, tuple) and s and s[0] == t.name for s in specs or ())
        return Found(t, ok)
    cls = _class(t.module, t.owner)
    if t.kind == "field":
        fields = getattr(cls, "__struct_fields__", None)
        if fields is None:
            fields = tuple(getattr(cls, "__dataclass_fields__", {}))
        return Found(t, t.name in fields)
    if t.kind == "sets":
        method, stored = t.name.split(":")
        fn = vars(cls).get(method)
        return Found(t, fn is not None and stored in code_names(fn))
    attr: Any = vars(cls).get(t.name)
    if attr is None:
        inherited = getattr(cls, t.name, None) is not None
        return Found(t, False, "inherited, not defined by the class" if inherited else "")
    if t.kind == "property":
        ok = isinstance(attr, property) and attr.fset is not None
        return Found(t, ok, "" if ok else "not a settable property")
    return Found(t, True)


def check_all() -> List[Found]:
    """Each target, looked at (a lookup that fails counts as missing)."""
    found = []
    for t in TARGETS:
        try:
            found.append(_look(t))
        except Exception as e:    # an import or a parse that fails: missing, and why
            found.append(Found(t, False, f"{type(e).__name__}: {e}"))
    return found


def fingerprint(fn: Any) -> str:
    source = textwrap.dedent(inspect.getsource(inspect.unwrap(fn)))
    return hashlib.sha256(source.encode()).hexdigest()[:12]


def fingerprints(lookup: Optional[Callable[[str, str, str], Any]] = None) -> Dict[str, str]:
    """The fingerprint of each replaced body of the installed SGLang
    (``lookup(module, class, attr)`` gives SGLang's own, default the class's)."""
    out = {}
    for module, owner, attr in REPLACED:
        fn = lookup(module, owner, attr) if lookup else vars(_class(module, owner)).get(attr)
        out[f"{owner}.{attr}"] = fingerprint(fn) if fn is not None else "missing"
    return out


#: The replaced bodies of each tested release (``python -m
#: pyshmlock.integrations.sglang --check`` prints the installed one's; the
#: real-SGLang suite checks them against each listed release).
_SHARED_BODIES = {
    "TokenizerManager.update_weights_from_disk": "8e14ecb26332",
    "TokenizerControlMixin.begin_weight_update": "1d564d776e36",
    "TokenizerControlMixin.end_weight_update": "e22c907ed57b",
    "TokenizerWorker.pause_generation": "85f1af4ee849",
    "TokenizerWorker.continue_generation": "dd2a0aa78c5e",
    "TokenizerWorker._apply_pause_continue_broadcast": "90d646e5520a",
}
# 0.5.22 and 0.5.23 allow an update with dp_size 1 only; 0.5.21 also with
# data-parallel attention (the three update bodies differ in that check).
_DP_SIZE_ONE_ONLY = {
    "TokenizerControlMixin.update_weights_from_distributed": "3710af529893",
    "TokenizerControlMixin.update_weights_from_tensor": "2bb5f751f8a1",
    "TokenizerControlMixin.update_weights_from_ipc": "3a4ab1c6f7be",
}
FINGERPRINTS: Dict[str, Dict[str, str]] = {
    "0.5.21": {**_SHARED_BODIES,
               "TokenizerControlMixin.update_weights_from_distributed": "da23dbe74039",
               "TokenizerControlMixin.update_weights_from_tensor": "1a086d9e65b6",
               "TokenizerControlMixin.update_weights_from_ipc": "095b4dd5a896"},
    "0.5.22": {**_SHARED_BODIES, **_DP_SIZE_ONE_ONLY},
    "0.5.23": {**_SHARED_BODIES, **_DP_SIZE_ONE_ONLY},
}
