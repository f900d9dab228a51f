"""Task keys where users have them (issue 31 item 4): an attribute of any span or of the resource, a field
inside a JSON-valued attribute, a baggage entry copied to spans; and the recipes of docs/conventions.md
("Setting the task key") run as written, with the real SDK, through `plumbline ingest`."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Tracer
from otlp import record, to_otlp_json

from plumbline_otel.assemble import task_key_value
from plumbline_otel.cli.main import cli
from plumbline_otel.ingest import ingest_files
from plumbline_otel.model import Trajectory
from plumbline_otel.store import Store

ROOT = Path(__file__).resolve().parents[2]
METADATA = json.dumps({"task_id": "INV-7", "thread_id": "th-1", "ticket": {"id": 42}, "tags": ["a"]})


@pytest.mark.parametrize(("key", "attributes", "resource", "expected"), [
    ("session.id", {"session.id": "s-1", "session": '{"id": "other"}'}, {}, "s-1"),  # the name as written, first
    ("metadata.task_id", {"metadata": METADATA}, {}, "INV-7"),
    ("metadata.ticket.id", {"metadata": METADATA}, {}, "42"),  # fields nest
    ("metadata.tags", {"metadata": METADATA}, {}, None),  # a list is no key
    ("metadata.task_id", {"metadata": {"task_id": "INV-8"}}, {}, "INV-8"),  # an OTLP map value
    ("metadata.task_id", {"metadata": "{not json"}, {}, None),
    ("metadata.task_id", {"metadata": "plain text"}, {}, None),
    ("app.ticket", {"app.ticket": ""}, {"app.ticket": "T-2"}, "T-2"),  # an empty value is no value
    ("deployment.id", {}, {"deployment.id": "d-1"}, "d-1"),  # a resource attribute by its name
    ("resource.deployment.id", {"deployment.id": "span's"}, {"deployment.id": "d-1"}, "d-1"),  # the resource only
    ("resource.deployment.id", {"deployment.id": "span's"}, {}, None),
    ("resource.config.task", {}, {"config": '{"task": "T-3"}'}, "T-3"),
    ("urgent", {"urgent": True}, {}, "true"),  # a bool as OTLP writes it, whether it arrives typed or as text
    ("urgent", {"urgent": "true"}, {}, "true"),
])
def test_a_task_key_is_read_as_users_name_it(key: str, attributes: dict[str, Any], resource: dict[str, Any], expected: str | None) -> None:
    assert task_key_value(key, attributes, resource) == expected


def _keyed_run(tracer: Tracer) -> None:
    """An instrumentation's spans: the key is on a child span's JSON metadata, not on the root."""
    with tracer.start_as_current_span("invoke_agent", attributes={
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.input.messages": json.dumps([{"role": "user", "parts": [{"type": "text", "content": "Pay invoice INV-7"}]}])}):
        with tracer.start_as_current_span("execute_tool pay", attributes={
                "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "pay", "gen_ai.tool.call.arguments": '{"invoice": "INV-7"}',
                "metadata": METADATA, "urgent": True}):
            pass


def _with_map_attribute(request: ExportTraceServiceRequest) -> ExportTraceServiceRequest:
    """The tool span also carries `config` as an OTLP map (kvlist) value, which the Python SDK cannot set but OTLP can."""
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue, KeyValueList

    ticket = KeyValueList(values=[KeyValue(key="ticket", value=AnyValue(string_value="T-9"))])
    for span in request.resource_spans[0].scope_spans[0].spans:
        if span.name.startswith("execute_tool"):
            span.attributes.append(KeyValue(key="config", value=AnyValue(kvlist_value=ticket)))
    return request


def _write(path: Path, requests: list[ExportTraceServiceRequest]) -> Path:
    path.write_text("".join(json.dumps(to_otlp_json(r)) + "\n" for r in requests))
    return path


@pytest.mark.parametrize(("keys", "expected"), [
    (["metadata.task_id"], ("INV-7", "attribute:metadata.task_id")),
    (["metadata.ticket.id"], ("42", "attribute:metadata.ticket.id")),
    (["resource.deployment.id"], ("d-1", "attribute:resource.deployment.id")),
    (["absent", "resource.service.name"], ("ap-agent", "attribute:resource.service.name")),
    (["config.ticket"], ("T-9", "attribute:config.ticket")),
    (["urgent"], ("true", "attribute:urgent")),
])
def test_streamed_and_rebuilt_runs_read_the_same_key(tmp_path: Path, keys: list[str], expected: tuple[str, str]) -> None:
    """A shard assembles from records trimmed to what the keys read; the store rebuilds from its columns. Both agree."""
    path = _write(tmp_path / "a.jsonl", [_with_map_attribute(record(_keyed_run, service="ap-agent", resource={"deployment.id": "d-1"}))])
    with Store(tmp_path / "streamed.duckdb") as store:
        store.set_task_keys(keys)
        ingest_files(store, [str(path)])
        [streamed] = list(store.trajectories())
    with Store(tmp_path / "rebuilt.duckdb") as store:
        ingest_files(store, [str(path)])
        [before] = list(store.trajectories())
        store.set_task_keys(keys)
        store.assemble()
        [rebuilt] = list(store.trajectories())
    assert before.task_key_source == "input_hash"
    assert (streamed.task_key, streamed.task_key_source) == (rebuilt.task_key, rebuilt.task_key_source) == expected


def _ingest(tmp_path: Path, request: ExportTraceServiceRequest, *options: str) -> list[Trajectory]:
    path = _write(tmp_path / "spans.otlp.jsonl", [request])
    db = tmp_path / "s.duckdb"
    result = CliRunner().invoke(cli, ["ingest", str(path), "--db", str(db), "--quiet", *options])
    assert result.exit_code == 0, result.output
    with Store(db, read_only=True) as store:
        return list(store.trajectories())


def test_openinference_metadata_names_the_task(tmp_path: Path) -> None:
    """OpenInference's LangChain instrumentation, on a real LangGraph graph: `--task-key metadata.task_id`."""
    from typing import TypedDict

    from langchain_core.tools import tool
    from langgraph.graph import END, START, StateGraph
    from openinference.instrumentation.langchain import LangChainInstrumentor

    class State(TypedDict):
        request: str

    @tool
    def pay(invoice: str) -> str:
        """Pay an invoice."""
        return f"paid {invoice}"

    def answer(state: State) -> State:
        return {"request": pay.invoke({"invoice": "INV-7"})}

    graph = StateGraph(State)
    graph.add_node("answer", answer)
    graph.add_edge(START, "answer")
    graph.add_edge("answer", END)
    app = graph.compile()
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    instrumentor = LangChainInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        app.invoke({"request": "Please pay invoice INV-7"}, config={"metadata": {"task_id": "INV-7"}, "configurable": {"thread_id": "th-1"}})
    finally:
        instrumentor.uninstrument()
    request = encode_spans(exporter.get_finished_spans())
    assert any(a.key == "metadata" for s in request.resource_spans[0].scope_spans[0].spans for a in s.attributes)

    for options, expected in [((), "input_hash"), (("--task-key", "metadata.task_id"), "INV-7"),
                              (("--task-key", "metadata.thread_id"), "th-1"), (("--task-key", "session.id"), "th-1")]:
        (tmp_path / expected).mkdir(exist_ok=True)
        [run] = _ingest(tmp_path / expected, request, *options)
        assert (run.task_key_source if not options else run.task_key) == expected, options
        table = CliRunner().invoke(cli, ["trajectories", "--db", str(tmp_path / expected / "s.duckdb"), "--format", "table"]).output
        assert "“Please pay invoice INV-7”" in table and "input:" not in table  # a task reads as its request
        assert not options or f"({expected})" in table  # and its key, when one was set


def _recipes() -> list[str]:
    """The Python blocks of docs/conventions.md's "Setting the task key", as the page shows them."""
    page = (ROOT / "docs" / "conventions.md").read_text(encoding="utf-8")
    section = page.split("## Setting the task key", 1)[1].split("\n## ", 1)[0]
    blocks = [re.sub(r"(?m)^  ", "", block) for block in re.findall(r"```python\n(.*?)```", section, re.S)]
    assert len(blocks) == 3, "the page shows the baggage, resource and span-processor recipes"
    return blocks


class SimulatedAgent:
    """Stands in for an agent: its instrumentation's spans (the root is not the user's), through the provider the recipe set."""

    def __init__(self, namespace: dict[str, Any]) -> None:
        self.namespace = namespace
        self.exporter = InMemorySpanExporter()

    def run(self, request: str) -> None:
        provider: TracerProvider = self.namespace["tracer_provider"]
        provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        tracer = provider.get_tracer("simulated-instrumentation")
        with tracer.start_as_current_span("invoke_agent", attributes={
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.input.messages": json.dumps([{"role": "user", "parts": [{"type": "text", "content": request}]}])}):
            with tracer.start_as_current_span("execute_tool pay", attributes={
                    "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "pay", "gen_ai.tool.call.arguments": '{"invoice": "INV-1001"}'}):
                pass


@pytest.mark.parametrize("recipe", [0, 1, 2], ids=["baggage", "resource", "span-processor"])
def test_the_documented_recipes_set_the_task_key(tmp_path: Path, recipe: int) -> None:
    from opentelemetry.sdk.resources import Resource

    namespace: dict[str, Any] = {"tracer_provider": TracerProvider(resource=Resource.create({"service.name": "ap-agent"}))}
    agent = namespace["agent"] = SimulatedAgent(namespace)
    exec(compile(_recipes()[recipe], f"docs/conventions.md recipe {recipe}", "exec"), namespace)
    request = encode_spans(agent.exporter.get_finished_spans())
    [run] = _ingest(tmp_path, request)
    assert (run.task_key, run.task_key_source, run.input) == ("INV-1001", "attribute:plumbline.task.key", "Please process invoice INV-1001")


def test_baggage_of_other_keys_stays_off_the_spans(tmp_path: Path) -> None:
    """The baggage recipe lets only its own key through: an upstream caller's baggage is not copied."""
    from opentelemetry import baggage, context

    namespace: dict[str, Any] = {"tracer_provider": TracerProvider()}
    agent = namespace["agent"] = SimulatedAgent(namespace)
    token = context.attach(baggage.set_baggage("upstream.user", "alice@example.com"))
    try:
        exec(compile(_recipes()[0], "docs/conventions.md recipe 0", "exec"), namespace)
    finally:
        context.detach(token)
    spans = agent.exporter.get_finished_spans()
    assert spans and all(s.attributes is not None and s.attributes.get("plumbline.task.key") == "INV-1001" for s in spans)
    assert not any(s.attributes is not None and "upstream.user" in s.attributes for s in spans)
