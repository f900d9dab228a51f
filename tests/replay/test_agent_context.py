"""An instrumented agent in another process joins its trial's trace from the environment, the way the OTel SDKs read it
(issue 40 item 12): ``TRACEPARENT``/``BAGGAGE`` (the specification's environment carriers, read with the SDK's
``EnvironmentGetter`` and its default propagators) and ``OTEL_RESOURCE_ATTRIBUTES`` (read by ``Resource.create``).

This only helps honest agents' spans be attributed: which trial a run belongs to is always the driver's signed record
(`plumbline_otel.trials`), never what the agent's spans say.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from plumbline_otel.replay import CommandAdapter, SpanSink, StudyConfig, run_study

from .toy import one_task

# An agent that knows nothing of plumbline: the SDK's own resource detection and environment carrier, nothing else.
AGENT = '''
import os, sys
from opentelemetry import baggage, propagate
from opentelemetry.propagators._envcarrier import EnvironmentGetter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from plumbline_otel.replay.export import OtlpJsonFileExporter

provider = TracerProvider(resource=Resource.create({"service.name": "sdk-agent"}))
provider.add_span_processor(SimpleSpanProcessor(OtlpJsonFileExporter(os.environ["PLUMBLINE_OTLP_FILE"])))
parent = propagate.extract(os.environ, getter=EnvironmentGetter())
with provider.get_tracer("sdk-agent").start_as_current_span("invoke_agent sdk-agent", context=parent) as span:
    span.set_attribute("gen_ai.operation.name", "invoke_agent")
    span.set_attribute("agent.saw_baggage_trial", str(baggage.get_baggage("plumbline.trial.id", parent)))
    span.set_attribute("agent.saw_tracestate", os.environ.get("TRACESTATE", ""))
provider.shutdown()
print("{}")
'''


def _agent_span(otlp_file: Path) -> tuple[dict[str, object], dict[str, str]]:
    """The agent's root span in the study's OTLP file, and its resource attributes as text."""
    for line in otlp_file.read_text().splitlines():
        for rs in json.loads(line).get("resourceSpans", []):
            resource = {a["key"]: str(next(iter(a["value"].values()))) for a in rs["resource"].get("attributes", [])}
            for ss in rs.get("scopeSpans", []):
                for span in ss.get("spans", []):
                    if span["name"] == "invoke_agent sdk-agent":
                        return span, resource
    raise AssertionError(f"no agent span in {otlp_file}")


def test_an_sdk_instrumented_agent_joins_its_trial_s_trace_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The runner's own environment may carry a trace context of its own (a CI job's, a parent process's): its
    # tracestate belongs to that trace, never to the attempt's, and must not reach the agent beside the attempt's parent.
    monkeypatch.setenv("TRACESTATE", "vendor=stale")
    monkeypatch.setenv("TRACEPARENT", "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01")
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    otlp = tmp_path / "spans.jsonl"
    config = StudyConfig("ctx", sink=SpanSink(otlp_file=str(otlp)), state_dir=tmp_path / "state", trace_wait_s=10.0, grace_s=0.0)
    summary = run_study(config, [one_task()], CommandAdapter([sys.executable, str(script)], timeout_s=120))
    [record] = summary.records
    assert record.status == "ok", record.reason
    span, resource = _agent_span(otlp)
    assert span["traceId"] == record.trace_id  # the attempt's own trace, minted by the driver
    parent = span["parentSpanId"]
    assert isinstance(parent, str) and len(parent) == 16 and parent != "cd" * 8  # the attempt's virtual root, not the runner's
    attributes = span["attributes"]
    assert isinstance(attributes, list)
    attrs = {a["key"]: str(next(iter(a["value"].values()))) for a in attributes}
    assert attrs["agent.saw_baggage_trial"] == record.trial_id
    assert attrs["agent.saw_tracestate"] == ""
    assert resource["plumbline.trial.id"] == record.trial_id and resource["plumbline.trial.attempt"] == str(record.attempt)
    assert resource["service.name"] == "sdk-agent"
