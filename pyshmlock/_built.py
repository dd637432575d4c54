"""Whether the compiled extensions are there: imported first by the
package, so a source checkout that was never built says so and how, instead
of the misleading "circular import" Python would report (the first module
that needs the core is imported half-way through the package's __init__).

It costs nothing on a built install: the two modules are imported here, as
the package would import them anyway, and only a ModuleNotFoundError for
one of them is turned into the message below."""
import importlib
import importlib.machinery
import os
import sys
from typing import Optional

_HERE = os.path.dirname(os.path.abspath(__file__))


def _installed_elsewhere(root: str) -> Optional[str]:
    """The directory of another pyshmlock Python would import if `root`
    (this checkout) were not on sys.path, or None."""
    real = os.path.realpath(root)
    paths = [p for p in sys.path if os.path.realpath(p or os.curdir) != real]
    spec = importlib.machinery.PathFinder.find_spec(__package__, paths)
    if spec is None:                     # an editable install's own finder
        for finder in sys.meta_path:
            if finder is importlib.machinery.PathFinder or not hasattr(finder, "find_spec"):
                continue
            try:
                spec = finder.find_spec(__package__, None)
            except Exception:
                spec = None
            if spec is not None:
                break
    where = list(spec.submodule_search_locations or []) if spec is not None else []
    others = [d for d in where if os.path.realpath(d) != os.path.realpath(_HERE)]
    return others[0] if others else None


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
    _OTHER = _installed_elsewhere(_ROOT)
    if _OTHER is not None:
        # The usual cause: `python -m ...`, `python -c` or a script run from
        # the checkout's root puts that directory first on sys.path.
        raise ImportError(
            f"{' and '.join(_MISSING)} (compiled) not built in {_HERE}: this unbuilt source "
            f"checkout shadows the installed pyshmlock in {_OTHER}, because Python put "
            f"{_ROOT} first on sys.path (`python -m`, `python -c` or a script started "
            "there).  Run from another directory (or with `python -P`, Python 3.11+), or "
            "build the checkout in place (`pip install -e .`, or `python setup.py "
            "build_ext --inplace`)",
            name=_MISSING[0], path=_HERE)
    raise ImportError(
        f"{' and '.join(_MISSING)} (compiled) not built in {_HERE}: this looks like a "
        f"source checkout.  Install the package (`pip install .`) from {_ROOT}, or build "
        "it in place there (`pip install -e .`, or `python setup.py build_ext --inplace`); "
        "an installed pyshmlock is imported when Python does not start in the checkout",
        name=_MISSING[0], path=_HERE)
