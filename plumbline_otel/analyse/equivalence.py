"""Equivalence: does agent B act like agent A on the same tasks and variants?

Runs are put in cells by (task key, perturbation, variant: ``plumbline.variant`` or
``plumbline.variant.id``, "-" when absent). Only cells both agents ran are compared; the others
are counted as unpaired. Within a cell:

- **effect path**: B's successful calls of effect tools (the spec's ``effect_tools``; every tool
  when it lists none) are aligned (Needleman–Wunsch) with A's reference for the cell: A's modal
  effect path, with modal arguments, as in consistency. Deliberation steps one architecture has
  and the other lacks are not compared. Divergences are skipped, extra, substituted and
  argument-changed steps, with the first one reported per run.
- **outcome**, where known (``plumbline.outcome`` on the run, e.g. the end state of the system of
  record): B's outcome against A's modal outcome for the cell. Runs without one are counted as
  unknown, never as agreeing.
- **conformance** (with a spec): A's and B's runs are paired in the cell by repeat
  (``plumbline.trial.repeat``, else start time, else id), and one McNemar exact test on critical
  conformance is run *per perturbation* over its pairs, with Holm's correction across the
  perturbations (pooling them would let one perturbation's difference hide another's). Runs past
  the shorter side of a cell are left out of the pairs, so an unpaired permutation test over
  every run of the perturbation's shared cells is given beside each.

Which runs count is the certificate's rule (`trials.account`): missing trials and
``tool_fault`` runs without evidence the fault hit them are left out and counted per side;
errored runs (crashed, timed out, no trace) are failing runs in the conformance tests and have no
effect path to compare.

A's own agreement with its reference (its self-consistency) is reported beside B's, as the noise
floor: B cannot be expected to match A better than A matches itself.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from plumbline_otel.analyse.conformance import evaluate
from plumbline_otel.analyse.consistency import Divergence, Reference, build_reference, diverge, path_of
from plumbline_otel.analyse.stats import PairedResult, holm, mcnemar_exact, permutation_test
from plumbline_otel.compare_values import canonical, compare
from plumbline_otel.model import Trajectory
from plumbline_otel.runs import OUTCOME, REPEAT, VARIANT, VARIANT_ID, agent_label, perturbation_of
from plumbline_otel.spec import Spec
from plumbline_otel.trials import KeyRing, account

VARIANT_KEYS = (VARIANT, VARIANT_ID)

Cell = tuple[str, str, str]  # task key, perturbation, variant


def cell_of(t: Trajectory) -> Cell:
    """The (task, perturbation, variant) a run belongs to."""
    variant = next((str(t.context[k]) for k in VARIANT_KEYS if t.context.get(k) not in (None, "")), "-")
    return (t.task_key or "", perturbation_of(t), variant)


def _order(t: Trajectory) -> tuple[Any, ...]:
    repeat = t.context.get(REPEAT)
    try:
        r = int(repeat) if repeat is not None else None
    except (TypeError, ValueError):
        r = None
    return (r is None, r or 0, t.start_ns, t.trajectory_id)


@dataclass
class PairedRun:
    """One of B's runs compared with A's reference for its cell."""

    cell: Cell
    trajectory_id: str
    divergences: list[Divergence]
    outcome_equal: bool | None  # None: an outcome is unknown on one side

    @property
    def same_path(self) -> bool:
        """No skipped, extra or substituted effect step."""
        return not any(d.kind in ("skipped", "extra", "substituted") for d in self.divergences)


@dataclass
class EquivalenceReport:
    """B against A; every count carries its n."""

    a: str
    b: str
    effect_tools: list[str] | None
    runs: list[PairedRun] = field(default_factory=list)
    references: dict[Cell, Reference] = field(default_factory=dict)
    a_self: list[int] = field(default_factory=lambda: [0, 0])  # A runs matching A's reference, A runs
    unpaired: dict[str, int] = field(default_factory=lambda: {"a_cells": 0, "b_cells": 0, "a_runs": 0, "b_runs": 0})
    # perturbation -> paired (A conformed, B conformed); and kA, nA, kB, nB over its shared cells
    conformance_pairs: dict[str, list[tuple[bool, bool]]] = field(default_factory=lambda: defaultdict(list))
    conformance_all: dict[str, list[int]] = field(default_factory=lambda: defaultdict(lambda: [0, 0, 0, 0]))
    excluded: dict[str, Counter[str]] = field(default_factory=lambda: {"a": Counter(), "b": Counter()})
    alpha: float = 0.05
    tested: bool = False  # a spec was given, so conformance is compared

    def mcnemar(self) -> dict[str, PairedResult]:
        """Exact McNemar on critical conformance per perturbation, over its paired runs (empty without a spec)."""
        return {p: mcnemar_exact(pairs) for p, pairs in sorted(self.conformance_pairs.items()) if pairs}

    def as_dict(self) -> dict[str, Any]:
        """JSON form."""
        n = len(self.runs)
        same = [r for r in self.runs if r.same_path]
        known = [r for r in self.runs if r.outcome_equal is not None]
        by_pert: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
        for r in self.runs:
            cell = by_pert[r.cell[1]]
            cell[0] += r.same_path
            cell[1] += 1
            if r.outcome_equal is not None:
                cell[2] += r.outcome_equal
                cell[3] += 1
        return {
            "a": self.a,
            "b": self.b,
            "effect_tools": self.effect_tools,
            "cells": len(self.references),
            "unpaired": self.unpaired,
            "excluded": {side: {k: counts.get(k, 0) for k in ("missing", "unexposed", "errored")}
                         for side, counts in self.excluded.items()},
            "runs": n,
            "same_effect_path": len(same),
            "same_arguments": sum(not r.divergences for r in same),
            "outcome": {"agree": sum(r.outcome_equal for r in known), "known": len(known), "unknown": n - len(known)},
            "a_self_consistency": {"k": self.a_self[0], "n": self.a_self[1]},
            "by_perturbation": {p: {"same_effect_path": s, "n": k, "outcome_agree": oa, "outcome_known": on}
                                for p, (s, k, oa, on) in sorted(by_pert.items())},
            "divergences": self.grouped_divergences(),
            "conformance": self._conformance(),
        }

    def _conformance(self) -> dict[str, Any] | None:
        if not self.tested:
            return None
        tests = self.mcnemar()
        adjusted = holm([m.p_value for m in tests.values()], self.alpha)
        by_pert = {}
        for (p, m), p_holm, reject in zip(tests.items(), adjusted.adjusted, adjusted.reject):
            ka, na, kb, nb = self.conformance_all[p]
            by_pert[p] = {
                "pairs": m.n, "both": m.both, "only_a": m.only_a, "only_b": m.only_b, "neither": m.neither,
                "a_rate": (m.both + m.only_a) / m.n, "b_rate": (m.both + m.only_b) / m.n,
                "mcnemar_p": m.p_value, "holm_p": p_holm, "differs": reject,
                "all_runs": {"a": {"k": ka, "n": na}, "b": {"k": kb, "n": nb},
                             "permutation_p": permutation_test(ka, na, kb, nb).p_value},
            }
        return {"test": "McNemar exact per perturbation, Holm across perturbations", "alpha": self.alpha,
                "perturbations": len(by_pert), "by_perturbation": by_pert}

    def grouped_divergences(self, limit: int = 20) -> list[dict[str, Any]]:
        """First divergences grouped by (kind, expected, got), commonest first."""
        groups: dict[tuple[str, str | None, str | None], dict[str, Any]] = {}
        for r in self.runs:
            if not r.divergences:
                continue
            d = r.divergences[0]
            g = groups.setdefault((d.kind, d.expected, d.got), {
                "kind": d.kind, "expected": d.expected, "got": d.got, "count": 0,
                "perturbations": Counter(), "example": {"trajectory_id": r.trajectory_id, "task_key": r.cell[0],
                                                        "detail": d.detail, "ref_index": d.ref_index}})
            g["count"] += 1
            g["perturbations"][r.cell[1]] += 1
        out = sorted(groups.values(), key=lambda g: (-g["count"], g["kind"], str(g["expected"]), str(g["got"])))[:limit]
        for g in out:
            g["perturbations"] = dict(sorted(g["perturbations"].items()))
        return out


def _select(runs: Iterable[tuple[Trajectory, str]], agent: str, excluded: Counter[str]) -> dict[Cell, list[Trajectory]]:
    """`agent`'s scored runs (exposed or errored) by cell; missing, unexposed and errored ones counted too."""
    out: dict[Cell, list[Trajectory]] = defaultdict(list)
    for t, status in runs:
        if t.task_key is None or agent not in (t.service, agent_label(t.service, t.service_version)):
            continue
        if status != "exposed":
            excluded[status] += 1
        if status in ("exposed", "errored"):
            out[cell_of(t)].append(t)
    return out


def _conforms(spec: Spec, t: Trajectory, exposed: set[str]) -> bool:
    return t.trajectory_id in exposed and evaluate(spec, t).conforms("critical")


def _modal_outcome(runs: Sequence[Trajectory]) -> Any:
    values = [t.context[OUTCOME] for t in runs if t.context.get(OUTCOME) is not None]
    if not values:
        return None
    counts = Counter(canonical(v) for v in values)
    best = min(counts.items(), key=lambda kv: (-kv[1], kv[0]))[0]
    return next(v for v in values if canonical(v) == best)


def equivalence(trajectories: Iterable[Trajectory], a: str, b: str, spec: Spec | None = None,
                keys: KeyRing | None = None) -> EquivalenceReport:
    """Compare agent `b` with agent `a` (a service name, or ``service@version``) on shared cells; replayed trials
    count by the driver's records that verify under `keys` (`trials.account`)."""
    runs = account(trajectories, keys).judged()
    exposed = {t.trajectory_id for t, status in runs if status == "exposed"}
    keep = spec.is_effect if spec is not None else None
    report = EquivalenceReport(a, b, sorted(spec.effect_tools) if spec and spec.effect_tools is not None else None,
                               tested=spec is not None)
    cells_a, cells_b = _select(runs, a, report.excluded["a"]), _select(runs, b, report.excluded["b"])
    for cell in sorted(set(cells_a) ^ set(cells_b)):
        side = "a" if cell in cells_a else "b"
        report.unpaired[f"{side}_cells"] += 1
        report.unpaired[f"{side}_runs"] += len((cells_a if side == "a" else cells_b)[cell])
    for cell in sorted(set(cells_a) & set(cells_b)):
        ra = sorted(cells_a[cell], key=_order)
        rb = sorted(cells_b[cell], key=_order)
        _compare_paths(report, cell, [t for t in ra if t.trajectory_id in exposed], [t for t in rb if t.trajectory_id in exposed],
                       spec, keep)
        if spec is not None:
            ok_a = [_conforms(spec, x, exposed) for x in ra]
            ok_b = [_conforms(spec, y, exposed) for y in rb]
            report.conformance_pairs[cell[1]] += list(zip(ok_a, ok_b))
            totals = report.conformance_all[cell[1]]
            for i, k in ((0, sum(ok_a)), (1, len(ok_a)), (2, sum(ok_b)), (3, len(ok_b))):
                totals[i] += k
    return report


def _compare_paths(report: EquivalenceReport, cell: Cell, ra: list[Trajectory], rb: list[Trajectory],
                   spec: Spec | None, keep: Any) -> None:
    """Effect paths and outcomes of B's exposed runs against A's reference (errored runs have neither)."""
    if not ra:
        return
    ref = build_reference(ra, spec, keep=keep)
    report.references[cell] = ref
    for t in ra:
        report.a_self[0] += not diverge(ref, path_of(t, keep), spec)
        report.a_self[1] += 1
    expected_outcome = _modal_outcome(ra)
    for t in rb:
        got = t.context.get(OUTCOME)
        same = None if expected_outcome is None or got is None else compare(expected_outcome, got).equal
        report.runs.append(PairedRun(cell, t.trajectory_id, diverge(ref, path_of(t, keep), spec), same))


def render_text(report: EquivalenceReport) -> str:
    """The `plumbline compare` report."""
    d = report.as_dict()
    n = d["runs"]
    lines = [
        f"compare {d['a']} (A) with {d['b']} (B) over {d['cells']} shared task/perturbation/variant cells, {n} B runs",
        f"effect tools: {', '.join(d['effect_tools']) if d['effect_tools'] is not None else 'all tool calls'}",
        f"same effect path: {d['same_effect_path']}/{n}   same arguments too: {d['same_arguments']}/{n}   "
        f"(A against itself: {d['a_self_consistency']['k']}/{d['a_self_consistency']['n']})",
        f"outcome agrees: {d['outcome']['agree']}/{d['outcome']['known']} where known ({d['outcome']['unknown']} unknown)",
    ]
    u = d["unpaired"]
    if u["a_cells"] or u["b_cells"]:
        lines.append(f"unpaired: {u['a_cells']} cells ({u['a_runs']} runs) only A ran, {u['b_cells']} cells ({u['b_runs']} runs) only B ran")
    for p, c in d["by_perturbation"].items():
        lines.append(f"  {p:<16} same effect path {c['same_effect_path']}/{c['n']}   outcome {c['outcome_agree']}/{c['outcome_known']}")
    x = d["excluded"]
    lines.append(f"not compared: A {x['a']['unexposed']} unexposed, {x['a']['missing']} missing; "
                 f"B {x['b']['unexposed']} unexposed, {x['b']['missing']} missing; errored runs (failures in the "
                 f"conformance tests, no effect path): A {x['a']['errored']}, B {x['b']['errored']}")
    if d["conformance"] is not None:
        c = d["conformance"]
        lines.append(f"critical conformance, {c['test']} (alpha {c['alpha']}):")
        for p, t in c["by_perturbation"].items():
            u = t["all_runs"]
            lines.append(
                f"  {p:<16} {t['pairs']} pairs: A {t['a_rate']:.3f}, B {t['b_rate']:.3f}; only A {t['only_a']}, only B {t['only_b']}; "
                f"McNemar p = {t['mcnemar_p']:.4g}, Holm p = {t['holm_p']:.4g}{'  DIFFERS' if t['differs'] else ''}"
            )
            lines.append(
                f"  {'':<16} all runs (unpaired): A {u['a']['k']}/{u['a']['n']}, B {u['b']['k']}/{u['b']['n']}; "
                f"permutation p = {u['permutation_p']:.4g}"
                + ("  (unequal repeats: runs past the shorter side are not in the paired test)"
                   if u["a"]["n"] != t["pairs"] or u["b"]["n"] != t["pairs"] else "")
            )
    if d["divergences"]:
        lines.append("first divergences:")
        for g in d["divergences"][:10]:
            per = ", ".join(f"{p} {k}" for p, k in g["perturbations"].items())
            lines.append(f"  {g['count']:>4} x {g['kind']:<16} {g['example']['detail']}   ({per}; e.g. {g['example']['trajectory_id']})")
    return "\n".join(lines)
