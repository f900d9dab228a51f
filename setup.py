"""Compiles the ingest hot path with mypyc (the project's metadata is in pyproject.toml).

The modules listed in `plumbline_otel/_native.py` are type-checked by mypy already; mypyc turns
them into C extensions, so a span costs about 1.6× less CPU to normalise, turn into rows and assemble.
Compilation is optional: when mypyc or the C compiler fails, or with PLUMBLINE_PURE_PYTHON=1 set
at install, the package installs as pure Python and gives the same results, more slowly
(`plumbline_otel._native.BUILD` says which; `.ci/run` requires the compiled build).
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from pathlib import Path

from setuptools import setup

native = runpy.run_path("plumbline_otel/_native.py")
extensions = []
if not os.environ.get(native["PURE_ENV"]):
    try:
        from mypyc.build import mypycify

        extensions = mypycify(list(native["COMPILED"]), opt_level="3", group_name="plumbline_otel_native")
        # what was compiled, so that an edited source is never shadowed by its stale binary (_native.py)
        with open(native["BUILT_FROM"], "w") as out:
            json.dump(native["digests"](Path(".")), out, indent=1, sort_keys=True)
    except (Exception, SystemExit) as exc:  # mypyc exits on a type error it meets
        print(f"plumbline_otel: not compiling the hot path ({exc!r}); installing pure Python", file=sys.stderr)
    for extension in extensions:
        extension.optional = True  # a machine without a C compiler gets the pure-Python package

setup(ext_modules=extensions)
