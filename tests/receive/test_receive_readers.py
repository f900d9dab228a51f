"""Reading while serving: every reader command goes through the server's API, and says so when it cannot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import SpanExportResult
from receive_support import ServeProcess, finished_spans
from waits import EVENT_DEADLINE_S

from plumbline_otel.cli.main import cli

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

SPEC = """
version: 1
name: readers
invariants:
  - id: MUST-PAY
    severity: critical
    must_call: schedule_payment
"""


def test_commands_read_a_served_store_through_the_api(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    with ServeProcess(tmp_path) as server:
        exporter = OTLPSpanExporter(endpoint=server.grpc_address, insecure=True, timeout=EVENT_DEADLINE_S)
        assert exporter.export(finished_spans(3)) == SpanExportResult.SUCCESS
        exporter.shutdown()
        runner = CliRunner()
        direct = runner.invoke(cli, ["trajectories", "--db", str(server.db)])
        # The holder named as it is (its pid and command line: the server), never guessed.
        assert server.proc is not None
        assert f"is held by process {server.proc.pid}" in str(direct.exception) and "serve" in str(direct.exception)
        assert "--server" in str(direct.exception)
        lines = runner.invoke(cli, ["trajectories", "--server", server.grpc_address]).output.strip().splitlines()
        assert sorted(json.loads(line)["task_key"] for line in lines) == ["task-0", "task-1", "task-2"]
        coverage = json.loads(runner.invoke(cli, ["coverage", "--server", server.grpc_address, "--format", "json"]).output)
        assert coverage["overall"]["tool_calls"]["tool_calls"] == 3
        checked = runner.invoke(cli, ["check", "--spec", str(spec), "--server", server.grpc_address, "--format", "json"])
        assert checked.exit_code == 0, checked.output
        summary = json.loads(checked.output[checked.output.index("{"):])
        assert summary["runs"] == 3 and summary["critical_conforming"] == 0 and summary["violations_written"] == 3  # stored in the served store through its API
        cert = tmp_path / "cert.json"
        result = runner.invoke(cli, ["certify", "--spec", str(spec), "--server", server.grpc_address, "--out", str(cert), "--format", "none"])
        assert result.exit_code == 0, result.output
        headline = json.loads(cert.read_text())["headline"]
        assert headline["cells"][0]["n"] == 3 and headline["cells"][0]["conforming"] == 0
