"""Where a study starts: the tasks to replay and the trials it already has, from one store or several read as one."""

from __future__ import annotations

from pathlib import Path

import pytest

from plumbline_otel.errors import ConfigError
from plumbline_otel.replay import source_tasks
from plumbline_otel.sources import Sources
from plumbline_otel.spec.testing import call, run, span_records
from plumbline_otel.store import Store
from plumbline_otel.trials import KeyRing


def _store(path: Path, runs: list) -> str:
    with Store(path) as store:
        for t in runs:
            store.write_spans(span_records(t))  # left unassembled: sourcing assembles first
    return str(path)


def _baseline(task: str) -> object:
    return run(call("lookup"), task=task, input=f"pay {task}", service="agent")


def test_one_store_gives_the_tasks_and_the_study_s_done_and_marker_only_trials(tmp_path: Path) -> None:
    done = run(call("lookup"), task="T1", input="pay T1 (paraphrased)", service="agent", plumbline__study="s",
               plumbline__trial__id="t-done", plumbline__perturbation="paraphrase")
    marker = run(task="T2", service="agent", plumbline__study="s", plumbline__trial__id="t-missing", plumbline__trial__status="missing")
    other = run(task="T2", service="agent", plumbline__study="other", plumbline__trial__id="t-other")
    db = _store(tmp_path / "a.duckdb", [_baseline("T1"), _baseline("T2"), done, marker, other])
    source = source_tasks(Sources([db]), "s", KeyRing())
    assert [(t.task_key, t.input) for t in source.tasks] == [("T1", "pay T1"), ("T2", "pay T2")]  # baselines only
    assert (source.completed, source.missing) == ({"t-done"}, {"t-missing"})
    assert [t.task_key for t in source_tasks(Sources([db]), "s", KeyRing(), task_keys=["T2"]).tasks] == ["T2"]


def test_several_stores_read_as_one(tmp_path: Path) -> None:
    a = _store(tmp_path / "a.duckdb", [_baseline("T1")])
    b = _store(tmp_path / "b.duckdb", [_baseline("T2")])
    assert [t.task_key for t in source_tasks(Sources([a, b], assemble=True), "s", KeyRing()).tasks] == ["T1", "T2"]


def test_no_store_and_no_task_are_errors_that_say_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such store; ingest the agent's traces first"):
        source_tasks(Sources([str(tmp_path / "absent.duckdb")]), "s", KeyRing())
    db = _store(tmp_path / "a.duckdb", [_baseline("T1")])
    with pytest.raises(ConfigError, match="no tasks matched .* of someone-else"):
        source_tasks(Sources([db]), "s", KeyRing(), agent="someone-else")
