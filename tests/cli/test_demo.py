"""`plumbline demo`, the README's first command, end to end on its embedded default."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from plumbline_otel.cli.main import _register, cli

_register()


def test_demo_samples_ingest_and_report(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["demo", "--db", str(tmp_path / "d.duckdb"), "--samples-only"])
    assert result.exit_code == 0, result.output
    assert "rejected 0" in result.output and "== All traffic ==" in result.output
    assert "get_invoice → schedule_payment" in result.output


@pytest.mark.slow
def test_demo_runs_checks_and_certifies_the_reference_agents(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    result = CliRunner().invoke(cli, ["demo", "--db", str(tmp_path / "d.duckdb"), "--runs-dir", str(runs)])
    assert result.exit_code == 0, result.output
    cert = json.loads((runs / "certificate.json").read_text())
    agents = {a["agent"].split("@")[0] for a in cert["agents"]}
    assert agents == {"ap-agent-plan_execute", "ap-agent-plan_execute_retry", "ap-agent-react"}
    cells = {(c["agent"].split("@")[0], c["perturbation"]): c for a in cert["agents"] for c in a["perturbations"]}
    # The retry arm absorbs the injected 503; the arm without retry cannot.
    assert cells[("ap-agent-plan_execute_retry", "tool_fault")]["conforming"] == 22
    assert cells[("ap-agent-plan_execute", "tool_fault")]["conforming"] < 22
    assert cert["headline"]["lower_bound"] == min(c["lower"] for c in cells.values())
    assert "7. Gate:" in result.output and "FAIL" in result.output
