"""What the pages show, gathered from the store's read interface (`store.Reader`): the queries are the store's, the
judgement and the layout are here.

Every function takes a `Reader`: the CLI's `Store`, or the console's reader of its own cursor (which sees
committed data and never waits on the writer). Only the one or two runs a page shows are decoded into
`Trajectory` objects, so a page costs the same on a store of a thousand spans or a million.
"""

from __future__ import annotations

from typing import Any

from plumbline_otel.model import Trajectory
from plumbline_otel.report.model import Certificate, CertificateFormatError, read_certificate
from plumbline_otel.runs import PERTURBATION, VARIANT
from plumbline_otel.store import PAGE_SIZE, Page, Reader, RunFilters, RunRow, TaskRun, TimelineSpan


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


def runs_page(store: Reader, page: int = 0, size: int = PAGE_SIZE, agent: str | None = None,
              task: str | None = None, filters: RunFilters | None = None, only: str | None = None) -> Page:
    """Runs (never the replay driver's records), one page at a time, filtered and sorted (newest first by default).

    Each row: the run's ids, agent, task, request text, perturbation, study, trial, start, duration,
    steps, tokens and cost where its spans carry them, and its status: ``errored``, ``unexposed`` or
    ``missing`` as the driver's records decide the trial (`trials.account`; a run no driver recorded by
    its own trace), else ``violating`` (with the invariants), ``conforming`` (judged, no violation) or
    ``not_checked``; a run of a recorded study no record stands for is ``unwitnessed``.
    """
    listed, runs = store.runs_page(filters or RunFilters(agent=agent, task=task), page, size, only)
    _annotate(store, listed.rows, runs)
    return listed


def _annotate(store: Reader, rows: list[RunRow], runs: dict[str, Trajectory]) -> None:
    """Give each row of a page its status, violated invariants, tokens and cost (a few small queries for the page only)."""
    from plumbline_otel.runs import run_status
    from plumbline_otel.trials import account

    if not rows:
        return
    ids = [r["trajectory_id"] for r in rows]
    studies = sorted({r["study"] for r in rows if r["study"]})
    books = None
    if studies:
        records = store.trial_records(studies, [r["trial_id"] for r in rows if r["trial_id"]])
        books = account(records + list(runs.values()), store.study_keys())
    by_run = {res.run.trajectory_id: res for res in books.results if res.run is not None} if books else {}
    unwitnessed = {t.trajectory_id for t in books.unwitnessed} if books else set()
    violated = store.invariants_violated(ids)
    checked = store.checked(ids)
    usage = store.usage([r["trace_id"] for r in rows])
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
        u = usage.get(r["trace_id"])
        r["tokens_in"], r["tokens_out"] = (u["tokens_in"], u["tokens_out"]) if u else (None, None)
        r["llm_calls"] = (u["llm_calls"] if u else 0) or 0
        record_cost = result.record.cost_usd if result is not None and result.record is not None and result.record.cost_usd else None
        r["cost"] = record_cost if record_cost is not None else (u["cost"] if u else None)


def run_timeline(store: Reader, run: Trajectory, limit: int = 2000) -> dict[str, Any]:
    """The run's spans as a waterfall: each with its offset and duration, depth in the span tree, the step it made
    (index into `run.steps`), model, tokens, cost, and the messages of an LLM call (input and output text)."""
    spans = store.spans_of(run.trace_id, limit)
    if not spans:
        return {"rows": [], "total_ns": 0, "truncated": False}
    start = min(s["start_ns"] or 0 for s in spans)
    end = max(s["end_ns"] or s["start_ns"] or 0 for s in spans)
    total = max(1, end - start)
    step_of = {s.span_id: i for i, s in enumerate(run.steps) if s.span_id}
    index = {s["span_id"]: s for s in spans}

    def level(s: TimelineSpan) -> int:
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


def other_run(store: Reader, run: Trajectory) -> str | None:
    """Another run of the same task to diff against: same perturbation and variant, another agent first, else a repeat, else any."""
    if not run.task_key:
        return None
    mine = (str(run.context.get(PERTURBATION) or "baseline"), str(run.context.get(VARIANT) or ""))
    best: tuple[int, str] | None = None
    for r in store.task_runs(run.task_key, per_cell=2):
        if r["trajectory_id"] == run.trajectory_id:
            continue
        rank = (0 if r["service"] != run.service else 1) if (r["perturbation"], r["variant"]) == mine else 2
        if best is None or rank < best[0]:
            best = (rank, r["trajectory_id"])
    return best[1] if best else None


def latest_certificate(store: Reader) -> Certificate | None:
    """The certificate stored last (`certify --server`, or `certify` on the file) that this plumbline reads, or None."""
    for kept in store.certificates(20):
        try:
            return read_certificate(kept)
        except CertificateFormatError:  # one an older plumbline kept, that this one cannot read, is passed over
            continue
    return None


def pick_pair(runs: list[TaskRun], vs: str, agent: str | None = None,
              perturbation: str | None = None) -> tuple[str, str] | None:
    """Ids of run A (`agent`, or any other agent) and run B (`vs`) on the same perturbation and variant.

    With no other agent on the task, two runs of `vs` itself (two repeats) are paired. The first
    matching cell in run order wins, so the choice is stable.
    """
    def named(r: TaskRun, name: str) -> bool:
        return name in (r["service"], r["agent"])

    def cell(r: TaskRun) -> tuple[str, str]:
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


def pair_on_task(store: Reader, task: str, vs: str, agent: str | None = None,
                 perturbation: str | None = None, study: str | None = None) -> tuple[Trajectory, Trajectory] | None:
    """Two stored runs on `task` and the same perturbation and variant: A (`agent`) and B (`vs`) (of one study's runs
    when `study` is given)."""
    ids = pick_pair(store.task_runs(task, perturbation, study=study), vs, agent, perturbation)
    if ids is None:
        return None
    a, b = store.load_run(ids[0]), store.load_run(ids[1])
    return (a, b) if a is not None and b is not None else None


__all__ = ["OneCursor", "latest_certificate", "other_run", "pair_on_task", "pick_pair", "run_timeline", "runs_page"]
