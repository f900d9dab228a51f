"""`plumbline proxy` record mode (issue 39 item 15): an untraced agent's calls through the proxy become
traffic: one run per agent conversation, stored by ingest, each a task whose input is its first user
request; the spans carry no study identity (ordinary traffic, never mistaken for a trial)."""

from __future__ import annotations

import json
from pathlib import Path

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from plumbline_otel.ingest import ingest_files
from plumbline_otel.replay import ReplayTask, Trial, TrialIdentity
from plumbline_otel.replay.export import OtlpJsonFileExporter
from plumbline_otel.replay.proxy import ModelProxy
from plumbline_otel.replay.proxy.record import ConversationRecorder
from plumbline_otel.replay.proxy.simulated import SimulatedProvider, default_script
from plumbline_otel.replay.tasks import select_tasks
from plumbline_otel.store import Store

from .proxy_helpers import LOOKUP, OPENAI_MODEL, chat_tools, openai_client


def agent(client, request: str) -> None:
    """An untraced tool loop: ask, run the proposed tool, ask again with its result."""
    messages: list[dict] = [{"role": "system", "content": "You pay invoices."}, {"role": "user", "content": request}]
    for _ in range(3):
        answer = client.chat.completions.create(model=OPENAI_MODEL, messages=messages, tools=chat_tools(LOOKUP))
        message = answer.choices[0].message
        if not message.tool_calls:
            return
        messages.append({"role": "assistant", "content": None, "tool_calls": [c.model_dump() for c in message.tool_calls]})
        messages += [{"role": "tool", "tool_call_id": c.id, "content": '{"amount": 12}'} for c in message.tool_calls]


def test_record_mode_turns_each_conversation_into_a_run_whose_task_is_its_first_request(tmp_path: Path) -> None:
    spans = tmp_path / "traffic.jsonl"
    provider = TracerProvider(resource=Resource.create({"service.name": "untraced-agent"}))
    provider.add_span_processor(SimpleSpanProcessor(OtlpJsonFileExporter(spans)))
    recorder = ConversationRecorder()
    sim = SimulatedProvider(default_script)
    sim.start()
    with ModelProxy(sim.upstreams(), env={}, tracer_provider=provider, recorder=recorder) as proxy:
        route = proxy.open_trial(Trial(TrialIdentity("proxy/adhoc", study="proxy"), ReplayTask("adhoc", "", "adhoc"), ""))
        client = openai_client(route)
        agent(client, "Please pay INV-1 today.")
        agent(client, "Refund INV-2 in full.")
        agent(client, "Please pay INV-1 today.")  # the same request again: a run of its own (it starts over)
        evidence = proxy.close_trial(route)
    sim.stop()
    provider.shutdown()
    assert evidence.calls == 6 and recorder.conversations == 3
    lines = [json.loads(line) for line in spans.read_text().splitlines()]
    attrs = [{a["key"] for a in s["attributes"]} for line in lines for r in line["resourceSpans"] for ss in r["scopeSpans"] for s in ss["spans"]]
    assert len(attrs) == 6 and not any(k.startswith("plumbline.trial") or k == "plumbline.study" for keys in attrs for k in keys)
    store = Store(tmp_path / "traffic.duckdb")
    ingest_files(store, [str(spans)], workers=1)
    runs = list(store.trajectories())
    assert len(runs) == 3 and all(r.service == "untraced-agent" for r in runs)
    tasks = select_tasks(store, agent="untraced-agent")
    assert sorted(t.input for t in tasks) == ["Please pay INV-1 today.", "Refund INV-2 in full."]
    assert all(t.tools == ("lookup_invoice",) for t in tasks)
    store.close()


def test_tool_calls_join_the_conversation_that_proposed_them() -> None:
    recorder = ConversationRecorder()
    first = recorder.model_call("chat", {"messages": [{"role": "user", "content": "pay INV-1"}]})
    second = recorder.model_call("chat", {"messages": [{"role": "user", "content": "refund INV-2"}]})
    recorder.proposed(first, ["pay"])
    recorder.proposed(second, ["refund"])
    assert recorder.tool_call("pay") == first and recorder.tool_call("refund") == second
    assert recorder.tool_call("unknown") == second  # else the latest conversation
    assert recorder.model_call("chat", {"messages": [{"role": "user", "content": "pay INV-1"}, {"role": "assistant", "content": "ok"}]}) == first
