"""Consistency: does an agent do the same thing, with the same arguments, each time it runs a task?

Per (agent, task), the runs are compared with a **reference**: the modal path among the task's
baseline runs (all runs when the task has no baseline run; a widespread perturbation must not
redefine "normal"), with, at each position, the modal arguments among the runs on that path.
Modes are taken with a deterministic tie-break (the smallest canonical form), never by input
order. A run is consistent when its path equals the reference path (Needleman–Wunsch alignment,
so an omitted step is one divergence, not a cascade) and every aligned step's arguments equal the
reference's under the spec's typed argument rules (`compare_values`; uncaptured arguments are not
compared). Paths are the successful tool calls: a failed call did not happen.

pass^k per task is the chance that k runs drawn from it are all consistent (`stats.pass_hat_k`);
with a spec it is also given for critical conformance, the "erratically right" measure.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from plumbline_otel.analyse.align import align
from plumbline_otel.analyse.conformance import evaluate
from plumbline_otel.analyse.stats import pass_hat_k
from plumbline_otel.compare_values import Rule, canonical, compare
from plumbline_otel.model import REDACTED, Step, Trajectory
from plumbline_otel.runs import agent_label, is_marker, perturbation_of
from plumbline_otel.spec import Spec

DivergenceKind = Literal["skipped", "extra", "substituted", "argument_changed", "outcome"]
MAX_K = 8


@dataclass(frozen=True)
class Divergence:
    """Where a run departs from its reference; indices are positions in the two paths."""

    kind: DivergenceKind
    ref_index: int | None
    run_index: int | None
    expected: str | None
    got: str | None
    detail: str

    def as_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {"kind": self.kind, "ref_index": self.ref_index, "run_index": self.run_index,
                "expected": self.expected, "got": self.got, "detail": self.detail}


@dataclass(frozen=True)
class Reference:
    """The modal path of a group of runs and the modal arguments at each of its positions."""

    names: tuple[str, ...]
    args: tuple[Any, ...]
    support: int  # runs that followed exactly this path
    pool: int  # runs the mode was taken over
    source: str  # "baseline" or "all runs"
    trajectory_id: str | None  # a run matching the reference exactly, when there is one


def path_of(trajectory: Trajectory, keep: Callable[[str], bool] | None = None) -> list[Step]:
    """The successful tool calls of a run, optionally only those `keep` accepts (effect tools)."""
    return [s for s in trajectory.steps if s.kind == "tool_call" and s.error is None and (keep is None or keep(s.name))]


def _args_rule(spec: Spec | None, tool: str) -> Rule:
    return spec.arg_rules.get(tool, Rule()) if spec is not None else Rule()


def _captured(args: Any) -> bool:
    return args is not None and args != REDACTED and not isinstance(args, str)


def build_reference(
    runs: Sequence[Trajectory], spec: Spec | None = None, keep: Callable[[str], bool] | None = None,
    prefer: Callable[[Trajectory], bool] | None = None,
) -> Reference:
    """The reference for `runs`: the mode over the runs `prefer` accepts (all if none does)."""
    preferred = [t for t in runs if prefer(t)] if prefer is not None else []
    pool = preferred or list(runs)
    paths = {t.trajectory_id: path_of(t, keep) for t in pool}
    counts = Counter(tuple(s.name for s in p) for p in paths.values())
    names, support = min(counts.items(), key=lambda kv: (-kv[1], repr(kv[0])))
    on_path = [p for p in paths.values() if tuple(s.name for s in p) == names]
    args: list[Any] = []
    for i, name in enumerate(names):
        rule = _args_rule(spec, name)
        seen = [p[i].args for p in on_path if _captured(p[i].args)]
        if not seen:
            args.append(None)
            continue
        forms = Counter(canonical(a, rule) for a in seen)
        best = min(forms.items(), key=lambda kv: (-kv[1], kv[0]))[0]
        args.append(next(a for a in seen if canonical(a, rule) == best))
    exact = sorted(
        tid for tid, p in paths.items()
        if tuple(s.name for s in p) == names and all(_same_args(spec, s, a) for s, a in zip(p, args))
    )
    return Reference(names, tuple(args), support, len(pool), "baseline" if preferred else "all runs",
                     exact[0] if exact else None)


def _same_args(spec: Spec | None, step: Step, expected: Any) -> bool:
    if expected is None or not _captured(step.args):
        return True
    return compare(expected, step.args, _args_rule(spec, step.name)).equal


def diverge(reference: Reference, path: Sequence[Step], spec: Spec | None = None) -> list[Divergence]:
    """Skipped, extra, substituted and argument-changed steps of `path` against `reference`, in path order."""
    alignment = align(list(reference.names), [s.name for s in path], key=lambda x: x)
    out: list[Divergence] = []
    for (ri, ci), column in zip(alignment.pairs, alignment.columns):
        expected = reference.names[ri] if ri is not None else None
        got = path[ci].name if ci is not None else None
        if column == "skipped":
            out.append(Divergence("skipped", ri, None, expected, None, f"step {ri}: {expected} skipped"))
        elif column == "extra":
            after = f"after step {ri_prev}" if (ri_prev := _last_ref(alignment.pairs, ci)) is not None else "at the start"
            out.append(Divergence("extra", None, ci, None, got, f"{after}: extra {got}"))
        elif column == "substituted":
            out.append(Divergence("substituted", ri, ci, expected, got, f"step {ri}: expected {expected}, got {got}"))
        else:
            assert ri is not None and ci is not None
            exp_args = reference.args[ri]
            if exp_args is None or not _captured(path[ci].args):
                continue
            cmp = compare(exp_args, path[ci].args, _args_rule(spec, expected or ""))
            if not cmp.equal:
                out.append(Divergence("argument_changed", ri, ci, expected, got, f"step {ri} {expected}: {cmp.detail}"))
    return out


def _last_ref(pairs: Sequence[tuple[int | None, int | None]], ci: int | None) -> int | None:
    last = None
    for ri, c in pairs:
        if c == ci:
            return last
        if ri is not None:
            last = ri
    return last


@dataclass
class RunConsistency:
    """One run against its task's reference."""

    trajectory_id: str
    perturbation: str
    divergences: list[Divergence]
    conforming: bool | None = None

    @property
    def same_path(self) -> bool:
        """No skipped, extra or substituted step."""
        return not any(d.kind in ("skipped", "extra", "substituted") for d in self.divergences)

    @property
    def consistent(self) -> bool:
        """Same path and same arguments."""
        return not self.divergences


@dataclass
class TaskConsistency:
    """The runs of one task by one agent."""

    agent: str
    task_key: str
    reference: Reference
    runs: list[RunConsistency] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """JSON form with counts and their n."""
        n = len(self.runs)
        same_path = [r for r in self.runs if r.same_path]
        consistent = sum(r.consistent for r in self.runs)
        out: dict[str, Any] = {
            "agent": self.agent,
            "task_key": self.task_key,
            "n": n,
            "reference": {"path": list(self.reference.names), "support": self.reference.support,
                          "pool": self.reference.pool, "from": self.reference.source,
                          "trajectory_id": self.reference.trajectory_id},
            "same_path": len(same_path),
            "same_arguments": sum(r.consistent for r in same_path),
            "consistent": consistent,
            "pass_hat_k": {k: pass_hat_k(n, consistent, k) for k in range(1, min(n, MAX_K) + 1)},
            "divergent_runs": [
                {"trajectory_id": r.trajectory_id, "perturbation": r.perturbation,
                 "first_divergence": r.divergences[0].as_dict(), "divergences": len(r.divergences)}
                for r in self.runs if r.divergences
            ],
        }
        judged = [r.conforming for r in self.runs if r.conforming is not None]
        if judged:
            c = sum(judged)
            out["conforming"] = c
            out["conformance_pass_hat_k"] = {k: pass_hat_k(len(judged), c, k) for k in range(1, min(len(judged), MAX_K) + 1)}
        return out


def consistency(trajectories: Iterable[Trajectory], spec: Spec | None = None) -> list[TaskConsistency]:
    """Per (agent, task) consistency of the runs (missing trials and runs without a task are left out)."""
    groups: dict[tuple[str, str], list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        if not is_marker(t) and t.task_key is not None:
            groups[(agent_label(t.service, t.service_version), t.task_key)].append(t)
    out = []
    for (agent, task), runs in sorted(groups.items()):
        runs.sort(key=lambda t: t.trajectory_id)
        ref = build_reference(runs, spec, prefer=lambda t: perturbation_of(t) == "baseline")
        report = TaskConsistency(agent, task, ref)
        for t in runs:
            conforming = evaluate(spec, t).conforms("critical") if spec is not None else None
            report.runs.append(RunConsistency(t.trajectory_id, perturbation_of(t), diverge(ref, path_of(t), spec), conforming))
        out.append(report)
    return out


def summarise(tasks: Sequence[TaskConsistency]) -> dict[str, Any]:
    """Totals over tasks: consistent runs per perturbation and mean pass^k over tasks with at least k runs."""
    by_pert: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for task in tasks:
        for r in task.runs:
            cell = by_pert[r.perturbation]
            cell[0] += r.consistent
            cell[1] += r.same_path
            cell[2] += 1
    per_k: dict[int, list[float]] = defaultdict(list)
    for task in tasks:
        for k, v in task.as_dict()["pass_hat_k"].items():
            per_k[k].append(v)
    runs = sum(len(t.runs) for t in tasks)
    return {
        "tasks": len(tasks),
        "runs": runs,
        "consistent": sum(r.consistent for t in tasks for r in t.runs),
        "same_path": sum(r.same_path for t in tasks for r in t.runs),
        "by_perturbation": {p: {"consistent": c, "same_path": s, "n": n} for p, (c, s, n) in sorted(by_pert.items())},
        "pass_hat_k": {k: {"mean": sum(v) / len(v), "tasks": len(v)} for k, v in sorted(per_k.items())},
    }


def render_text(tasks: Sequence[TaskConsistency], limit: int = 10) -> str:
    """Totals, then the least consistent tasks with their first divergence."""
    s = summarise(tasks)
    lines = [f"consistency: {s['consistent']}/{s['runs']} runs match their task's reference "
             f"(same path: {s['same_path']}/{s['runs']}) over {s['tasks']} tasks"]
    for p, c in s["by_perturbation"].items():
        lines.append(f"  {p:<16} consistent {c['consistent']}/{c['n']}   same path {c['same_path']}/{c['n']}")
    for k, v in s["pass_hat_k"].items():
        lines.append(f"  pass^{k}: {v['mean']:.3f} (mean over {v['tasks']} tasks)")
    worst = sorted(tasks, key=lambda t: (sum(r.consistent for r in t.runs) / max(1, len(t.runs)), t.task_key))[:limit]
    for t in worst:
        d = t.as_dict()
        if not d["divergent_runs"]:
            continue
        first = d["divergent_runs"][0]
        lines.append(f"  {t.agent} {t.task_key}: {d['consistent']}/{d['n']} consistent; e.g. {first['trajectory_id']}: "
                     f"{first['first_divergence']['detail']}")
    return "\n".join(lines)
