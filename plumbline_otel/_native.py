"""Which modules are compiled with mypyc, and running their Python source when the build is stale.

The hot path (OTLP JSON mapping, normalisation, assembly, rows, and the model they share) is
compiled to C by mypyc when the package is installed (`setup.py`), which makes a span about 1.6×
cheaper to prepare. The same source is the pure-Python fallback, so the two must never disagree: the build
records a digest of each source it compiled (`BUILT_FROM`), and the compiled modules are used only
while every source still has its digest (an edited checkout runs its edits, not a stale binary);
`PLUMBLINE_PURE_PYTHON=1` runs the source on purpose. The modules of one build call each other
directly in C, so it is all of them or none.

This module imports nothing of the package: `setup.py` reads `COMPILED` from it before the
package can be imported, and `plumbline_otel/__init__.py` runs `choose()` before anything else.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

COMPILED = (
    "plumbline_otel/model.py",
    "plumbline_otel/assemble.py",
    "plumbline_otel/rows.py",
    "plumbline_otel/normalise/__init__.py",
    "plumbline_otel/normalise/_extract.py",
    "plumbline_otel/normalise/_messages.py",
    "plumbline_otel/normalise/_shapes.py",
    "plumbline_otel/normalise/_values.py",
    "plumbline_otel/decode/_json.py",
    "plumbline_otel/decode/_json_wire.py",
)
PURE_ENV = "PLUMBLINE_PURE_PYTHON"
# Written by setup.py: {ABI: {source path: sha256 of what was compiled}}. Each interpreter's binaries have their
# own name (ABI) in the checkout, so virtual environments of several Pythons installed from it keep theirs apart.
BUILT_FROM = "plumbline_otel/_native_build.json"
ABI = importlib.machinery.EXTENSION_SUFFIXES[0]  # what this interpreter's binaries end with, e.g. .cpython-311-x86_64-linux-gnu.so
_ROOT = Path(__file__).resolve().parent.parent


def _module_name(path: str) -> str:
    return path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def digests(root: Path) -> dict[str, str]:
    """The sha256 of each compiled module's source under `root`."""
    return {path: hashlib.sha256((root / path).read_bytes()).hexdigest() for path in COMPILED}


def _binary(source: Path) -> Path | None:
    stem = source.parent / ("__init__" if source.name == "__init__.py" else source.stem)
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        if stem.with_name(stem.name + suffix).exists():
            return stem.with_name(stem.name + suffix)
    return None


def build_state(root: Path = _ROOT) -> str:
    """'compiled', or why the Python source runs instead (printed by the benchmarks beside their figures)."""
    if os.environ.get(PURE_ENV):
        return f"pure Python ({PURE_ENV} is set)"
    binaries = {path: _binary(root / path) for path in COMPILED}
    if not any(binaries.values()):
        return "pure Python (not compiled at install)"
    try:
        records = json.loads((root / BUILT_FROM).read_text())
        built_from = records.get(ABI, records)  # one flat record: as builds wrote it before there was one per interpreter
    except (OSError, ValueError, AttributeError):
        built_from = {}
    if not built_from or not all(isinstance(digest, str) for digest in built_from.values()):
        # setup.py records a build once every module was compiled
        return "pure Python (the last install did not finish compiling: `pip install -v -e .` shows why)"
    now = digests(root)
    for path, binary in binaries.items():
        if binary is None:
            return f"pure Python ({path} was not compiled)"
        if built_from.get(path) != now[path]:
            return f"pure Python ({path} changed after the build: `pip install -e .` compiles it again)"
    return "compiled"


class _SourceFinder(importlib.abc.MetaPathFinder):
    """Finds the compiled modules' `.py` files before the import system finds their `.so` files."""

    def __init__(self, sources: dict[str, Path]) -> None:
        self.sources = sources

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        source = self.sources.get(fullname)
        if source is None:
            return None
        locations = [str(source.parent)] if source.name == "__init__.py" else None
        return importlib.util.spec_from_file_location(fullname, source, submodule_search_locations=locations)


BUILD = build_state()


def choose() -> None:
    """Make the compiled modules import from their source unless the build is current."""
    if BUILD != "compiled" and not any(isinstance(f, _SourceFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _SourceFinder({_module_name(path): _ROOT / path for path in COMPILED}))
