"""Integrations of pyshmlock into other programs (imported lazily: each
module needs its program installed, the package itself needs nothing)."""

__all__ = ["sglang"]
