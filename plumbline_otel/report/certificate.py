"""Certificates: how far an agent can be trusted to hold its critical invariants, with the evidence pinned.

A certificate is built from runs (stored traffic or replay trials) and a spec. Runs are grouped
into cells by agent (service name and version) and perturbation (``plumbline.perturbation``,
"baseline" when absent). Per cell: n judged runs, the conforming ones (critical conformance: no
critical violation), the Wilson 95% interval, the interval with tasks as clusters, the trials
recorded as missing (``plumbline.trial.status`` missing/error: counted beside n, never in it,
never as passes), the runs never exposed to their perturbation (below) and the violations per
invariant with the runs it applied to.

Fault exposure. A run whose ``plumbline.fault.fired`` is false had a fault configured that never
fired: it measured the agent without the fault, so it says nothing about the perturbation it is
labelled with (the seed system's 81.2% for tool_fault mixed 32 such runs with 32 exposed ones).
Such a run is ``unexposed``: counted per cell beside ``missing``, never in n, never as conforming,
never in the clustered interval or the runs a cell needs, and still covered by the evidence hash.
A run without the attribute (no fault configured, or an agent that does not report it) is scored
as before; a fired fault (true) is scored.

The headline is exactly ``min`` over cells of the Wilson lower 95% bound of critical
conformance. Every cell attaining that minimum is reported (no order-dependent tie-breaking), and
it is never replaced by the cell with the worst point estimate: with unequal n the two differ
(10/10 has a lower bound below 60/64's despite its higher rate). Each cell also says how many runs
the target bound needs at its observed failure count (`stats.trials_needed`). With several agents
in one certificate each has its own headline and the top-level one is the minimum over all of
them (certify one agent with ``agent=`` to gate it alone).

Provenance pins the inputs: the spec hash, the data window, the plumbline version and an
evidence hash. The evidence hash is a hash list: sha256 of each run's canonical JSON (ids, task,
agent, run attributes, and every step with its arguments, result and error), then sha256 over
the ``trajectory_id:digest`` lines sorted by trajectory id. Any changed byte of any step changes
it, and the order runs were read in does not.
"""

from __future__ import annotations

import hashlib
import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

import orjson

from plumbline_otel import __version__
from plumbline_otel.analyse.conformance import STUDY, TRIAL_ID, agent_label, evaluate, is_missing, perturbation_of
from plumbline_otel.analyse.stats import clustered_interval, trials_needed, wilson_interval
from plumbline_otel.model import Trajectory
from plumbline_otel.spec import Spec

CERTIFICATE_VERSION = 1
CERTIFICATE_KIND = "plumbline.certificate"
FAULT_FIRED = "plumbline.fault.fired"
_TIE = 1e-12  # lower bounds within this are the same bound (float noise, not a difference)


@dataclass
class Cell:
    """One (agent, perturbation): the counts and intervals of critical conformance."""

    agent: str
    perturbation: str
    n: int
    conforming: int
    rate: float | None
    lower: float
    upper: float
    clustered_lower: float
    clustered_upper: float
    clusters: int
    design_effect: float | None
    missing: int
    unexposed: int  # runs whose configured fault never fired: not in n, not scored
    lower_if_missing_failed: float
    trials_needed: int
    short_by: int
    violations: dict[str, int] = field(default_factory=dict)  # invariant id -> runs violating
    applicable: dict[str, int] = field(default_factory=dict)  # invariant id -> runs it applied to
    unexposed_runs: list[str] = field(default_factory=list)  # their trial ids (trajectory id without one), sorted


@dataclass
class _Tally:
    runs: int = 0
    conforming: int = 0
    missing: int = 0
    unexposed: int = 0
    unexposed_ids: list[str] = field(default_factory=list)
    per_task: dict[str, list[int]] = field(default_factory=lambda: defaultdict(lambda: [0, 0]))
    violations: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    applicable: dict[str, int] = field(default_factory=lambda: defaultdict(int))


def fault_unexposed(trajectory: Trajectory) -> bool:
    """True when the run had a fault configured that never fired (``plumbline.fault.fired`` false).

    A boolean false is what the arms send; the string "false" (an exporter that stringifies
    attributes) is read the same way. Absent, true or anything else is not unexposed.
    """
    value = trajectory.context.get(FAULT_FIRED)
    return value is False or (isinstance(value, str) and value.strip().lower() == "false")


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
) -> dict[str, Any]:
    """The certificate (a JSON-ready dict, ``version`` first) for the runs that match `agent` and `study`.

    `agent` selects a service name (or ``service@version``); `study` the ``plumbline.study`` attribute. `target` is the
    lower bound a gate will ask for; it sets each cell's ``trials_needed``.
    """
    tallies: dict[tuple[str, str], _Tally] = defaultdict(_Tally)
    digests: list[tuple[str, str]] = []
    window = [None, None]  # type: list[int | None]
    trial_ids: set[str] = set()
    for t in trajectories:
        if agent is not None and agent not in (t.service, agent_label(t.service, t.service_version)):
            continue
        if study is not None and str(t.context.get(STUDY, "")) != study:
            continue
        digests.append((t.trajectory_id, evidence_digest(t)))
        if t.context.get(TRIAL_ID) is not None:
            trial_ids.add(str(t.context[TRIAL_ID]))
        if t.start_ns:
            window[0] = t.start_ns if window[0] is None else min(window[0], t.start_ns)
            window[1] = t.start_ns if window[1] is None else max(window[1], t.start_ns)
        _count(tallies[(agent_label(t.service, t.service_version), perturbation_of(t))], spec, t)
    cells = [_cell(a, p, tallies[(a, p)], target) for a, p in sorted(tallies)]
    return {
        "version": CERTIFICATE_VERSION,
        "kind": CERTIFICATE_KIND,
        "target_bound": target,
        "confidence": 0.95,
        "measure": "critical conformance: runs with no violation of a critical invariant",
        "headline": _headline(cells, target),
        "agents": _agents(cells, target),
        "spec": {"name": spec.name, "hash": spec.hash, "source": spec.source,
                 "invariants": [{"id": i.id, "severity": i.severity, "kind": i.kind} for i in spec.invariants]},
        "provenance": {
            "plumbline_version": __version__,
            "generated_at": datetime.now(timezone.utc).isoformat().replace("+00:00", "Z"),
            "filters": {"agent": agent, "study": study},
            "data_window": {"start_ns": window[0], "end_ns": window[1], "start": _iso(window[0]), "end": _iso(window[1])},
            "runs": len(digests),
            "scored_runs": sum(c.n for c in cells),
            "trials_with_id": len(trial_ids),
            "evidence_sha256": evidence_hash(digests),
            "evidence_method": "sha256 over sorted 'trajectory_id:sha256(canonical run JSON)' lines",
        },
    }


def _count(tally: _Tally, spec: Spec, t: Trajectory) -> None:
    if is_missing(t):
        tally.missing += 1
        return
    if fault_unexposed(t):
        tally.unexposed += 1
        tally.unexposed_ids.append(str(t.context.get(TRIAL_ID) or t.trajectory_id))
        return
    result = evaluate(spec, t)
    ok = result.conforms("critical")
    tally.runs += 1
    tally.conforming += ok
    task = tally.per_task[t.task_key or f"(no task) {t.trajectory_id}"]
    task[0] += ok
    task[1] += 1
    for inv, verdict in result.verdicts:
        if verdict.status == "not_applicable":
            continue
        tally.applicable[inv.id] += 1
        if verdict.status == "fail":
            tally.violations[inv.id] += 1


def _cell(agent: str, perturbation: str, tally: _Tally, target: float) -> Cell:
    w = wilson_interval(tally.conforming, tally.runs)
    c = clustered_interval([(k, n) for k, n in tally.per_task.values()])
    worst_case = wilson_interval(tally.conforming, tally.runs + tally.missing)
    needed = trials_needed(target, failures=tally.runs - tally.conforming)
    return Cell(
        agent=agent,
        perturbation=perturbation,
        n=tally.runs,
        conforming=tally.conforming,
        rate=w.rate,
        lower=w.lower,
        upper=w.upper,
        clustered_lower=c.lower,
        clustered_upper=c.upper,
        clusters=c.clusters or 0,
        design_effect=c.design_effect,
        missing=tally.missing,
        unexposed=tally.unexposed,
        lower_if_missing_failed=worst_case.lower,
        trials_needed=needed,
        short_by=max(0, needed - tally.runs),
        violations=dict(sorted(tally.violations.items())),
        applicable=dict(sorted(tally.applicable.items())),
        unexposed_runs=sorted(tally.unexposed_ids),
    )


def _headline(cells: list[Cell], target: float) -> dict[str, Any]:
    """min over cells of the Wilson lower bound; every cell attaining it; whether n suffices."""
    if not cells:
        return {"lower_bound": 0.0, "cells": [], "meets_target": False, "short_cells": [],
                "note": "no runs matched: nothing is certified"}
    bound = min(c.lower for c in cells)
    tied = [c for c in cells if math.isclose(c.lower, bound, rel_tol=0.0, abs_tol=_TIE)]
    short = [c for c in cells if c.short_by > 0]
    note = ""
    if short:
        note = "; ".join(
            f"{c.agent} {c.perturbation}: n={c.n}, needs {c.trials_needed} runs at {c.n - c.conforming} failure(s) for {target}"
            for c in short
        )
    return {
        "lower_bound": bound,
        "cells": [_ref(c) for c in tied],
        "meets_target": bound >= target,
        "clustered_lower_bound": min(c.clustered_lower for c in cells),
        "missing": sum(c.missing for c in cells),
        "unexposed": sum(c.unexposed for c in cells),
        "short_cells": [_ref(c) for c in short],
        "note": note,
    }


def _ref(c: Cell) -> dict[str, Any]:
    return {"agent": c.agent, "perturbation": c.perturbation, "n": c.n, "conforming": c.conforming,
            "lower": c.lower, "missing": c.missing, "unexposed": c.unexposed, "trials_needed": c.trials_needed, "short_by": c.short_by}


def _agents(cells: list[Cell], target: float) -> list[dict[str, Any]]:
    by_agent: dict[str, list[Cell]] = defaultdict(list)
    for c in cells:
        by_agent[c.agent].append(c)
    out = []
    for name in sorted(by_agent):
        mine = by_agent[name]
        head = _headline(mine, target)
        out.append({
            "agent": name,
            "headline": {k: head[k] for k in ("lower_bound", "cells", "meets_target", "clustered_lower_bound")},
            "perturbations": [asdict(c) for c in mine],
        })
    return out
