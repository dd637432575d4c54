"""Every public method of every public class has a signature that
inspect.signature (and so help(), IDEs and the API page) can read, C
methods included: they carry CPython's __text_signature__ docstring prefix
(`name($self, /, timeout=None)\\n--\\n\\n`).  No public signature shows a
private parameter."""
import importlib
import inspect

import pytest

MODULES = ["pyshmlock", "pyshmlock.metrics", "pyshmlock.cluster",
           "pyshmlock.integrations.sglang"]
WITH = {"__enter__", "__exit__", "__aenter__", "__aexit__"}


def _ours(owner):
    return (getattr(owner, "__module__", "") or "").startswith("pyshmlock")


def _public_callables():
    for modname in MODULES:
        try:
            mod = importlib.import_module(modname)
        except ImportError as e:          # an optional dependency
            pytest.skip(f"{modname}: {e}")
        for name in mod.__all__:
            obj = getattr(mod, name)
            if inspect.isclass(obj):
                if not issubclass(obj, BaseException):
                    yield f"{modname}.{name}", obj
                for attr in dir(obj):
                    if attr.startswith("_") and attr not in WITH:
                        continue
                    # Defined by a class of ours (a C base included), not
                    # inherited from Python's own types.
                    owner = next(c for c in obj.__mro__ if attr in c.__dict__)
                    if not _ours(owner):
                        continue
                    value = getattr(obj, attr)
                    if callable(value) and not inspect.isclass(value):
                        yield f"{modname}.{name}.{attr}", value
            elif callable(obj):
                yield f"{modname}.{name}", obj


CALLABLES = dict(_public_callables())


@pytest.mark.parametrize("name", sorted(CALLABLES))
def test_every_public_callable_has_a_signature(name):
    sig = inspect.signature(CALLABLES[name])
    private = [p for p in sig.parameters if p.startswith("_")]
    assert not private, f"{name}{sig} shows private parameters {private}"


def test_the_c_hold_calls_read_like_python():
    import pyshmlock
    assert str(inspect.signature(pyshmlock.RWLock.acquire_read)) == "(self, /, timeout=None)"
    assert str(inspect.signature(pyshmlock.SyncHold)) == "(lock, kind, timeout=None)"
    assert pyshmlock.AsyncHold.acquire.__name__ == "acquire"
