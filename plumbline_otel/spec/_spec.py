"""A spec: named invariants with ids, severities and conditions, plus where ground truth comes from."""

from __future__ import annotations

import hashlib
import inspect
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, overload

from plumbline_otel.compare_values import Rule
from plumbline_otel.errors import SpecError
from plumbline_otel.model import Trajectory
from plumbline_otel.spec._context import Condition, ContextFn
from plumbline_otel.spec._verdict import SEVERITIES, Invariant, Severity, Verdict

SPEC_VERSION = 1
_WHEN_FALSE = Verdict.na("condition does not hold")


@dataclass(frozen=True)
class DeclaredInvariant:
    """An invariant as declared: its unique id, severity and `when`, around the check itself.

    Calling it applies the condition first: when the condition does not hold the verdict is
    ``not_applicable`` and the check is not run.
    """

    id: str
    severity: Severity
    check: Invariant
    description: str = ""
    when: Condition | None = None
    line: int | None = None  # where it was declared in its YAML file, when it came from one

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise SpecError(f"invariant {self.id}: severity {self.severity!r} is not one of {', '.join(SEVERITIES)}")
        if not isinstance(self.id, str) or not self.id.strip():
            raise SpecError("an invariant needs a non-empty string id")

    def __call__(self, trajectory: Trajectory, context: Mapping[str, Any]) -> Verdict:
        if self.when is not None and not self.when.holds(context, trajectory.context):
            return _WHEN_FALSE
        return self.check(trajectory, context)

    @property
    def kind(self) -> str:
        """The YAML kind (``must_call`` …), or ``python`` for a plain callable."""
        return next(iter(self.describe_check()))

    def describe_check(self) -> dict[str, Any]:
        """The check's canonical description: its kind and parameters."""
        describe = getattr(self.check, "describe", None)
        if callable(describe):
            return dict(describe())
        fn = self.check
        ref = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__qualname__)}"
        return {"python": {"ref": ref, "source_sha256": _source_hash(fn)}}

    def describe(self) -> dict[str, Any]:
        """Canonical, JSON-ready (descriptions and line numbers are left out: they change no verdict)."""
        out: dict[str, Any] = {"id": self.id, "severity": self.severity, **self.describe_check()}
        if self.when is not None:
            out["when"] = self.when.describe()
        return out


def _source_hash(obj: Any) -> str | None:
    try:
        return hashlib.sha256(inspect.getsource(obj).encode()).hexdigest()
    except (OSError, TypeError):
        return None


@overload
def invariant(
    id: str, check: Invariant, *, severity: Severity = ..., description: str = ..., when: Any = ...
) -> DeclaredInvariant: ...
@overload
def invariant(
    id: str, check: None = None, *, severity: Severity = ..., description: str = ..., when: Any = ...
) -> Callable[[Invariant], DeclaredInvariant]: ...


def invariant(
    id: str,
    check: Invariant | None = None,
    *,
    severity: Severity = "critical",
    description: str = "",
    when: Any = None,
) -> DeclaredInvariant | Callable[[Invariant], DeclaredInvariant]:
    """Declare an invariant in Python: ``invariant("AP-AUDIT", MustCall("post_audit_log"), severity="minor")``.

    Without `check` it is a decorator for a plain function ``(trajectory, context) -> Verdict``.
    `when` takes the YAML mapping form or a `Condition`.
    """
    cond = when if isinstance(when, Condition) or when is None else Condition.parse(when)

    def make(fn: Invariant) -> DeclaredInvariant:
        return DeclaredInvariant(id, severity, fn, description, cond)

    return make(check) if check is not None else make


@dataclass(frozen=True)
class Spec:
    """The invariants one agent or domain is held to, with its context provider.

    `effect_tools` lists the tool calls that change the world (equivalence compares those; None
    means every tool call). `arg_rules` gives, per tool, the typed rule for its argument object
    (consistency and equivalence compare arguments with it).
    """

    name: str
    invariants: tuple[DeclaredInvariant, ...]
    version: int = SPEC_VERSION
    predicates: str | None = None  # the module the named predicates came from
    context_ref: str | None = None
    context_provider: ContextFn | None = field(default=None, compare=False, repr=False)
    effect_tools: tuple[str, ...] | None = None
    arg_rules: Mapping[str, Rule] = field(default_factory=dict)
    source: str | None = None  # the file it was read from

    def __post_init__(self) -> None:
        object.__setattr__(self, "invariants", tuple(self.invariants))
        seen: dict[str, DeclaredInvariant] = {}
        for inv in self.invariants:
            if inv.id in seen:
                where = f"{self.source}:{inv.line}: " if self.source and inv.line else ""
                first = f" (first declared at line {seen[inv.id].line})" if seen[inv.id].line else ""
                raise SpecError(f"{where}duplicate invariant id {inv.id!r}{first}")
            seen[inv.id] = inv

    @staticmethod
    def of(name: str, invariants: Iterable[DeclaredInvariant], **kwargs: Any) -> Spec:
        """Build a spec in Python."""
        return Spec(name=name, invariants=tuple(invariants), **kwargs)

    @property
    def ids(self) -> list[str]:
        """Invariant ids in declaration order."""
        return [i.id for i in self.invariants]

    def get(self, invariant_id: str) -> DeclaredInvariant:
        """The invariant with that id; KeyError when there is none."""
        for inv in self.invariants:
            if inv.id == invariant_id:
                return inv
        raise KeyError(invariant_id)

    def canonical(self) -> dict[str, Any]:
        """The canonical spec: what it checks, independent of layout, order and prose."""
        return {
            "version": self.version,
            "name": self.name,
            "predicates": self.predicates,
            "context": self.context_ref,
            "effect_tools": sorted(self.effect_tools) if self.effect_tools is not None else None,
            "arg_rules": {t: self.arg_rules[t].describe() for t in sorted(self.arg_rules)},
            "invariants": sorted((i.describe() for i in self.invariants), key=lambda d: d["id"]),
        }

    @cached_property
    def hash(self) -> str:
        """sha256 of the canonical spec (hex)."""
        text = json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(text.encode()).hexdigest()

    def context_for(self, task_key: str | None) -> Mapping[str, Any]:
        """The task's ground truth from the provider ({} without a provider or task key)."""
        if self.context_provider is None or task_key is None:
            return {}
        return self.context_provider(task_key)

    def evaluate(
        self, trajectory: Trajectory, context: Mapping[str, Any] | None = None
    ) -> list[tuple[DeclaredInvariant, Verdict]]:
        """Every invariant's verdict on one trajectory, in declaration order."""
        ctx = self.context_for(trajectory.task_key) if context is None else context
        return [(inv, inv(trajectory, ctx)) for inv in self.invariants]

    def is_effect(self, tool: str) -> bool:
        """Whether a call of `tool` changes the world (every tool call when none are listed)."""
        return self.effect_tools is None or tool in self.effect_tools
