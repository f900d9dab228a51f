"""Several instances, one answer: a corpus split by trace id across three `plumbline serve`
instances (as the Collector's loadbalancing exporter routes it) reads, through --server repeated
and then through --db repeated or a glob, exactly as one instance that received everything; a
trace whose spans reached two instances is named, with its stores, and left out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Status, StatusCode, Tracer
from receive_support import ServeProcess, span_key
from waits import EVENT_DEADLINE_S

from plumbline_otel.cli.main import cli

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

SPEC = """
version: 1
name: sharded
invariants:
  - id: MUST-PAY
    severity: critical
    must_call: schedule_payment
  - id: LOOKUP-FIRST
    severity: major
    ordering: [lookup_invoice, schedule_payment]
"""
AGENTS = ("payer-a", "payer-b")
PERTURBATIONS = ("baseline", "paraphrase")
TASKS = [f"INV-{i:03d}" for i in range(8)]
REPEATS = 2
SHARDS = 3
LOADBALANCING = Path(__file__).parents[2] / "configs" / "otelcol-contrib-loadbalancing.yaml"


def _run(tracer: Tracer, agent: str, task: str, perturbation: str, repeat: int, pays: bool = True) -> None:
    """One agent run in the current GenAI conventions, its trial identity on the root span."""
    trial = f"{agent}/{task}/{perturbation}/{repeat}"
    with tracer.start_as_current_span("invoke_agent payer", attributes={
        "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "payer", "gen_ai.conversation.id": task,
        "gen_ai.input.messages": json.dumps([{"role": "user", "parts": [{"type": "text", "content": f"Please pay {task}"}]}]),
        "plumbline.study": "sharded", "plumbline.trial.id": trial, "plumbline.trial.attempt": 1,
        "plumbline.trial.repeat": repeat, "plumbline.perturbation": perturbation, "plumbline.variant": f"{perturbation}-0",
    }):
        with tracer.start_as_current_span("chat claude", attributes={
            "gen_ai.operation.name": "chat", "gen_ai.request.model": "claude-haiku-4-5",
            "gen_ai.usage.input_tokens": 900, "gen_ai.usage.output_tokens": 40}):
            pass
        with tracer.start_as_current_span("execute_tool lookup_invoice", attributes={
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup_invoice",
            "gen_ai.tool.call.arguments": json.dumps({"invoice_id": task})}):
            pass
        with tracer.start_as_current_span("execute_tool schedule_payment", attributes={
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "schedule_payment",
            "gen_ai.tool.call.arguments": json.dumps({"invoice_id": task})}) as span:
            if not pays:
                span.set_status(Status(StatusCode.ERROR, "PaymentGatewayError: timeout"))


def corpus() -> list[ReadableSpan]:
    """Two agents × two perturbations × eight tasks × two repeats, with failures that differ by
    agent, task and perturbation (so cells, task clusters and paired runs all matter)."""
    spans: list[ReadableSpan] = []
    for agent in AGENTS:
        memory = InMemorySpanExporter()  # one per provider: shutting a provider down stops its exporter
        provider = TracerProvider(resource=Resource.create({"service.name": agent}))
        provider.add_span_processor(SimpleSpanProcessor(memory))
        tracer = provider.get_tracer("tests.sharded")
        for p, perturbation in enumerate(PERTURBATIONS):
            for t, task in enumerate(TASKS):
                for repeat in range(REPEATS):
                    fails = agent == "payer-b" and (t + p) % 3 == 0 or agent == "payer-a" and t == 5 and repeat == 1
                    _run(tracer, agent, task, perturbation, repeat, pays=not fails)
        provider.shutdown()
        spans += memory.get_finished_spans()
    return spans


def shard_of(span: ReadableSpan) -> int:
    """Route by trace id, as the loadbalancing exporter does with `routing_key: traceID`."""
    context = span.get_span_context()
    assert context is not None
    return context.trace_id % SHARDS


def send(server: ServeProcess, spans: list[ReadableSpan]) -> None:
    exporter = OTLPSpanExporter(endpoint=server.grpc_address, insecure=True, timeout=EVENT_DEADLINE_S)
    assert exporter.export(spans) == SpanExportResult.SUCCESS
    exporter.shutdown()


def invoke(*args: str) -> Any:
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == 0, (result.output, result.exception)
    return result


def certificate(tmp_path: Path, spec: Path, stores: list[str]) -> dict[str, Any]:
    out = tmp_path / "cert.json"
    invoke("certify", "--spec", str(spec), *stores, "--out", str(out), "--format", "none")
    cert = json.loads(out.read_text())
    cert["provenance"].pop("generated_at")
    return cert


def readings(tmp_path: Path, spec: Path, stores: list[str]) -> dict[str, Any]:
    """Everything a reader says about the stores: certificate, coverage, comparison, trajectories, check."""
    coverage = json.loads(invoke("coverage", *stores, "--format", "json").stdout)
    coverage.pop("stores", None)
    misrouted = coverage.pop("misrouted_traces", [])
    return {
        "certificate": certificate(tmp_path, spec, stores),
        "coverage": coverage,
        "misrouted": misrouted,
        "comparison": json.loads(invoke("compare", *AGENTS, "--spec", str(spec), *stores, "--format", "json").stdout),
        "trajectories": invoke("trajectories", *stores).stdout.splitlines(),
        "check": json.loads(invoke("check", "--spec", str(spec), *stores, "--format", "json").stdout)["critical_conforming"],
    }


def test_three_instances_read_as_one_and_a_misrouted_trace_is_named(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    spans = corpus()
    shards = [ServeProcess(tmp_path, db=tmp_path / f"shard-{i}.duckdb") for i in range(SHARDS)]
    single = ServeProcess(tmp_path, db=tmp_path / "single.duckdb")
    try:
        for server in (*shards, single):
            server.start()
        send(single, spans)
        for i, server in enumerate(shards):
            send(server, [s for s in spans if shard_of(s) == i])

        one = readings(tmp_path, spec, ["--server", single.grpc_address])
        many = readings(tmp_path, spec, [arg for s in shards for arg in ("--server", s.grpc_address)])
    finally:
        for server in (*shards, single):
            server.stop()

    cert = one["certificate"]
    cells = [c for a in cert["agents"] for c in a["perturbations"]]
    assert len(cells) == 4 and all(c["tasks"] == len(TASKS) and c["n"] == len(TASKS) * REPEATS for c in cells)
    assert {c["conforming"] for c in cells} != {len(TASKS) * REPEATS}  # some cells hold failures
    assert one["coverage"]["overall"]["trajectories"]["tasks_seen_more_than_once"] == len(TASKS)
    assert len(one["trajectories"]) == len(AGENTS) * len(PERTURBATIONS) * len(TASKS) * REPEATS
    comparison = one["comparison"]
    assert comparison["cells"] == len(TASKS) * len(PERTURBATIONS) and comparison["runs"] > 0
    assert comparison["same_effect_path"] < comparison["runs"]  # payer-b's failed payments show
    # every shard got part of the traffic, and tasks' runs were spread over several shards
    roots = [s for s in spans if s.parent is None]
    assert all(any(shard_of(s) == i for s in roots) for i in range(SHARDS))
    spread = [len({shard_of(s) for s in roots if (s.attributes or {}).get("gen_ai.conversation.id") == task}) > 1 for task in TASKS]
    assert sum(spread) >= len(TASKS) // 2  # (trace ids are random: all 8 runs of a task on one shard is rare, not impossible)
    assert many == one  # certificate (evidence hash included), coverage, comparison, trajectories, check
    assert one["misrouted"] == []

    # Stopped instances' files: --db repeated, and a glob, read as the single instance's file.
    single_file = readings(tmp_path, spec, ["--db", str(single.db)])
    assert single_file == one
    assert readings(tmp_path, spec, [arg for s in shards for arg in ("--db", str(s.db))]) == one
    assert readings(tmp_path, spec, ["--db", str(tmp_path / "shard-*.duckdb")]) == one

    # A trace whose spans reach two instances: named with both stores, left out (not split, not
    # double counted), so the certificate is still the one-store certificate of the routed runs.
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "payer-a"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    _run(provider.get_tracer("tests.sharded"), "payer-a", TASKS[0], "baseline", 9, pays=False)
    provider.shutdown()
    stray = list(memory.get_finished_spans())
    trace_id = span_key(stray[0])[0]
    restarted = [ServeProcess(tmp_path, db=shards[i].db) for i in range(2)]
    try:
        for server in restarted:
            server.start()
        send(restarted[0], stray[:2])
        send(restarted[1], stray[2:])
        mixed = [*(arg for s in restarted for arg in ("--server", s.grpc_address)), "--db", str(shards[2].db)]
        result = CliRunner().invoke(cli, ["certify", "--spec", str(spec), *mixed, "--out", str(tmp_path / "c.json"), "--format", "none"])
        assert result.exit_code == 0, result.output
        assert "1 trace(s) reached more than one store (misrouted" in result.stderr
        assert f"{trace_id} in {restarted[0].grpc_address}, {restarted[1].grpc_address}" in result.stderr
        cert = json.loads((tmp_path / "c.json").read_text())
        cert["provenance"].pop("generated_at")
        assert cert == one["certificate"]
        coverage = json.loads(invoke("coverage", *mixed, "--format", "json").stdout)
        assert coverage.pop("misrouted_traces") == [{"trace_id": trace_id, "stores": [restarted[0].grpc_address, restarted[1].grpc_address]}]
        assert coverage.pop("stores") == [str(shards[2].db), restarted[0].grpc_address, restarted[1].grpc_address]
        assert coverage == one["coverage"]  # its pieces are counted nowhere
        lines = invoke("trajectories", *mixed).stdout.splitlines()
        assert lines == one["trajectories"]
    finally:
        for server in restarted:
            server.stop()


def test_the_loadbalancing_example_routes_by_trace_id_to_one_plumbline_per_backend() -> None:
    """The collector config says what the test above does: traceID routing over separate instances."""
    config = yaml.safe_load(LOADBALANCING.read_text())
    exporter = config["exporters"]["loadbalancing"]
    assert exporter["routing_key"] == "traceID"
    backends = exporter["resolver"]["static"]["hostnames"]
    assert len(backends) == SHARDS and len(set(backends)) == SHARDS
    text = LOADBALANCING.read_text()
    for port in (b.rsplit(":", 1)[1] for b in backends):  # one `plumbline serve` with its own file per backend
        assert f"--grpc-port {port}" in text
    assert all(f"--server 127.0.0.1:{b.rsplit(':', 1)[1]}" in text for b in backends)
    assert "shard-*.duckdb" in text
