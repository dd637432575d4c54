"""Build glue: setuptools compiles the C core through cffi (see pyshmlock/_build.py)."""
from setuptools import setup

setup(cffi_modules=["pyshmlock/_build.py:ffibuilder"])
