"""What the pages show, gathered from the store: plain functions of a DuckDB connection.

Every function takes a connection (the CLI's store connection, or the console's own read cursor,
which sees committed data and never waits on the writer) and answers with SQL: lists are paged
with LIMIT/OFFSET, counts are GROUP BYs, and only the one or two runs a page shows are decoded
into `Trajectory` objects. Nothing here loops over every stored run in Python, so a page costs
the same on a store of a thousand spans or a million.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from plumbline_otel.model import Trajectory
from plumbline_otel.rows import trajectory_from_doc
from plumbline_otel.runs import PERTURBATION, TRIAL_ID, VARIANT

PAGE_SIZE = 50
_CTX = "json_extract_string(doc, '$.context.\"{}\"')"
_PERT_SQL = f"coalesce({_CTX.format(PERTURBATION)}, 'baseline')"
_VARIANT_SQL = f"coalesce({_CTX.format(VARIANT)}, '')"
_AGENT_SQL = "coalesce(service, '(unknown service)') || coalesce('@' || service_version, '')"


@dataclass(frozen=True)
class Page:
    """One page of a listing: its rows, where it starts and how many rows there are in all."""

    rows: list[dict[str, Any]]
    page: int
    size: int
    total: int

    @property
    def pages(self) -> int:
        """How many pages the listing has (at least one, possibly empty)."""
        return max(1, -(-self.total // self.size))


class OneCursor:
    """A connection whose `cursor()` is itself: every query of a computation runs on one cursor,
    so one `interrupt()` stops whichever query is running (a cursor's own cursors would escape it)."""

    def __init__(self, cursor: Any) -> None:
        self._cursor = cursor

    def cursor(self) -> OneCursor:
        return self

    def execute(self, *args: Any) -> Any:
        return self._cursor.execute(*args)

    def close(self) -> None:
        """Left to the owner of the cursor."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)


class _StoreView:
    """A connection dressed as the `Store` that `coverage_report` reads (its `.connection` and `.schema_version`)."""

    def __init__(self, connection: Any) -> None:
        from plumbline_otel.store import schema_version

        self.connection = connection
        self.schema_version = schema_version(connection)


def _rows(connection: Any, sql: str, params: list[Any] | None = None) -> list[dict[str, Any]]:
    cursor = connection.cursor()
    try:
        cursor.execute(sql, params or [])
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, row)) for row in cursor.fetchall()]
    finally:
        cursor.close()


def has_table(connection: Any, name: str) -> bool:
    """True when the store has table `name` (violations exist only once `check` has run)."""
    return bool(_rows(connection, "SELECT 1 AS x FROM information_schema.tables WHERE table_name = ?", [name]))


def runs_page(connection: Any, page: int = 0, size: int = PAGE_SIZE, agent: str | None = None,
              task: str | None = None) -> Page:
    """Runs, newest first, one page at a time; `agent` is ``service`` or ``service@version``."""
    clauses, params = ["TRUE"], []  # type: list[str], list[Any]
    if agent:
        clauses.append(f"(service = ? OR {_AGENT_SQL} = ?)")
        params += [agent, agent]
    if task:
        clauses.append("task_key = ?")
        params.append(task)
    where = " AND ".join(clauses)
    total = _rows(connection, f"SELECT count(*) AS n FROM trajectories WHERE {where}", params)[0]["n"]
    rows = _rows(connection, f"""
        WITH page AS (SELECT trajectory_id FROM trajectories WHERE {where} ORDER BY start_ns DESC, trajectory_id LIMIT ? OFFSET ?)
        SELECT trajectory_id, {_AGENT_SQL} AS agent, task_key, {_PERT_SQL} AS perturbation, start_ns, n_steps, n_tool_calls,
               {_CTX.format('plumbline.trial.status')} AS trial_status
        FROM trajectories SEMI JOIN page USING (trajectory_id)
        ORDER BY start_ns DESC, trajectory_id""", [*params, size, page * size])  # JSON is read for the page's rows only
    return Page(rows, page, size, int(total))


def load_run(connection: Any, run_id: str) -> Trajectory | None:
    """One stored run by its trajectory id or trace id, else by its trial id (what certificates list)."""
    rows = _rows(connection, "SELECT doc FROM trajectories WHERE trajectory_id = ? OR trace_id = ? LIMIT 1", [run_id, run_id])
    if not rows:
        rows = _rows(connection, f"SELECT doc FROM trajectories WHERE {_CTX.format(TRIAL_ID)} = ? ORDER BY start_ns DESC LIMIT 1",
                     [run_id])
    return trajectory_from_doc(orjson.loads(rows[0]["doc"])) if rows else None


def run_violations(connection: Any, trajectory_id: str) -> list[dict[str, Any]]:
    """The stored violations of one run, most severe first, each with the step that broke it."""
    if not has_table(connection, "violations"):
        return []
    return _rows(connection, """
        SELECT invariant_id, severity, step_index, step_name, detail FROM violations WHERE trajectory_id = ?
        ORDER BY CASE severity WHEN 'critical' THEN 0 WHEN 'major' THEN 1 ELSE 2 END, invariant_id""", [trajectory_id])


def violations_summary(connection: Any, spec_hash: str | None = None, examples: int = 3) -> list[dict[str, Any]]:
    """Per invariant: severity, runs violating, tasks affected and a few example runs (with the step)."""
    if not has_table(connection, "violations"):
        return []
    where, params = ("spec_hash = ?", [spec_hash]) if spec_hash else ("TRUE", [])
    rows = _rows(connection, f"""
        WITH v AS (SELECT *, row_number() OVER (PARTITION BY invariant_id ORDER BY trajectory_id) AS k
                   FROM violations WHERE {where})
        SELECT invariant_id, any_value(severity) AS severity, count(*) AS runs, count(DISTINCT task_key) AS tasks,
               list({{'trajectory_id': trajectory_id, 'task_key': task_key, 'step_index': step_index,
                     'step_name': step_name, 'detail': detail}} ORDER BY trajectory_id) FILTER (WHERE k <= ?) AS examples
        FROM v GROUP BY invariant_id
        ORDER BY CASE any_value(severity) WHEN 'critical' THEN 0 WHEN 'major' THEN 1 ELSE 2 END, runs DESC, invariant_id""",
                 [*params, examples])
    return rows


def coverage(connection: Any) -> dict[str, Any]:
    """The coverage report (`plumbline coverage`), computed over this connection."""
    from plumbline_otel.coverage import coverage_report

    return coverage_report(_StoreView(connection))  # type: ignore[arg-type]


def task_runs(connection: Any, task: str, perturbation: str | None = None, per_cell: int = 2) -> list[dict[str, Any]]:
    """The first `per_cell` runs of each agent in each (perturbation, variant) of one task: what a pairing chooses from."""
    where, params = ("task_key = ?", [task]) if perturbation is None else (f"task_key = ? AND {_PERT_SQL} = ?", [task, perturbation])
    return _rows(connection, f"""
        SELECT * FROM (
            SELECT trajectory_id, service, {_AGENT_SQL} AS agent, {_PERT_SQL} AS perturbation, {_VARIANT_SQL} AS variant, start_ns
            FROM trajectories WHERE {where})
        QUALIFY row_number() OVER (PARTITION BY agent, perturbation, variant ORDER BY start_ns, trajectory_id) <= ?
        ORDER BY start_ns, trajectory_id""", [*params, per_cell])


def pick_pair(runs: list[dict[str, Any]], vs: str, agent: str | None = None,
              perturbation: str | None = None) -> tuple[str, str] | None:
    """Ids of run A (`agent`, or any other agent) and run B (`vs`) on the same perturbation and variant.

    With no other agent on the task, two runs of `vs` itself (two repeats) are paired. The first
    matching cell in run order wins, so the choice is stable.
    """
    def named(r: dict[str, Any], name: str) -> bool:
        return name in (r["service"], r["agent"])

    def cell(r: dict[str, Any]) -> tuple[str, str]:
        return r["perturbation"], r["variant"]

    runs = [r for r in runs if perturbation is None or r["perturbation"] == perturbation]
    b_runs = [r for r in runs if named(r, vs)]
    a_runs = [r for r in runs if (named(r, agent) if agent else not named(r, vs))]
    for a in a_runs:
        for b in b_runs:
            if cell(a) == cell(b):
                return a["trajectory_id"], b["trajectory_id"]
    if agent is None:  # two repeats of the same agent
        for i, a in enumerate(b_runs):
            for b in b_runs[i + 1:]:
                if cell(a) == cell(b):
                    return a["trajectory_id"], b["trajectory_id"]
    return None


def pair_on_task(connection: Any, task: str, vs: str, agent: str | None = None,
                 perturbation: str | None = None) -> tuple[Trajectory, Trajectory] | None:
    """Two stored runs on `task` and the same perturbation and variant: A (`agent`) and B (`vs`)."""
    ids = pick_pair(task_runs(connection, task, perturbation), vs, agent, perturbation)
    if ids is None:
        return None
    a, b = load_run(connection, ids[0]), load_run(connection, ids[1])
    return (a, b) if a is not None and b is not None else None


def diff_candidates(connection: Any, limit: int = 20, window: int = 20_000) -> list[dict[str, Any]]:
    """Tasks run by two or more agents under the same perturbation and variant, among the `window`
    most recent runs: the diffs worth a link."""
    return _rows(connection, f"""
        SELECT task_key, perturbation, variant, list(DISTINCT agent ORDER BY agent) AS agents,
               list(DISTINCT service ORDER BY service) AS services, count(*) AS runs
        FROM (SELECT task_key, service, {_AGENT_SQL} AS agent, {_PERT_SQL} AS perturbation, {_VARIANT_SQL} AS variant
              FROM trajectories WHERE task_key IS NOT NULL AND trajectory_id IN (
                  SELECT trajectory_id FROM trajectories ORDER BY start_ns DESC LIMIT {int(window)}))
        GROUP BY task_key, perturbation, variant HAVING count(DISTINCT agent) > 1
        ORDER BY perturbation = 'baseline', task_key, perturbation LIMIT ?""", [limit])


def store_totals(connection: Any) -> dict[str, Any]:
    """Spans, runs, agents and tasks in the store: the console's first line."""
    spans = _rows(connection, "SELECT count(*) AS spans FROM spans")[0]
    runs = _rows(connection, f"""SELECT count(*) AS runs, count(DISTINCT {_AGENT_SQL}) AS agents,
                                 count(DISTINCT task_key) AS tasks FROM trajectories""")[0]
    return {**spans, **runs}


__all__ = ["PAGE_SIZE", "OneCursor", "Page", "coverage", "diff_candidates", "has_table", "load_run", "pair_on_task", "pick_pair",
           "run_violations", "runs_page", "store_totals", "task_runs", "violations_summary"]
