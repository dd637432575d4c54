"""Build glue: setuptools compiles the C core through cffi (pyshmlock/_build.py)
and the hand-written fast-path extension pyshmlock._fast (csrc/fastpath.c)."""
import os
import sys

from setuptools import setup

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "pyshmlock"))
from _build import fast_extension  # noqa: E402

setup(cffi_modules=["pyshmlock/_build.py:ffibuilder"], ext_modules=[fast_extension()])
