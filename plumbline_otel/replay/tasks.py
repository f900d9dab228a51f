"""Task selection: which tasks to replay, taken from stored trajectories.

A task is a task key plus the input of a representative run: the most recent *baseline* run of
that key that has an input and is not a missing-trial marker (a perturbed run's input is itself
a variant, so it never stands for the task). ``tasks_from_trajectories`` is the pure rule;
``select_tasks`` applies it to a store (by agent, task keys, time and an SQL filter), and
``source_tasks`` adds what a study needs to resume: the trials it already ran.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from plumbline_otel.errors import ConfigError
from plumbline_otel.model import Trajectory
from plumbline_otel.runs import STUDY, TRIAL_ID, agent_label, is_missing, is_record, perturbation_of
from plumbline_otel.sources import Sources
from plumbline_otel.store import RunFilter, Store
from plumbline_otel.trials import DECIDED, KeyRing, record_of, verify_record


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


def select_tasks(store: Store | Sources, agent: str | None = None, task_keys: Sequence[str] | None = None,
                 since_ns: int | None = None, where: str | None = None) -> list[ReplayTask]:
    """Tasks from a ``Store`` (or ``Sources``, several stores read as one): runs of ``agent``
    (service or service@version), optionally only ``task_keys``, started at/after ``since_ns`` and
    matching the SQL filter ``where`` over the trajectories table (files only)."""
    service = agent.split("@", 1)[0] if agent else None
    keys = list(task_keys) if task_keys else None
    runs = store.trajectories(service=service, task=keys[0] if keys and len(keys) == 1 else None,
                              since_ns=since_ns, where=where)
    return tasks_from_trajectories(runs, keys, agent)


def trials_of(trajectories: Iterable[Trajectory], study: str, keys: KeyRing) -> tuple[set[str], set[str]]:
    """(trial ids decided, trial ids recorded only as missing) of ``study`` among these runs and records.

    Decided: an attempt the agent ran (ok or errored), by the driver's records that verify under
    ``keys`` (a forged "ok" never makes resume skip a trial); a study stored before the records
    existed is read by its runs and legacy markers instead.
    """
    decided: set[str] = set()
    missing: set[str] = set()
    legacy_decided: set[str] = set()
    legacy_missing: set[str] = set()
    for t in trajectories:
        if str(t.context.get(STUDY, "")) != study:
            continue
        record = record_of(t)
        if record is not None:
            if verify_record(t, keys) != "verified" or record.status == "sealed":
                continue
            if record.attempt:
                (decided if record.status in DECIDED else missing).add(record.trial_id)
            else:
                missing.add(record.trial_id)  # planned: missing until an attempt ran
            continue
        tid = t.context.get(TRIAL_ID)
        if tid is not None and not is_record(t):
            (legacy_missing if is_missing(t) else legacy_decided).add(str(tid))
    if decided or missing:
        return decided, missing - decided
    return legacy_decided, legacy_missing - legacy_decided


def stored_trials(store: Store, study: str, keys: KeyRing) -> tuple[set[str], set[str]]:
    """(trial ids decided, trial ids recorded only as missing) of ``study`` in one store (`trials_of`)."""
    store.assemble()
    return trials_of(store.trajectories(runs=RunFilter(study=study)), study, keys)


@dataclass(frozen=True)
class TaskSource:
    """What a study starts from: the tasks to replay, and the trials it already has (for resume)."""

    tasks: list[ReplayTask]
    completed: set[str]  # trial ids decided: an attempt the agent ran
    missing: set[str]  # trial ids no attempt has reached the agent yet: they run (again) as new attempts


def source_tasks(stores: Sources, study: str, keys: KeyRing, agent: str | None = None, task_keys: Sequence[str] | None = None,
                 since_ns: int | None = None, where: str | None = None) -> TaskSource:
    """The tasks and the study's resume state, from one store file or from several stores and servers read as one.

    One file is opened for writing and assembled first, so spans a crash left unassembled count;
    a served file cannot be opened, so servers are read through their API. No task matched is a
    `ConfigError` that says which filters to check.
    """
    db = stores.single_db
    if db is None:
        tasks = select_tasks(stores, agent=agent, task_keys=task_keys, since_ns=since_ns, where=where)
        completed, missing = trials_of(stores.trajectories(), study, keys)
    else:
        if not Path(db).exists():
            raise ConfigError(f"--db {db}: no such store; ingest the agent's traces first (`plumbline ingest … --db {db}`)")
        with Store(db) as store:
            store.assemble()
            tasks = select_tasks(store, agent=agent, task_keys=task_keys, since_ns=since_ns, where=where)
            completed, missing = stored_trials(store, study, keys)
    if not tasks:
        raise ConfigError("no tasks matched (baseline runs with a task key and an input"
                          + (f" of {agent}" if agent else "") + "): check --agent/--task/--where/--since")
    return TaskSource(tasks, completed, missing)
