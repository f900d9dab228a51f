"""Branch-point replay (issue 44): a recorded run is a tape; a trial branched at step k is answered from the tape up
to k (no provider call), faulted at k, live after it; an agent that leaves the recorded run in the prefix is missing
with the step and the first difference, never scored. The agent is a plain OpenAI SDK loop that runs its own tools;
the provider is the simulated stand-in, whose received requests are counted."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest

from plumbline_otel.model import Step, Trajectory
from plumbline_otel.replay import InjectedFault, RetryPolicy, SpanSink, StudyConfig, Trial, TrialOutcome, inject_fault, run_study
from plumbline_otel.replay.cache import ResponseCache
from plumbline_otel.replay.proxy import ModelProxy
from plumbline_otel.replay.proxy.simulated import SimReply, SimulatedProvider
from plumbline_otel.replay.tape import (
    ModelStep,
    TapeError,
    ToolStep,
    parse_branch_at,
    tape_for_task,
    tape_from_trajectory,
)

from .proxy_helpers import OPENAI_MODEL
from .toy import tasks

TOOLS = [{"type": "function", "function": {"name": name, "description": name, "parameters": {
    "type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}}} for name in ("lookup_invoice", "pay")]


def script(api: str, body: dict[str, Any]) -> SimReply:
    """lookup_invoice, then pay, then a final answer: a 5-step run (model, tool, model, tool, model)."""
    results = [m for m in body.get("messages") or [] if m.get("role") == "tool"]
    if not results:
        return SimReply(tool_calls=[("lookup_invoice", {"id": "INV-1000"})], input_tokens=100, output_tokens=10)
    if len(results) == 1:
        return SimReply(tool_calls=[("pay", {"id": "INV-1000"})], input_tokens=100, output_tokens=10)
    return SimReply(text="paid" if "error" not in str(results) else "retried", input_tokens=100, output_tokens=10)


@pytest.fixture
def sim() -> Iterator[SimulatedProvider]:
    provider = SimulatedProvider(script)
    provider.start()
    yield provider
    provider.stop()


def agent(amount: str = "100.00") -> Any:
    """An OpenAI SDK tool loop that executes its own tools (the driver's injector can fail them)."""
    def run(trial: Trial) -> TrialOutcome:
        client = openai.OpenAI(base_url=trial.routes["OPENAI_BASE_URL"], api_key="agent-key", max_retries=0)
        messages: list[Any] = [{"role": "user", "content": trial.text}]
        for _ in range(6):
            answer = client.chat.completions.create(model=OPENAI_MODEL, messages=messages, tools=TOOLS)  # type: ignore[arg-type]
            message = answer.choices[0].message
            if not message.tool_calls:
                return TrialOutcome(output=message.content)
            messages.append(message.model_dump(exclude_none=True))
            for call in message.tool_calls:
                name = call.function.name  # type: ignore[union-attr]
                try:
                    inject_fault(name)
                    content = orjson.dumps({"lookup_invoice": {"amount": amount}, "pay": {"paid": True}}[name]).decode()
                except InjectedFault as exc:
                    content = f"error: {exc}"
                messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
        raise RuntimeError("no final answer")
    return run


def study(tmp_path: Path, name: str, proxy: ModelProxy, run: Any, **kw: Any) -> Any:
    config = StudyConfig(name, sink=SpanSink(otlp_file=str(tmp_path / f"{name}.jsonl")), state_dir=tmp_path / name, proxies=[proxy],
                         grace_s=0.0, concurrency=1, retry=RetryPolicy(max_attempts=1), **kw)
    return run_study(config, tasks(1), run)


def recorded(tmp_path: Path, sim: SimulatedProvider) -> Any:
    """Study "src": the baseline run, recorded in its cassette; its tape."""
    with ModelProxy(sim.upstreams(), ResponseCache(tmp_path / "src" / "responses.jsonl"), env={}) as proxy:
        summary = study(tmp_path, "src", proxy, agent())
    assert [r.status for r in summary.records] == ["ok"]
    return tape_for_task(tmp_path / "src" / "responses.jsonl", tasks(1)[0].task_key)


def test_a_recorded_run_is_a_tape_of_its_model_responses_and_tool_results(tmp_path: Path, sim: SimulatedProvider) -> None:
    tape = recorded(tmp_path, sim)
    assert [s.kind for s in tape.steps] == ["model", "tool", "model", "tool", "model"]
    assert [s.name for s in tape.tool_steps] == ["lookup_invoice", "pay"]
    assert orjson.loads(tape.tool_steps[0].result) == {"amount": "100.00"}
    assert tape.gaps == () and tape.coverage()["requests_recorded"] == 3
    assert tape.branch_points("tool_fault") == [2, 4] and tape.branch_points("model_fault") == [1, 3, 5]
    with pytest.raises(TapeError, match="tool_fault branches at a tool step; step 3 is a model response"):
        tape.check_branch(3, "tool_fault")


def test_the_prefix_is_served_from_the_tape_with_no_provider_call(tmp_path: Path, sim: SimulatedProvider) -> None:
    tape = recorded(tmp_path, sim)
    before = len(sim.requests)
    with ModelProxy(sim.upstreams(), ResponseCache(tmp_path / "b" / "responses.jsonl"), env={}) as proxy:
        summary = study(tmp_path, "b", proxy, agent(), branch_at=(5,), tapes={tasks(1)[0].task_key: tape})
    (record,) = summary.records
    assert (record.status, record.perturbation) == ("ok", "baseline@5")
    assert len(sim.requests) - before == 1  # model calls 1 and 2 answered from the tape; only step 5 reached the provider
    assert record.evidence["model_proxy"]["tape_served"] == 2
    assert record.evidence["model_proxy"]["upstream_calls"] == 1


def test_a_divergence_in_the_prefix_makes_the_trial_missing_with_the_step_and_first_difference(
        tmp_path: Path, sim: SimulatedProvider) -> None:
    tape = recorded(tmp_path, sim)
    before = len(sim.requests)
    with ModelProxy(sim.upstreams(), ResponseCache(tmp_path / "d" / "responses.jsonl"), env={}) as proxy:
        summary = study(tmp_path, "d", proxy, agent(amount="999.00"), branch_at=(5,), tapes={tasks(1)[0].task_key: tape})
    (record,) = summary.records
    assert record.status == "missing"
    assert record.reason is not None and record.reason.startswith("diverged at step 3: ")
    assert "100.00" in record.reason and "999.00" in record.reason  # the first difference: the tool result the agent got
    assert len(sim.requests) == before  # diverged inside the prefix: the provider was never called


def test_a_tool_fault_at_each_tool_step_is_a_cell_per_step(tmp_path: Path, sim: SimulatedProvider) -> None:
    tape = recorded(tmp_path, sim)
    before = len(sim.requests)
    with ModelProxy(sim.upstreams(), ResponseCache(tmp_path / "f" / "responses.jsonl"), env={}) as proxy:
        summary = study(tmp_path, "f", proxy, agent(), perturbations=("tool_fault",), branch_at=parse_branch_at("each"),
                        tapes={tasks(1)[0].task_key: tape})
    records = sorted(summary.records, key=lambda r: r.perturbation)
    assert [(r.perturbation, r.status, r.fault_fired) for r in records] == [
        ("tool_fault@2", "ok", True), ("tool_fault@4", "ok", True)]
    assert [r.fault for r in records] == ["lookup_invoice:503:1:1", "pay:503:1:1"]
    assert [r.evidence["model_proxy"]["tape_served"] for r in records] == [1, 2]
    assert len(sim.requests) - before == 2 + 1  # @2: model calls 2 and 3 live; @4: call 3 live


def test_a_production_run_without_captured_results_says_what_is_missing() -> None:
    run = Trajectory("r1", "t1", "k", "attribute:x", "svc", None, None, "pay it", "paid", (), (
        Step(kind="llm_call", name="m", result="", model="m"),
        Step(kind="tool_call", name="lookup_invoice", args={"id": "1"}, call_id="c1", source="llm_output", result={"amount": 3}),
        Step(kind="llm_call", name="m", result=""),
        Step(kind="tool_call", name="pay", args={"id": "1"}, call_id="c2", source="llm_output", gaps=("result:attribute_absent",)),
        Step(kind="llm_call", name="m", result="paid"),
    ))
    tape = tape_from_trajectory(run)
    assert [type(s) for s in tape.steps] == [ModelStep, ToolStep, ModelStep, ToolStep, ModelStep]
    assert tape.gaps == ("step 4: the result of pay was not captured (result:attribute_absent)",)
    assert tape.check_branch(4, "tool_fault").index == 4  # the prefix (steps 1-3) is whole
    with pytest.raises(TapeError, match="step 4 \\(pay\\) has no recorded result"):
        tape.check_branch(5, "model_fault")
