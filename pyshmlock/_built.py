"""Whether the compiled extensions are there: imported first by the
package, so a source checkout that was never built says so and how, instead
of the misleading "circular import" Python would report (the first module
that needs the core is imported half-way through the package's __init__).

It costs nothing on a built install: the two modules are imported here, as
the package would import them anyway, and only a ModuleNotFoundError for
one of them is turned into the message below."""
import importlib
import os

_HERE = os.path.dirname(os.path.abspath(__file__))
_MISSING = []
for _m in ("_shmlock", "_fast"):
    try:
        importlib.import_module(f"{__package__}.{_m}")
    except ModuleNotFoundError as e:
        if e.name != f"{__package__}.{_m}":
            raise
        _MISSING.append(e.name)
if _MISSING:
    _ROOT = os.path.dirname(_HERE)
    raise ImportError(
        f"{' and '.join(_MISSING)} (compiled) not built in {_HERE}: this looks like a "
        f"source checkout.  Install the package (`pip install .`) from {_ROOT}, or build "
        "it in place there (`pip install -e .`, or `python setup.py build_ext --inplace`); "
        "an installed pyshmlock is imported when Python does not start in the checkout",
        name=_MISSING[0], path=_HERE)
