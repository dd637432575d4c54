"""Whether the compiled core is there: imported first by the package, so a
source checkout that was never built says so and how, instead of the
misleading "circular import" Python would report (the first module that
needs the core is imported half-way through the package's __init__)."""
import importlib.util
import os

_HERE = os.path.dirname(os.path.abspath(__file__))
_MISSING = [m for m in ("_shmlock", "_fast")
            if importlib.util.find_spec(f"{__package__}.{m}") is None]
if _MISSING:
    raise ImportError(
        f"pyshmlock's compiled core ({', '.join(_MISSING)}) is not built in {_HERE}: this "
        "looks like a source checkout.  Install it (`pip install .`, or `pip install -e .` "
        f"to work on it) from {os.path.dirname(_HERE)}, or build it in place there "
        "(`python csrc/build_extensions.py`); an installed pyshmlock is imported when "
        "Python does not start in the checkout", name=__package__, path=_HERE)
