"""What an invariant returns, and the contract every invariant callable meets."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from plumbline_otel.model import Trajectory

Status = Literal["pass", "fail", "not_applicable"]
Severity = Literal["critical", "major", "minor"]
SEVERITIES: tuple[Severity, ...] = ("critical", "major", "minor")


@dataclass(frozen=True)
class Verdict:
    """One invariant's judgement of one trajectory.

    ``step_index`` indexes ``trajectory.steps`` (all steps, not only tool calls), so it lines up
    with the exported ``steps`` list; it is None when no single step is to blame ("never called").
    ``error`` is set when the check itself could not run (a domain predicate raised): such a
    verdict is ``not_applicable`` and is reported apart, never as a pass or a fail.
    """

    status: Status
    detail: str = ""
    step_index: int | None = None
    step_name: str | None = None
    error: str | None = None

    @staticmethod
    def ok(detail: str = "") -> Verdict:
        """A pass."""
        return Verdict("pass", detail) if detail else _PASS

    @staticmethod
    def na(detail: str) -> Verdict:
        """Not applicable: the invariant says nothing about this run."""
        return Verdict("not_applicable", detail)

    @staticmethod
    def fail(detail: str, step_index: int | None = None, step_name: str | None = None) -> Verdict:
        """A violation, located at a step when one is to blame."""
        return Verdict("fail", detail, step_index, step_name)


_PASS = Verdict("pass")


@runtime_checkable
class Invariant(Protocol):
    """An invariant is any callable judging one trajectory against its task's context.

    Contract: pure (no I/O, no state kept between calls), safe to call from several threads,
    and total: it returns ``not_applicable`` rather than raising when the trajectory lacks what
    it needs (arguments not captured, no ground truth). ``context`` is the task's ground truth.
    """

    def __call__(self, trajectory: Trajectory, context: Mapping[str, Any]) -> Verdict: ...
