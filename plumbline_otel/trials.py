"""What happened in each trial, as the replay driver saw it: the records, and how a trial's result is decided.

The driver (`replay/runner.py`) writes one *record* per planned trial (``plan``, attempt 0) and
one per attempt (``attempt``), each a plain root span in a trace of its own, so an agent's spans
can never share, shadow or outvote it (the old marker shared the attempt's trace and lost to the
agent's root span: a crash after export certified as a pass). Records reach the store the way
runs do, through the study's span sink, and every reader sees them as trajectories.

``account`` turns the stored trajectories into one result per planned trial:

* the trial's result is its first attempt the agent ran (``ok`` or ``errored``); attempts that
  never reached the agent (spend cap, interrupted runner, refused at the door) are ``missing``
  and are replaced by a later attempt that ran;
* ``errored`` (crashed, hung, exited non-zero, left no trace) is in n and failing, whatever the
  agent's spans say;
* ``ok`` is scored on the run in the attempt's trace; a faulted trial (`runs.FAULT_PERTURBATIONS`)
  is *exposed* only when the driver or a plumbline proxy saw the fault reach the agent, and a
  ``decoy_tools`` or ``sampling`` trial only when the metered client or the model proxy saw the
  decoys or sampling parameters in a model request; else *unexposed* (listed, never scored). An agent's own ``plumbline.fault.fired`` that disagrees
  with the record is ignored and reported as a conflict; a record the trace cannot confirm
  (a framework that redacts tool errors) still stands, and is noted;
* an ``ok`` trial whose run is not in the store is ``missing`` ("ingest the study's spans");
* a planned trial no attempt ran is ``missing``; one a sequential study never ran because its
  cell's answer was known first is ``stopped``, and counts nowhere.

Runs of a study with no records at all (exports older than the records, imported studies) keep
the trace-based rule (`runs.run_status`) and are flagged as such; runs that claim a trial of a
recorded study that no record stands for are listed as *unwitnessed*, never scored.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from plumbline_otel.model import Trajectory
from plumbline_otel.runs import (
    COST_METERED,
    COST_USD,
    EVIDENCE,
    FAULT_CLAIMED,
    FAULT_FIRED,
    FAULT_PERTURBATIONS,
    FAULT_PLANNED,
    FAULT_SOURCE,
    INSTANCE,
    PERTURBATION,
    RECORD_AT,
    RECORD_KIND,
    REPEAT,
    REQUEST_PERTURBATIONS,
    RUN_TRACE,
    SEEN,
    SEEN_BY,
    SEQUENTIAL,
    STUDY,
    TASK_KEY,
    TRIAL_ATTEMPT,
    TRIAL_ID,
    TRIAL_REASON,
    TRIAL_STATUS,
    VARIANT,
    agent_label,
    fault_shown,
    is_record,
    run_status,
    strict_bool,
)

TrialStatus = Literal["exposed", "unexposed", "errored", "missing", "stopped"]
RAN = frozenset({"ok", "errored"})  # attempt statuses in which the agent ran: the trial's result
DECIDED = RAN | {"stopped"}  # "stopped": never run, its cell's answer was known first (replay --target)


@dataclass(frozen=True)
class AttemptRecord:
    """One record the driver wrote: a planned trial (attempt 0) or one attempt of it."""

    study: str
    instance: str
    trial_id: str
    attempt: int
    status: str  # planned | ok | errored | missing
    reason: str | None
    agent: str
    perturbation: str
    task_key: str | None
    variant: str | None
    repeat: int | None
    trace_id: str | None  # the attempt's trace (where its run is)
    fault: str | None = None
    fault_fired: bool | None = None
    fault_source: str | None = None
    fault_claimed: bool | None = None
    seen: bool | None = None  # decoy_tools / sampling: seen in a model request
    seen_by: str | None = None
    cost_usd: float = 0.0
    metered: bool | None = None
    at_ns: int = 0
    sequential: bool = False  # a plan record of a study that stops a cell once its answer is known
    evidence: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)


def record_trace_id(instance: str, trial_id: str, attempt: int, plan: bool) -> str:
    """Where the driver writes its record of an attempt (or of the trial's plan): a trace of its own,
    derived from the trial's identity, so a record found anywhere else is not the driver's."""
    kind = "plan" if plan else "record"
    value = hashlib.sha256(f"plumbline.{kind}:{instance}:{trial_id}#{attempt}".encode()).hexdigest()[:32]
    return value if int(value, 16) else "2".rjust(32, "0")


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def _text(value: Any) -> str | None:
    return None if value in (None, "") else str(value)


def _evidence(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    try:
        parsed = orjson.loads(value) if isinstance(value, (str, bytes)) else None
    except orjson.JSONDecodeError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def record_of(t: Trajectory) -> AttemptRecord | None:
    """The driver's record a trajectory carries, or None when it is not one."""
    if not is_record(t):
        return None
    c = t.context
    study, trial_id = _text(c.get(STUDY)), _text(c.get(TRIAL_ID))
    if study is None or trial_id is None:
        return None
    kind = str(c.get(RECORD_KIND))
    instance, attempt = str(c.get(INSTANCE) or ""), _int(c.get(TRIAL_ATTEMPT)) or 1
    if t.trace_id != record_trace_id(instance, trial_id, attempt, kind == "plan"):
        return None  # spans in another trace (an agent's own, stamped with record attributes) are no record
    return AttemptRecord(
        study=study, instance=str(c.get(INSTANCE) or ""), trial_id=trial_id,
        attempt=0 if kind == "plan" else (_int(c.get(TRIAL_ATTEMPT)) or 0),
        status="planned" if kind == "plan" else str(c.get(TRIAL_STATUS) or "missing").strip().lower(),
        reason=_text(c.get(TRIAL_REASON)), agent=agent_label(t.service, t.service_version),
        perturbation=_text(c.get(PERTURBATION)) or "baseline", task_key=_text(c.get(TASK_KEY)),
        variant=_text(c.get(VARIANT)), repeat=_int(c.get(REPEAT)), trace_id=_text(c.get(RUN_TRACE)),
        fault=_text(c.get(FAULT_PLANNED)), fault_fired=strict_bool(c.get(FAULT_FIRED)),
        fault_source=_text(c.get(FAULT_SOURCE)), fault_claimed=strict_bool(c.get(FAULT_CLAIMED)),
        seen=strict_bool(c.get(SEEN)), seen_by=_text(c.get(SEEN_BY)),
        cost_usd=_float(c.get(COST_USD)), metered=strict_bool(c.get(COST_METERED)),
        at_ns=_int(c.get(RECORD_AT)) or t.start_ns or 0, sequential=strict_bool(c.get(SEQUENTIAL)) is True,
        evidence=_evidence(c.get(EVIDENCE)),
    )


@dataclass(frozen=True)
class TrialResult:
    """One planned trial, counted once: its status, the run it is judged on, and the record that decided it."""

    study: str
    trial_id: str
    agent: str
    perturbation: str
    task_key: str | None
    status: TrialStatus
    reason: str | None
    run: Trajectory | None  # the run judged (status "exposed"), or the errored attempt's run if any
    record: AttemptRecord | None  # the deciding attempt (None: planned, never attempted)
    record_trajectory: Trajectory | None  # where that record is stored: it stands for a trial the agent left no run of
    attempts: int  # attempts recorded, those that never reached the agent included
    notes: tuple[str, ...] = ()  # conflicts and unconfirmed evidence, in words
    sequential: bool = False  # its study stops a cell once the answer is known: the anytime-valid bound applies


@dataclass
class Accounting:
    """Every stored run and record, sorted into what the certificate counts."""

    results: list[TrialResult] = field(default_factory=list)  # one per planned trial of recorded studies
    legacy: list[Trajectory] = field(default_factory=list)  # runs no driver recorded: the trace-based rule
    unwitnessed: list[Trajectory] = field(default_factory=list)  # claim a recorded study's trial; no record stands for them
    records: list[AttemptRecord] = field(default_factory=list)

    def judged(self) -> list[tuple[Trajectory, TrialStatus]]:
        """Every trial and untracked run an analysis counts, with its status: a recorded trial's run (or,
        when the agent left none, the driver's record standing in for it) and the runs no driver recorded
        (by their own trace). Unwitnessed runs are left out; so are trials with nothing stored to stand for them."""
        out: list[tuple[Trajectory, TrialStatus]] = []
        for r in self.results:
            stand_in = r.run or r.record_trajectory
            if stand_in is not None:
                out.append((stand_in, r.status))
        out.extend((t, run_status(t)) for t in self.legacy)
        return out


def _result_attempt(attempts: list[AttemptRecord]) -> AttemptRecord | None:
    """The first attempt the agent ran, else the last that did not (why it is missing)."""
    ordered = sorted(attempts, key=lambda r: (r.at_ns, r.instance, r.attempt))
    ran = [r for r in ordered if r.status in RAN]
    return ran[0] if ran else (ordered[-1] if ordered else None)


def _run_for(record: AttemptRecord, by_trace: dict[str, Trajectory], by_attempt: dict[tuple[str, str, int], Trajectory]) -> Trajectory | None:
    if record.trace_id and record.trace_id in by_trace:
        return by_trace[record.trace_id]
    return by_attempt.get((record.instance, record.trial_id, record.attempt))


def _notes(record: AttemptRecord, run: Trajectory) -> tuple[str, ...]:
    """Where the agent's word and the driver's disagree (the driver's stands)."""
    notes = []
    claimed = strict_bool(run.context.get(FAULT_FIRED))
    for who, says in (("its spans", claimed), ("its adapter", record.fault_claimed)):
        if says is not None and says != bool(record.fault_fired):
            notes.append(f"conflict: {who} say the fault {'fired' if says else 'did not fire'}; the driver saw it "
                         f"{'fire' if record.fault_fired else 'not fire'} (the driver's record stands)")
    if record.fault_fired and record.fault_source == "injector" and not fault_shown(run):
        notes.append("unconfirmed by the trace: the driver's injector raised, but no failed step shows the injected "
                     "error (the framework may redact tool errors)")
    return tuple(notes)


def _decide(planned: AttemptRecord | None, attempts: list[AttemptRecord], by_trace: dict[str, Trajectory],
            by_attempt: dict[tuple[str, str, int], Trajectory], where: dict[int, Trajectory]) -> TrialResult:
    base = planned or attempts[0]
    decided = _result_attempt(attempts)
    label = decided or base

    def result(status: TrialStatus, reason: str | None, run: Trajectory | None = None, notes: tuple[str, ...] = ()) -> TrialResult:
        agent = agent_label(run.service, run.service_version) if run is not None else label.agent
        return TrialResult(base.study, base.trial_id, agent, base.perturbation, base.task_key, status, reason, run,
                           decided, where.get(id(decided)) if decided else None, len(attempts), notes,
                           planned is not None and planned.sequential)

    if decided is None:
        return result("missing", "planned; never attempted")
    if decided.status == "stopped":
        return result("stopped", decided.reason or "not run: its cell was decided first")
    if decided.status not in RAN:
        return result("missing", decided.reason or "never reached the agent")
    run = _run_for(decided, by_trace, by_attempt)
    if decided.status == "errored":
        return result("errored", decided.reason or "errored", run)
    if run is None:
        return result("missing", f"ran, but its run (trace {decided.trace_id}) is not in the store: ingest the study's spans")
    notes = _notes(decided, run) if decided.fault else ()
    if base.perturbation in FAULT_PERTURBATIONS and not decided.fault_fired:
        return result("unexposed", "the driver saw no fault reach the agent", run, notes)
    if base.perturbation in REQUEST_PERTURBATIONS and not decided.seen:
        return result("unexposed", f"the driver never saw {base.perturbation} reach a model request", run, notes)
    return result("exposed", None, run, notes)


def account(trajectories: Iterable[Trajectory]) -> Accounting:
    """Sort runs and records: one result per planned trial of every study the driver recorded (module docstring)."""
    out = Accounting()
    runs: list[Trajectory] = []
    where: dict[int, Trajectory] = {}
    for t in trajectories:
        record = record_of(t)
        if record is not None:
            out.records.append(record)
            where[id(record)] = t
        elif not is_record(t):
            runs.append(t)
    recorded = {r.study for r in out.records}
    by_trace = {t.trace_id: t for t in runs}
    by_attempt = {(str(t.context.get(INSTANCE) or ""), str(t.context.get(TRIAL_ID)), _int(t.context.get(TRIAL_ATTEMPT)) or 1): t
                  for t in runs if t.context.get(TRIAL_ID) is not None}
    planned: dict[tuple[str, str], AttemptRecord] = {}
    attempts: dict[tuple[str, str], list[AttemptRecord]] = defaultdict(list)
    for r in out.records:
        if r.attempt == 0:
            planned.setdefault((r.study, r.trial_id), r)
        else:
            attempts[(r.study, r.trial_id)].append(r)
    used: set[str] = set()
    for key in sorted(set(planned) | set(attempts)):
        result = _decide(planned.get(key), attempts.get(key, []), by_trace, by_attempt, where)
        out.results.append(result)
        if result.run is not None:
            used.add(result.run.trajectory_id)
    for t in runs:
        study = str(t.context.get(STUDY) or "")
        if study in recorded:
            if t.trajectory_id not in used:
                out.unwitnessed.append(t)
        else:
            out.legacy.append(t)
    return out
