"""Perturbations applied on the wire by the model-API proxy, seen through the real SDKs: sampling and decoys
rewritten upstream, each model fault raised as the SDK's own error, tool results replaced, the cassette
replayed offline byte for byte, and a GenAI span per call."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from waits import EVENT_DEADLINE_S

from plumbline_otel.replay.cache import ResponseCache
from plumbline_otel.replay.identity import FaultPlan
from plumbline_otel.replay.perturb import PERTURBATIONS, ModelFaultPlan, PerturbOptions, ToolResultFaultPlan, build_variants
from plumbline_otel.replay.proxy import ModelProxy
from plumbline_otel.replay.proxy.simulated import SimReply, SimulatedProvider

from .proxy_helpers import (
    ANTHROPIC_MODEL,
    LOOKUP,
    OPENAI_MODEL,
    PAY,
    TASK,
    anthropic_client,
    chat_tools,
    openai_client,
    responses_tools,
    trial,
)

DECOY = {"name": "lookup_employee", "description": "Look up an employee.",
         "input_schema": {"type": "object", "properties": {"name": {"type": "string"}}}}


@pytest.fixture
def sim() -> Iterator[SimulatedProvider]:
    provider = SimulatedProvider().start()
    yield provider
    provider.stop()


@pytest.fixture
def proxy(sim: SimulatedProvider) -> Iterator[ModelProxy]:
    with ModelProxy(sim.upstreams(), env={}) as p:
        yield p


def test_the_new_perturbations_are_registered_and_leave_the_text_alone() -> None:
    assert {"model_fault", "tool_result_fault"} <= set(PERTURBATIONS)
    variants = build_variants(TASK, ["model_fault", "tool_result_fault"], PerturbOptions(variants=4))
    faults = [ModelFaultPlan.from_dict(v.metadata["model_fault"]) for v in variants if v.perturbation == "model_fault"]
    assert [f.kind for f in faults if f] == ["rate_limit", "overloaded", "timeout", "stream_cut"]
    results = [ToolResultFaultPlan.from_dict(v.metadata["tool_result_fault"]) for v in variants if v.perturbation == "tool_result_fault"]
    assert {r.tool for r in results if r} == set(TASK.tools)
    assert all(v.text == TASK.input and v.rejected is None for v in variants)
    with pytest.raises(ValueError, match="model fault kind"):
        ModelFaultPlan("meteor")


def test_sampling_is_rewritten_upstream_and_recorded_before_and_after(proxy: ModelProxy, sim: SimulatedProvider) -> None:
    route = proxy.open_trial(trial(perturbation="sampling", temperature=0.3, seed=42))
    openai_client(route).chat.completions.create(model=OPENAI_MODEL, messages=[{"role": "user", "content": "x"}], temperature=1.0)
    anthropic_client(route).messages.create(model=ANTHROPIC_MODEL, max_tokens=10, messages=[{"role": "user", "content": "x"}])
    evidence = proxy.close_trial(route)
    chat, messages = sim.requests[0]["body"], sim.requests[1]["body"]
    assert (chat["temperature"], chat["seed"]) == (0.3, 42)
    assert messages["temperature"] == 0.3 and "seed" not in messages  # Messages takes no seed: skipped, not sent
    changes = [(c["call"], c["param"], c["before"], c["after"]) for c in evidence.sampling_changes]
    assert changes == [(1, "temperature", 1.0, 0.3), (1, "seed", None, 42), (2, "temperature", None, 0.3)]
    assert [(c["call"], c["param"], c["after"]) for c in evidence.sampling_unchanged] == [(2, "seed", None)]
    assert "skipped" in evidence.sampling_unchanged[0]


def _call(api: str, route: Any, **params: Any) -> None:
    """One model call of ``api`` through the route, with the agent's own sampling ``params``."""
    if api == "chat":
        openai_client(route).chat.completions.create(model=OPENAI_MODEL, messages=[{"role": "user", "content": "x"}], **params)
    elif api == "responses":
        openai_client(route).responses.create(model=OPENAI_MODEL, input="x", **params)
    else:
        anthropic_client(route).messages.create(model=ANTHROPIC_MODEL, max_tokens=10, messages=[{"role": "user", "content": "x"}],
                                                extra_body=params)  # this SDK's signature lists no top_p


HONOURED = {"chat": ("temperature", "top_p", "seed"), "responses": ("temperature", "top_p"), "messages": ("temperature", "top_p")}
DEFAULTS = {"temperature": 1.0, "top_p": 1.0}


@pytest.mark.parametrize("api", ["chat", "responses", "messages"])
def test_every_default_sampling_variant_changes_a_parameter_the_api_honours(api: str, proxy: ModelProxy, sim: SimulatedProvider) -> None:
    """Issue 39 item 4: the request the provider gets under each sampling variant differs, in a parameter that
    API honours, from the unperturbed one, and the proxy's evidence (what the driver calls "reached") says so."""
    variants = [v for v in build_variants(TASK, ["sampling"], PerturbOptions(variants=3))]
    assert len(variants) == 3 and all(v.rejected is None for v in variants)
    route = proxy.open_trial(trial(perturbation="baseline"))
    _call(api, route)
    proxy.close_trial(route)
    unperturbed = sim.requests[-1]["body"]
    for k, variant in enumerate(variants):
        metadata: dict[str, Any] = dict(variant.metadata)
        route = proxy.open_trial(trial(k=k + 1, perturbation="sampling", **metadata))
        _call(api, route)
        evidence = proxy.close_trial(route)
        got = sim.requests[-1]["body"]
        differs = [p for p in HONOURED[api] if got.get(p, DEFAULTS.get(p)) != unperturbed.get(p, DEFAULTS.get(p))]
        assert differs, (api, variant.metadata, got)
        assert set(HONOURED[api]) >= set(got) & {"temperature", "top_p", "seed"}  # nothing the API refuses is sent
        assert {c["param"] for c in evidence.sampling_changes} == set(differs)  # reached: exactly what the provider got differently


@pytest.mark.parametrize("api", ["chat", "responses", "messages"])
def test_sampling_that_changes_nothing_the_provider_does_is_not_reached(api: str, proxy: ModelProxy, sim: SimulatedProvider) -> None:
    """Temperature 1.0 on a request that sets none (every API's default), or the value the agent already sends,
    and a seed where the API takes none, leave the provider's request as it was: no evidence of reach."""
    route = proxy.open_trial(trial(perturbation="sampling", temperature=1.0))
    _call(api, route)
    route2 = proxy.open_trial(trial(k=1, perturbation="sampling", top_p=0.5))
    _call(api, route2, top_p=0.5)
    first, second = proxy.close_trial(route), proxy.close_trial(route2)
    assert first.sampling_changes == () and second.sampling_changes == ()
    assert [c["param"] for c in first.sampling_unchanged] == ["temperature"]
    assert first.as_dict()["sampling_changes"] == []  # what the driver's witness reads: not seen, so never scored


def test_sampling_is_skipped_where_the_model_would_refuse_it(proxy: ModelProxy, sim: SimulatedProvider) -> None:
    """A reasoning model on Responses takes no temperature, and Anthropic's newer models refuse temperature with
    top_p: the proxy sends neither (the provider would fail the call, blamed on the agent) and claims no reach."""
    route = proxy.open_trial(trial(perturbation="sampling", temperature=0.3))
    openai_client(route).responses.create(model="o4-mini", input="x")
    anthropic_client(route).messages.create(model=ANTHROPIC_MODEL, max_tokens=10, messages=[{"role": "user", "content": "x"}],
                                            extra_body={"top_p": 0.9})
    evidence = proxy.close_trial(route)
    assert "temperature" not in sim.requests[-2]["body"] and "temperature" not in sim.requests[-1]["body"]
    assert evidence.sampling_changes == ()
    assert [str(c["skipped"]).split(" ")[0] for c in evidence.sampling_unchanged] == ["OpenAI", "Anthropic"]


@pytest.mark.parametrize("api", ["chat", "responses", "messages"])
def test_decoys_are_offered_in_each_schema_and_a_proposed_decoy_is_witnessed(api: str) -> None:
    def script(which: Any, body: dict[str, Any]) -> SimReply:
        return SimReply(tool_calls=[("lookup_employee", {"name": "Ann"})])  # the model reaches for the decoy

    sim = SimulatedProvider(script).start()
    try:
        with ModelProxy(sim.upstreams(), env={}) as proxy:
            route = proxy.open_trial(trial(perturbation="decoy_tools", decoy_tools=[DECOY]))
            if api == "chat":
                reply = openai_client(route).chat.completions.create(model=OPENAI_MODEL, messages=[{"role": "user", "content": "x"}],
                                                                     tools=chat_tools(LOOKUP))  # type: ignore[arg-type]
                assert reply.choices[0].message.tool_calls[0].function.name == "lookup_employee"  # type: ignore[index,union-attr]
                offered = [t["function"]["name"] for t in sim.requests[0]["body"]["tools"]]
            elif api == "responses":
                openai_client(route).responses.create(model=OPENAI_MODEL, input="x", tools=responses_tools(LOOKUP))  # type: ignore[arg-type]
                offered = [t["name"] for t in sim.requests[0]["body"]["tools"]]
                assert sim.requests[0]["body"]["tools"][1]["parameters"] == DECOY["input_schema"]
            else:
                anthropic_client(route).messages.create(model=ANTHROPIC_MODEL, max_tokens=10, messages=[{"role": "user", "content": "x"}],
                                                        tools=[LOOKUP])  # type: ignore[list-item]
                offered = [t["name"] for t in sim.requests[0]["body"]["tools"]]
                assert sim.requests[0]["body"]["tools"][1]["input_schema"] == DECOY["input_schema"]
            evidence = proxy.close_trial(route)
    finally:
        sim.stop()
    assert offered == ["lookup_invoice", "lookup_employee"]
    assert evidence.decoys_offered == ("lookup_employee",) and evidence.decoys_proposed == ("lookup_employee",)


def test_decoys_are_not_added_to_a_call_without_tools(proxy: ModelProxy, sim: SimulatedProvider) -> None:
    route = proxy.open_trial(trial(perturbation="decoy_tools", decoy_tools=[DECOY]))
    openai_client(route).chat.completions.create(model=OPENAI_MODEL, messages=[{"role": "user", "content": "x"}])
    assert "tools" not in sim.requests[0]["body"] and proxy.close_trial(route).decoys_offered == ()


@pytest.mark.parametrize(("kind", "error"), [("rate_limit", openai.RateLimitError), ("overloaded", openai.InternalServerError),
                                             ("timeout", openai.APITimeoutError), ("stream_cut", openai.APIError)])
def test_each_model_fault_reaches_the_openai_sdk_as_that_error(proxy: ModelProxy, sim: SimulatedProvider, kind: str,
                                                               error: type[Exception]) -> None:
    # The held call (10 s) times out at the client's 5 s, never sooner however loaded the machine; the calls that pass
    # have all the time they need (a 0.5 s timeout on every call failed the passing ones under load).
    plan = ModelFaultPlan(kind, on_call=2, hold_s=10.0, after_events=2)
    route = proxy.open_trial(trial(perturbation="model_fault", model_fault=plan.as_dict()))
    client = openai_client(route, timeout=EVENT_DEADLINE_S)
    ask: dict[str, Any] = {"model": OPENAI_MODEL, "messages": [{"role": "user", "content": "pay"}]}
    client.chat.completions.create(**ask)  # call 1 passes
    with pytest.raises((error, httpx.HTTPError)):
        for _ in client.chat.completions.create(**ask, stream=True, timeout=5.0 if kind == "timeout" else EVENT_DEADLINE_S):
            pass
    client.chat.completions.create(**ask)  # call 3 passes again
    evidence = proxy.close_trial(route)
    assert [(f["kind"], f["call"]) for f in evidence.faults] == [(kind, 2)]
    assert evidence.upstream_calls == (3 if kind == "stream_cut" else 2)  # only a cut stream was generated (and paid)


@pytest.mark.parametrize(("kind", "error"), [("rate_limit", anthropic.RateLimitError), ("overloaded", anthropic.OverloadedError)])
def test_anthropic_sees_429_and_529(proxy: ModelProxy, kind: str, error: type[Exception]) -> None:
    route = proxy.open_trial(trial(perturbation="model_fault", model_fault=ModelFaultPlan(kind).as_dict()))
    with pytest.raises(error):
        anthropic_client(route).messages.create(model=ANTHROPIC_MODEL, max_tokens=10, messages=[{"role": "user", "content": "x"}])
    evidence = proxy.close_trial(route)
    assert str(evidence.faults[0]["detail"]).startswith("HTTP 529" if kind == "overloaded" else "HTTP 429") and evidence.cost_usd == 0


def test_a_cut_whole_body_fails_the_anthropic_sdk(proxy: ModelProxy) -> None:
    route = proxy.open_trial(trial(model_fault=ModelFaultPlan("stream_cut").as_dict()))
    with pytest.raises((anthropic.APIError, httpx.HTTPError)):
        anthropic_client(route).messages.create(model=ANTHROPIC_MODEL, max_tokens=10, messages=[{"role": "user", "content": "x"}])
    evidence = proxy.close_trial(route)
    assert evidence.faults[0]["detail"] == "body dropped after half its bytes" and evidence.cost_usd and evidence.cost_usd > 0


def _agent_loop_messages(route: Any) -> list[Any]:
    """A two-step Anthropic tool loop: the model calls lookup_invoice, the agent runs it and sends its result back."""
    client = anthropic_client(route)
    messages: list[Any] = [{"role": "user", "content": "Please pay INV-1029."}]
    first = client.messages.create(model=ANTHROPIC_MODEL, max_tokens=100, messages=messages, tools=[LOOKUP, PAY])  # type: ignore[list-item]
    call = first.content[0]
    messages += [{"role": "assistant", "content": [c.model_dump() for c in first.content]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "INV-1029: 4,820.00 GBP, open"}]}]  # type: ignore[union-attr]
    client.messages.create(model=ANTHROPIC_MODEL, max_tokens=100, messages=messages, tools=[LOOKUP, PAY])  # type: ignore[list-item]
    return messages


@pytest.mark.parametrize("api", ["chat", "responses", "messages"])
def test_tool_result_fault_replaces_the_planned_tools_result_on_its_way_to_the_model(proxy: ModelProxy, sim: SimulatedProvider,
                                                                                     api: str) -> None:
    plan = ToolResultFaultPlan("lookup_invoice", "503")
    route = proxy.open_trial(trial(perturbation="tool_result_fault", tool_result_fault=plan.as_dict()))
    if api == "messages":
        _agent_loop_messages(route)
        seen = sim.requests[1]["body"]["messages"][2]["content"][0]
        assert seen["content"] == plan.error_message and seen["is_error"] is True
    elif api == "chat":
        client = openai_client(route)
        messages: list[Any] = [{"role": "user", "content": "Please pay INV-1029."}]
        first = client.chat.completions.create(model=OPENAI_MODEL, messages=messages, tools=chat_tools(LOOKUP, PAY))  # type: ignore[arg-type]
        message = first.choices[0].message
        messages += [message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "INV-1029: open"}]  # type: ignore[index]
        client.chat.completions.create(model=OPENAI_MODEL, messages=messages, tools=chat_tools(LOOKUP, PAY))  # type: ignore[arg-type]
        assert sim.requests[1]["body"]["messages"][2]["content"] == plan.error_message
    else:  # Responses with server-side state: the call is not in the input, only its id (learnt from the answer)
        client = openai_client(route)
        answer = client.responses.create(model=OPENAI_MODEL, input="Please pay INV-1029.", tools=responses_tools(LOOKUP, PAY))  # type: ignore[arg-type]
        call: Any = answer.output[0]
        client.responses.create(model=OPENAI_MODEL, previous_response_id=answer.id, tools=responses_tools(LOOKUP, PAY),  # type: ignore[arg-type]
                                input=[{"type": "function_call_output", "call_id": call.call_id, "output": "INV-1029: open"}])
        assert sim.requests[1]["body"]["input"][0]["output"] == plan.error_message
    evidence = proxy.close_trial(route)
    assert [(f["kind"], f["call"]) for f in evidence.faults] == [("tool_result_fault", 2)]
    assert plan.error_message == FaultPlan("lookup_invoice", "503").error_message  # the store matches it like a tool fault


def test_a_recorded_study_replays_offline_with_no_upstream_call_and_identical_bytes(tmp_path: Path, sim: SimulatedProvider) -> None:
    path = tmp_path / "cassette.jsonl"

    def run(mode: str) -> tuple[list[bytes], Any]:
        with ModelProxy(sim.upstreams(), ResponseCache(path, mode), env={}) as proxy:
            route = proxy.open_trial(trial(temperature=0.7))
            bodies = []
            for stream in (False, True):
                for url, body in ((f"{route.openai_base_url}/chat/completions", {"model": OPENAI_MODEL, "messages": [{"role": "user", "content": "x"}]}),
                                  (f"{route.openai_base_url}/responses", {"model": OPENAI_MODEL, "input": "x"}),
                                  (f"{route.anthropic_base_url}/v1/messages", {"model": ANTHROPIC_MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]})):
                    bodies.append(httpx.post(url, json={**body, "stream": stream}).content)
            return bodies, proxy.close_trial(route)

    recorded, first = run("record")
    upstream = len(sim.requests)
    replayed, second = run("replay")
    assert len(sim.requests) == upstream == 6  # the replay asked the provider nothing
    assert replayed == recorded
    assert second.cache_hits == 6 and second.upstream_calls == 0 and second.cost_usd == 0 < (first.cost_usd or 0)  # a hit costs nothing
    with ModelProxy(sim.upstreams(), ResponseCache(path, "replay"), env={}) as proxy:  # another trial: a miss, refused
        route = proxy.open_trial(trial(k=9))
        with pytest.raises(openai.APIStatusError, match="no recorded answer"):
            openai_client(route).chat.completions.create(model=OPENAI_MODEL, messages=[{"role": "user", "content": "x"}])
        assert proxy.close_trial(route).refused_offline == 1
    assert len(sim.requests) == upstream


def test_a_genai_span_per_call_under_the_trials_trace(sim: SimulatedProvider) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with ModelProxy(sim.upstreams(), env={}, tracer_provider=provider) as proxy:
        t = trial()
        route = proxy.open_trial(t)
        with anthropic_client(route).messages.stream(model=ANTHROPIC_MODEL, max_tokens=50, tools=[LOOKUP],  # type: ignore[list-item]
                                                     messages=[{"role": "user", "content": "Please pay INV-1029."}]) as stream:
            stream.get_final_message()
        proxy.close_trial(route)
    (span,) = exporter.get_finished_spans()
    attrs = dict(span.attributes or {})
    assert span.context is not None and format(span.context.trace_id, "032x") == t.identity.trace_id
    assert span.parent is not None and format(span.parent.span_id, "016x") == t.identity.parent_span_id
    assert attrs["gen_ai.operation.name"] == "chat" and attrs["gen_ai.provider.name"] == "anthropic"
    assert attrs["gen_ai.request.model"] == ANTHROPIC_MODEL and attrs["plumbline.trial.id"] == t.trial_id
    assert int(attrs["gen_ai.usage.output_tokens"]) == 20  # type: ignore[arg-type]
    output = json.loads(str(attrs["gen_ai.output.messages"]))
    assert output[0]["parts"] == [{"type": "tool_call", "id": "call_1_0", "name": "lookup_invoice", "arguments": {"id": "INV-1"}}]
    assert json.loads(str(attrs["gen_ai.input.messages"]))[0]["parts"][0]["content"] == "Please pay INV-1029."
