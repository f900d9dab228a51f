"""Compiles the ingest hot path with mypyc (the project's metadata is in pyproject.toml).

The modules listed in `plumbline_otel/_native.py` are type-checked by mypy already; mypyc turns
them into C extensions, so a span costs about 1.6× less CPU to normalise, turn into rows and assemble.
Compilation is optional: when mypyc or the C compiler fails, or with PLUMBLINE_PURE_PYTHON=1 set
at install, the package installs as pure Python and gives the same results, more slowly
(`plumbline_otel._native.BUILD` says which; `.ci/run` requires the compiled build).

pip shows a build's output only with `-v`, and the compile takes a minute or more, so what the
build is doing is also written to the installing terminal when there is one (`_say`). An editable
install builds the extensions into the checkout, which every virtual environment installed from it
shares: a binary is replaced by a new file, never rewritten in place (a process of another
environment keeps running the one it loaded), and the sources it was compiled from are recorded
only once every extension was built (`BUILT_FROM`): an edit made meanwhile, or a failed compile,
leaves the Python source running instead of a stale or partial build.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import time
from pathlib import Path
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

native = runpy.run_path("plumbline_otel/_native.py")


def _say(message: str) -> None:
    """To the build's stderr (pip -v shows it) and to the terminal pip was run from, which pip leaves alone."""
    print(f"plumbline_otel: {message}", file=sys.stderr, flush=True)
    try:
        with open("/dev/tty", "w", encoding="utf-8") as tty:  # no terminal (CI, a pipe): stderr only
            tty.write(f"\nplumbline_otel: {message}\n")
    except OSError:
        pass


def _record(digests: dict[str, str] | None, root: str = ".") -> None:
    """Record (None: forget) what this interpreter's binaries were compiled from; other interpreters' records stay."""
    path = Path(root, native["BUILT_FROM"])
    try:
        records = json.loads(path.read_text())
        records = records if isinstance(records, dict) and all(isinstance(v, dict) for v in records.values()) else {}
    except (OSError, ValueError):
        records = {}
    records.pop(native["ABI"], None)
    if digests is not None:
        records[native["ABI"]] = digests
    path.write_text(json.dumps(records, indent=1, sort_keys=True) + "\n")


class BuildNative(build_ext):
    """Records what was compiled once every extension is in place, and replaces binaries instead of rewriting them."""

    digests: dict[str, str] = {}  # of the sources mypyc read, before compiling them

    def run(self) -> None:
        if not self.extensions:
            return super().run()
        _say("compiling the C (most of the time)")
        started = time.time()
        # Into the checkout (an editable install, `inplace`), else into the wheel being built, never into a checkout
        # whose own binaries (another environment's editable install) this build did not touch.
        root = "." if self.inplace else self.build_lib
        if self.inplace:
            _record(None)  # until this build is complete, the source runs
        super().run()
        built = [self.get_ext_fullpath(ext.name) for ext in self.extensions]
        missing = [path for path in built if not os.path.exists(path) or os.path.getmtime(path) < started]
        if missing:
            _say(f"not compiled ({len(missing)} of {len(built)} extensions failed to build; `pip install -v` shows why): "
                 "the package runs as pure Python, with the same results, more slowly")
            return None
        _record(self.digests, root)
        _say(f"compiled the hot path in {time.time() - STARTED:.0f} s")
        return None

    def copy_file(self, infile: Any, outfile: Any, *args: Any, **kwargs: Any) -> Any:
        if os.path.exists(outfile):
            os.unlink(outfile)  # a process that loaded the old binary keeps its copy
        return super().copy_file(infile, outfile, *args, **kwargs)


STARTED = time.time()
# pip's build backend runs this file for its requirements and metadata too: only a build compiles
BUILDING = bool({"build", "build_ext", "bdist_wheel", "editable_wheel", "develop", "install"} & set(sys.argv[1:]))
extensions = []
if BUILDING and not os.environ.get(native["PURE_ENV"]):
    _say(f"type-checking and compiling {len(native['COMPILED'])} modules with mypyc: about 1-3 minutes on one core "
         f"(`{native['PURE_ENV']}=1 pip install ...` installs pure Python at once)")
    try:
        from mypyc.build import mypycify

        BuildNative.digests = native["digests"](Path("."))
        extensions = mypycify(list(native["COMPILED"]), opt_level="3", group_name="plumbline_otel_native")
    except (Exception, SystemExit) as exc:  # mypyc exits on a type error it meets
        _say(f"not compiling the hot path ({exc!r}); installing pure Python")
    for extension in extensions:
        extension.optional = True  # a machine without a C compiler gets the pure-Python package

setup(ext_modules=extensions, cmdclass={"build_ext": BuildNative})
