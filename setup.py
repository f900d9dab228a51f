"""Compiles the ingest hot path with mypyc (the project's metadata is in pyproject.toml).

The modules listed in `plumbline_otel/_native.py` are type-checked by mypy already; mypyc turns
them into C extensions, so a span costs about 1.4× less CPU to normalise, store and assemble.
Compilation is optional: with no C compiler, or with PLUMBLINE_PURE_PYTHON=1 set at install, the
package installs as pure Python and gives the same results, more slowly.
"""

from __future__ import annotations

import os
import runpy

from setuptools import setup

native = runpy.run_path("plumbline_otel/_native.py")
extensions = []
if not os.environ.get(native["PURE_ENV"]):
    from mypyc.build import mypycify

    extensions = mypycify(list(native["COMPILED"]), opt_level="3", group_name="plumbline_otel_native")
    for extension in extensions:
        extension.optional = True  # a machine without a C compiler gets the pure-Python package

setup(ext_modules=extensions)
