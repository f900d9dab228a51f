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
from plumbline_otel.runs import (
    FAULT_FIRED,
    FAULT_PERTURBATIONS,
    PERTURBATION,
    RECORD_KIND,
    REQUEST_PERTURBATIONS,
    RUN_TRACE,
    SEEN,
    STUDY,
    TRIAL_ID,
    TRIAL_STATUS,
    VARIANT,
)

PAGE_SIZE = 50
# What `check` and `certify` keep for the pages beside the violations (tables `checked_runs`, `checks`, `certificates`:
# `Store.record_check`, `Store.store_certificate`).
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


_RECORD_SQL = (f"(n_steps = 0 AND coalesce({_CTX.format(RECORD_KIND)}, '') IN ('plan', 'attempt'))")  # runs.is_record in SQL
_STUDY_SQL = _CTX.format(STUDY)
_COST_SQL = ("try_cast(coalesce(json_extract_string(attributes, '$.\"llm.cost.total\"'), "
             "json_extract_string(attributes, '$.\"gen_ai.usage.cost\"')) AS DOUBLE)")
# The project's recorded producer and framework traces (runs/samples, tests/fixtures) name their service so: the demo loads
# them to show what the instrumentations send, and they are sample traffic, not agents under test.
FIXTURE_PREFIX = "plumbline-fixture-"
_FIXTURE_SQL = f"starts_with(coalesce(service, ''), '{FIXTURE_PREFIX}')"


def _scope(study: str | None, column: str = "trajectory_id") -> tuple[str, list[Any]]:
    """SQL (and its parameters) keeping rows of one study's runs and records by `column`; TRUE for no study."""
    if study is None:
        return "TRUE", []
    return f"{column} IN (SELECT {column} FROM trajectories WHERE {_STUDY_SQL} = ?)", [study]


STATUSES = ("conforming", "violating", "not_checked", "errored", "unexposed", "missing")
SORTS = {"started": "start_ns", "duration": "(end_ns - start_ns)", "steps": "n_steps", "agent": _AGENT_SQL, "task": "task_key",
         "tokens": "coalesce(tok.tokens, 0)"}


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


def _status_sql(status: str, connection: Any) -> str:
    """Runs of one status, in SQL (the page's own status is decided by `trials.account`, which these follow)."""
    violated = "trajectory_id IN (SELECT trajectory_id FROM violations)" if has_table(connection, "violations") else "FALSE"
    checked = "trajectory_id IN (SELECT trajectory_id FROM checked_runs)" if has_table(connection, "checked_runs") else "FALSE"
    marker = f"lower({_CTX.format(TRIAL_STATUS)})"
    recorded = (f"FROM trajectories WHERE {_RECORD_SQL} AND {_CTX.format(RECORD_KIND)} = 'attempt' "
                f"AND {_CTX.format(RUN_TRACE)} IS NOT NULL")
    errored = f"({marker} IN ('errored', 'error') OR trace_id IN (SELECT {_CTX.format(RUN_TRACE)} {recorded} AND lower({_CTX.format(TRIAL_STATUS)}) = 'errored'))"
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


def _where(connection: Any, f: RunFilters) -> tuple[str, list[Any]]:
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
        clauses.append("trajectory_id IN (SELECT trajectory_id FROM violations WHERE invariant_id = ?)"
                       if has_table(connection, "violations") else "FALSE")
        params += [f.invariant] if has_table(connection, "violations") else []
    if f.status:
        clauses.append(_status_sql(f.status, connection))
    return " AND ".join(clauses), params


_TOKENS = ("SELECT trace_id, sum(input_tokens) AS tokens_in, sum(output_tokens) AS tokens_out, "
           "coalesce(sum(input_tokens), 0) + coalesce(sum(output_tokens), 0) AS tokens, sum({cost}) AS cost, "
           "count(*) FILTER (WHERE step_kind = 'llm_call') AS llm_calls FROM spans WHERE {where} GROUP BY trace_id")


def runs_page(connection: Any, page: int = 0, size: int = PAGE_SIZE, agent: str | None = None,
              task: str | None = None, filters: RunFilters | None = None, only: str | None = None) -> Page:
    """Runs (never the replay driver's records), one page at a time, filtered and sorted (newest first by default).

    Each row: the run's ids, agent, task, request text, perturbation, study, trial, start, duration,
    steps, tokens and cost where its spans carry them, and its status: ``errored``, ``unexposed`` or
    ``missing`` as the driver's records decide the trial (`trials.account`; a run no driver recorded by
    its own trace), else ``violating`` (with the invariants), ``conforming`` (judged, no violation) or
    ``not_checked``; a run of a recorded study no record stands for is ``unwitnessed``.
    """
    f = filters or RunFilters(agent=agent, task=task)
    where, params = _where(connection, f)
    if only is not None:  # one run's row (its page's status line)
        where, params = f"{where} AND trajectory_id = ?", [*params, only]
    total = int(_rows(connection, f"SELECT count(*) AS n FROM trajectories WHERE {where}", params)[0]["n"])
    page = max(0, min(page, -(-total // size) - 1))  # past the last page (?page=999999999999): the last page
    order = f"{SORTS[f.sort]} {f.order.upper()} NULLS LAST, trajectory_id"
    join = (f"LEFT JOIN ({_TOKENS.format(cost=_COST_SQL, where='step_kind = ' + repr('llm_call'))}) tok USING (trace_id)"
            if f.sort == "tokens" else "")
    rows = _rows(connection, f"""
        WITH page AS (SELECT trajectory_id FROM trajectories {join} WHERE {where} ORDER BY {order} LIMIT ? OFFSET ?)
        SELECT trajectory_id, trace_id, {_AGENT_SQL} AS agent, service, task_key, task_key_source, left(input, 240) AS input,
               length(input) > 240 AS input_cut, {_PERT_SQL} AS perturbation, {_STUDY_SQL} AS study, {_CTX.format(TRIAL_ID)} AS trial_id,
               start_ns, end_ns, end_ns - start_ns AS duration_ns, n_steps, n_tool_calls, doc
        FROM trajectories {join} SEMI JOIN page USING (trajectory_id)
        ORDER BY {order}""", [*params, size, page * size])  # JSON is read for the page's rows only
    _annotate(connection, rows)
    return Page(rows, page, size, total)


def _annotate(connection: Any, rows: list[dict[str, Any]]) -> None:
    """Give each row of a page its status, violated invariants, tokens and cost (a few small queries for the page only)."""
    from plumbline_otel.runs import run_status
    from plumbline_otel.trials import account

    if not rows:
        return
    ids = [r["trajectory_id"] for r in rows]
    runs = {r["trajectory_id"]: trajectory_from_doc(orjson.loads(r.pop("doc"))) for r in rows}
    studies = sorted({r["study"] for r in rows if r["study"]})
    books = None
    if studies:
        records = _rows(connection, f"""
            SELECT doc FROM trajectories WHERE {_RECORD_SQL} AND {_STUDY_SQL} IN (SELECT unnest(?))
              AND {_CTX.format(TRIAL_ID)} IN (SELECT unnest(?))""", [studies, [r["trial_id"] for r in rows if r["trial_id"]]])
        books = account([trajectory_from_doc(orjson.loads(x["doc"])) for x in records] + list(runs.values()))
    by_run = {res.run.trajectory_id: res for res in books.results if res.run is not None} if books else {}
    unwitnessed = {t.trajectory_id for t in books.unwitnessed} if books else set()
    violated: dict[str, list[dict[str, Any]]] = {}
    if has_table(connection, "violations"):
        for v in _rows(connection, """SELECT trajectory_id, invariant_id, any_value(severity) AS severity FROM violations
                                     WHERE trajectory_id IN (SELECT unnest(?)) GROUP BY ALL
                                     ORDER BY CASE any_value(severity) WHEN 'critical' THEN 0 WHEN 'major' THEN 1 ELSE 2 END, invariant_id""", [ids]):
            violated.setdefault(v["trajectory_id"], []).append({"id": v["invariant_id"], "severity": v["severity"]})
    checked = ({r["trajectory_id"] for r in _rows(connection, "SELECT DISTINCT trajectory_id FROM checked_runs WHERE trajectory_id IN (SELECT unnest(?))", [ids])}
               if has_table(connection, "checked_runs") else set())
    usage = {u["trace_id"]: u for u in _rows(connection, _TOKENS.format(
        cost=_COST_SQL, where="trace_id IN (SELECT unnest(?)) AND step_kind = 'llm_call'"), [[r["trace_id"] for r in rows]])}
    for r in rows:
        tid = r["trajectory_id"]
        result = by_run.get(tid)
        trial = result.status if result is not None else ("unwitnessed" if tid in unwitnessed else run_status(runs[tid]))
        r["reason"] = result.reason if result is not None else None
        r["invariants"] = violated.get(tid, [])
        if trial in ("errored", "unexposed", "missing", "unwitnessed"):
            r["status"] = trial
        elif r["invariants"]:
            r["status"] = "violating"
        else:
            r["status"] = "conforming" if tid in checked else "not_checked"
        u = usage.get(r["trace_id"], {})
        r["tokens_in"], r["tokens_out"], r["llm_calls"] = u.get("tokens_in"), u.get("tokens_out"), u.get("llm_calls") or 0
        record_cost = result.record.cost_usd if result is not None and result.record is not None and result.record.cost_usd else None
        r["cost"] = record_cost if record_cost is not None else u.get("cost")


def filter_choices(connection: Any) -> dict[str, list[str]]:
    """The values each filter of the runs list can take (agents, perturbations, studies, invariants), from the store."""
    one = _rows(connection, f"""SELECT list(DISTINCT {_AGENT_SQL} ORDER BY {_AGENT_SQL}) AS agents FROM trajectories
                                WHERE NOT {_RECORD_SQL}""")[0]
    more = _rows(connection, f"""SELECT list(DISTINCT p ORDER BY p) AS perturbations, list(DISTINCT s ORDER BY s) FILTER (WHERE s IS NOT NULL) AS studies
                                 FROM (SELECT {_PERT_SQL} AS p, {_STUDY_SQL} AS s FROM trajectories WHERE n_steps = 0 OR trajectory_id IN
                                       (SELECT trajectory_id FROM trajectories ORDER BY start_ns DESC LIMIT 20000))""")[0]
    invariants = ([r["invariant_id"] for r in _rows(connection, "SELECT DISTINCT invariant_id FROM violations ORDER BY 1")]
                  if has_table(connection, "violations") else [])
    return {"agents": one["agents"] or [], "perturbations": more["perturbations"] or [], "studies": more["studies"] or [],
            "invariants": invariants, "statuses": list(STATUSES)}


def run_timeline(connection: Any, run: Trajectory, limit: int = 2000) -> dict[str, Any]:
    """The run's spans as a waterfall: each with its offset and duration, depth in the span tree, the step it made
    (index into `run.steps`), model, tokens, cost, and the messages of an LLM call (input and output text)."""
    spans = _rows(connection, f"""
        SELECT span_id, parent_span_id, name, start_ns, end_ns, step_kind, tool_name, model, input_tokens, output_tokens,
               input_text, output_text, status_code, error, {_COST_SQL} AS cost
        FROM spans WHERE trace_id = ? ORDER BY start_ns, span_id LIMIT ?""", [run.trace_id, limit])
    if not spans:
        return {"rows": [], "total_ns": 0, "truncated": False}
    start = min(s["start_ns"] or 0 for s in spans)
    end = max(s["end_ns"] or s["start_ns"] or 0 for s in spans)
    total = max(1, end - start)
    step_of = {s.span_id: i for i, s in enumerate(run.steps) if s.span_id}
    index = {s["span_id"]: s for s in spans}

    def level(s: dict[str, Any]) -> int:
        """Depth in the span tree (parents outside the stored spans, or a cycle, end it)."""
        seen: set[str] = set()
        d, parent = 0, s["parent_span_id"]
        while parent in index and parent not in seen:
            seen.add(parent)
            d += 1
            parent = index[parent]["parent_span_id"]
        return d

    rows = []
    for s in spans:
        began, ended = s["start_ns"] or start, s["end_ns"] or s["start_ns"] or start
        rows.append({**s, "depth": level(s), "offset_pct": round(100 * (began - start) / total, 2),
                     "width_pct": round(max(0.3, 100 * max(0, ended - began) / total), 2), "duration_ns": max(0, ended - began),
                     "step": step_of.get(s["span_id"])})
    return {"rows": rows, "total_ns": end - start, "truncated": len(spans) >= limit,
            "tokens_in": sum(r["input_tokens"] or 0 for r in rows if r["step_kind"] == "llm_call"),
            "tokens_out": sum(r["output_tokens"] or 0 for r in rows if r["step_kind"] == "llm_call"),
            "cost": sum(r["cost"] or 0.0 for r in rows) or None}


def other_run(connection: Any, run: Trajectory) -> str | None:
    """Another run of the same task to diff against: same perturbation and variant, another agent first, else a repeat, else any."""
    if not run.task_key:
        return None
    mine = (str(run.context.get(PERTURBATION) or "baseline"), str(run.context.get(VARIANT) or ""))
    best: tuple[int, str] | None = None
    for r in task_runs(connection, run.task_key, per_cell=2):
        if r["trajectory_id"] == run.trajectory_id:
            continue
        rank = (0 if r["service"] != run.service else 1) if (r["perturbation"], r["variant"]) == mine else 2
        if best is None or rank < best[0]:
            best = (rank, r["trajectory_id"])
    return best[1] if best else None


def latest_certificate(connection: Any) -> dict[str, Any] | None:
    """The certificate stored last (`certify --server`, or `certify` on the file), or None."""
    if not has_table(connection, "certificates"):
        return None
    from plumbline_otel.report.render import validate

    for row in _rows(connection, "SELECT doc FROM certificates ORDER BY stored_ns DESC LIMIT 20"):
        cert = orjson.loads(row["doc"])
        if validate(cert) is None:  # one an older plumbline kept, that this one cannot read, is passed over
            return dict(cert)
    return None


def checks_done(connection: Any) -> list[dict[str, Any]]:
    """Every stored check: spec name, hash, where it was read from, when, and how many runs it judged; newest first."""
    if not has_table(connection, "checks"):
        return []
    return _rows(connection, "SELECT spec_hash, spec_name, spec_path, checked_ns, runs FROM checks ORDER BY checked_ns DESC")


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


def violations_summary(connection: Any, spec_hash: str | None = None, examples: int = 3, study: str | None = None) -> list[dict[str, Any]]:
    """Per invariant: severity, runs violating, tasks affected and a few example runs (with the step and the run's
    request text); of one study's runs when `study` is given."""
    if not has_table(connection, "violations"):
        return []
    where, params = ("spec_hash = ?", [spec_hash]) if spec_hash else ("TRUE", [])
    scope, scoped = _scope(study)
    rows = _rows(connection, f"""
        WITH v AS (SELECT *, row_number() OVER (PARTITION BY invariant_id ORDER BY trajectory_id) AS k
                   FROM violations WHERE {where} AND {scope}),
             e AS (SELECT v.*, left(t.input, 160) AS request, t.task_key_source
                   FROM (SELECT * FROM v WHERE k <= ?) v LEFT JOIN trajectories t USING (trajectory_id))
        SELECT invariant_id, any_value(severity) AS severity, count(*) AS runs, count(DISTINCT task_key) AS tasks,
               (SELECT list({{'trajectory_id': e.trajectory_id, 'task_key': e.task_key, 'task_key_source': e.task_key_source,
                             'request': e.request, 'step_index': e.step_index, 'step_name': e.step_name, 'detail': e.detail}}
                            ORDER BY e.trajectory_id) FROM e WHERE e.invariant_id = v.invariant_id) AS examples
        FROM v GROUP BY invariant_id
        ORDER BY CASE any_value(severity) WHEN 'critical' THEN 0 WHEN 'major' THEN 1 ELSE 2 END, runs DESC, invariant_id""",
                 [*params, *scoped, examples])
    return rows


def coverage(connection: Any) -> dict[str, Any]:
    """The coverage report (`plumbline coverage`), computed over this connection."""
    from plumbline_otel.coverage import coverage_report

    return coverage_report(_StoreView(connection))  # type: ignore[arg-type]


def task_runs(connection: Any, task: str, perturbation: str | None = None, per_cell: int = 2, study: str | None = None) -> list[dict[str, Any]]:
    """The first `per_cell` runs of each agent in each (perturbation, variant) of one task (of one study's runs when
    `study` is given): what a pairing chooses from."""
    where, params = ("task_key = ?", [task]) if perturbation is None else (f"task_key = ? AND {_PERT_SQL} = ?", [task, perturbation])
    where += f" AND NOT {_RECORD_SQL}"  # the driver's records stand for trials, not runs: nothing to diff
    if study is not None:
        where += f" AND {_STUDY_SQL} = ?"
        params.append(study)
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
                 perturbation: str | None = None, study: str | None = None) -> tuple[Trajectory, Trajectory] | None:
    """Two stored runs on `task` and the same perturbation and variant: A (`agent`) and B (`vs`) (of one study's runs
    when `study` is given)."""
    ids = pick_pair(task_runs(connection, task, perturbation, study=study), vs, agent, perturbation)
    if ids is None:
        return None
    a, b = load_run(connection, ids[0]), load_run(connection, ids[1])
    return (a, b) if a is not None and b is not None else None


def diff_candidates(connection: Any, limit: int = 20, window: int = 20_000, study: str | None = None) -> list[dict[str, Any]]:
    """Tasks run by two or more agents under the same perturbation and variant, among the `window`
    most recent runs (of one study when `study` is given): the diffs worth a link, each with a request of the task."""
    scope, params = ("TRUE", []) if study is None else (f"{_STUDY_SQL} = ?", [study])
    return _rows(connection, f"""
        SELECT task_key, any_value(task_key_source) AS task_key_source, min(request) AS request, perturbation, variant,
               list(DISTINCT agent ORDER BY agent) AS agents, list(DISTINCT service ORDER BY service) AS services, count(*) AS runs
        FROM (SELECT task_key, task_key_source, left(input, 160) AS request, service, {_AGENT_SQL} AS agent,
                     {_PERT_SQL} AS perturbation, {_VARIANT_SQL} AS variant
              FROM trajectories WHERE task_key IS NOT NULL AND NOT {_RECORD_SQL} AND trajectory_id IN (
                  SELECT trajectory_id FROM trajectories WHERE {scope} ORDER BY start_ns DESC LIMIT {int(window)}))
        GROUP BY task_key, perturbation, variant HAVING count(DISTINCT agent) > 1
        ORDER BY perturbation = 'baseline', task_key, perturbation LIMIT ?""", [*params, limit])


def store_totals(connection: Any, study: str | None = None) -> dict[str, Any]:
    """Spans, runs, agents and tasks in the store (of one study's runs when `study` is given): the first line of a page.

    The driver's records are no runs; the project's recorded sample traces (services named `FIXTURE_PREFIX`…)
    are no agents: their runs are counted apart (`samples`, `sample_services`)."""
    scope, params = _scope(study, "trace_id")
    spans = _rows(connection, f"SELECT count(*) AS spans FROM spans WHERE {scope}", params)[0]
    scope, params = _scope(study)
    runs = _rows(connection, f"""SELECT count(*) FILTER (WHERE NOT {_FIXTURE_SQL}) AS runs,
                                 count(DISTINCT {_AGENT_SQL}) FILTER (WHERE NOT {_FIXTURE_SQL}) AS agents,
                                 count(DISTINCT task_key) FILTER (WHERE NOT {_FIXTURE_SQL}) AS tasks,
                                 count(*) FILTER (WHERE {_FIXTURE_SQL}) AS samples,
                                 count(DISTINCT service) FILTER (WHERE {_FIXTURE_SQL}) AS sample_services
                                 FROM trajectories WHERE NOT {_RECORD_SQL} AND {scope}""", params)[0]
    return {**spans, **runs, "study": study}


RECORD_SQL, STUDY_SQL = _RECORD_SQL, _STUDY_SQL  # for the pages' own queries

__all__ = ["FIXTURE_PREFIX", "PAGE_SIZE", "RECORD_SQL", "SORTS", "STUDY_SQL", "STATUSES", "OneCursor", "Page", "RunFilters", "checks_done", "coverage", "filter_choices",
           "other_run", "run_timeline", "latest_certificate", "diff_candidates", "has_table", "load_run", "pair_on_task", "pick_pair",
           "run_violations", "runs_page", "store_totals", "task_runs", "violations_summary"]
