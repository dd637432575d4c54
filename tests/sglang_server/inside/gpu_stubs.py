"""Stand-ins for the three packages that cannot import without a GPU:
`triton`, `sgl_kernel` and `torchvision` (SGLang's own test helper
maybe_stub_sgl_kernel() does the same for sgl_kernel). Nothing of SGLang is
stubbed: its router, workers, managers and sockets are the real ones.

Import this before SGLang. torch decides at import whether triton exists
(its inductor, which SGLang's @torch.compile decorators load, builds on
that), so torch and its inductor are imported first, seeing no triton; only
then does the stand-in appear, for SGLang's own `import triton`."""

import importlib.abc
import importlib.machinery
import sys
from typing import Any, Optional

import torch
import torch._inductor.compile_fx
import torch.utils.flop_counter  # noqa: F401

STUBBED = ("triton", "sgl_kernel", "torchvision")


class _StubMeta(type):
    """A stand-in that is at once a class (isinstance works), a decorator
    (returns the function unchanged) and a namespace (any attribute)."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _stub_class(f"{cls.__qualname__}.{name}")

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]
        return cls

    def __getitem__(cls, key: Any) -> Any:
        return cls

    def __iter__(cls) -> Any:
        return iter(())

    def __bool__(cls) -> bool:
        return False

    def __or__(cls, other: Any) -> Any:
        return cls

    __ror__ = __or__


def _stub_class(name: str) -> Any:
    return _StubMeta(name.rsplit(".", 1)[-1], (), {"__qualname__": name})


class _Loader(importlib.abc.Loader):
    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: Any) -> None:
        module.__version__ = "0.0.0"
        module.__getattr__ = lambda name: _stub_class(f"{module.__name__}.{name}")


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Optional[Any]:
        if fullname.split(".")[0] not in STUBBED:
            return None
        spec = importlib.machinery.ModuleSpec(fullname, _Loader(), origin=__file__,
                                              is_package=True)
        spec.has_location = True
        return spec


sys.meta_path.insert(0, _Finder())
