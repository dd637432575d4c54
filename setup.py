"""Build glue: setuptools compiles the C core through cffi (see pyshmlock/_build.py).

The extension is built against the stable ABI (cffi defines Py_LIMITED_API),
so the wheel is tagged cp39-abi3: one wheel serves CPython 3.9 and later.
"""
from setuptools import setup

setup(cffi_modules=["pyshmlock/_build.py:ffibuilder"],
      options={"bdist_wheel": {"py_limited_api": "cp39"}})
