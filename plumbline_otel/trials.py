"""What happened in each trial, as the replay driver saw it: the records, and how a trial's result is decided.

The driver (`replay/runner.py`) writes (`AttemptRecord`, one class for writer and reader) one *record* per planned trial (``plan``, attempt 0) and
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

**The trust boundary.** The agent under test controls every byte it writes: its spans in any
trace, its stdout, its HTTP answers, files in its working directory. So:

* a record counts only if the driver wrote it: each carries ``plumbline.record.mac``, an
  HMAC-SHA256 over its other ``plumbline.*`` attributes and its service, keyed by a secret made
  with the study's state (`KeyRing`) and never given to an agent. A record whose MAC fails is a
  *forgery*; one whose study state is not at hand is *unverified*; both are counted nowhere and
  listed;
* a trial's run is the trace the driver minted for the attempt (random, handed to the agent in
  its traceparent), nothing the agent names; no run is found by the identity its spans claim;
* which study, cell, task and repeat a run belongs to is the record's: the run is judged as the
  record's identity (`witnessed`), whatever ``plumbline.*`` attributes its spans carry.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import orjson

from plumbline_otel.model import Trajectory
from plumbline_otel.runs import (
    COST_BASIS,
    COST_METERED,
    COST_REPORTED,
    COST_USD,
    EVIDENCE,
    FAULT_CLAIMED,
    FAULT_FIRED,
    FAULT_PERTURBATIONS,
    FAULT_PLANNED,
    FAULT_SOURCE,
    IDENTITY_KEYS,
    INSTANCE,
    PERTURBATION,
    RECORD_AT,
    RECORD_KIND,
    RECORD_MAC,
    REPEAT,
    REQUEST_PERTURBATIONS,
    RUN_TRACE,
    SEALED_SPANS,
    SEEN,
    SEEN_BY,
    SEQUENTIAL,
    STUDY,
    TASK_KEY,
    TRACE_CLAIMED,
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


@dataclass(kw_only=True)
class AttemptRecord:
    """The driver's record of a planned trial (attempt 0) or of one attempt of it: one class for the driver that writes
    it (`replay.runner`: ``attributes`` as a span beside the runs, ``row`` in the ledger) and for every reader
    (`record_of`: what a stored record says).

    ``status``: ok (the agent ran and its run reached the sink), errored (the agent ran and crashed, hung, exited non-zero
    or left no trace) or missing (no attempt reached the agent: cap, interrupted, refused at the door); a reader also
    sees planned and sealed. ``fault_fired`` is what the driver (or a proxy) saw; the adapter's own report is kept apart
    in ``fault_claimed``. ``metered`` is false when the cost is the adapter's own report (or the whole reservation), not
    what a plumbline meter counted. The fields after ``context`` are the driver's account of this run of the study
    (its ledger and summary); they are not in the stored record.
    """

    trial_id: str
    status: str  # planned | sealed | ok | errored | missing | stopped | elsewhere | duplicate
    perturbation: str = "baseline"
    task_key: str | None = None
    variant: str | None = None
    repeat: int | None = None
    study: str = ""
    instance: str = ""
    agent: str = ""
    attempt: int = 0  # the attempt's number (0: the plan record, or never started)
    reason: str | None = None
    trace_id: str | None = None  # the attempt's trace (where its run is)
    fault: str | None = None
    fault_fired: bool | None = None
    fault_source: str | None = None
    fault_claimed: bool | None = None
    seen: bool | None = None  # decoy_tools / sampling / a paraphrased turn at a branch point: seen in a model request
    seen_by: str | None = None
    cost_usd: float = 0.0
    metered: bool | None = None
    cost_basis: str | None = None  # whose figure cost_usd is (`runs.COST_BASIS`)
    cost_reported_usd: float | None = None  # what the run's own spans reported (gen_ai.usage.cost.*), never what settles it
    at_ns: int = 0
    sequential: bool = False  # a plan record of a study that stops a cell once its answer is known
    evidence: dict[str, Any] = field(default_factory=dict, compare=False)  # what each proxy witnessed, by witness
    trace_claimed: str | None = None  # a trace the adapter named that is not the attempt's: a conflict, never judged
    sealed: frozenset[str] | None = None  # a seal: the span ids of the attempt's trace that had arrived when its window closed
    context: dict[str, Any] = field(default_factory=dict, compare=False)  # the trial's identity (`runs.IDENTITY_KEYS`)
    # The driver's account of this run of the study:
    attempts: int = 0  # executions in this run of the study
    seconds: float = 0.0
    model_calls: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    reserved_usd: float = 0.0
    overrun_usd: float = 0.0  # an adapter's reported cost beyond its reservation

    def row(self) -> dict[str, Any]:
        """The attempt as the study's ledger keeps it (resume, the summary)."""
        return {**{k: getattr(self, k) for k in _LEDGER_FIELDS}, "evidence": dict(self.evidence), "at": time.time()}

    def attributes(self, cost_usd: float) -> dict[str, Any]:
        """The driver's record of the current attempt, as span attributes (``record_of`` reads them back)."""
        return {
            RECORD_KIND: "attempt", TRIAL_STATUS: self.status, TRIAL_REASON: (self.reason or "")[:500] or None,
            RUN_TRACE: self.trace_id, FAULT_PLANNED: self.fault, FAULT_FIRED: self.fault_fired, FAULT_SOURCE: self.fault_source,
            FAULT_CLAIMED: self.fault_claimed, SEEN: self.seen, SEEN_BY: self.seen_by, COST_USD: round(cost_usd, 8),
            COST_METERED: self.metered, COST_BASIS: self.cost_basis, COST_REPORTED: self.cost_reported_usd,
            TRACE_CLAIMED: self.trace_claimed,
            RECORD_AT: time.time_ns(), EVIDENCE: orjson.dumps(self.evidence).decode() if self.evidence else None,
        }


# What a ledger row holds of a record (its keys are what `replay.ledger` and resume read).
_LEDGER_FIELDS = ("trial_id", "task_key", "perturbation", "variant", "repeat", "status", "reason", "attempts", "attempt",
                  "cost_usd", "trace_id", "seconds", "model_calls", "cache_hits", "cache_misses", "fault", "fault_fired",
                  "fault_source", "fault_claimed", "seen", "seen_by", "metered", "cost_basis", "cost_reported_usd",
                  "reserved_usd", "overrun_usd", "trace_claimed")


def placed(run: Trajectory, identity: Mapping[str, Any]) -> Trajectory:
    """The run as the driver's identity of its trial places it: its task and every ``plumbline.*`` attribute are the
    driver's (`runs.IDENTITY_KEYS`), so no attribute the agent wrote moves it to another study, cell, task or
    repeat, or claims a fault."""
    own = {k: v for k, v in run.context.items() if not k.startswith("plumbline.")}
    task = identity.get(TASK_KEY)
    return Trajectory(run.trajectory_id, run.trace_id, None if task is None else str(task), run.task_key_source, run.service,
                      run.service_version, run.agent_name, run.input, run.final_output, run.conventions, run.steps, run.start_ns,
                      run.end_ns, {**own, **{k: identity[k] for k in IDENTITY_KEYS if identity.get(k) is not None}})


def witnessed(run: Trajectory, record: AttemptRecord) -> Trajectory:
    """The run as the driver's record places it (`placed`), with whether the driver saw its fault fire."""
    view = placed(run, record.context)
    if record.fault_fired is not None:
        view.context[FAULT_FIRED] = record.fault_fired
    return view


STATE_FILE = "study.json"  # in a study's state directory: its random instance id and its secret key


def states_beside(db_path: str | Path) -> Path:
    """Where the states of studies replayed from a store live by default: ``<db>.replay/`` (one folder per study)."""
    stem = Path(db_path).with_suffix("")
    return stem.with_name(stem.name + ".replay")


def new_key() -> str:
    """A study state's secret: 256 random bits, as hex."""
    return secrets.token_hex(32)


def _canonical(value: Any) -> str:
    """One text per value whatever way it travelled (OTLP JSON writes 64-bit integers as text, doubles as numbers)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    return value if isinstance(value, str) else orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def record_mac(key: str, attributes: Mapping[str, Any], service: str | None, version: str | None) -> str:
    """The MAC a record carries: HMAC-SHA256 over its service, version and every ``plumbline.*`` attribute but the MAC."""
    items = sorted((k, _canonical(v)) for k, v in attributes.items()
                   if k.startswith("plumbline.") and k != RECORD_MAC and v is not None)
    message = orjson.dumps([service or "", version or "", items])
    return hmac.new(bytes.fromhex(key), message, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class KeyRing:
    """The secret key of each study state at hand, by its instance id: what verifies a record as the driver's."""

    keys: Mapping[str, str] = field(default_factory=dict)
    sources: tuple[str, ...] = ()  # where they were read, for the message when a record cannot be verified

    def key(self, instance: str) -> str | None:
        return self.keys.get(instance)

    def merged(self, other: KeyRing) -> KeyRing:
        return KeyRing({**self.keys, **other.keys}, self.sources + other.sources)

    @classmethod
    def of(cls, instance: str, key: str) -> KeyRing:
        return cls({instance: key}, ())

    @classmethod
    def load(cls, state_dirs: Iterable[str | Path]) -> KeyRing:
        """The keys of these study state directories (each holding ``study.json``); a directory holding study
        states (``<db>.replay/``) is searched one level down. Unreadable or keyless states are skipped."""
        keys: dict[str, str] = {}
        sources: list[str] = []
        for d in state_dirs:
            root = Path(d)
            for path in [root / STATE_FILE, *sorted(root.glob(f"*/{STATE_FILE}"))]:
                try:
                    doc = orjson.loads(path.read_bytes())
                except (OSError, orjson.JSONDecodeError):
                    continue
                if isinstance(doc, dict) and isinstance(doc.get("instance"), str) and isinstance(doc.get("key"), str):
                    keys[doc["instance"]] = doc["key"]
                    sources.append(str(path))
        return cls(keys, tuple(sources))

    @classmethod
    def beside(cls, db_paths: Iterable[str | Path]) -> KeyRing:
        """The keys of the studies replayed from these stores (their default state, `states_beside`)."""
        return cls.load(states_beside(p) for p in db_paths)


def verify_record(t: Trajectory, keys: KeyRing) -> Literal["verified", "forged", "unverified"]:
    """Whether the driver wrote this record: its MAC checks under its study state's key (`forged` when it does not,
    `unverified` when that key is not at hand)."""
    key = keys.key(str(t.context.get(INSTANCE) or ""))
    if key is None:
        return "unverified"
    mac = t.context.get(RECORD_MAC)
    expected = record_mac(key, t.context, t.service, t.service_version)
    return "verified" if isinstance(mac, str) and hmac.compare_digest(mac, expected) else "forged"


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
    """What a record-shaped trajectory says, or None when it is not one (whether the driver wrote it is `verify_record`'s)."""
    if not is_record(t):
        return None
    c = t.context
    study, trial_id = _text(c.get(STUDY)), _text(c.get(TRIAL_ID))
    if study is None or trial_id is None:
        return None
    kind = str(c.get(RECORD_KIND))
    return AttemptRecord(
        study=study, instance=str(c.get(INSTANCE) or ""), trial_id=trial_id,
        attempt=0 if kind == "plan" else (_int(c.get(TRIAL_ATTEMPT)) or 0),
        status={"plan": "planned", "seal": "sealed"}.get(kind) or str(c.get(TRIAL_STATUS) or "missing").strip().lower(),
        reason=_text(c.get(TRIAL_REASON)), agent=agent_label(t.service, t.service_version),
        perturbation=_text(c.get(PERTURBATION)) or "baseline", task_key=_text(c.get(TASK_KEY)),
        variant=_text(c.get(VARIANT)), repeat=_int(c.get(REPEAT)), trace_id=_text(c.get(RUN_TRACE)),
        fault=_text(c.get(FAULT_PLANNED)), fault_fired=strict_bool(c.get(FAULT_FIRED)),
        fault_source=_text(c.get(FAULT_SOURCE)), fault_claimed=strict_bool(c.get(FAULT_CLAIMED)),
        seen=strict_bool(c.get(SEEN)), seen_by=_text(c.get(SEEN_BY)),
        cost_usd=_float(c.get(COST_USD)), metered=strict_bool(c.get(COST_METERED)),
        at_ns=_int(c.get(RECORD_AT)) or t.start_ns or 0, sequential=strict_bool(c.get(SEQUENTIAL)) is True,
        evidence=_evidence(c.get(EVIDENCE)), trace_claimed=_text(c.get(TRACE_CLAIMED)),
        sealed=frozenset(filter(None, str(c.get(SEALED_SPANS) or "").split(","))) if kind == "seal" else None,
        context={k: c[k] for k in IDENTITY_KEYS if c.get(k) is not None},
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
    records: list[AttemptRecord] = field(default_factory=list)  # verified: the driver wrote them
    record_trajectories: list[Trajectory] = field(default_factory=list)  # where those records are stored
    forged: list[Trajectory] = field(default_factory=list)  # record-shaped, and their MAC fails: counted nowhere
    unverified: list[Trajectory] = field(default_factory=list)  # records whose study state's key is not at hand

    def judged(self) -> list[tuple[Trajectory, TrialStatus]]:
        """Every trial and untracked run an analysis counts, with its status: a recorded trial's run (as its record
        places it, `witnessed`; or, when the agent left none, the driver's record standing in for it) and the runs no
        driver recorded (by their own trace). Unwitnessed runs are left out; so are trials with nothing stored to stand for them."""
        out: list[tuple[Trajectory, TrialStatus]] = []
        for r in self.results:
            stand_in = r.run or r.record_trajectory
            if stand_in is not None:
                out.append((stand_in, r.status))
        out.extend((t, run_status(t)) for t in self.legacy)
        return out

    def of_study(self, study: str) -> Accounting:
        """Only one study: its trials by their records; the other lists by the study their spans claim."""
        def claims(t: Trajectory) -> bool:
            return str(t.context.get(STUDY) or "") == study

        return Accounting([r for r in self.results if r.study == study], [t for t in self.legacy if claims(t)],
                          [t for t in self.unwitnessed if claims(t)], [r for r in self.records if r.study == study],
                          [t for t in self.record_trajectories if claims(t)], [t for t in self.forged if claims(t)],
                          [t for t in self.unverified if claims(t)])

    def untrusted_records(self) -> list[tuple[str, str]]:
        """(trial id, why) of every record-shaped span not believed."""
        out = [(str(t.context.get(TRIAL_ID)), "forged: its MAC does not check under the study's key") for t in self.forged]
        out += [(str(t.context.get(TRIAL_ID)), f"unverified: no key for study instance {t.context.get(INSTANCE) or '(none)'} "
                 "(pass --state DIR, the replay's state directory, or --state-url)") for t in self.unverified]
        return out

    def untrusted(self) -> list[str]:
        """Why some record-shaped spans were not believed, in words (empty when every record verified)."""
        lines = []
        if self.forged:
            trials = sorted({str(t.context.get(TRIAL_ID)) for t in self.forged})
            lines.append(f"{len(self.forged)} forged driver record(s) (their MAC does not check under the study's key), "
                         f"counted nowhere: {', '.join(trials[:5])}{' …' if len(trials) > 5 else ''}")
        if self.unverified:
            instances = sorted({str(t.context.get(INSTANCE) or '(none)') for t in self.unverified})
            lines.append(f"{len(self.unverified)} driver record(s) of study instance(s) {', '.join(instances[:3])} could not be "
                         "verified: their study state (study.json, with its key) is not at hand; pass --state DIR "
                         "(the replay's state directory) or --state-url; they are counted nowhere")
        return lines


def _result_attempt(attempts: list[AttemptRecord]) -> AttemptRecord | None:
    """The first attempt the agent ran, else the last that did not (why it is missing)."""
    ordered = sorted(attempts, key=lambda r: (r.attempt, r.at_ns, r.instance))
    ran = [r for r in ordered if r.status in RAN]
    return ran[0] if ran else (ordered[-1] if ordered else None)


def _notes(record: AttemptRecord, run: Trajectory | None) -> tuple[str, ...]:
    """Where the agent's word and the driver's disagree (the driver's stands); `run` is the run as stored."""
    notes = []
    if record.trace_claimed:
        notes.append(f"conflict: its adapter named trace {record.trace_claimed} as its run; the trial is judged on the "
                     f"trace the driver minted for it ({record.trace_id})")
    if not record.fault or run is None:
        return tuple(notes)
    claimed = strict_bool(run.context.get(FAULT_FIRED))
    for who, says in (("its spans", claimed), ("its adapter", record.fault_claimed)):
        if says is not None and says != bool(record.fault_fired):
            notes.append(f"conflict: {who} say the fault {'fired' if says else 'did not fire'}; the driver saw it "
                         f"{'fire' if record.fault_fired else 'not fire'} (the driver's record stands)")
    if record.fault_fired and record.fault_source == "injector" and not fault_shown(witnessed(run, record)):
        notes.append("unconfirmed by the trace: the driver's injector raised, but no failed step shows the injected "
                     "error (the framework may redact tool errors)")
    return tuple(notes)


def _within_window(run: Trajectory, seal: AttemptRecord | None) -> tuple[Trajectory, tuple[str, ...]]:
    """The run as its evidence window closed: steps of spans that arrived after it (not in the seal) are left out, and
    said. Without a seal (an endpoint sink, or a study stopped before its windows closed) the run stands as stored."""
    if seal is None or seal.sealed is None:
        return run, ()
    late = [s for s in run.steps if s.span_id and s.span_id not in seal.sealed]
    if not late:
        return run, ()
    kept = tuple(s for s in run.steps if not (s.span_id and s.span_id not in seal.sealed))
    names = ", ".join(sorted({s.name for s in late}))
    return (Trajectory(run.trajectory_id, run.trace_id, run.task_key, run.task_key_source, run.service, run.service_version,
                       run.agent_name, run.input, run.final_output, run.conventions, kept, run.start_ns, run.end_ns, run.context),
            (f"late: {len(late)} step(s) ({names}) arrived after its evidence window closed: stored, and left out of its verdict",))


def _by_trace(runs: list[Trajectory]) -> dict[str, list[Trajectory]]:
    grouped: dict[str, list[Trajectory]] = defaultdict(list)
    for t in runs:
        grouped[t.trace_id].append(t)
    return grouped


def _whole_trace(parts: list[Trajectory]) -> Trajectory:
    """A trial's run is the whole trace the driver minted for it: an agent holding a conversation of several turns in
    it is assembled as a run per turn (assemble rule 6), and the trial is judged on all of them in order, never on one
    turn while the others go unjudged."""
    if len(parts) == 1:
        return parts[0]
    parts = sorted(parts, key=lambda t: (t.start_ns, t.trajectory_id))
    first, last = parts[0], parts[-1]
    steps = tuple(s for t in parts for s in t.steps)
    conventions = tuple(dict.fromkeys(c for t in parts for c in t.conventions))
    return Trajectory(first.trace_id, first.trace_id, first.task_key, first.task_key_source, first.service,
                      first.service_version, first.agent_name, first.input, last.final_output, conventions, steps,
                      first.start_ns, max(t.end_ns for t in parts), {**last.context, **first.context})


def _decide(planned: AttemptRecord | None, attempts: list[AttemptRecord], by_trace: dict[str, Trajectory],
            where: dict[int, Trajectory], seals: Mapping[tuple[str, str, str, int], AttemptRecord]) -> TrialResult:
    base = planned or attempts[0]
    decided = _result_attempt(attempts)
    label = decided or base

    # A shared study's fenced attempts (`replay.pgstate`): the agent ran again after its runner lost the trial; shown, never counted.
    duplicates = tuple(f"duplicate execution: attempt {a.attempt} (trace {a.trace_id}) ran too, by a runner that had lost the "
                       f"trial's lease; not counted ({a.reason or 'fenced'})" for a in sorted(attempts, key=lambda a: a.attempt)
                       if a.status == "duplicate")

    def result(status: TrialStatus, reason: str | None, run: Trajectory | None = None, notes: tuple[str, ...] = ()) -> TrialResult:
        return TrialResult(base.study, base.trial_id, label.agent, base.perturbation, base.task_key, status, reason, run,
                           decided, where.get(id(decided)) if decided else None, len(attempts), notes + duplicates,
                           planned is not None and planned.sequential)

    if decided is None:
        return result("missing", "planned; never attempted")
    if decided.status == "stopped":
        return result("stopped", decided.reason or "not run: its cell was decided first")
    if decided.status not in RAN:
        return result("missing", decided.reason or "never reached the agent")
    found = by_trace.get(decided.trace_id) if decided.trace_id else None
    run, late = _within_window(witnessed(found, decided), seals.get(_attempt_key(decided))) if found is not None else (None, ())
    notes = _notes(decided, found) + late
    if decided.status == "errored":
        return result("errored", decided.reason or "errored", run, notes)
    if run is None:
        return result("missing", f"ran, but its run (trace {decided.trace_id}) is not in the store: ingest the study's spans")
    kind = base.perturbation.partition("@")[0]  # a branch point's label carries its step (tool_fault@3, replay.tape)
    if kind in FAULT_PERTURBATIONS and not decided.fault_fired:
        return result("unexposed", "the driver saw no fault reach the agent", run, notes)
    if decided.seen is False or (kind in REQUEST_PERTURBATIONS and not decided.seen):
        return result("unexposed", f"the driver never saw {base.perturbation} reach a model request", run, notes)
    return result("exposed", None, run, notes)


def _attempt_key(r: AttemptRecord) -> tuple[str, str, str, int]:
    return r.study, r.trial_id, r.instance, r.attempt


def account(trajectories: Iterable[Trajectory], keys: KeyRing | None = None) -> Accounting:
    """Sort runs and records: one result per planned trial of every study the driver recorded (module docstring).

    ``keys`` verifies the records (`verify_record`); without it no record is believed, and every trial of a
    recorded study is left out, its records listed as unverified.
    """
    keys = keys or KeyRing()
    out = Accounting()
    runs: list[Trajectory] = []
    where: dict[int, Trajectory] = {}
    recorded: set[str] = set()  # studies with a record-shaped span, believed or not: their runs are never legacy
    for t in trajectories:
        record = record_of(t)
        if record is None:
            if not is_record(t):
                runs.append(t)
            continue
        recorded.add(record.study)
        verdict = verify_record(t, keys)
        if verdict == "verified":
            out.records.append(record)
            out.record_trajectories.append(t)
            where[id(record)] = t
        else:
            (out.forged if verdict == "forged" else out.unverified).append(t)
    by_trace = {trace: _whole_trace(parts) for trace, parts in _by_trace(runs).items()}
    planned: dict[tuple[str, str], AttemptRecord] = {}
    attempts: dict[tuple[str, str, str, int], AttemptRecord] = {}
    seals: dict[tuple[str, str, str, int], AttemptRecord] = {}
    # A fenced execution shares its attempt number with the record of the runner that took the trial over (which found it
    # interrupted): kept apart, so neither hides the other.
    duplicates: dict[tuple[str, str, str, int], AttemptRecord] = {}
    for r in out.records:
        if r.attempt == 0:
            planned.setdefault((r.study, r.trial_id), r)
        else:  # a record written twice is one attempt
            (seals if r.status == "sealed" else duplicates if r.status == "duplicate" else attempts).setdefault(_attempt_key(r), r)
    by_trial: dict[tuple[str, str], list[AttemptRecord]] = defaultdict(list)
    for (study, trial_id, _, _), r in [*attempts.items(), *duplicates.items()]:
        by_trial[(study, trial_id)].append(r)
    used: set[str] = set()
    for key in sorted(set(planned) | set(by_trial)):
        result = _decide(planned.get(key), by_trial.get(key, []), by_trace, where, seals)
        out.results.append(result)
        if result.run is not None:
            used.update(t.trajectory_id for t in runs if t.trace_id == result.run.trace_id)
    for t in runs:
        study = str(t.context.get(STUDY) or "")
        if study in recorded:
            if t.trajectory_id not in used:
                out.unwitnessed.append(t)
        elif t.trajectory_id not in used:
            out.legacy.append(t)
    return out
