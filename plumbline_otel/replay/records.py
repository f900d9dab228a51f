"""What the driver makes of an attempt and of a study run: the witnesses' evidence read into the attempt's record
(`witness`, `plumbline_failed`), and the study's summary (`StudySummary`). The record class itself is
`plumbline_otel.trials.AttemptRecord`, one class for the driver that writes it and every reader.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypedDict

from plumbline_otel.replay.contracts import Evidence, TrialOutcome
from plumbline_otel.replay.perturb import Variant
from plumbline_otel.replay.plan import RetryPolicy
from plumbline_otel.replay.scope import TrialScope
from plumbline_otel.replay.tape import base_perturbation
from plumbline_otel.runs import REQUEST_PERTURBATIONS
from plumbline_otel.trials import RAN, AttemptRecord, KeyRing


class RecoveredDoc(TypedDict):
    """An attempt a dead runner left unfinished, recorded missing on resume."""

    trial_id: str
    attempt: int
    reason: str | None


class OverrunDoc(TypedDict):
    """A trial whose adapter reported more than its reservation."""

    trial_id: str
    reserved_usd: float
    overrun_usd: float


class SummaryDoc(TypedDict):
    """``summary.json``: one run of a study (`StudySummary.as_dict`)."""

    study: str
    instance: str
    planned: int
    skipped_resume: int
    ok: int
    missing: int
    errored: int
    stopped: int
    decided_cells: dict[str, str]
    rerun_as_new_trials: int
    rejected_variants: int
    rejections: list[dict[str, object]]
    spent_usd: float
    session_usd: float
    budget_usd: float | None
    budget_high_water_usd: float
    records_written: int
    cache_hits: int
    cache_recorded: int
    faults_fired: int
    fault_trials: int
    seconds: float
    unmetered_trials: list[str]
    recovered: list[RecoveredDoc]
    overruns: list[OverrunDoc]


@dataclass
class StudySummary:
    """One run of a study: what was planned, ran, skipped, spent, and each trial's record."""

    study: str
    planned: int = 0
    skipped: int = 0
    ok: int = 0
    missing: int = 0
    errored: int = 0
    rejected: list[Variant] = field(default_factory=list)
    records: list[AttemptRecord] = field(default_factory=list)
    spent_usd: float = 0.0  # cumulative for the study, prior runs included
    session_usd: float = 0.0
    budget_usd: float | None = None
    budget_high_water_usd: float = 0.0
    written: int = 0  # the driver's records sent to the sink
    cache_hits: int = 0
    cache_recorded: int = 0
    seconds: float = 0.0
    instance: str = ""
    rerun_as: int = 0  # trials run again as new trials (--rerun)
    released_usd: float = 0.0  # reservations of dead runners released on resume
    stopped: int = 0  # trials a sequential study did not run: their cell was decided first
    elsewhere: int = 0  # trials of a shared study another runner held or had decided
    decided_cells: dict[str, str] = field(default_factory=dict)  # perturbation -> how the study decided it
    recovered: list[AttemptRecord] = field(default_factory=list)  # attempts a dead runner left unfinished
    keys: KeyRing = field(default_factory=KeyRing)  # the study state's key: what verifies its records (never an agent's)

    @property
    def ran(self) -> int:
        """Trials this run attempted and decided or stopped."""
        return self.ok + self.missing + self.errored + self.stopped

    def faults(self) -> tuple[int, int]:
        """(fired, planned) over faulted trials the agent ran, as the driver saw them."""
        faulted = [r for r in self.records if r.fault and r.status in ("ok", "errored")]
        return sum(r.fault_fired is True for r in faulted), len(faulted)

    def unmetered(self) -> list[AttemptRecord]:
        """Trials the agent ran whose cost no plumbline meter fully saw (the reservation, an estimate, or the adapter's higher report)."""
        return [r for r in self.records if r.status in ("ok", "errored") and r.metered is False]

    def as_dict(self) -> SummaryDoc:
        """The summary as ``summary.json`` keeps it."""
        fired, faulted = self.faults()
        return {
            "study": self.study, "instance": self.instance, "planned": self.planned, "skipped_resume": self.skipped,
            "ok": self.ok, "missing": self.missing, "errored": self.errored, "stopped": self.stopped,
            "decided_cells": self.decided_cells, "rerun_as_new_trials": self.rerun_as,
            "rejected_variants": len(self.rejected),
            "rejections": [v.as_dict() for v in self.rejected], "spent_usd": self.spent_usd,
            "session_usd": self.session_usd, "budget_usd": self.budget_usd,
            "budget_high_water_usd": self.budget_high_water_usd, "records_written": self.written,
            "cache_hits": self.cache_hits, "cache_recorded": self.cache_recorded,
            "faults_fired": fired, "fault_trials": faulted, "seconds": round(self.seconds, 3),
            "unmetered_trials": [r.trial_id for r in self.unmetered()],
            "recovered": [{"trial_id": r.trial_id, "attempt": r.attempt, "reason": r.reason} for r in self.recovered],
            "overruns": [{"trial_id": r.trial_id, "reserved_usd": r.reserved_usd, "overrun_usd": r.overrun_usd}
                         for r in self.records if r.overrun_usd > 0],
        }

    def render(self) -> str:
        """The summary as the command prints it."""
        stopped = f", {self.stopped} stopped" if self.stopped else ""
        lines = [f"study {self.study}: {self.planned} trials planned; ran {self.ran} ({self.ok} ok, "
                 f"{self.missing} missing, {self.errored} errored{stopped}), {self.skipped} skipped by resume; "
                 f"{len(self.rejected)} variant(s) rejected by the guard; {self.seconds:.1f}s"]
        if self.elsewhere:
            lines.append(f"  shared study: {self.elsewhere} trial(s) were held or decided by other runners")
        for how in sorted(self.decided_cells.values()):
            lines.append(f"  sequential: {how.removeprefix('not run: ')}; its remaining trials were not run")
        if self.rerun_as:
            lines.append(f"  --rerun: {self.rerun_as} trial(s) already decided ran again as new trials (new repeat numbers)")
        for r in self.recovered[:10]:
            lines.append(f"  recorded missing {r.trial_id}: {r.reason}")
        if self.released_usd:
            lines.append(f"  released ${self.released_usd:.4f} a dead runner still held reserved")
        for v in self.rejected[:10]:
            lines.append(f"  rejected {v.task_key} {v.perturbation}/{v.variant_id}: {v.rejected}")
        if len(self.rejected) > 10:
            lines.append(f"  … and {len(self.rejected) - 10} more (variants.jsonl)")
        fired, faulted = self.faults()
        if faulted:
            lines.append(f"  faults seen by the driver to fire in {fired}/{faulted} faulted trials the agent ran")
        cap = f" of ${self.budget_usd:.2f}" if self.budget_usd is not None else ""
        lines.append(f"  spend ${self.session_usd:.4f} this run, ${self.spent_usd:.4f}{cap} for the study; "
                     f"cache: {self.cache_hits} hits, {self.cache_recorded} recorded")
        unmetered = self.unmetered()
        if unmetered:
            lines.append(f"  UNMETERED: {len(unmetered)} trial(s) spent money no plumbline meter fully saw; their cost is the whole "
                         "reservation, an upper-bound estimate of the calls whose usage never came, or the adapter's higher "
                         "report, never less (route the agent through `--proxy`)")
        for r in self.records:
            if r.overrun_usd > 0:
                lines.append(f"  OVERRUN {r.trial_id}: reported ${r.reserved_usd + r.overrun_usd:.4f} against a "
                             f"${r.reserved_usd:.4f} reservation; the study stopped (declare a larger --trial-max-usd)")
        problems = [r for r in self.records if r.status in ("missing", "errored", "duplicate")]
        for r in problems[:10]:
            lines.append(f"  {r.status} {r.trial_id}: {r.reason}")
        if len(problems) > 10:
            lines.append(f"  … and {len(problems) - 10} more (ledger.jsonl)")
        if self.written:
            lines.append(f"  {self.written} driver record(s) written beside the runs: certify takes each trial's status, "
                         "exposure and cost from them, never from the agent's spans")
        return "\n".join(lines)


def witness(record: AttemptRecord, scope: TrialScope | None, outcome: TrialOutcome | None, evidence: Sequence[Evidence]) -> None:
    """What the driver saw (its injector, its metered client) and its proxies saw, beside what the adapter claimed."""
    if scope is not None:
        record.model_calls, record.cache_hits, record.cache_misses = scope.model_calls, scope.cache_hits, scope.cache_misses
        if scope.fault is not None:
            record.fault_fired = scope.fault.fired
            record.fault_source = "injector" if scope.fault.fired else None
        if record.perturbation in scope.seen:
            record.seen, record.seen_by = True, "client"
    perturbation = base_perturbation(record.perturbation)
    for seen in evidence:
        saw = seen.as_dict()
        who = str(seen.witness)
        record.evidence[who] = _brief(saw)
        record.cache_hits += _int(saw.get("cache_hits"))  # answered from the cassette at the proxy
        if record.fault and saw.get("faults") and not record.fault_fired:
            record.fault_fired, record.fault_source = True, who
        if (perturbation == "decoy_tools" and saw.get("decoys_offered")) or (perturbation == "sampling" and saw.get("sampling_changes")):
            record.seen, record.seen_by = True, who
        if saw.get("turn_rewrites") is not None and not record.seen:  # a paraphrased turn at a branch point (issue 44)
            record.seen, record.seen_by = (True, who) if _int(saw.get("turn_rewrites")) > 0 else (False, None)
    if perturbation in REQUEST_PERTURBATIONS and record.seen is None:
        record.seen = False
    if outcome is not None:
        record.fault_claimed = outcome.fault_fired
        if outcome.trace_id and outcome.trace_id != record.trace_id:
            record.trace_claimed = outcome.trace_id  # the agent named another run: a conflict, never its run


def plumbline_failed(status: str, reason: str | None, retry: float | None, evidence: Sequence[Evidence],
                     policy: RetryPolicy, n: int, stopping: bool) -> tuple[str, str | None, float | None]:
    """An attempt in which plumbline itself, or a provider or tool server it stands in front of, failed is not the
    agent's result: it is missing with the real cause (whatever the agent then did). A refusal of plumbline's own
    (spend cap, cassette miss) is final; a provider, tool server or proxy that failed is retried within the
    policy. An agent that sent no model call through its route is unrouted (missing, never scored)."""
    if status not in RAN:
        return status, reason, retry
    own = status if status == "ok" else f"{status}: {reason}"
    for e in evidence:  # a branch-point replay whose agent left the recorded run in the prefix: measured, never scored
        diverged = _objects(e.as_dict().get("diverged"))
        if diverged:
            first = min(diverged, key=lambda d: _int(d.get("step")))
            return "missing", f"diverged at step {first.get('step')}: {first.get('detail')} (agent's own result: {own})", None
    for e in evidence:
        saw = e.as_dict()
        if saw.get("refused_budget"):
            return "missing", f"plumbline refused {saw['refused_budget']} model call(s) at the spend cap (agent's own result: {own})", None
        if saw.get("refused_offline"):
            return "missing", (f"cassette miss: plumbline had no recorded answer for {saw['refused_offline']} model call(s) "
                               f"offline (agent's own result: {own})"), None
    failures = []
    for e in evidence:
        saw = e.as_dict()
        for kind, label in (("provider_failures", "provider failed"), ("server_died", "tool server died"), ("proxy_errors", "proxy error")):
            for item in _objects(saw.get(kind)):  # never a fault the proxy injected itself (those are the perturbation)
                if not item.get("recovered"):  # a failure the agent's own retry got past is the world it works in
                    failures.append(f"{label}: {item.get('detail') or item.get('status') or dict(item)}")
    if failures:
        again = n < policy.max_attempts and not stopping
        return "missing", f"{failures[0]}{f' (+{len(failures) - 1} more)' if len(failures) > 1 else ''} (agent's own result: {own})", (
            policy.delay(n) if again else None)
    unseen = [e for e in evidence if e.witness == "model_proxy" and e.calls == 0]
    if unseen:
        return "missing", (f"unrouted: no model call reached this attempt's proxy route (the agent ignored OPENAI_BASE_URL / "
                           f"ANTHROPIC_BASE_URL, or sent calls the proxy could not route); agent's own result: {own}"), None
    return status, reason, retry


def _brief(evidence: Mapping[str, object]) -> dict[str, object]:
    """A proxy's evidence as the record keeps it: everything but the per-exchange list (the cassette has those)."""
    exchanges = evidence.get("exchanges")
    return {**{k: v for k, v in evidence.items() if k != "exchanges"},
            **({"exchanges": len(exchanges)} if isinstance(exchanges, (list, tuple)) else {})}


def _objects(value: object) -> list[Mapping[str, object]]:
    """The JSON objects in an evidence list (anything else in it is not evidence)."""
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, (list, tuple)) else []


def _int(value: object) -> int:
    return int(value) if isinstance(value, (int, float)) or (isinstance(value, str) and value.strip().isdigit()) else 0
