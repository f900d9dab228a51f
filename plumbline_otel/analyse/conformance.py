"""Conformance: which declared invariants each stored run obeyed (DESIGN.md sections 6-7).

`evaluate` judges one trajectory; `check` streams a store (or any iterable of trajectories)
through a spec, writes the violations to the store's ``violations`` table and returns a
`ConformanceSummary` grouped by severity and invariant. Runs recorded as missing trials
(``plumbline.trial.status`` of ``missing`` or ``error``: the agent never produced a run) are not
judged at all: they are counted apart, never as passes and never as failures.

Writing is idempotent and correct under re-assembly: a trajectory's old violations for the same
spec hash are replaced by the new ones in one transaction, so checking twice adds nothing and a
run re-assembled from late spans does not keep a stale violation.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from plumbline_otel.model import Trajectory
from plumbline_otel.spec import SEVERITIES, DeclaredInvariant, Severity, Spec, Verdict

PERTURBATION = "plumbline.perturbation"
STUDY = "plumbline.study"
TRIAL_ID = "plumbline.trial.id"
TRIAL_STATUS = "plumbline.trial.status"
VARIANT = "plumbline.variant"
MISSING_STATUSES = frozenset({"missing", "error"})
_RANK = {s: i for i, s in enumerate(SEVERITIES)}


def perturbation_of(trajectory: Trajectory) -> str:
    """The perturbation a run was made under; "baseline" for ordinary traffic."""
    value = trajectory.context.get(PERTURBATION)
    return str(value) if value not in (None, "") else "baseline"


def agent_label(service: str | None, version: str | None) -> str:
    """How an agent is named in reports: ``service@version`` (``service`` when unversioned)."""
    name = service or "(unknown service)"
    return f"{name}@{version}" if version else name


def is_missing(trajectory: Trajectory) -> bool:
    """True for a trial recorded as missing: there is no run to judge."""
    return str(trajectory.context.get(TRIAL_STATUS, "")).lower() in MISSING_STATUSES


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
            "not_covered": self.not_covered,
            "violations_written": self.violations_written,
            "by_severity": groups,
        }


def check(
    spec: Spec,
    trajectories: Iterable[Trajectory],
    connection: Any | None = None,
    batch: int = 20_000,
) -> ConformanceSummary:
    """Judge every run; with a duckdb `connection`, store the violations (idempotently)."""
    summary = ConformanceSummary.for_spec(spec)
    checked: list[str] = []
    rows: list[tuple[Any, ...]] = []
    for result in _judge(spec, trajectories, summary):
        summary.add(result)
        if connection is None:
            continue
        checked.append(result.trajectory_id)
        rows.extend(_rows(result))
        if len(checked) >= batch:
            summary.violations_written += _write(connection, checked, rows, spec.hash)
            checked, rows = [], []
    if connection is not None and checked:
        summary.violations_written += _write(connection, checked, rows, spec.hash)
    return summary


def _judge(spec: Spec, trajectories: Iterable[Trajectory], summary: ConformanceSummary) -> Iterator[RunResult]:
    for trajectory in trajectories:
        if is_missing(trajectory):
            summary.missing += 1
            continue
        yield evaluate(spec, trajectory)


VIOLATIONS_DDL = """
CREATE TABLE IF NOT EXISTS violations (
    spec_hash     VARCHAR NOT NULL,
    invariant_id  VARCHAR NOT NULL,
    trajectory_id VARCHAR NOT NULL,
    severity      VARCHAR NOT NULL,
    task_key      VARCHAR,
    step_index    INTEGER,
    step_name     VARCHAR,
    detail        VARCHAR,
    PRIMARY KEY (spec_hash, trajectory_id, invariant_id)
)
"""
_ROW_COLUMNS = ("invariant_id", "trajectory_id", "severity", "task_key", "step_index", "step_name", "detail")


def _rows(result: RunResult) -> list[tuple[Any, ...]]:
    return [
        (inv.id, result.trajectory_id, inv.severity, result.task_key, v.step_index, v.step_name, v.detail)
        for inv, v in result.violations
    ]


def write_violations(connection: Any, results: Iterable[RunResult], spec_hash: str) -> int:
    """Replace the stored violations of these runs under `spec_hash`; returns the rows written.

    One transaction, written as Arrow batches (never row-by-row INSERTs). The key is
    (spec_hash, trajectory_id, invariant_id): an invariant has one verdict per run.
    """
    results = list(results)
    return _write(connection, [r.trajectory_id for r in results], [row for r in results for row in _rows(r)], spec_hash)


def _write(connection: Any, checked_ids: list[str], rows: list[tuple[Any, ...]], spec_hash: str) -> int:
    import pyarrow as pa

    checked = pa.table({"trajectory_id": pa.array(checked_ids, pa.string())})
    columns = list(zip(*rows)) if rows else [[] for _ in _ROW_COLUMNS]
    table = pa.table({
        name: pa.array(list(col), pa.int32() if name == "step_index" else pa.string())
        for name, col in zip(_ROW_COLUMNS, columns)
    })
    connection.execute(VIOLATIONS_DDL)
    connection.register("_pl_checked", checked)
    connection.register("_pl_rows", table)
    try:
        connection.execute("BEGIN TRANSACTION")
        try:
            connection.execute(
                "DELETE FROM violations WHERE spec_hash = ? AND trajectory_id IN (SELECT trajectory_id FROM _pl_checked)",
                [spec_hash],
            )
            connection.execute(
                "INSERT INTO violations SELECT ?, invariant_id, trajectory_id, severity, task_key, step_index, step_name, detail "
                "FROM _pl_rows",
                [spec_hash],
            )
            connection.execute("COMMIT")
        except Exception:
            connection.execute("ROLLBACK")
            raise
    finally:
        connection.unregister("_pl_checked")
        connection.unregister("_pl_rows")
    return table.num_rows


def render_text(summary: ConformanceSummary) -> str:
    """The `plumbline check` report: runs, then invariants grouped by severity with one example each."""
    lines = [
        f"spec {summary.spec_name} ({summary.spec_hash[:12]})",
        f"runs checked: {summary.runs}   conforming: {summary.conforming}/{summary.runs}   "
        f"critical-conforming: {summary.critical_conforming}/{summary.runs}",
    ]
    if summary.missing:
        lines.append(f"missing trials (not judged): {summary.missing}")
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
