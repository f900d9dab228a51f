"""Conformance: which declared invariants each stored run obeyed (docs/statistics.md).

`evaluate` judges one trajectory; `check` streams a store (or any iterable of trajectories)
through a spec, keeps the violations in the store's ``violations`` table and returns a
`ConformanceSummary` grouped by severity and invariant. Trial markers (``plumbline.trial.status``)
are not judged against the invariants, since they hold no steps: ``missing`` (never started) is
counted apart, ``errored`` (started, then crashed, timed out or left no trace; the legacy value
``error`` reads the same) is counted apart here and scored as a failing run by the certificate.

Keeping them is idempotent and correct under re-assembly: `Store.write_violations` replaces a
run's old violations for the same spec hash in one transaction, so checking twice adds nothing and
a run re-assembled from late spans does not keep a stale violation.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from plumbline_otel.model import Trajectory
from plumbline_otel.runs import is_errored, is_marker, is_missing
from plumbline_otel.spec import SEVERITIES, DeclaredInvariant, Severity, Spec, Verdict

_RANK = {s: i for i, s in enumerate(SEVERITIES)}


@dataclass(frozen=True)
class RunResult:
    """Every invariant's verdict on one run."""

    trajectory_id: str
    task_key: str | None
    verdicts: tuple[tuple[DeclaredInvariant, Verdict], ...]

    @property
    def violations(self) -> list[tuple[DeclaredInvariant, Verdict]]:
        """The failed invariants, most severe first (declaration order within a severity)."""
        failed = [(i, v) for i, v in self.verdicts if v.status == "fail"]
        return sorted(failed, key=lambda iv: _RANK[iv[0].severity]) if len(failed) > 1 else failed

    def conforms(self, severity: Severity = "critical") -> bool:
        """No violation at `severity` or worse ("critical": critical conformance)."""
        worst = _RANK[severity]
        return not any(v.status == "fail" and _RANK[i.severity] <= worst for i, v in self.verdicts)


def evaluate(spec: Spec, trajectory: Trajectory, context: Mapping[str, Any] | None = None) -> RunResult:
    """Judge one run against every invariant of `spec` (context from the spec's provider by default)."""
    return RunResult(trajectory.trajectory_id, trajectory.task_key, tuple(spec.evaluate(trajectory, context)))


@dataclass
class InvariantTally:
    """Counts for one invariant over the runs checked."""

    id: str
    severity: Severity
    kind: str
    description: str
    applicable: int = 0
    passed: int = 0
    failed: int = 0
    errors: int = 0
    tasks: set[str] = field(default_factory=set)
    example: dict[str, Any] | None = None
    first_error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON form: counts with their n (the runs where the invariant applied)."""
        return {
            "id": self.id,
            "severity": self.severity,
            "kind": self.kind,
            "description": self.description,
            "applicable": self.applicable,
            "passed": self.passed,
            "failed": self.failed,
            "evaluation_errors": self.errors,
            "tasks_affected": len(self.tasks),
            "example": self.example,
            "first_error": self.first_error,
        }


@dataclass
class ConformanceSummary:
    """What `check` found: per-invariant tallies plus run counts."""

    spec_name: str
    spec_hash: str
    invariants: dict[str, InvariantTally]
    runs: int = 0
    conforming: int = 0  # no violation at all
    critical_conforming: int = 0
    missing: int = 0
    errored: int = 0  # markers of trials that started and left no run: not judged here
    not_covered: int = 0  # runs where no invariant applied
    violations_written: int = 0

    @staticmethod
    def for_spec(spec: Spec) -> ConformanceSummary:
        """An empty summary with one tally per invariant."""
        tallies = {i.id: InvariantTally(i.id, i.severity, i.kind, i.description) for i in spec.invariants}
        return ConformanceSummary(spec.name, spec.hash, tallies)

    def add(self, result: RunResult) -> None:
        """Count one judged run."""
        self.runs += 1
        self.conforming += not result.violations
        self.critical_conforming += result.conforms("critical")
        applied = False
        for inv, verdict in result.verdicts:
            tally = self.invariants[inv.id]
            if verdict.error is not None:
                tally.errors += 1
                tally.first_error = tally.first_error or verdict.error
                continue
            if verdict.status == "not_applicable":
                continue
            applied = True
            tally.applicable += 1
            if verdict.status == "pass":
                tally.passed += 1
                continue
            tally.failed += 1
            tally.tasks.add(result.task_key or f"(no task) {result.trajectory_id}")
            if tally.example is None:
                tally.example = {
                    "trajectory_id": result.trajectory_id,
                    "task_key": result.task_key,
                    "step_index": verdict.step_index,
                    "step_name": verdict.step_name,
                    "detail": verdict.detail,
                }
        self.not_covered += not applied

    def as_dict(self) -> dict[str, Any]:
        """JSON form, invariants grouped by severity (most severe first, then by failures)."""
        groups: dict[str, list[dict[str, Any]]] = {s: [] for s in SEVERITIES}
        for tally in sorted(self.invariants.values(), key=lambda t: (-t.failed, t.id)):
            groups[tally.severity].append(tally.as_dict())
        return {
            "spec": {"name": self.spec_name, "hash": self.spec_hash},
            "runs": self.runs,
            "conforming": self.conforming,
            "critical_conforming": self.critical_conforming,
            "missing_trials": self.missing,
            "errored_trials": self.errored,
            "not_covered": self.not_covered,
            "violations_written": self.violations_written,
            "by_severity": groups,
        }


def check(
    spec: Spec,
    trajectories: Iterable[Trajectory],
    store: ViolationStore | None = None,
    batch: int = 20_000,
) -> ConformanceSummary:
    """Judge every run; with a `store`, keep the violations there (idempotently, `batch` runs a transaction)."""
    summary = ConformanceSummary.for_spec(spec)
    checked: list[str] = []
    rows: list[tuple[Any, ...]] = []
    for result in _judge(spec, trajectories, summary):
        summary.add(result)
        if store is None:
            continue
        checked.append(result.trajectory_id)
        rows.extend(violation_rows(result))
        if len(checked) >= batch:
            summary.violations_written += store.write_violations(spec.hash, checked, rows)
            checked, rows = [], []
    if store is not None and checked:
        summary.violations_written += store.write_violations(spec.hash, checked, rows)
    return summary


def _judge(spec: Spec, trajectories: Iterable[Trajectory], summary: ConformanceSummary) -> Iterator[RunResult]:
    for trajectory in trajectories:
        if is_marker(trajectory):
            summary.missing += is_missing(trajectory)
            summary.errored += is_errored(trajectory)
            continue
        yield evaluate(spec, trajectory)


class ViolationStore(Protocol):
    """Where `check` keeps violations: `Store.write_violations` (the store owns the table)."""

    def write_violations(self, spec_hash: str, checked: list[str], rows: list[tuple[Any, ...]]) -> int: ...


def violation_rows(result: RunResult) -> list[tuple[Any, ...]]:
    """The run's violations in the store's `VIOLATION_COLUMNS` order."""
    return [
        (inv.id, result.trajectory_id, inv.severity, result.task_key, v.step_index, v.step_name, v.detail)
        for inv, v in result.violations
    ]


def write_violations(store: ViolationStore, results: Iterable[RunResult], spec_hash: str) -> int:
    """Replace the stored violations of these runs under `spec_hash`; returns the rows written."""
    results = list(results)
    return store.write_violations(spec_hash, [r.trajectory_id for r in results], [row for r in results for row in violation_rows(r)])


def render_text(summary: ConformanceSummary) -> str:
    """The `plumbline check` report: runs, then invariants grouped by severity with one example each."""
    lines = [
        f"spec {summary.spec_name} ({summary.spec_hash[:12]})",
        f"runs checked: {summary.runs}   conforming: {summary.conforming}/{summary.runs}   "
        f"critical-conforming: {summary.critical_conforming}/{summary.runs}",
    ]
    if summary.missing:
        lines.append(f"missing trials (never started, not judged): {summary.missing}")
    if summary.errored:
        lines.append(f"errored trials (started, no run to judge; certify scores them as failing runs): {summary.errored}")
    if summary.not_covered:
        lines.append(f"runs no invariant applied to: {summary.not_covered}")
    data = summary.as_dict()["by_severity"]
    for severity in SEVERITIES:
        if not data[severity]:
            continue
        lines.append("")
        lines.append(f"{severity.upper()}")
        for t in data[severity]:
            lines.append(
                f"  {t['id']:<28} {t['failed']:>6} failed / {t['applicable']} applicable"
                f"   tasks affected: {t['tasks_affected']}"
            )
            ex = t["example"]
            if ex is not None:
                where = f"step {ex['step_index']} ({ex['step_name']})" if ex["step_index"] is not None else "(never called)"
                lines.append(f"      e.g. {ex['trajectory_id']} {where}: {ex['detail']}")
            if t["evaluation_errors"]:
                lines.append(f"      evaluation errors: {t['evaluation_errors']} (first: {t['first_error']})")
    return "\n".join(lines)
