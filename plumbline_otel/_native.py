"""Which modules are compiled with mypyc, and running their Python source when the build is stale.

The hot path (OTLP JSON mapping, normalisation, assembly, rows, and the model they share) is
compiled to C by mypyc when the package is installed (`setup.py`), which makes a span about 1.4×
cheaper. The same source is the pure-Python fallback, so the two must never disagree: a compiled module is used only when
none of the compiled modules' sources changed after the build (an edited checkout runs its edits),
and `PLUMBLINE_PURE_PYTHON=1` runs the source on purpose. The modules of one build call each
other directly in C, so it is all of them or none.

This module imports nothing of the package: `setup.py` reads `COMPILED` from it before the
package can be imported, and `plumbline_otel/__init__.py` runs `choose()` before anything else.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
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
)
PURE_ENV = "PLUMBLINE_PURE_PYTHON"
_ROOT = Path(__file__).resolve().parent.parent


def _module_name(path: str) -> str:
    return path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


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
    binaries = [(path, _binary(root / path)) for path in COMPILED]
    if not any(binary for _, binary in binaries):
        return "pure Python (not compiled at install)"
    for path, binary in binaries:
        if binary is None:
            return f"pure Python ({path} was not compiled)"
        if (root / path).stat().st_mtime > binary.stat().st_mtime:
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
