"""Three `plumbline serve` instances commit what they receive to one lake (PLUMBLINE_LAKE in their
environment) and `--lake` reads it as the three stores read together; an instance killed with -9
commits the rest when it comes back. Every wait is for an event (a server's ready line, an export's answer, an exit),
with deadlines (receive_support's) that only bound a hang, so the test does not depend on the machine's speed."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.sdk.trace.export import SpanExportResult
from receive_support import ServeProcess, finished_spans

from plumbline_otel.cli.main import cli

ANSWER_DEADLINE = 300  # seconds: how long a hung server may keep an export waiting, far beyond a slow answer


def _read(args: list[str]) -> tuple[str, dict]:
    runs = CliRunner().invoke(cli, ["trajectories", *args])
    coverage = CliRunner().invoke(cli, ["coverage", "--format", "json", *args])
    assert runs.exit_code == 0 and coverage.exit_code == 0, (runs.output, coverage.output)
    report = json.loads(coverage.stdout)
    report.pop("stores", None), report.pop("misrouted_traces", None)
    return runs.stdout, report


def test_three_served_instances_commit_to_one_lake(tmp_path: Path) -> None:
    lake = str(tmp_path / "lake")
    env = {"PLUMBLINE_LAKE_INTERVAL": "0.3"}
    servers = [ServeProcess(tmp_path, "--assemble-interval", "0.2", db=tmp_path / f"i{i}.duckdb",
                            env={**env, "PLUMBLINE_LAKE": lake, "PLUMBLINE_LAKE_INSTANCE": f"i{i}"}).start() for i in range(3)]
    try:
        for i, server in enumerate(servers):  # each instance gets its own traces, as the loadbalancing exporter sends them
            # The answer is the event waited for (sent once the spans are committed); its deadline only bounds a hang.
            exporter = GrpcSpanExporter(endpoint=f"http://{server.grpc_address}", insecure=True, timeout=ANSWER_DEADLINE)
            assert exporter.export(finished_spans(4, service=f"agent-{i % 2}", prefix=f"s{i}")) == SpanExportResult.SUCCESS
            exporter.shutdown()
        servers[2].kill()  # -9: whatever it had not committed yet is committed when it serves again
        servers[2] = ServeProcess(tmp_path, db=tmp_path / "i2.duckdb", env={**env, "PLUMBLINE_LAKE": lake, "PLUMBLINE_LAKE_INSTANCE": "i2"}).start()
    finally:
        for server in servers:
            assert server.stop() == 0, server.log_path.read_text()
    files = _read([arg for i in range(3) for arg in ("--db", str(tmp_path / f"i{i}.duckdb"))])
    through = _read(["--lake", lake])
    assert files[0].count("\n") == 12
    assert through == files
