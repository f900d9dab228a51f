"""An agent that cheats changes nothing the certificate counts: each cheat beside its honest twin, through the CLI.

Agents of every adapter kind (`tests/replay/cheats.py`: a command, an HTTP endpoint, an in-process class) forge the
driver's records, name another trial's run as theirs, relabel their study, task and cell, and state their own cost.
The certificate of each cheat must count what its honest twin's counts; what the cheat wrote is shown, never believed.
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from waits import EVENT_DEADLINE_S

from plumbline_otel.cli.main import cli
from plumbline_otel.report import Certificate, build_certificate, load_certificate, render_text
from plumbline_otel.report.model import RunReason
from plumbline_otel.runs import INSTANCE, RECORD_KIND, RECORD_MAC, is_record
from plumbline_otel.spec import load_spec
from plumbline_otel.store import Store

from .cheats import serve_http
from .toy import ROOT, cell, study

KINDS = ("command", "http", "python")


@contextmanager
def agent(kind: str, mode: str, tmp_path: Path, name: str) -> Iterator[list[str]]:
    """The --adapter (and its options) of a cheat `mode` of one adapter kind."""
    if kind == "command":
        yield ["command:" + f"{sys.executable} -m tests.replay.cheats {mode}", "--adapter-option", f"cwd={ROOT}"]
    elif kind == "python":
        yield ["python:tests.replay.cheats:InProcess", "--adapter-option", f"mode={mode}"]
    else:
        with serve_http(str(tmp_path / f"{name}.otlp.jsonl")) as url:
            yield [f"http:{url}/{mode}"]


def certified(kind: str, mode: str, tmp_path: Path, db: Path, name: str, *extra: str, repeats: int = 2) -> tuple[Any, Certificate]:
    with agent(kind, mode, tmp_path, name) as adapter:
        replayed, cert, _ = study(tmp_path, db, adapter[0], *adapter[1:], *extra, repeats=repeats, name=name)
    return replayed, cert


def counts(cert: Certificate) -> list[tuple[Any, ...]]:
    """What a gate and a reader rely on, cell by cell."""
    return [(c.agent, c.perturbation, c.n, c.conforming, c.exposed, c.errored, c.unexposed, c.missing,
             c.witnessed, round(c.cost_usd, 6), c.unmetered) for a in cert.agents for c in a.perturbations]


def untrusted(cert: Certificate) -> tuple[RunReason, ...]:
    return cert.provenance.untrusted_records or ()


@pytest.mark.parametrize("kind", KINDS)
def test_a_forged_ok_record_after_a_crash_counts_nowhere_and_is_shown_as_a_forgery(kind: str, tmp_path: Path, db: Path) -> None:
    _, honest = certified(kind, "crash", tmp_path, db, "honest")
    _, cheat = certified(kind, "forge_ok_crash", tmp_path, db, "cheat")
    assert counts(cheat) == counts(honest)
    assert (cell(cheat).n, cell(cheat).errored, cell(cheat).conforming) == (4, 4, 0)
    forged = untrusted(cheat)
    assert len(forged) == 4 and all(f.reason.startswith("forged") for f in forged)
    assert not untrusted(honest)
    # shown as forgeries on the terminal and in the report's certificate
    assert "NOT BELIEVED (counted nowhere): 4 forged" in render_text(cheat)
    page = tmp_path / "report.html"
    assert CliRunner().invoke(cli, ["report", "--db", str(db), "--cert", str(tmp_path / "cheat.cert.json"), "--out", str(page)]).exit_code == 0
    assert "Not believed, counted nowhere:" in page.read_text() and "forged: its MAC does not check" in page.read_text()


@pytest.mark.parametrize("kind", KINDS)
def test_invented_trials_with_forged_records_are_never_scored(kind: str, tmp_path: Path, db: Path) -> None:
    _, honest = certified(kind, "skips", tmp_path, db, "honest")
    _, cheat = certified(kind, "forge_many", tmp_path, db, "cheat")
    assert counts(cheat) == counts(honest) == [("toy-agent@1", "baseline", 4, 0, 4, 0, 0, 0, 4, 0.0, 0)]
    assert len(untrusted(cheat)) == 4 * 25 * 2  # a plan and an "ok" record for each invented trial, from each real one
    assert cell(cheat).unwitnessed == 4 * 25  # the invented runs claim the study: listed, never scored


@pytest.mark.parametrize("kind", KINDS)
def test_an_agent_cannot_choose_the_run_it_is_judged_on(kind: str, tmp_path: Path, db: Path) -> None:
    certified(kind, "pays", tmp_path, db, "earlier")  # conforming runs the cheat can find in an OTLP file beside its own
    _, honest = certified(kind, "silent", tmp_path, db, "honest")
    _, cheat = certified(kind, "point", tmp_path, db, "cheat")
    assert counts(cheat) == counts(honest)
    assert (cell(cheat).n, cell(cheat).errored, cell(cheat).conforming) == (4, 4, 0)
    assert all("no trace received" in r.reason for r in cell(cheat).errored_runs)
    assert len([n for n in cell(cheat).notes if "named trace" in n.note]) == 4  # the named trace: a conflict, shown


@pytest.mark.parametrize("kind", KINDS)
def test_relabelling_a_run_moves_it_out_of_no_study_task_or_cell(kind: str, tmp_path: Path, db: Path) -> None:
    _, honest = certified(kind, "skips", tmp_path, db, "honest")
    _, cheat = certified(kind, "relabel", tmp_path, db, "cheat")
    assert counts(cheat) == counts(honest)
    assert [c.perturbation for a in cheat.agents for c in a.perturbations] == ["baseline"]
    assert cell(cheat).per_task == cell(honest).per_task  # judged against its own task's ground truth


@pytest.mark.parametrize("kind", KINDS)
def test_an_agent_that_says_it_cost_nothing_is_charged_its_reservation(kind: str, tmp_path: Path, db: Path) -> None:
    cap = ["--budget-usd", "0.20", "--trial-max-usd", "0.05"]
    honest_run, honest = certified(kind, "pays", tmp_path, db, "honest", *cap, repeats=3)
    cheat_run, cheat = certified(kind, "free", tmp_path, db, "cheat", *cap, repeats=3)
    assert counts(cheat) == counts(honest)
    assert (cell(cheat).n, cell(cheat).missing, cell(cheat).unmetered) == (4, 2, 4) and cell(cheat).cost_usd == pytest.approx(0.2)
    assert "ran 6 (4 ok, 2 missing, 0 errored)" in honest_run.output and "ran 6 (4 ok, 2 missing, 0 errored)" in cheat_run.output


def test_no_bytes_an_agent_writes_on_its_spans_change_any_trial(tmp_path: Path, db: Path) -> None:
    """A property: 40 random rewritings of every agent run's labels (any plumbline.* attribute, any value), each with
    record-shaped copies beside it (no steps, any MAC, a trace of their own), leave every cell of the certificate as it was.
    (What the agent did, its steps, is its own: that may change its conformance, never its trial's status or membership.)"""
    certified("python", "pays", tmp_path, db, "honest", "--perturbations", "baseline,tool_fault")
    spec = load_spec(tmp_path / "spec.yaml")
    with Store(db) as store:
        stored, keys = list(store.trajectories()), store.study_keys()
    honest = build_certificate(spec, stored, study="honest", keys=keys)
    keys_written = ["plumbline.study", "plumbline.trial.id", "plumbline.trial.attempt", "plumbline.task.key", "plumbline.perturbation",
                    "plumbline.variant", "plumbline.trial.repeat", INSTANCE, "plumbline.trial.status", "plumbline.trial.reason",
                    "plumbline.fault.fired", "plumbline.fault.source", "plumbline.cost.usd", "plumbline.cost.metered",
                    "plumbline.trial.trace_id", RECORD_KIND, RECORD_MAC, "plumbline.record.at_ns", "plumbline.perturbation.seen"]
    values = ["honest", "elsewhere", "ok", "errored", "missing", "true", "false", True, False, 0, 1, 0.0, 99.0, "attempt", "plan",
              "tool_fault", "paraphrase", "INV-0", "0" * 64]
    rng = random.Random(20261207)
    agent_runs = [t for t in stored if not is_record(t)]
    for _ in range(40):
        lies = {k: rng.choice(values) for k in rng.sample(keys_written, rng.randint(1, len(keys_written)))}
        changed = [replace(t, context={**t.context, **lies}) for t in agent_runs]
        copies = [replace(t, steps=(), trajectory_id=f"copy-{t.trajectory_id}", trace_id=f"{rng.getrandbits(127):032x}")
                  for t in changed if rng.random() < 0.5]
        lied = build_certificate(spec, [t for t in stored if is_record(t)] + changed + copies, study="honest", keys=keys)
        assert counts(lied) == counts(honest), lies


def test_without_the_study_state_no_record_is_believed_and_certify_says_where_to_find_it(tmp_path: Path, db: Path) -> None:
    certified("python", "pays", tmp_path, db, "honest")
    spec = load_spec(tmp_path / "spec.yaml")
    with Store(db) as store:
        stored = list(store.trajectories())
    cert = build_certificate(spec, stored, study="honest")  # no keys at hand
    assert cert.agents == () or all(c.n == 0 for a in cert.agents for c in a.perturbations)
    reasons = [r.reason for r in untrusted(cert)]
    assert sum(r.startswith("unverified") and "--state" in r for r in reasons) == 4 + 4 + 4  # plans, attempts and seals
    assert sum(r.startswith("unwitnessed") for r in reasons) == 4  # its runs: no believed record stands for them


@pytest.mark.parametrize("kind", ["command", "python"])
def test_spans_after_a_trial_s_evidence_window_are_stored_marked_late_and_change_nothing(kind: str, tmp_path: Path, db: Path) -> None:
    # toy.study's --grace 0.5; the detached children export 3 s after (a window closes at its end plus the grace, or a
    # little later on a loaded machine: never earlier, so the driver's own delay never makes an agent's span late)
    _, first = certified(kind, "late", tmp_path, db, "late")
    spans = tmp_path / "late.otlp.jsonl"
    deadline = time.monotonic() + EVENT_DEADLINE_S  # ends when the spans are there: this only bounds a hang
    while spans.read_text().count('"execute_tool pay"') < 4 and time.monotonic() < deadline:  # the detached children's spans
        time.sleep(0.2)
    assert spans.read_text().count('"execute_tool pay"') == 4
    runner = CliRunner()
    assert runner.invoke(cli, ["ingest", str(spans), "--db", str(db), "--quiet"]).exit_code in (0, 3)
    out = tmp_path / "again.cert.json"
    assert runner.invoke(cli, ["certify", "--spec", str(tmp_path / "spec.yaml"), "--db", str(db), "--study", "late",
                               "--out", str(out), "--format", "none"]).exit_code == 0
    again = load_certificate(out)
    assert counts(again) == counts(first) and (cell(again).n, cell(again).conforming) == (4, 0)  # same answer twice
    late = [n.note for n in cell(again).notes if n.note.startswith("late:")]
    assert len(late) == 4 and all("(pay)" in n for n in late)  # and it says which runs received spans after their window
