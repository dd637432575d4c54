"""Build glue: setuptools compiles the C core through cffi and the
hand-written fast-path extension pyshmlock._fast; both are described in
csrc/build_extensions.py, which is kept outside the package (it is never
installed).

Both extensions are built against the stable ABI (Py_LIMITED_API for 3.9),
so the wheel is tagged cp39-abi3: one wheel serves CPython 3.9 and later.
"""
import os
import sys

from setuptools import setup

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc"))
from build_extensions import fast_extension

setup(cffi_modules=["csrc/build_extensions.py:ffibuilder"],
      ext_modules=[fast_extension()],
      options={"bdist_wheel": {"py_limited_api": "cp39"}})
