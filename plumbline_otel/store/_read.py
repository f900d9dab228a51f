"""The store's read interface: every query a reader runs on the store's tables, and the only place outside the writer that builds SQL over them.

A `Reader` runs on one DuckDB connection: a `Store` is one (on its own connection), and the console
reads through a cursor of the server's database (`Reader(cursor)`), which sees committed data and
never waits on the writer. Lists are paged with LIMIT/OFFSET, counts are GROUP BYs, and only the
one or two runs a page shows are decoded into `Trajectory` objects, so a page costs the same on a
store of a thousand spans or a million. Rows come back as the TypedDicts below (the pages'
templates read them by key); the coverage figures are in `_read_coverage.py`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import orjson
import pyarrow as pa

from plumbline_otel.model import Trajectory
from plumbline_otel.rows import trajectory_from_doc
from plumbline_otel.runs import (
    FAULT_FIRED,
    FAULT_PERTURBATIONS,
    PERTURBATION,
    RECORD_KIND,
    RECORD_KINDS,
    REQUEST_PERTURBATIONS,
    RUN_TRACE,
    SEEN,
    STUDY,
    TRIAL_ID,
    TRIAL_STATUS,
    VARIANT,
)
from plumbline_otel.store._read_coverage import coverage_counts
from plumbline_otel.store._schema import schema_version
from plumbline_otel.trials import KeyRing

PAGE_SIZE = 50
_CTX = "json_extract_string(doc, '$.context.\"{}\"')"
_PERT_SQL = f"coalesce({_CTX.format(PERTURBATION)}, 'baseline')"
_VARIANT_SQL = f"coalesce({_CTX.format(VARIANT)}, '')"
_AGENT_SQL = "coalesce(service, '(unknown service)') || coalesce('@' || service_version, '')"
_RECORD_SQL = (f"(n_steps = 0 AND coalesce({_CTX.format(RECORD_KIND)}, '') IN ({', '.join(repr(k) for k in RECORD_KINDS)}))")  # runs.is_record
_STUDY_SQL = _CTX.format(STUDY)
_COST_SQL = ("try_cast(coalesce(json_extract_string(attributes, '$.\"llm.cost.total\"'), "
             "json_extract_string(attributes, '$.\"gen_ai.usage.cost\"')) AS DOUBLE)")
# The project's recorded producer and framework traces (runs/samples, tests/fixtures) name their service so: the demo loads
# them to show what the instrumentations send, and they are sample traffic, not agents under test.
FIXTURE_PREFIX = "plumbline-fixture-"
_FIXTURE_SQL = f"starts_with(coalesce(service, ''), '{FIXTURE_PREFIX}')"
_SEVERITY_ORDER = "CASE {} WHEN 'critical' THEN 0 WHEN 'major' THEN 1 ELSE 2 END"

STATUSES = ("conforming", "violating", "not_checked", "errored", "unexposed", "missing")
SORTS = {"started": "start_ns", "duration": "(end_ns - start_ns)", "steps": "n_steps", "agent": _AGENT_SQL, "task": "task_key",
         "tokens": "coalesce(tok.tokens, 0)"}
_TOKENS = ("SELECT trace_id, sum(input_tokens) AS tokens_in, sum(output_tokens) AS tokens_out, "
           "coalesce(sum(input_tokens), 0) + coalesce(sum(output_tokens), 0) AS tokens, sum({cost}) AS cost, "
           "count(*) FILTER (WHERE step_kind = 'llm_call') AS llm_calls FROM spans WHERE {where} GROUP BY trace_id")

# `parquet_export`'s tables: runs, steps and violations, each row with its UTC day and service (the partitions).
_DATE = "strftime(make_timestamp(t.start_ns // 1000), '%Y-%m-%d') AS date"

_TRAJECTORIES = f"""
SELECT t.trajectory_id AS run, t.trace_id, t.task_key, t.task_key_source, t.service_version, t.agent_name,
       t.input, t.final_output, t.conventions, make_timestamp(t.start_ns // 1000) AS start_time, t.start_ns, t.end_ns,
       t.n_steps, t.n_tool_calls, nullif((t.doc->'context')::VARCHAR, 'null') AS context, {_DATE}, t.service
FROM trajectories t WHERE {{window}}"""

_STEPS = f"""
WITH s AS (
    SELECT t.trajectory_id, t.trace_id, t.service, t.start_ns,
           unnest(json_extract(t.doc, '$.steps[*]')) AS step,
           generate_subscripts(json_extract(t.doc, '$.steps[*]'), 1) - 1 AS step_index
    FROM trajectories t WHERE {{window}})
SELECT t.trajectory_id AS run, t.step_index AS "index", t.step->>'kind' AS kind, t.step->>'name' AS name,
       nullif((t.step->'args')::VARCHAR, 'null') AS arguments, t.step->>'result' AS result, t.step->>'error' AS error,
       t.step->>'source' AS source, t.step->>'call_id' AS call_id, t.trace_id, t.step->>'span_id' AS span_id,
       (t.step->>'start_ns')::BIGINT AS step_start_ns, {_DATE}, t.service
FROM s t"""

_VIOLATIONS = f"""
SELECT v.trajectory_id AS run, v.spec_hash, v.invariant_id, v.severity, v.task_key, v.step_index, v.step_name, v.detail,
       t.trace_id, {_DATE}, t.service
FROM violations v JOIN trajectories t USING (trajectory_id) WHERE {{window}}"""

# exported table -> (its query, the store table it needs: a store never checked has no violations)
_EXPORTS = {"trajectories": (_TRAJECTORIES, "trajectories"), "steps": (_STEPS, "trajectories"), "violations": (_VIOLATIONS, "violations")}


@dataclass(frozen=True)
class RunFilter:
    """Which stored runs a product module reads, as values the store binds as parameters (never SQL).

    Each field left as None means any; the fields given must all hold. `--where` (the user's own SQL
    over the trajectories table) is the expert option beside it; product code passes a `RunFilter`.
    """

    trace_id: str | None = None  # the run(s) of one trace
    study: str | None = None  # runs and records of one replay study (`plumbline.study`)
    study_prefix: str | None = None  # of the studies whose name starts so (the demo's `ap-demo-…`)
    run_ids: tuple[str, ...] | None = None  # these trajectory ids

    def sql(self) -> tuple[list[str], list[Any]]:
        """The conditions over the trajectories table, with their parameters."""
        clauses: list[str] = []
        params: list[Any] = []
        for condition, value in (("trace_id = ?", self.trace_id), (f"{_STUDY_SQL} = ?", self.study),
                                 (f"starts_with({_STUDY_SQL}, ?)", self.study_prefix),
                                 ("trajectory_id IN (SELECT unnest(?::VARCHAR[]))", list(self.run_ids) if self.run_ids is not None else None)):
            if value is not None:
                clauses.append(condition)
                params.append(value)
        return clauses, params

    def matches(self, run: Trajectory) -> bool:
        """The same test on a run already read (a server's, which takes no filter)."""
        study = run.context.get(STUDY)
        study_text = None if study is None else str(study)
        return ((self.trace_id is None or run.trace_id == self.trace_id)
                and (self.study is None or study_text == self.study)
                and (self.study_prefix is None or (study_text is not None and study_text.startswith(self.study_prefix)))
                and (self.run_ids is None or run.trajectory_id in self.run_ids))


@dataclass(frozen=True)
class RunFilters:
    """What the runs list is narrowed to (each empty means any) and how it is sorted."""

    agent: str | None = None  # service or service@version
    task: str | None = None
    perturbation: str | None = None
    study: str | None = None
    status: str | None = None  # one of STATUSES
    invariant: str | None = None  # runs violating this invariant
    q: str | None = None  # text in the request
    sort: str = "started"
    order: str = "desc"

    @classmethod
    def of(cls, params: dict[str, str]) -> RunFilters:
        """From a query string's parameters; unknown sorts and statuses are a ValueError (a 400)."""
        got = {k: (params.get(k) or None) for k in ("agent", "task", "perturbation", "study", "status", "invariant", "q")}
        sort, order = params.get("sort") or "started", params.get("order") or "desc"
        if sort not in SORTS or order not in ("asc", "desc"):
            raise ValueError(f"sort by one of {', '.join(SORTS)}, order asc or desc")
        if got["status"] is not None and got["status"] not in STATUSES:
            raise ValueError(f"status is one of {', '.join(STATUSES)}")
        return cls(**got, sort=sort, order=order)

    def params(self) -> dict[str, str]:
        """The non-empty ones, for links that keep them."""
        return {k: v for k, v in vars(self).items() if v and (k, v) not in (("sort", "started"), ("order", "desc"))}


class InvariantMark(TypedDict):
    id: str
    severity: str


class _RunRowColumns(TypedDict):
    trajectory_id: str
    trace_id: str
    agent: str
    service: str | None
    task_key: str | None
    task_key_source: str | None
    input: str | None  # its first 240 characters
    input_cut: bool
    perturbation: str
    study: str | None
    trial_id: str | None
    start_ns: int
    end_ns: int
    duration_ns: int
    n_steps: int
    n_tool_calls: int


class RunRow(_RunRowColumns, total=False):
    """A row of the runs list; the keys past the columns are given by the page (`report.data.runs_page`)."""

    status: str
    reason: str | None
    invariants: list[InvariantMark]
    tokens_in: int | None
    tokens_out: int | None
    llm_calls: int
    cost: float | None


@dataclass(frozen=True)
class Page:
    """One page of a listing: its rows, where it starts and how many rows there are in all."""

    rows: list[RunRow]
    page: int
    size: int
    total: int

    @property
    def pages(self) -> int:
        """How many pages the listing has (at least one, possibly empty)."""
        return max(1, -(-self.total // self.size))


class Usage(TypedDict):
    """A trace's LLM calls: tokens in and out, cost where the spans carry it."""

    trace_id: str
    tokens_in: int | None
    tokens_out: int | None
    tokens: int
    cost: float | None
    llm_calls: int


class TimelineSpan(TypedDict):
    span_id: str
    parent_span_id: str | None
    name: str
    start_ns: int | None
    end_ns: int | None
    step_kind: str | None
    tool_name: str | None
    model: str | None
    input_tokens: int | None
    output_tokens: int | None
    input_text: str | None
    output_text: str | None
    status_code: str | None
    error: str | None
    cost: float | None


class CheckRow(TypedDict):
    spec_hash: str
    spec_name: str | None
    spec_path: str | None
    checked_ns: int | None
    runs: int | None


class RunViolation(TypedDict):
    invariant_id: str
    severity: str
    step_index: int | None
    step_name: str | None
    detail: str | None


class ViolationSummary(TypedDict):
    """One invariant's violations: how many runs and tasks, and a few examples (each a dict of the run and the step)."""

    invariant_id: str
    severity: str
    runs: int
    tasks: int
    examples: list[dict[str, Any]]


class TaskRun(TypedDict):
    trajectory_id: str
    service: str | None
    agent: str
    perturbation: str
    variant: str
    start_ns: int


class DiffCandidate(TypedDict):
    task_key: str
    task_key_source: str | None
    request: str | None
    perturbation: str
    variant: str
    agents: list[str]
    services: list[str]
    runs: int


class Totals(TypedDict):
    """The first line of a page: spans, runs, agents, tasks, and the recorded samples counted apart."""

    spans: int
    runs: int
    agents: int
    tasks: int
    samples: int
    sample_services: int
    study: str | None


def _scope(study: str | None, column: str = "trajectory_id") -> tuple[str, list[Any]]:
    """SQL (and its parameters) keeping rows of one study's runs and records by `column`; TRUE for no study."""
    if study is None:
        return "TRUE", []
    return f"{column} IN (SELECT {column} FROM trajectories WHERE {_STUDY_SQL} = ?)", [study]


class Reader:
    """The queries readers run on a store, on one connection (see the module docstring)."""

    def __init__(self, connection: Any, version: int | None = None) -> None:
        """`version`: the schema version the connection holds, when the caller knows it (read from the file otherwise)."""
        self.connection = connection
        self.schema_version = version if version is not None else self._version()

    def _version(self) -> int:
        """The file's schema version, read through a cursor of its own: a result left open on `connection` (a
        console's) would hold the database, and a writer could not attach an invalidated file again."""
        cursor = self.connection.cursor()
        try:
            return schema_version(cursor)
        finally:
            cursor.close()

    def _rows(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        cursor = self.connection.cursor()
        try:
            cursor.execute(sql, list(params))
            names = [d[0] for d in cursor.description]
            return [dict(zip(names, row)) for row in cursor.fetchall()]
        finally:
            cursor.close()

    def _docs(self, sql: str, params: Sequence[Any] = ()) -> list[Trajectory]:
        return [trajectory_from_doc(orjson.loads(r["doc"])) for r in self._rows(sql, params)]

    def has_table(self, name: str) -> bool:
        """True when the store has table `name` (a file an older plumbline wrote, opened read-only, may lack some)."""
        return bool(self._rows("SELECT 1 AS x FROM information_schema.tables WHERE table_name = ?", [name]))

    # --- runs ---------------------------------------------------------------------------------

    def trajectories(self, service: str | None = None, task: str | None = None, since_ns: int | None = None,
                     where: str | None = None, runs: RunFilter | None = None) -> Iterator[Trajectory]:
        """Stored trajectories in start order, of `runs` when given.

        `where` is the user's own SQL filter over the trajectories table (`--where`, an expert option
        of the CLI); product code narrows the runs with `runs`, whose values are bound as parameters.
        """
        clauses, params = runs.sql() if runs is not None else ([], [])
        clauses.insert(0, "TRUE")
        for column, value in (("service", service), ("task_key", task)):
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(value)
        if since_ns is not None:
            clauses.append("start_ns >= ?")
            params.append(since_ns)
        if where:
            clauses.append(f"({where})")
        cursor = self.connection.cursor()
        cursor.execute(f"SELECT doc FROM trajectories WHERE {' AND '.join(clauses)} ORDER BY start_ns, trajectory_id", params)
        while rows := cursor.fetchmany(1000):
            for (doc,) in rows:
                yield trajectory_from_doc(orjson.loads(doc))

    def trajectories_built_since(self, ns: int) -> int:
        """How many stored trajectories were built at or after `ns` (a wall-clock time in ns)."""
        return int(self._rows("SELECT count(*) AS n FROM trajectories WHERE assembled_ns >= ?", [ns])[0]["n"])

    def assembled_after(self, after_ns: int, assemblies: int) -> list[tuple[Trajectory, int]]:
        """The runs of the first `assemblies` assemblies after `after_ns`, each with when it was assembled (a watermark)."""
        rows = self._rows(
            "SELECT doc, assembled_ns FROM trajectories WHERE assembled_ns > ? AND assembled_ns <= "
            "(SELECT max(a) FROM (SELECT DISTINCT assembled_ns AS a FROM trajectories WHERE assembled_ns > ? ORDER BY a LIMIT ?))",
            [after_ns, after_ns, assemblies])
        return [(trajectory_from_doc(orjson.loads(r["doc"])), r["assembled_ns"]) for r in rows]

    def pending_traces(self) -> int:
        """Traces whose spans arrived after their trajectory was last built (or that have none yet).

        Readers that cannot assemble (a read-only file) report this count, because the
        trajectories table does not reflect those traces' spans.
        """
        return int(self._rows("SELECT count(*) AS n FROM dirty_traces")[0]["n"])

    def trace_ids(self) -> list[str]:
        """Every stored trace id, in order."""
        return [r["trace_id"] for r in self._rows("SELECT DISTINCT trace_id FROM spans ORDER BY 1")]

    def load_run(self, run_id: str) -> Trajectory | None:
        """One stored run by its trajectory id or trace id, else by its trial id (what certificates list)."""
        runs = self._docs("SELECT doc FROM trajectories WHERE trajectory_id = ? OR trace_id = ? LIMIT 1", [run_id, run_id])
        if not runs:
            runs = self._docs(f"SELECT doc FROM trajectories WHERE {_CTX.format(TRIAL_ID)} = ? ORDER BY start_ns DESC LIMIT 1", [run_id])
        return runs[0] if runs else None

    def recent_runs(self, limit: int, study: str | None = None) -> list[Trajectory]:
        """The `limit` most recent runs that have a task (never the driver's records), oldest first; of one study when given."""
        scope, params = ("TRUE", []) if study is None else (f"{_STUDY_SQL} = ?", [study])
        return self._docs("SELECT doc FROM (SELECT doc, start_ns, trajectory_id FROM trajectories WHERE task_key IS NOT NULL "
                          f"AND NOT {_RECORD_SQL} AND {scope} ORDER BY start_ns DESC LIMIT ?) ORDER BY start_ns, trajectory_id",
                          [*params, limit])

    def study(self, study: str) -> tuple[pa.Table, list[Trajectory]]:
        """One study's runs and records, and every span of their traces (as stored rows)."""
        spans = self.connection.sql(f"SELECT * FROM spans WHERE trace_id IN (SELECT trace_id FROM trajectories WHERE {_STUDY_SQL} = ?)",
                                    params=[study]).to_arrow_table()
        return spans, self._docs(f"SELECT doc FROM trajectories WHERE {_STUDY_SQL} = ? ORDER BY start_ns, trajectory_id", [study])

    def file_path(self) -> str | None:
        """The store's file (None for a store in memory)."""
        found = self.connection.execute("SELECT path FROM duckdb_databases() WHERE database_name = current_database()").fetchone()
        return str(found[0]) if found and found[0] else None

    def study_keys(self) -> KeyRing:
        """The keys of the replay studies whose state sits beside this file (``<db>.replay/<study>/study.json``):
        what verifies the driver's records it holds (`trials.verify_record`). Empty for a store in memory."""
        path = self.file_path()
        return KeyRing.beside([path]) if path else KeyRing()

    def trial_records(self, studies: list[str], trial_ids: list[str]) -> list[Trajectory]:
        """The replay driver's records of these trials of these studies."""
        return self._docs(f"SELECT doc FROM trajectories WHERE {_RECORD_SQL} AND {_STUDY_SQL} IN (SELECT unnest(?)) "
                          f"AND {_CTX.format(TRIAL_ID)} IN (SELECT unnest(?))", [studies, trial_ids])

    # --- the runs list --------------------------------------------------------------------------

    def _status_sql(self, status: str) -> str:
        """Runs of one status, in SQL (the page's own status is decided by `trials.account`, which these follow)."""
        violated = "trajectory_id IN (SELECT trajectory_id FROM violations)" if self.has_table("violations") else "FALSE"
        checked = "trajectory_id IN (SELECT trajectory_id FROM checked_runs)" if self.has_table("checked_runs") else "FALSE"
        marker = f"lower({_CTX.format(TRIAL_STATUS)})"
        recorded = (f"FROM trajectories WHERE {_RECORD_SQL} AND {_CTX.format(RECORD_KIND)} = 'attempt' "
                    f"AND {_CTX.format(RUN_TRACE)} IS NOT NULL")
        errored = (f"({marker} IN ('errored', 'error') OR trace_id IN (SELECT {_CTX.format(RUN_TRACE)} {recorded} "
                   f"AND lower({_CTX.format(TRIAL_STATUS)}) = 'errored'))")
        faults = ", ".join(f"'{p}'" for p in sorted(FAULT_PERTURBATIONS))
        requests = ", ".join(f"'{p}'" for p in sorted(REQUEST_PERTURBATIONS))
        unexposed = (f"(({_PERT_SQL} IN ({faults}) AND coalesce(lower({_CTX.format(FAULT_FIRED)}), '') NOT IN ('true', '1') "
                     f"AND trace_id NOT IN (SELECT {_CTX.format(RUN_TRACE)} {recorded} AND lower({_CTX.format(FAULT_FIRED)}) IN ('true', '1')))"
                     f" OR ({_PERT_SQL} IN ({requests}) AND trace_id IN (SELECT {_CTX.format(RUN_TRACE)} {recorded} "
                     f"AND coalesce(lower({_CTX.format(SEEN)}), '') NOT IN ('true', '1'))))")
        return {
            "violating": violated,
            "conforming": f"({checked} AND NOT {violated} AND NOT {errored})",
            "not_checked": f"(NOT {checked} AND NOT {violated} AND NOT {errored} AND coalesce({marker}, '') <> 'missing')",
            "errored": errored,
            "unexposed": f"(NOT {errored} AND {unexposed})",
            "missing": f"({marker} = 'missing')",
        }[status]

    def _where(self, f: RunFilters) -> tuple[str, list[Any]]:
        clauses, params = [f"NOT {_RECORD_SQL}"], []  # type: list[str], list[Any]
        if f.agent:
            clauses.append(f"(service = ? OR {_AGENT_SQL} = ?)")
            params += [f.agent, f.agent]
        if f.task:
            clauses.append("task_key = ?")
            params.append(f.task)
        if f.perturbation:
            clauses.append(f"{_PERT_SQL} = ?")
            params.append(f.perturbation)
        if f.study:
            clauses.append(f"{_STUDY_SQL} = ?")
            params.append(f.study)
        if f.q:
            clauses.append("(contains(lower(coalesce(input, '')), lower(?)) OR contains(lower(coalesce(task_key, '')), lower(?)))")
            params += [f.q, f.q]
        if f.invariant:
            violations = self.has_table("violations")
            clauses.append("trajectory_id IN (SELECT trajectory_id FROM violations WHERE invariant_id = ?)" if violations else "FALSE")
            params += [f.invariant] if violations else []
        if f.status:
            clauses.append(self._status_sql(f.status))
        return " AND ".join(clauses), params

    def runs_page(self, filters: RunFilters, page: int, size: int, only: str | None = None) -> tuple[Page, dict[str, Trajectory]]:
        """One page of runs (never the replay driver's records), filtered and sorted, with each row's run decoded.

        `only`: that run's row alone. A page past the last is the last page.
        """
        where, params = self._where(filters)
        if only is not None:
            where, params = f"{where} AND trajectory_id = ?", [*params, only]
        total = int(self._rows(f"SELECT count(*) AS n FROM trajectories WHERE {where}", params)[0]["n"])
        page = max(0, min(page, -(-total // size) - 1))  # past the last page (?page=999999999999): the last page
        order = f"{SORTS[filters.sort]} {filters.order.upper()} NULLS LAST, trajectory_id"
        join = (f"LEFT JOIN ({_TOKENS.format(cost=_COST_SQL, where='step_kind = ' + repr('llm_call'))}) tok USING (trace_id)"
                if filters.sort == "tokens" else "")
        rows = self._rows(f"""
            WITH page AS (SELECT trajectory_id FROM trajectories {join} WHERE {where} ORDER BY {order} LIMIT ? OFFSET ?)
            SELECT trajectory_id, trace_id, {_AGENT_SQL} AS agent, service, task_key, task_key_source, left(input, 240) AS input,
                   length(input) > 240 AS input_cut, {_PERT_SQL} AS perturbation, {_STUDY_SQL} AS study, {_CTX.format(TRIAL_ID)} AS trial_id,
                   start_ns, end_ns, end_ns - start_ns AS duration_ns, n_steps, n_tool_calls, doc
            FROM trajectories {join} SEMI JOIN page USING (trajectory_id)
            ORDER BY {order}""", [*params, size, page * size])  # JSON is read for the page's rows only
        runs = {r["trajectory_id"]: trajectory_from_doc(orjson.loads(r.pop("doc"))) for r in rows}
        return Page(rows, page, size, total), runs  # type: ignore[arg-type]  # the columns are RunRow's

    def invariants_violated(self, run_ids: list[str]) -> dict[str, list[InvariantMark]]:
        """The invariants each of these runs violates (under any spec), most severe first."""
        if not self.has_table("violations"):
            return {}
        violated: dict[str, list[InvariantMark]] = {}
        for v in self._rows(f"""SELECT trajectory_id, invariant_id, any_value(severity) AS severity FROM violations
                                WHERE trajectory_id IN (SELECT unnest(?)) GROUP BY ALL
                                ORDER BY {_SEVERITY_ORDER.format('any_value(severity)')}, invariant_id""", [run_ids]):
            violated.setdefault(v["trajectory_id"], []).append({"id": v["invariant_id"], "severity": v["severity"]})
        return violated

    def checked(self, run_ids: list[str]) -> set[str]:
        """Those of these runs that some spec judged (`check`, `certify`)."""
        if not self.has_table("checked_runs"):
            return set()
        return {r["trajectory_id"] for r in self._rows(
            "SELECT DISTINCT trajectory_id FROM checked_runs WHERE trajectory_id IN (SELECT unnest(?))", [run_ids])}

    def usage(self, trace_ids: list[str]) -> dict[str, Usage]:
        """Tokens, cost and LLM calls of these traces' LLM spans, by trace."""
        rows = self._rows(_TOKENS.format(cost=_COST_SQL, where="trace_id IN (SELECT unnest(?)) AND step_kind = 'llm_call'"), [trace_ids])
        return {r["trace_id"]: r for r in rows}  # type: ignore[misc]  # the columns are Usage's

    def filter_choices(self) -> dict[str, list[str]]:
        """The values each filter of the runs list can take (agents, perturbations, studies, invariants, statuses)."""
        one = self._rows(f"""SELECT list(DISTINCT {_AGENT_SQL} ORDER BY {_AGENT_SQL}) AS agents FROM trajectories
                             WHERE NOT {_RECORD_SQL}""")[0]
        more = self._rows(f"""SELECT list(DISTINCT p ORDER BY p) AS perturbations, list(DISTINCT s ORDER BY s) FILTER (WHERE s IS NOT NULL) AS studies
                              FROM (SELECT {_PERT_SQL} AS p, {_STUDY_SQL} AS s FROM trajectories WHERE n_steps = 0 OR trajectory_id IN
                                    (SELECT trajectory_id FROM trajectories ORDER BY start_ns DESC LIMIT 20000))""")[0]
        invariants = ([r["invariant_id"] for r in self._rows("SELECT DISTINCT invariant_id FROM violations ORDER BY 1")]
                      if self.has_table("violations") else [])
        return {"agents": one["agents"] or [], "perturbations": more["perturbations"] or [], "studies": more["studies"] or [],
                "invariants": invariants, "statuses": list(STATUSES)}

    def spans_of(self, trace_id: str, limit: int) -> list[TimelineSpan]:
        """A trace's first `limit` spans in start order, as a waterfall shows them."""
        return self._rows(f"""
            SELECT span_id, parent_span_id, name, start_ns, end_ns, step_kind, tool_name, model, input_tokens, output_tokens,
                   input_text, output_text, status_code, error, {_COST_SQL} AS cost
            FROM spans WHERE trace_id = ? ORDER BY start_ns, span_id LIMIT ?""", [trace_id, limit])  # type: ignore[return-value]

    # --- checks, violations, certificates ---------------------------------------------------------

    def stored_violations(self, spec_hash: str, run_ids: list[str]) -> set[tuple[str, str]]:
        """(trajectory_id, invariant_id) of the stored violations of these runs under `spec_hash`."""
        rows = self._rows("SELECT trajectory_id, invariant_id FROM violations WHERE spec_hash = ? AND trajectory_id IN (SELECT unnest(?))",
                          [spec_hash, run_ids])
        return {(r["trajectory_id"], r["invariant_id"]) for r in rows}

    def run_violations(self, trajectory_id: str) -> list[RunViolation]:
        """The stored violations of one run, most severe first, each with the step that broke it."""
        if not self.has_table("violations"):
            return []
        return self._rows(f"""
            SELECT invariant_id, severity, step_index, step_name, detail FROM violations WHERE trajectory_id = ?
            ORDER BY {_SEVERITY_ORDER.format('severity')}, invariant_id""", [trajectory_id])  # type: ignore[return-value]

    def violations_summary(self, spec_hash: str | None = None, examples: int = 3, study: str | None = None) -> list[ViolationSummary]:
        """Per invariant: severity, runs violating, tasks affected and a few example runs (with the step and the run's
        request text); of one study's runs when `study` is given."""
        if not self.has_table("violations"):
            return []
        where, params = ("spec_hash = ?", [spec_hash]) if spec_hash else ("TRUE", [])
        scope, scoped = _scope(study)
        return self._rows(f"""
            WITH v AS (SELECT *, row_number() OVER (PARTITION BY invariant_id ORDER BY trajectory_id) AS k
                       FROM violations WHERE {where} AND {scope}),
                 e AS (SELECT v.*, left(t.input, 160) AS request, t.task_key_source
                       FROM (SELECT * FROM v WHERE k <= ?) v LEFT JOIN trajectories t USING (trajectory_id))
            SELECT invariant_id, any_value(severity) AS severity, count(*) AS runs, count(DISTINCT task_key) AS tasks,
                   (SELECT list({{'trajectory_id': e.trajectory_id, 'task_key': e.task_key, 'task_key_source': e.task_key_source,
                                 'request': e.request, 'step_index': e.step_index, 'step_name': e.step_name, 'detail': e.detail}}
                                ORDER BY e.trajectory_id) FROM e WHERE e.invariant_id = v.invariant_id) AS examples
            FROM v GROUP BY invariant_id
            ORDER BY {_SEVERITY_ORDER.format('any_value(severity)')}, runs DESC, invariant_id""",
                          [*params, *scoped, examples])  # type: ignore[return-value]

    def checks_done(self) -> list[CheckRow]:
        """Every stored check: spec name, hash, where it was read from, when, and how many runs it judged; newest first."""
        if not self.has_table("checks"):
            return []
        return self._rows("SELECT spec_hash, spec_name, spec_path, checked_ns, runs FROM checks ORDER BY checked_ns DESC")  # type: ignore[return-value]

    def certificates(self, limit: int) -> list[dict[str, Any]]:
        """The certificates stored last (`certify --server`, or `certify` on the file), newest first, as they were kept."""
        if not self.has_table("certificates"):
            return []
        return [orjson.loads(r["doc"]) for r in self._rows("SELECT doc FROM certificates ORDER BY stored_ns DESC LIMIT ?", [limit])]

    # --- tasks and pairs ------------------------------------------------------------------------------

    def task_runs(self, task: str, perturbation: str | None = None, per_cell: int = 2, study: str | None = None) -> list[TaskRun]:
        """The first `per_cell` runs of each agent in each (perturbation, variant) of one task (of one study's runs when
        `study` is given): what a pairing chooses from."""
        where, params = ("task_key = ?", [task]) if perturbation is None else (f"task_key = ? AND {_PERT_SQL} = ?", [task, perturbation])
        where += f" AND NOT {_RECORD_SQL}"  # the driver's records stand for trials, not runs: nothing to diff
        if study is not None:
            where += f" AND {_STUDY_SQL} = ?"
            params.append(study)
        return self._rows(f"""
            SELECT * FROM (
                SELECT trajectory_id, service, {_AGENT_SQL} AS agent, {_PERT_SQL} AS perturbation, {_VARIANT_SQL} AS variant, start_ns
                FROM trajectories WHERE {where})
            QUALIFY row_number() OVER (PARTITION BY agent, perturbation, variant ORDER BY start_ns, trajectory_id) <= ?
            ORDER BY start_ns, trajectory_id""", [*params, per_cell])  # type: ignore[return-value]

    def diff_candidates(self, limit: int = 20, window: int = 20_000, study: str | None = None) -> list[DiffCandidate]:
        """Tasks run by two or more agents under the same perturbation and variant, among the `window`
        most recent runs (of one study when `study` is given): the diffs worth a link, each with a request of the task."""
        scope, params = ("TRUE", []) if study is None else (f"{_STUDY_SQL} = ?", [study])
        return self._rows(f"""
            SELECT task_key, any_value(task_key_source) AS task_key_source, min(request) AS request, perturbation, variant,
                   list(DISTINCT agent ORDER BY agent) AS agents, list(DISTINCT service ORDER BY service) AS services, count(*) AS runs
            FROM (SELECT task_key, task_key_source, left(input, 160) AS request, service, {_AGENT_SQL} AS agent,
                         {_PERT_SQL} AS perturbation, {_VARIANT_SQL} AS variant
                  FROM trajectories WHERE task_key IS NOT NULL AND NOT {_RECORD_SQL} AND trajectory_id IN (
                      SELECT trajectory_id FROM trajectories WHERE {scope} ORDER BY start_ns DESC LIMIT {int(window)}))
            GROUP BY task_key, perturbation, variant HAVING count(DISTINCT agent) > 1
            ORDER BY perturbation = 'baseline', task_key, perturbation LIMIT ?""", [*params, limit])  # type: ignore[return-value]

    def totals(self, study: str | None = None) -> Totals:
        """Spans, runs, agents and tasks in the store (of one study's runs when `study` is given).

        The driver's records are no runs; the project's recorded sample traces (services named `FIXTURE_PREFIX`…)
        are no agents: their runs are counted apart (`samples`, `sample_services`)."""
        scope, params = _scope(study, "trace_id")
        spans = self._rows(f"SELECT count(*) AS spans FROM spans WHERE {scope}", params)[0]
        scope, params = _scope(study)
        runs = self._rows(f"""SELECT count(*) FILTER (WHERE NOT {_FIXTURE_SQL}) AS runs,
                              count(DISTINCT {_AGENT_SQL}) FILTER (WHERE NOT {_FIXTURE_SQL}) AS agents,
                              count(DISTINCT task_key) FILTER (WHERE NOT {_FIXTURE_SQL}) AS tasks,
                              count(*) FILTER (WHERE {_FIXTURE_SQL}) AS samples,
                              count(DISTINCT service) FILTER (WHERE {_FIXTURE_SQL}) AS sample_services
                              FROM trajectories WHERE NOT {_RECORD_SQL} AND {scope}""", params)[0]
        return {**spans, **runs, "study": study}  # type: ignore[typeddict-item]

    # --- exports --------------------------------------------------------------------------------------

    def copy_to_parquet(self, source: str | pa.Table, since_ns: int | None, target: Path, pattern: str | None = None) -> int:
        """Write one exported table (`_EXPORTS`: runs since `since_ns`, or all) or an Arrow table's rows to a folder
        partitioned by date and service, with DuckDB's COPY; returns the rows written (0 for a table the store lacks)."""
        options = "FORMAT parquet, PARTITION_BY (date, service)" + (f", FILENAME_PATTERN '{pattern}'" if pattern else "")
        path = str(target).replace("'", "''")
        if isinstance(source, pa.Table):
            self.connection.register("_pl_export", source)
            try:
                row = self.connection.execute(f"COPY (SELECT * FROM _pl_export) TO '{path}' ({options})").fetchone()
            finally:
                self.connection.unregister("_pl_export")
        else:
            query, needs = _EXPORTS[source]
            if not self.has_table(needs):
                return 0
            window = "TRUE" if since_ns is None else f"t.start_ns >= {int(since_ns)}"
            row = self.connection.execute(f"COPY ({query.format(window=window)}) TO '{path}' ({options})").fetchone()
        return int(row[0]) if row else 0

    # --- coverage ---------------------------------------------------------------------------------

    def coverage_counts(self, since_ns: int | None = None, exclude_traces: Sequence[str] = ()) -> dict[str, Any]:
        """The coverage report's figures in their additive form (`_read_coverage.py`; `coverage.report_from_counts` reads them)."""
        return coverage_counts(self, since_ns, exclude_traces)
