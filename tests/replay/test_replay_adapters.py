"""Command and HTTP adapters: the trial identity reaches an agent in another process, the OTel way."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import baggage, trace
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.sdk.resources import Resource
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from plumbline_otel.errors import ConfigError
from plumbline_otel.replay import (
    AdapterError,
    CommandAdapter,
    FaultPlan,
    HttpAdapter,
    PythonAdapter,
    SpanSink,
    StudyConfig,
    TransientAdapterError,
    load_adapter,
    plan_study,
    run_study,
)
from plumbline_otel.replay.adapters import adapter_of

from .toy import ToyAgent, one_task

AGENT = """
import json, os, sys
text = sys.stdin.read() if len(sys.argv) < 2 else sys.argv[1]
if os.environ.get("PLUMBLINE_REPEAT") == "1" and os.environ.get("FAIL_REPEAT_1"):
    sys.exit(75)
print("working...")
print(json.dumps({"output": text, "cost_usd": 0.25, "resource": os.environ["OTEL_RESOURCE_ATTRIBUTES"],
                  "traceparent": os.environ["TRACEPARENT"], "baggage": os.environ["BAGGAGE"],
                  "fault": os.environ.get("PLUMBLINE_FAULT"), "otlp_file": os.environ.get("PLUMBLINE_OTLP_FILE")}))
"""


def trial(perturbation: str = "tool_fault", repeat: int = 0, tmp_path: Path | None = None):
    config = StudyConfig("ext", perturbations=(perturbation,), repeats=repeat + 1,
                         sink=SpanSink(otlp_file=str(tmp_path / "x.jsonl")) if tmp_path else None)
    return plan_study(config, [one_task()]).trials[repeat]


def test_resource_attributes_and_carriers_decode_to_the_identity_in_the_otel_sdk(monkeypatch: pytest.MonkeyPatch) -> None:
    t = trial()
    env = t.env({"OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=ci,plumbline.study=stale"})
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", env["OTEL_RESOURCE_ATTRIBUTES"])
    attrs = Resource.create({"service.name": "agent"}).attributes
    assert attrs["plumbline.trial.id"] == t.trial_id and "/" in t.trial_id
    assert attrs["plumbline.study"] == "ext" and attrs["deployment.environment"] == "ci"
    assert attrs["plumbline.task.key"] == "INV-1029" and attrs["plumbline.perturbation"] == "tool_fault"
    # the fault evidence survives the environment carrier exactly (spaces, colons and all)
    assert attrs["plumbline.fault.tool"] == "lookup_invoice" and attrs["plumbline.trial.attempt"] == "1"
    assert attrs["plumbline.fault.error"] == FaultPlan("lookup_invoice", "503").error_message
    assert env["PLUMBLINE_TRIAL_ATTEMPT"] == "1"
    ctx = W3CBaggagePropagator().extract({"baggage": env["BAGGAGE"]})
    assert baggage.get_all(ctx)["plumbline.trial.id"] == t.trial_id
    assert baggage.get_all(ctx)["plumbline.fault"] == "lookup_invoice:503:1:1"
    span = trace.get_current_span(TraceContextTextMapPropagator().extract({"traceparent": env["TRACEPARENT"]}))
    assert format(span.get_span_context().trace_id, "032x") == t.trace_id


def test_command_adapter_gives_stdin_env_and_reads_the_report(tmp_path: Path) -> None:
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    t = trial(tmp_path=tmp_path)
    outcome = CommandAdapter([sys.executable, str(script)]).run(t)
    assert outcome.output == t.text and outcome.cost_usd == 0.25 and outcome.trace_id == t.trace_id
    assert f"plumbline.trial.id={t.trial_id}" in str(outcome.detail["resource"])
    assert outcome.detail["traceparent"] == t.identity.traceparent()
    assert outcome.detail["fault"] == str(FaultPlan("lookup_invoice", "503"))
    assert outcome.detail["otlp_file"] == str(tmp_path / "x.jsonl")
    as_arg = adapter_of(load_adapter(f"command:{sys.executable} {script} {{input}}")).run(t)
    assert as_arg.output == t.text
    with pytest.raises(TransientAdapterError):  # exit 75 (EX_TEMPFAIL)
        CommandAdapter(f"env FAIL_REPEAT_1=1 {sys.executable} {script}").run(trial(repeat=1, tmp_path=tmp_path))
    with pytest.raises(AdapterError, match="exited 3"):
        CommandAdapter([sys.executable, "-c", "import sys; sys.exit(3)"]).run(t)


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        self.server.seen.append({"headers": {k.lower(): v for k, v in self.headers.items()}, "body": body})  # type: ignore[attr-defined]
        status = self.server.statuses.pop(0) if self.server.statuses else 200  # type: ignore[attr-defined]
        payload = json.dumps({"output": "done", "cost_usd": 0.01} if status == 200 else {"error": "busy"}).encode()
        self.send_response(status)
        if status == 503:
            self.send_header("Retry-After", "0")
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


@pytest.fixture
def server() -> Iterator[HTTPServer]:
    srv = HTTPServer(("127.0.0.1", 0), _Handler)
    srv.seen, srv.statuses = [], []  # type: ignore[attr-defined]
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_http_adapter_posts_the_trial_with_baggage_and_traceparent(server: HTTPServer) -> None:
    url = f"http://127.0.0.1:{server.server_port}/run"
    t = trial("sampling")
    outcome = adapter_of(load_adapter(f"http:{url}")).run(t)
    assert outcome.output == "done" and outcome.cost_usd == 0.01 and outcome.trace_id == t.trace_id
    [seen] = server.seen  # type: ignore[attr-defined]
    assert seen["body"]["input"] == t.text and seen["body"]["trial"]["trial_id"] == t.trial_id
    assert seen["body"]["metadata"]["temperature"] == 0.7  # the first sampling variant: off every API's default (1.0)
    ctx = W3CBaggagePropagator().extract({"baggage": seen["headers"]["baggage"]})
    assert baggage.get_all(ctx)["plumbline.perturbation"] == "sampling"
    assert seen["headers"]["traceparent"] == t.identity.traceparent()


def test_http_503_is_transient_and_the_driver_retries_it(server: HTTPServer, tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{server.server_port}/run"
    server.statuses[:] = [503]  # type: ignore[attr-defined]
    with pytest.raises(TransientAdapterError) as raised:
        HttpAdapter(url).run(trial())
    assert raised.value.retry_after == 0.0
    server.statuses[:] = [503, 400]  # type: ignore[attr-defined]
    from plumbline_otel.replay import RetryPolicy

    summary = run_study(StudyConfig("h", repeats=2, concurrency=1, retry=RetryPolicy(base_delay_s=0.001)),
                        [one_task()], HttpAdapter(url))
    assert [(r.status, r.attempts) for r in summary.records] == [("ok", 2), ("errored", 1)] or \
        [(r.status, r.attempts) for r in summary.records] == [("errored", 2), ("ok", 1)]
    assert summary.spent_usd == pytest.approx(0.01)
    with pytest.raises(TransientAdapterError, match="cannot reach"):
        HttpAdapter("http://127.0.0.1:9/run", timeout_s=2).run(trial())


def test_load_adapter_forms() -> None:
    assert type(load_adapter("python:tests.replay.toy:ToyAgent")).__name__ == ToyAgent.__name__  # a class: built
    fn = load_adapter("python:json:dumps")
    assert isinstance(fn, PythonAdapter)
    assert isinstance(load_adapter("https://example.invalid/run"), HttpAdapter)
    command = load_adapter("command:agent --flag 'two words'")
    assert isinstance(command, CommandAdapter) and command.argv == ["agent", "--flag", "two words"]
    with pytest.raises(ConfigError):
        load_adapter("python:no.such.module:x")
    with pytest.raises(ConfigError):
        load_adapter("ftp://x")
