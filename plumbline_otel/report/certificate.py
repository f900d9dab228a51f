"""Certificates: how far an agent can be trusted to hold its critical invariants, with the evidence pinned.

The certificate's format is the typed model in `report.model` (its JSON schema ships beside it);
`build_certificate` computes one. Everything downstream (the gate, the renderers, the evaluation
events, the store) takes that model; a file is its `Certificate.to_json`.

A certificate is built from runs (stored traffic or replay trials) and a spec. Runs are grouped
into cells by agent (service name and version) and perturbation (``plumbline.perturbation``,
"baseline" when absent). For a replay study the unit is the *trial*: each planned trial counts
once, and what happened to it is what the replay driver recorded (`plumbline_otel.trials`), never
what the agent's spans claim. Every trial lands in exactly one of these counts:

* **exposed**: a run judged against the spec. A faulted trial (``tool_fault``,
  ``tool_result_fault``, ``model_fault``) is exposed only when the driver's injector or a
  plumbline proxy saw the fault reach the agent; a ``decoy_tools`` or ``sampling`` trial only when the
  metered client or the model proxy saw it in a model request (``evidence_from`` counts who saw
  each exposed trial's perturbation); runs of other
  perturbations are always exposed.
* **errored**: the agent ran and crashed, hung, exited non-zero or left no trace. In n, and
  non-conforming, listed with its reason (``errored_runs``), whatever spans it exported first.
* **unexposed**: a faulted trial the fault was not seen to reach: listed (``unexposed_runs``),
  never scored; a cell of only unexposed runs has n = 0 and certifies nothing.
* **missing**: no attempt reached the agent (spend cap, interrupted, refused at the door), or its
  run is not in the store: beside n, never in it (``missing_runs``); the cell also gives the bound
  if every missing trial had failed. A planned cell with no runs is shown with its counts.

Beside them: ``unwitnessed_runs`` (runs claiming a trial of a recorded study that no record stands
for), ``notes`` (an agent's fault claim that disagrees with the driver's record, or a record its
trace cannot confirm), the cell's recorded ``cost_usd`` and ``unmetered`` trials. Runs no driver
recorded (live traffic, older exports, imported studies) are counted by their own trace
(`runs.run_status`, ``trace_judged``).

So n = exposed + errored, and conforming counts exposed runs with no critical violation.

Per cell: Wilson 95% (``lower``/``upper``: runs as if independent), the gate's bounds on the mean
conformance over tasks (``gate_lower``/``gate_upper``, method ``gate_method``: ``wilson_tasks``,
`stats.task_interval`, for a number of tasks fixed in advance; ``betting_cs``,
`stats.sequential_interval`, for a study that stopped when its answer was known; `report.gate`
says how each is gated), the distinct ``tasks``, pass^k over each task's repeats and the flip
rate (tasks whose repeats disagree), and the violations per invariant with the runs it applied to.

An instrumented agent whose SDK did not continue the trial's ``TRACEPARENT`` exports its run in a
trace of its own, with the trial's identity on its resource (``OTEL_RESOURCE_ATTRIBUTES``). That
trace is never taken for the trial (a trial's run is the trace the driver minted): the run is
listed once, in the certificate's ``unattributed_runs``, with the trial it claims, and the trial
whose minted trace holds no run is missing with one reason that says so, not a warning per run
in every cell.

The headline is exactly ``min`` over cells of ``gate_lower``. Every cell attaining it is reported
(no order-dependent tie-breaking), and it is never replaced by the cell with the worst point
estimate. Each cell also says how many runs the target needs at its observed failure count if
they came from distinct tasks (`stats.trials_needed`). With several agents each has its own
headline and the top-level one is the minimum over all of them.

Provenance pins the inputs: the spec hash, the data window, the plumbline version and an
evidence hash. The evidence hash is a hash list: sha256 of each run's canonical JSON (ids, task,
agent, run attributes, and every step with its arguments, result and error), then sha256 over
the ``trajectory_id:digest`` lines sorted by trajectory id. Any changed byte of any step changes
it, and the order runs were read in does not. It covers every matched trajectory: markers and
unexposed runs too.
"""

from __future__ import annotations

import hashlib
import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone

import orjson

from plumbline_otel import __version__
from plumbline_otel.analyse.conformance import evaluate
from plumbline_otel.analyse.stats import (
    FAIL,
    INCONCLUSIVE,
    PASS,
    SEQUENTIAL_METHOD,
    TASK_METHOD,
    Interval,
    gate_decision,
    pass_k_curve,
    repeat_agreement,
    sequential_interval,
    task_interval,
    tasks_to_settle,
    wilson_interval,
)
from plumbline_otel.model import Trajectory
from plumbline_otel.report.model import (
    CERTIFICATE_KIND,
    CERTIFICATE_VERSION,
    GATE_METHODS,
    Agent,
    AgentHeadline,
    Cell,
    CellRef,
    Certificate,
    DataWindow,
    Filters,
    Headline,
    InvariantRef,
    PassK,
    PassKPoint,
    Provenance,
    RunNote,
    RunReason,
    SpecRef,
    UnattributedRun,
)
from plumbline_otel.runs import STUDY, TRIAL_ID, agent_label, errored_reason, perturbation_of, run_label, run_status
from plumbline_otel.spec import Spec
from plumbline_otel.trials import RAN, Accounting, KeyRing, TrialResult, account

GATE_METHOD = TASK_METHOD
_TIE = 1e-12  # lower bounds within this are the same bound (float noise, not a difference)


@dataclass
class _Tally:
    exposed: int = 0
    conforming: int = 0
    missing: int = 0
    errored: list[RunReason] = field(default_factory=list)
    unexposed: list[str] = field(default_factory=list)
    per_task: dict[str, list[int]] = field(default_factory=lambda: defaultdict(lambda: [0, 0]))
    missing_per_task: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    violations: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    applicable: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    unwitnessed: list[str] = field(default_factory=list)
    missing_runs: list[RunReason] = field(default_factory=list)
    notes: list[RunNote] = field(default_factory=list)
    evidence_from: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    witnessed: int = 0
    trace_judged: int = 0
    cost_usd: float = 0.0
    unmetered: int = 0
    sequential: bool = False  # the study stopped this cell when its answer was known (replay --target)
    stopped: int = 0  # planned trials a sequential study never ran: the cell was decided first

    @property
    def runs(self) -> int:
        return self.exposed + len(self.errored)


def fault_unexposed(trajectory: Trajectory) -> bool:
    """True for a run that counts as unexposed (see `runs.run_status`)."""
    return run_status(trajectory) == "unexposed"


def evidence_digest(trajectory: Trajectory) -> str:
    """sha256 of one run's canonical JSON: everything a verdict could depend on."""
    doc = {
        "trajectory_id": trajectory.trajectory_id,
        "trace_id": trajectory.trace_id,
        "task_key": trajectory.task_key,
        "service": trajectory.service,
        "service_version": trajectory.service_version,
        "context": trajectory.context,
        "start_ns": trajectory.start_ns,
        "end_ns": trajectory.end_ns,
        "steps": [[s.kind, s.name, s.args, s.result, s.error, s.call_id] for s in trajectory.steps],
    }
    return hashlib.sha256(orjson.dumps(doc, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS, default=str)).hexdigest()


def evidence_hash(digests: Iterable[tuple[str, str]]) -> str:
    """sha256 over ``trajectory_id:digest`` lines sorted by trajectory id (the hash list)."""
    h = hashlib.sha256()
    for tid, digest in sorted(digests):
        h.update(f"{tid}:{digest}\n".encode())
    return h.hexdigest()


def _iso(ns: int | None) -> str | None:
    if ns is None:
        return None
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).isoformat().replace("+00:00", "Z")


def build_certificate(
    spec: Spec,
    trajectories: Iterable[Trajectory],
    *,
    agent: str | None = None,
    study: str | None = None,
    target: float = 0.95,
    keys: KeyRing | None = None,
) -> Certificate:
    """The certificate (`report.model.Certificate`) for the runs that match `agent` and `study`.

    `agent` selects a service name (or ``service@version``); `study` the ``plumbline.study`` attribute. `target` is the
    lower bound a gate will ask for; it sets each cell's ``verdict`` and ``tasks_needed``. Trials of a replay study are counted from
    the driver's records (`plumbline_otel.trials`), each planned trial once, and only records that verify under `keys` (the study
    states' keys): a study is chosen by its records, and a trial's run is the trace its record names, whatever study, task or
    cell the run's own spans claim.
    """
    tallies: dict[tuple[str, str], _Tally] = defaultdict(_Tally)
    digests: list[tuple[str, str]] = []
    records = 0  # of the digests, the driver's records: pinned by the evidence hash, but no runs
    window = [None, None]  # type: list[int | None]
    books = account(trajectories, keys)
    if study is not None:
        books = books.of_study(study)

    def wanted(label: str) -> bool:
        return agent is None or agent in (label, label.split("@", 1)[0])

    def pin(t: Trajectory) -> None:
        digests.append((t.trajectory_id, evidence_digest(t)))
        if t.start_ns:
            window[0] = t.start_ns if window[0] is None else min(window[0], t.start_ns)
            window[1] = t.start_ns if window[1] is None else max(window[1], t.start_ns)

    for record, t in zip(books.records, books.record_trajectories):
        if wanted(record.agent):
            digests.append((t.trajectory_id, evidence_digest(t)))
            records += 1
    unattributed, joined_elsewhere = _unattributed(books)
    for result in books.results:
        if wanted(result.agent):
            if result.run is not None:
                pin(result.run)
            _count_trial(tallies[(result.agent, result.perturbation)], spec, result,
                         (result.study, result.trial_id) in joined_elsewhere)
    for t in books.legacy:
        label = agent_label(t.service, t.service_version)
        if wanted(label):
            pin(t)
            _count(tallies[(label, perturbation_of(t))], spec, t)
    claimed: list[RunReason] = []
    listed: list[UnattributedRun] = []
    for t in books.unwitnessed:  # listed beside the cell it claims when there is one; a cell no driver recorded is never made of them
        label = agent_label(t.service, t.service_version)
        if wanted(label):
            pin(t)
            if id(t) in unattributed:
                listed.append(UnattributedRun(run=t.trajectory_id, trial=run_label(t)))
            elif (label, perturbation_of(t)) in tallies:
                tallies[(label, perturbation_of(t))].unwitnessed.append(run_label(t))
            else:
                claimed.append(RunReason(run=run_label(t), reason=f"unwitnessed: claims {label} under {perturbation_of(t)}, a cell "
                                                                  "no driver record stands for"))
    untrusted = tuple(RunReason(run=run, reason=why) for run, why in books.untrusted_records()) + tuple(claimed)
    cells = [_cell(a, p, tallies[(a, p)], target) for a, p in sorted(tallies)]
    return Certificate(
        version=CERTIFICATE_VERSION,
        kind=CERTIFICATE_KIND,
        target_bound=target,
        confidence=0.95,
        measure="critical conformance: runs with no violation of a critical invariant",
        n_counts="planned trials the agent ran, by the replay driver's records: exposed runs judged against the spec "
                 "plus errored trials (failures); unexposed, unwitnessed and missing trials are listed beside n",
        headline=_headline(cells, target),
        agents=_agents(cells, target),
        spec=SpecRef(name=spec.name, hash=spec.hash, source=spec.source,
                     invariants=tuple(InvariantRef(id=i.id, severity=i.severity, kind=i.kind) for i in spec.invariants)),
        provenance=Provenance(
            plumbline_version=__version__,
            generated_at=datetime.now(timezone.utc).isoformat().replace("+00:00", "Z"),
            filters=Filters(agent=agent, study=study),
            data_window=DataWindow(start_ns=window[0], end_ns=window[1], start=_iso(window[0]), end=_iso(window[1])),
            runs=len(digests) - records,
            scored_runs=sum(c.n for c in cells),
            trials=sum(c.witnessed for c in cells),
            evidence_sha256=evidence_hash(digests),
            evidence_method="sha256 over sorted 'trajectory_id:sha256(canonical run JSON)' lines, the driver's records included",
            untrusted_records=untrusted or None,
        ),
        unattributed_runs=tuple(sorted(listed, key=lambda u: (u.trial, u.run))) or None,
    )


UNJOINED = ("ran, but its run is in a trace of the agent's own, not the one the driver minted for it (the agent's "
            "tracing did not continue the trial's TRACEPARENT): see the certificate's unattributed_runs")


def _unattributed(books: Accounting) -> tuple[set[int], set[tuple[str, str]]]:
    """The unwitnessed runs that claim a trial the driver did record (an instrumented agent's own trace, which could not
    join its trial), by id(), and the (study, trial id) of the trials they claim."""
    recorded = {(r.study, r.trial_id) for r in books.results}
    runs, trials = set(), set()
    for t in books.unwitnessed:
        claim = (str(t.context.get(STUDY) or ""), str(t.context.get(TRIAL_ID) or ""))
        if claim in recorded:
            runs.add(id(t))
            trials.add(claim)
    return runs, trials


def _task(t: Trajectory) -> str:
    return t.task_key or f"(no task) {t.trajectory_id}"


def _judge(tally: _Tally, spec: Spec, t: Trajectory, task: str) -> None:
    """Score one exposed run against the spec."""
    counts = tally.per_task[task]
    counts[1] += 1
    result = evaluate(spec, t)
    ok = result.conforms("critical")
    tally.exposed += 1
    tally.conforming += ok
    counts[0] += ok
    for inv, verdict in result.verdicts:
        if verdict.status == "not_applicable":
            continue
        tally.applicable[inv.id] += 1
        if verdict.status == "fail":
            tally.violations[inv.id] += 1


def _count_trial(tally: _Tally, spec: Spec, result: TrialResult, joined_elsewhere: bool = False) -> None:
    """One planned trial, as the driver's record decided it; `joined_elsewhere`: a run claiming it is in a trace of its own."""
    tally.witnessed += 1
    tally.sequential |= result.sequential
    label = result.trial_id
    task = result.task_key or f"(no task) {label}"
    record = result.record
    if record is not None:
        tally.cost_usd += record.cost_usd
        tally.unmetered += record.metered is False and record.status in RAN
    tally.notes.extend(RunNote(label, note) for note in result.notes)
    if result.status == "stopped":
        tally.stopped += 1
    elif result.status == "missing":
        tally.missing += 1
        tally.missing_per_task[task] += 1
        unjoined = joined_elsewhere and result.run is None and result.record is not None and result.record.status in RAN
        tally.missing_runs.append(RunReason(label, UNJOINED if unjoined else result.reason or "missing"))
    elif result.status == "unexposed":
        tally.unexposed.append(label)
    elif result.status == "errored":
        tally.per_task[task][1] += 1
        tally.errored.append(RunReason(label, result.reason or "errored"))
    else:
        assert result.run is not None
        witness = record.fault_source if record is not None and record.fault_fired else (record.seen_by if record is not None and record.seen else None)
        if witness:
            tally.evidence_from[witness] += 1
        _judge(tally, spec, result.run, task)


def _count(tally: _Tally, spec: Spec, t: Trajectory) -> None:
    """A run no driver recorded (traffic, older exports, imported studies): the trace-based rule."""
    tally.trace_judged += 1
    status = run_status(t)
    if status == "missing":
        tally.missing += 1
        tally.missing_per_task[_task(t)] += 1
        return
    if status == "unexposed":
        tally.unexposed.append(run_label(t))
        return
    if status == "errored":
        tally.per_task[_task(t)][1] += 1
        tally.errored.append(RunReason(run_label(t), errored_reason(t)))
        return
    _judge(tally, spec, t, _task(t))


def _if_missing_failed(tally: _Tally) -> list[tuple[int, int]]:
    """Per-task (conforming, runs) with every missing trial added as a failing run of its task."""
    counts = {task: list(kn) for task, kn in tally.per_task.items()}
    for task, missing in tally.missing_per_task.items():
        counts.setdefault(task, [0, 0])[1] += missing
    return [(k, n) for k, n in counts.values()]


def _gate_interval(per_task: list[tuple[int, int]], sequential: bool) -> Interval:
    return sequential_interval(per_task) if sequential else task_interval(per_task)


def _cell(agent: str, perturbation: str, tally: _Tally, target: float) -> Cell:
    w = wilson_interval(tally.conforming, tally.runs)
    tasks = sorted(tally.per_task.items())
    counts = [(k, n) for _, (k, n) in tasks]
    gate = _gate_interval(counts, tally.sequential)
    agreement = repeat_agreement(counts)
    most = max((n for _, n in counts), default=0)
    verdict = gate_decision(gate.lower, gate.upper, target) if counts else INCONCLUSIVE
    return Cell(
        agent=agent,
        perturbation=perturbation,
        n=tally.runs,
        conforming=tally.conforming,
        rate=w.rate,
        lower=w.lower,
        upper=w.upper,
        gate_lower=gate.lower,
        gate_upper=gate.upper,
        gate_method=gate.method,
        task_rate=gate.rate,
        verdict=verdict,
        tasks=len(counts),
        exposed=tally.exposed,
        unexposed=len(tally.unexposed),
        errored=len(tally.errored),
        missing=tally.missing,
        lower_if_missing_failed=wilson_interval(tally.conforming, tally.runs + tally.missing).lower,
        gate_lower_if_missing_failed=_gate_interval(_if_missing_failed(tally), tally.sequential).lower,
        pass_k=PassK(k=agreement.k, value=agreement.pass_k),
        pass_k_curve=tuple(PassKPoint(k=p.k, estimate=p.estimate, lower=p.lower, upper=p.upper, tasks=p.tasks_used)
                           for p in (pass_k_curve(counts, most) if most else [])),
        flip_rate=agreement.flip_rate,
        tasks_needed=tasks_to_settle(verdict, counts, target),
        per_task=tuple((task, k, n) for task, (k, n) in tasks),
        violations=dict(sorted(tally.violations.items())),
        applicable=dict(sorted(tally.applicable.items())),
        errored_runs=tuple(sorted(tally.errored, key=lambda r: (r.run, r.reason))),
        unexposed_runs=tuple(sorted(tally.unexposed)),
        missing_runs=tuple(sorted(tally.missing_runs, key=lambda r: (r.run, r.reason))),
        unwitnessed=len(tally.unwitnessed),
        unwitnessed_runs=tuple(sorted(tally.unwitnessed)),
        witnessed=tally.witnessed,
        trace_judged=tally.trace_judged,
        evidence_from=dict(sorted(tally.evidence_from.items())),
        notes=tuple(sorted(tally.notes, key=lambda r: (r.run, r.note))),
        cost_usd=round(tally.cost_usd, 8),
        unmetered=tally.unmetered,
        stopped=tally.stopped,
    )


def overall(verdicts: list[str]) -> str:
    """FAIL if any cell fails, PASS if every cell passes, else INCONCLUSIVE (nothing certified is INCONCLUSIVE)."""
    if FAIL in verdicts:
        return FAIL
    return PASS if verdicts and all(v == PASS for v in verdicts) else INCONCLUSIVE


def _headline(cells: list[Cell], target: float) -> Headline:
    """min over cells of the gate's bound; every cell attaining it; the verdict; what holds the others back."""
    methods = sorted({c.gate_method for c in cells}) or [GATE_METHOD]
    method = methods[0] if len(methods) == 1 else "mixed"
    if not cells:
        return Headline(lower_bound=0.0, method=method, method_description=GATE_METHODS[GATE_METHOD], cells=(),
                        meets_target=False, verdict=INCONCLUSIVE, tasks_needed=None, short_cells=(),
                        note="no runs matched: nothing is certified")
    bound = min(c.gate_lower for c in cells)
    tied = [c for c in cells if math.isclose(c.gate_lower, bound, rel_tol=0.0, abs_tol=_TIE)]
    needs = [c.tasks_needed for c in cells if c.verdict == INCONCLUSIVE]
    return Headline(
        lower_bound=bound,
        method=method,
        method_description="; ".join(GATE_METHODS.get(m, m) for m in methods),
        cells=tuple(CellRef.of(c) for c in tied),
        meets_target=bound >= target,
        verdict=overall([c.verdict for c in cells]),
        tasks_needed=None if None in needs else max((n for n in needs if n is not None), default=0),
        wilson_lower_bound=min(c.lower for c in cells),
        missing=sum(c.missing for c in cells),
        errored=sum(c.errored for c in cells),
        unexposed=sum(c.unexposed for c in cells),
        short_cells=tuple(CellRef.of(c) for c in cells if c.verdict != PASS),
        note="; ".join(note for c in cells if (note := _shortfall(c, target))),
    )


def advice(method: str, more: int | None, target: float) -> str:
    """How an INCONCLUSIVE cell can be settled without voiding its stated error (issue 38), in words.

    Only a sequential study's bound stays valid as tasks are added and looked at again, so the
    number is always the sequential one; for a fixed-n study the words also say plainly that
    gating it again after more tasks does not keep its 5%.
    """
    if more is None:
        return "no number of clean tasks can reach it"
    resume = f"plumbline replay --resume --target {target:g}, with the new tasks"
    if method == SEQUENTIAL_METHOD:
        return (f"{more} more distinct clean task(s) would settle it: continue the sequential study ({resume}); its "
                "anytime-valid bound keeps its stated error at every look")
    return (f"{more} more distinct clean task(s) would settle it as a sequential study ({resume}), whose anytime-valid "
            "bound (betting_cs) over all its tasks keeps its stated error at every look; adding tasks to this fixed-n "
            "study and gating it again with wilson_tasks does not keep its stated 5%")


def _shortfall(c: Cell, target: float) -> str:
    """Why a cell is not PASS at the target, in words ("" when it is)."""
    where = f"{c.agent} {c.perturbation}"
    if c.n == 0:
        return f"{where}: no evidence (0 scored runs; {c.unexposed} unexposed, {c.missing} missing)"
    if c.verdict == FAIL:
        return f"{where}: FAIL, its upper bound {c.gate_upper:.4f} is below {target}"
    if c.verdict == INCONCLUSIVE:
        return f"{where}: INCONCLUSIVE at {c.tasks} task(s), bound {c.gate_lower:.4f} for {target}; {advice(c.gate_method, c.tasks_needed, target)}"
    return ""


def _agents(cells: list[Cell], target: float) -> tuple[Agent, ...]:
    by_agent: dict[str, list[Cell]] = defaultdict(list)
    for c in cells:
        by_agent[c.agent].append(c)
    out = []
    for name in sorted(by_agent):
        mine = by_agent[name]
        head = _headline(mine, target)
        assert head.wilson_lower_bound is not None  # an agent has cells
        out.append(Agent(
            agent=name,
            headline=AgentHeadline(lower_bound=head.lower_bound, method=head.method, cells=head.cells, meets_target=head.meets_target,
                                   verdict=head.verdict, tasks_needed=head.tasks_needed, wilson_lower_bound=head.wilson_lower_bound),
            perturbations=tuple(mine),
        ))
    return tuple(out)


__all__ = [
    "CERTIFICATE_KIND", "CERTIFICATE_VERSION", "GATE_METHOD", "GATE_METHODS", "UNJOINED", "Cell", "Certificate", "build_certificate",
    "evidence_digest", "evidence_hash", "fault_unexposed", "overall",
]
