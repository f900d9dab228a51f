"""Conditions (`when:`) and context providers: the task's ground truth an invariant reads.

A condition is a conjunction of clauses on context keys:
``{key: value}`` (typed equality, the `compare_values` rules), ``{key: {in: [..]}}``,
``{key: {not: v}}`` and ``{key: {not_in: [..]}}``. A clause on a key the context lacks never
holds, whatever its operator: with no ground truth, the invariant does not apply. Keys are
looked up in the task context first, then in the run's own attributes (`Trajectory.context`,
e.g. ``plumbline.perturbation``).

A context provider maps a task key to its ground truth. References:
``python:package.module:function`` (called with the task key), ``file:path.json`` (an object
keyed by task key, or a list of records with a key field) and ``file:path.csv`` (one row per task,
keyed by the ``key`` column, ``task_key`` by default). Relative paths are taken from the spec
file's folder. An unknown task gets an empty context.
"""

from __future__ import annotations

import csv
import importlib
import json
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plumbline_otel.compare_values import Matcher
from plumbline_otel.errors import ConfigError

ContextFn = Callable[[str], Mapping[str, Any]]
_OPS = ("in", "not", "not_in")


@dataclass(frozen=True)
class Condition:
    """All clauses must hold; each clause is (key, operator, operand)."""

    clauses: tuple[tuple[str, str, Any], ...]

    def __post_init__(self) -> None:
        # Operands canonicalised once: a condition runs on every trajectory.
        compiled = tuple(
            (key, op, tuple(Matcher(o) for o in operand) if op in ("in", "not_in") else (Matcher(operand),))
            for key, op, operand in self.clauses
        )
        object.__setattr__(self, "_compiled", compiled)

    @staticmethod
    def parse(raw: Any) -> Condition:
        """Build from the YAML mapping; raises ValueError with the reason."""
        if not isinstance(raw, Mapping) or not raw:
            raise ValueError("when must be a non-empty mapping of context key to value")
        clauses = []
        for key, val in raw.items():
            if isinstance(val, Mapping):
                if len(val) != 1 or next(iter(val)) not in _OPS:
                    raise ValueError(f"when.{key}: an operator mapping has exactly one of {', '.join(_OPS)}")
                op, operand = next(iter(val.items()))
                if op in ("in", "not_in") and not isinstance(operand, list):
                    raise ValueError(f"when.{key}.{op} expects a list")
                clauses.append((str(key), str(op), operand))
            else:
                clauses.append((str(key), "eq", val))
        return Condition(tuple(clauses))

    def holds(self, context: Mapping[str, Any], run: Mapping[str, Any] | None = None) -> bool:
        """True when every clause holds on the context (falling back to run attributes)."""
        for key, op, matchers in self._compiled:  # type: ignore[attr-defined]
            if key in context:
                value = context[key]
            elif run is not None and key in run:
                value = run[key]
            else:
                return False
            hit = any(m(value) for m in matchers)
            if hit == (op in ("not", "not_in")):
                return False
        return True

    def describe(self) -> dict[str, Any]:
        """Canonical form (part of the spec hash)."""
        return {k: (v if op == "eq" else {op: v}) for k, op, v in sorted(self.clauses, key=lambda c: c[0])}


class _Cached:
    """Memoises a provider per task key: ground truth does not change within one evaluation."""

    def __init__(self, fn: ContextFn) -> None:
        self._fn = fn
        self._cache: dict[str, Mapping[str, Any]] = {}
        self._lock = threading.Lock()

    def __call__(self, task_key: str) -> Mapping[str, Any]:
        hit = self._cache.get(task_key)
        if hit is None:
            try:
                hit = self._fn(task_key) or {}
            except Exception as exc:  # the system of record is the user's code: say where it broke
                raise ConfigError(f"context provider failed for task {task_key!r}: {type(exc).__name__}: {exc}") from exc
            if not isinstance(hit, Mapping):
                raise ConfigError(f"context provider returned {type(hit).__name__} for task {task_key!r}, not a mapping")
            with self._lock:
                self._cache[task_key] = hit
        return hit


def load_provider(ref: str, base_dir: Path | None = None, key: str = "task_key") -> ContextFn:
    """Resolve a provider reference; raises ValueError with the reason."""
    if ref.startswith("python:"):
        target = ref[len("python:") :]
        module_name, _, attr = target.partition(":")
        if not module_name or not attr:
            raise ValueError(f"python provider must read python:module:function, got {ref!r}")
        fn = getattr(import_module(module_name, base_dir), attr, None)
        if not callable(fn):
            raise ValueError(f"{module_name} has no callable {attr}")
        return _Cached(fn)
    if ref.startswith("file:"):
        path = Path(ref[len("file:") :])
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        table = _read_table(path, key)
        return lambda task_key: table.get(task_key, {})
    raise ValueError(f"unknown context provider {ref!r} (use python:module:function or file:path)")


def _read_table(path: Path, key: str) -> dict[str, Mapping[str, Any]]:
    if not path.is_file():
        raise ValueError(f"context file {path} not found")
    if path.suffix.lower() == ".csv":
        with path.open(newline="", encoding="utf-8") as fh:
            rows = list(csv.DictReader(fh))
        if rows and key not in rows[0]:
            raise ValueError(f"{path}: no {key!r} column")
        return {row[key]: row for row in rows}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from exc
    if isinstance(data, list):
        if not all(isinstance(r, Mapping) and key in r for r in data):
            raise ValueError(f"{path}: every record needs a {key!r} field")
        return {str(r[key]): r for r in data}
    if isinstance(data, Mapping) and all(isinstance(v, Mapping) for v in data.values()):
        return {str(k): v for k, v in data.items()}
    raise ValueError(f"{path}: expected an object keyed by task key or a list of records")


def import_module(name: str, base_dir: Path | None = None) -> Any:
    """Import `name`; if its top package is not importable, retry from the spec's folder and its parent."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if base_dir is None or exc.name not in (name, name.split(".")[0]):
            raise ValueError(f"cannot import {name}: {exc}") from exc
    top = name.split(".")[0]
    for root in (base_dir.resolve(), base_dir.resolve().parent):
        found = (root / top).is_dir() or (root / f"{top}.py").is_file()
        if found and str(root) not in sys.path:
            sys.path.append(str(root))
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise ValueError(f"cannot import {name}: {exc}") from exc
