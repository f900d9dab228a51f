"""Branch-point replay of a conversation (issue 44): a six-step run of two user turns (model, tool, model | model,
tool, model), recorded through the model-API proxy, replayed from a step with the prefix from its tape.

* a paraphrased user turn at step k: the turn's recorded text, paraphrased and guard-checked, replaces the agent's
  user message from the model call at k on (the agent itself is handed the task's request unchanged);
* decoy tools offered from step k, never in the prefix;
* a branch at each of the six steps (tool_fault at the tool steps, model_fault at the model steps), certified per step.

The agent is a plain OpenAI SDK loop that runs its own tools; the provider is the simulated stand-in, whose received
requests are counted and read."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest
from click.testing import CliRunner

from plumbline_otel.cli.main import cli
from plumbline_otel.replay import InjectedFault, RetryPolicy, SpanSink, StudyConfig, Trial, TrialOutcome, inject_fault, run_study
from plumbline_otel.replay.cache import ResponseCache
from plumbline_otel.replay.proxy import ModelProxy
from plumbline_otel.replay.proxy.simulated import SimReply, SimulatedProvider
from plumbline_otel.replay.tape import Tape, TapeError, parse_branch_at, tape_for_task

from .proxy_helpers import OPENAI_MODEL
from .toy import tasks

TOOLS = [{"type": "function", "function": {"name": name, "description": name, "parameters": {
    "type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}}} for name in ("lookup_invoice", "pay")]
TURN_2 = "Go ahead and pay invoice INV-1000 now."
SPEC = """version: 1
name: conv
invariants:
  - {id: PAY, severity: critical, must_call: pay}
  - {id: PAY-ONCE, severity: critical, call_at_most: {tool: pay, n: 1}}
"""


def script(api: str, body: dict[str, Any]) -> SimReply:
    """Turn 1: look the invoice up, say it is open; turn 2: pay it, say so; a payment that failed is tried again
    (which PAY-ONCE forbids: a failed call may have paid)."""
    messages = body.get("messages") or []
    users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    since = [m for m in messages[users[-1]:] if m.get("role") == "tool"]
    if len(users) == 1:
        if not since:
            return SimReply(tool_calls=[("lookup_invoice", {"id": "INV-1000"})], input_tokens=100, output_tokens=10)
        return SimReply(text="INV-1000 is open for 100.00 GBP.", input_tokens=100, output_tokens=10)
    if not since or (len(since) == 1 and "error" in str(since[-1].get("content"))):
        return SimReply(tool_calls=[("pay", {"id": "INV-1000"})], input_tokens=100, output_tokens=10)
    return SimReply(text="paid", input_tokens=100, output_tokens=10)


@pytest.fixture
def sim() -> Iterator[SimulatedProvider]:
    provider = SimulatedProvider(script)
    provider.start()
    yield provider
    provider.stop()


def conversation(turn_2: str = TURN_2, stream: bool = False) -> Any:
    """A two-turn conversation: the trial's request, then (after the agent's answer) the user's second message;
    ``stream``: each answer streamed (the SDK's stream helper assembles it)."""
    def run(trial: Trial) -> TrialOutcome:
        client = openai.OpenAI(base_url=trial.routes["OPENAI_BASE_URL"], api_key="agent-key", max_retries=2)
        messages: list[Any] = [{"role": "user", "content": trial.text}]
        answers = []
        for turn in (None, turn_2):
            if turn is not None:
                messages.append({"role": "user", "content": turn})
            for _ in range(4):
                if stream:
                    with client.chat.completions.stream(model=OPENAI_MODEL, messages=messages, tools=TOOLS) as events:  # type: ignore[arg-type]
                        answer: Any = events.get_final_completion()
                else:
                    answer = client.chat.completions.create(model=OPENAI_MODEL, messages=messages, tools=TOOLS)  # type: ignore[arg-type]
                message = answer.choices[0].message
                messages.append(message.model_dump(exclude_none=True))
                if not message.tool_calls:
                    answers.append(message.content)
                    break
                for call in message.tool_calls:
                    name = call.function.name
                    try:
                        inject_fault(name)
                        content = orjson.dumps({"lookup_invoice": {"amount": "100.00"}, "pay": {"paid": True}}[name]).decode()
                    except InjectedFault as exc:
                        content = f"error: {exc}"
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
        return TrialOutcome(output=" / ".join(str(a) for a in answers))
    return run


def study(tmp_path: Path, name: str, sim: SimulatedProvider, run: Any, **kw: Any) -> Any:
    """A study of the one task, through the model-API proxy, whose spans (the agent's run) go to the study's sink."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    sink = SpanSink(otlp_file=str(tmp_path / f"{name}.jsonl"))
    spans = TracerProvider(resource=Resource.create({"service.name": "toy-agent", "service.version": "1"}))
    spans.add_span_processor(SimpleSpanProcessor(sink.exporter()))
    with ModelProxy(sim.upstreams(), ResponseCache(tmp_path / name / "responses.jsonl"), env={}, tracer_provider=spans) as proxy:
        config = StudyConfig(name, sink=sink, state_dir=tmp_path / name, proxies=[proxy],
                             grace_s=0.0, concurrency=1, retry=RetryPolicy(max_attempts=1), **kw)
        return run_study(config, tasks(1), run)


def recorded(tmp_path: Path, sim: SimulatedProvider) -> Tape:
    summary = study(tmp_path, "src", sim, conversation())
    assert [r.status for r in summary.records] == ["ok"]
    return tape_for_task(tmp_path / "src" / "responses.jsonl", tasks(1)[0].task_key)


def user_messages(request: dict[str, Any]) -> list[str]:
    return [m["content"] for m in request["body"]["messages"] if m.get("role") == "user"]


def test_a_conversation_tape_knows_its_user_turns(tmp_path: Path, sim: SimulatedProvider) -> None:
    tape = recorded(tmp_path, sim)
    assert [s.kind for s in tape.steps] == ["model", "tool", "model", "model", "tool", "model"]
    assert tape.user_turns() == {1: tasks(1)[0].input, 4: TURN_2}
    assert tape.branch_points("paraphrase") == [1, 4] and tape.branch_points("decoy_tools") == [1, 3, 4, 6]
    with pytest.raises(TapeError, match="paraphrase branches at a user turn; step 3 continues an earlier turn"):
        tape.check_branch(3, "paraphrase")


def test_a_paraphrased_user_turn_at_step_k_reaches_the_model_from_k_on(tmp_path: Path, sim: SimulatedProvider) -> None:
    tape = recorded(tmp_path, sim)
    before = len(sim.requests)
    summary = study(tmp_path, "para", sim, conversation(), perturbations=("paraphrase",), branch_at=(4,),
                    tapes={tasks(1)[0].task_key: tape})
    (record,) = summary.records
    assert (record.perturbation, record.status) == ("paraphrase@4", "ok"), record.reason
    live = sim.requests[before:]
    assert len(live) == 2  # steps 1-3 (model calls 1 and 2) from the tape; calls 3 and 4 live
    first_turn, second_turn = user_messages(live[0])
    assert first_turn == tasks(1)[0].input  # the agent was handed the task's own request: the prefix is the recorded one
    assert second_turn != TURN_2 and "INV-1000" in second_turn  # the turn at step 4, paraphrased (ids kept: the guard)
    assert user_messages(live[1])[1] == second_turn  # and in every request after it, though the agent keeps the original
    assert record.evidence["model_proxy"]["tape_served"] == 2
    assert record.seen is True and record.evidence["model_proxy"]["turn_rewrites"] == 2


def test_an_agent_that_stops_before_the_paraphrased_turn_never_met_it_and_is_not_scored(
        tmp_path: Path, sim: SimulatedProvider) -> None:
    from plumbline_otel.trials import account

    tape = recorded(tmp_path, sim)

    def first_turn_only(trial: Trial) -> TrialOutcome:  # the prefix (served from the tape), then it stops
        client = openai.OpenAI(base_url=trial.routes["OPENAI_BASE_URL"], api_key="agent-key", max_retries=2)
        messages: list[Any] = [{"role": "user", "content": trial.text}]
        for _ in range(2):
            message = client.chat.completions.create(model=OPENAI_MODEL, messages=messages, tools=TOOLS).choices[0].message  # type: ignore[arg-type]
            messages.append(message.model_dump(exclude_none=True))
            messages += [{"role": "tool", "tool_call_id": c.id, "content": '{"amount":"100.00"}'} for c in message.tool_calls or []]
        return TrialOutcome(output=str(messages[-1].get("content")))

    summary = study(tmp_path, "para-stop", sim, first_turn_only, perturbations=("paraphrase",), branch_at=(4,),
                    tapes={tasks(1)[0].task_key: tape})
    (record,) = summary.records
    assert record.status == "ok" and record.seen is False, record.reason  # ran, but the turn it was to be judged on never came
    assert record.evidence["model_proxy"]["turn_rewrites"] == 0
    from plumbline_otel.ingest import ingest_files
    from plumbline_otel.store import Store
    from plumbline_otel.trials import KeyRing

    with Store(tmp_path / "s.duckdb") as store:
        ingest_files(store, [str(tmp_path / "para-stop.jsonl")])
        (result,) = account(store.trajectories(), KeyRing.load([tmp_path / "para-stop"])).results
    assert result.status == "unexposed" and "never saw paraphrase@4 reach a model request" in (result.reason or "")


def test_a_turn_that_is_not_the_recorded_one_is_a_divergence_never_scored(tmp_path: Path, sim: SimulatedProvider) -> None:
    tape = recorded(tmp_path, sim)
    summary = study(tmp_path, "para-d", sim, conversation("Pay INV-1000 right away, please."), perturbations=("paraphrase",),
                    branch_at=(4,), tapes={tasks(1)[0].task_key: tape})
    (record,) = summary.records
    assert record.status == "missing"
    assert record.reason is not None and record.reason.startswith(
        "diverged at step 4: the user turn the paraphrase replaces is not in the agent's request: recorded 'Go ahead and pay")


def test_decoy_tools_are_offered_from_step_k_never_in_the_prefix(tmp_path: Path, sim: SimulatedProvider) -> None:
    tape = recorded(tmp_path, sim)
    before = len(sim.requests)
    summary = study(tmp_path, "decoy", sim, conversation(), perturbations=("decoy_tools",), branch_at=(4,),
                    tapes={tasks(1)[0].task_key: tape})
    (record,) = summary.records
    assert (record.perturbation, record.status, record.seen, record.seen_by) == ("decoy_tools@4", "ok", True, "model_proxy")
    live = sim.requests[before:]
    assert len(live) == 2
    offered = [[t["function"]["name"] for t in r["body"]["tools"]] for r in live]
    assert all(len(names) > 2 and names[:2] == ["lookup_invoice", "pay"] for names in offered)  # decoys from call 3 (step 4) on
    assert record.evidence["model_proxy"]["tape_served"] == 2


def test_a_branch_at_each_step_of_a_six_step_run_is_certified_per_step(tmp_path: Path, sim: SimulatedProvider) -> None:
    tape = recorded(tmp_path, sim)
    before = len(sim.requests)
    summary = study(tmp_path, "each", sim, conversation(), perturbations=("tool_fault", "model_fault"), branch_at=parse_branch_at("each"),
                    tapes={tasks(1)[0].task_key: tape})
    by_label = {r.perturbation: r for r in summary.records}
    assert sorted(by_label, key=lambda p: int(p.partition("@")[2])) == [
        "model_fault@1", "tool_fault@2", "model_fault@3", "model_fault@4", "tool_fault@5", "model_fault@6"]
    assert all(r.status == "ok" and r.fault_fired for r in by_label.values()), [(r.perturbation, r.status, r.reason) for r in summary.records]
    # The prefix is the tape's: a branch at step k sends the provider only the model calls from k on (a faulted model
    # call is answered by the proxy, and the agent's retry goes live): @1 4, @2 3, @3 3, @4 2, @5 2 (the model tries the
    # failed payment again), @6 1.
    assert [by_label[f"model_fault@{k}"].evidence["model_proxy"].get("tape_served", 0) for k in (1, 3, 4, 6)] == [0, 1, 2, 3]
    assert len(sim.requests) - before == 4 + 3 + 3 + 2 + 2 + 1

    db = tmp_path / "each.duckdb"
    runner = CliRunner()
    assert runner.invoke(cli, ["ingest", str(tmp_path / "each.jsonl"), "--db", str(db), "--quiet"]).exit_code == 0
    (tmp_path / "spec.yaml").write_text(SPEC)
    out = tmp_path / "each.cert.json"
    certified = runner.invoke(cli, ["certify", "--spec", str(tmp_path / "spec.yaml"), "--db", str(db), "--study", "each",
                                    "--state", str(tmp_path / "each"), "--out", str(out), "--format", "text"])
    assert certified.exit_code == 0, certified.output
    cells = {c["perturbation"]: c for a in json.loads(out.read_text())["agents"] for c in a["perturbations"]}
    assert set(cells) == set(by_label)
    for label, cell in cells.items():  # one cell per step, each with its own count, bound and verdict
        assert (cell["n"], cell["exposed"], cell["missing"]) == (1, 1, 0), (label, cell)
        assert cell["verdict"] and cell.get("lower") is not None, (label, cell)
    # A fault at step 5 (the payment) is where the agent pays twice: the only step where it does not conform.
    assert {label: cell["conforming"] for label, cell in cells.items()} == {
        "model_fault@1": 1, "tool_fault@2": 1, "model_fault@3": 1, "model_fault@4": 1, "tool_fault@5": 0, "model_fault@6": 1}
    profile = {line.split(",")[1].split("(")[0].strip(): line for line in certified.output.splitlines() if "profile over steps" in line}
    assert "@1 1/1" in profile["model_fault"] and profile["model_fault"].index("@4 1/1") < profile["model_fault"].index("@6 1/1")
    assert profile["tool_fault"].index("@2 1/1") < profile["tool_fault"].index("@5 0/1"), certified.output


def test_a_streaming_agent_is_served_its_prefix_as_a_stream(tmp_path: Path, sim: SimulatedProvider) -> None:
    """Recorded streamed, the tape's answers are the recorded event streams, replayed byte for byte in the prefix."""
    summary = study(tmp_path, "src", sim, conversation(stream=True))
    assert [r.status for r in summary.records] == ["ok"]
    tape = tape_for_task(tmp_path / "src" / "responses.jsonl", tasks(1)[0].task_key)
    assert [s.kind for s in tape.steps] == ["model", "tool", "model", "model", "tool", "model"]
    assert all("event-stream" in (s.content_type or "") for s in tape.model_steps)
    before = len(sim.requests)
    summary = study(tmp_path, "stream5", sim, conversation(stream=True), perturbations=("tool_fault",), branch_at=(5,),
                    tapes={tasks(1)[0].task_key: tape})
    (record,) = summary.records
    assert (record.perturbation, record.status, record.fault_fired) == ("tool_fault@5", "ok", True), record.reason
    assert record.evidence["model_proxy"]["tape_served"] == 3 and len(sim.requests) - before == 2  # pay tried again, then "paid"
