"""`plumbline demo`, the README's first command, end to end on its embedded default."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from demo_support import DemoRun

from plumbline_otel.cli.main import cli
from plumbline_otel.runs import is_record
from plumbline_otel.store import Store
from plumbline_otel.trials import states_beside


def test_demo_samples_ingest_and_report(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["demo", "--db", str(tmp_path / "d.duckdb"), "--samples-only"])
    assert result.exit_code == 0, result.output
    assert "rejected 0" in result.output and "== All traffic ==" in result.output
    assert "get_invoice → schedule_payment" in result.output


@pytest.mark.slow
def test_demo_replays_checks_and_certifies_the_reference_agents_through_the_replay_driver(demo_run: DemoRun) -> None:
    result, db = demo_run.result, demo_run.db
    assert result.exit_code == 0, result.output
    cert = json.loads(demo_run.certificate.read_text())
    agents = {a["agent"].split("@")[0] for a in cert["agents"]}
    assert agents == {"ap-agent-plan_execute", "ap-agent-plan_execute_retry", "ap-agent-react"}
    cells = {(c["agent"].split("@")[0], c["perturbation"]): c for a in cert["agents"] for c in a["perturbations"]}
    perturbations = {"baseline", "paraphrase", "distractor", "decoy_tools", "sampling", "tool_fault"}
    assert {p for _, p in cells} == perturbations
    assert all(c["n"] == 44 and c["missing"] == 0 for c in cells.values())  # 22 tasks × 2 repeats, all six
    # The retry arm absorbs the injected 503; the arm without retry cannot.
    assert cells[("ap-agent-plan_execute_retry", "tool_fault")]["conforming"] == 44
    assert cells[("ap-agent-plan_execute", "tool_fault")]["conforming"] < 44
    assert "8. Gate:" in result.output and "FAIL" in result.output
    # It went through the replay driver: a ledger per agent, guard and cap in the summary, and
    # every certified run carries its attempt and, under tool_fault, the driver's fault evidence.
    for arm in ("plan_execute", "plan_execute_retry", "react"):
        state = states_beside(db) / arm  # beside the store, where certify and the console find the key
        assert (state / "ledger.jsonl").exists() and (state / "variants.jsonl").exists() and (state / "study.json").exists()
        assert f"study ap-demo-{arm}: 264 trials planned; ran 264 (264 ok, 0 missing, 0 errored)" in result.output
    assert result.output.count("faults seen by the driver to fire in 44/44 faulted trials the agent ran") == 3
    # Every cell's evidence came from the driver: its injector for tool faults, its metered client for decoys and sampling.
    assert all(cells[(a, "tool_fault")]["evidence_from"] == {"injector": 44} for a, _ in cells)
    assert all(cells[(a, p)]["evidence_from"] == {"client": 44} for a, _ in cells for p in ("decoy_tools", "sampling"))
    with Store(db) as store:
        replayed = [t for t in store.trajectories() if str(t.context.get("plumbline.study", "")).startswith("ap-demo-")
                    and not is_record(t)]
    assert len(replayed) == 792 and len({t.trace_id for t in replayed}) == 792
    assert all(t.context["plumbline.trial.attempt"] == 1 for t in replayed)
    faulted = [t for t in replayed if t.context["plumbline.perturbation"] == "tool_fault"]
    for t in faulted:
        tool, error = t.context["plumbline.fault.tool"], t.context["plumbline.fault.error"]
        assert t.context["plumbline.fault.fired"] is True
        assert any(s.failed and s.name == tool and error in (s.error or "") for s in t.tool_steps)
