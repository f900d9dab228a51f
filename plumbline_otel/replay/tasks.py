"""Task selection: which tasks to replay, taken from stored trajectories.

A task is a task key plus the input of a representative run: the most recent *baseline* run of
that key that has an input and is not a missing-trial marker (a perturbed run's input is itself
a variant, so it never stands for the task). ``tasks_from_trajectories`` is the pure rule;
``select_tasks`` applies it to a store (by agent, task keys, time and an SQL filter).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from plumbline_otel.model import Trajectory
from plumbline_otel.runs import agent_label, is_missing, perturbation_of


@dataclass(frozen=True)
class ReplayTask:
    """One task to replay: its key, the request as the agent received it, and where it came from."""

    task_key: str
    input: str
    source_trajectory_id: str
    service: str | None = None
    service_version: str | None = None
    start_ns: int = 0
    tools: tuple[str, ...] = ()  # tools the source run called successfully, in first-call order
    # What the source run's model calls used: the basis of a trial's spend reservation.
    model: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0

    def as_dict(self) -> dict[str, object]:
        return {"task_key": self.task_key, "input": self.input, "source_trajectory_id": self.source_trajectory_id,
                "service": self.service, "service_version": self.service_version, "start_ns": self.start_ns,
                "tools": list(self.tools), "model": self.model, "input_tokens": self.input_tokens,
                "output_tokens": self.output_tokens}


def _tools(t: Trajectory) -> tuple[str, ...]:
    seen: dict[str, None] = {}
    for step in t.tool_steps:
        if not step.failed:
            seen.setdefault(step.name, None)
    return tuple(seen)


def _usage(t: Trajectory) -> tuple[str | None, int, int]:
    """(model, input tokens, output tokens) over the run's model calls."""
    calls = [s for s in t.steps if s.kind == "llm_call"]
    model = next((s.model for s in calls if s.model), None)
    return model, sum(s.input_tokens or 0 for s in calls), sum(s.output_tokens or 0 for s in calls)


def tasks_from_trajectories(trajectories: Iterable[Trajectory], task_keys: Sequence[str] | None = None,
                            agent: str | None = None) -> list[ReplayTask]:
    """One task per task key (sorted by key): the most recent baseline run with an input."""
    wanted = set(task_keys) if task_keys else None
    best: dict[str, Trajectory] = {}
    for t in trajectories:
        if t.task_key is None or not t.input or is_missing(t) or perturbation_of(t) != "baseline":
            continue
        if wanted is not None and t.task_key not in wanted:
            continue
        if agent is not None and agent not in (t.service, agent_label(t.service, t.service_version)):
            continue
        current = best.get(t.task_key)
        if current is None or (t.start_ns, t.trajectory_id) > (current.start_ns, current.trajectory_id):
            best[t.task_key] = t
    return [ReplayTask(key, t.input or "", t.trajectory_id, t.service, t.service_version, t.start_ns, _tools(t), *_usage(t))
            for key, t in sorted(best.items())]


def select_tasks(store, agent: str | None = None, task_keys: Sequence[str] | None = None,  # type: ignore[no-untyped-def]
                 since_ns: int | None = None, where: str | None = None) -> list[ReplayTask]:
    """Tasks from a ``Store`` (or ``Sources``, several stores read as one): runs of ``agent``
    (service or service@version), optionally only ``task_keys``, started at/after ``since_ns`` and
    matching the SQL filter ``where`` over the trajectories table (files only)."""
    service = agent.split("@", 1)[0] if agent else None
    clauses = ["task_key IS NOT NULL", "input IS NOT NULL"]
    if where:
        clauses.append(f"({where})")
    keys = list(task_keys) if task_keys else None
    runs = store.trajectories(service=service, task=keys[0] if keys and len(keys) == 1 else None,
                              since_ns=since_ns, where=" AND ".join(clauses) if where else None)
    return tasks_from_trajectories(runs, keys, agent)
