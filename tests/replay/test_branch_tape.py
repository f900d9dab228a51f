"""The tape's pure pieces (issue 44): what a recorded model step answered, a served tool result's structured content,
and a user turn rewritten in each API's request shape."""

from __future__ import annotations

from typing import Any

import pytest

from plumbline_otel.model import Step, Trajectory
from plumbline_otel.replay.tape import replace_user_text, structured_for, tape_from_trajectory, user_texts


def test_a_model_step_recorded_as_its_message_or_an_sdk_repr_answers_no_text() -> None:
    outputs = ["{'content': None, 'refusal': None, 'role': 'assistant', 'annotations': [], 'tool_calls': []}",
               "ResponseFunctionToolCall(arguments='{\"invoice_id\": \"INV-1\"}', call_id='c1', name='lookup', type='function_call')",
               '{"role": "assistant", "content": "done"}', "Paid INV-1."]
    steps: list[Step] = []
    for n, out in enumerate(outputs):
        steps.append(Step(kind="llm_call", name="m", result=out))
        if n < 2:
            steps.append(Step(kind="tool_call", name="lookup", args={"invoice_id": "INV-1"}, call_id=f"c{n}", source="llm_output", result="{}"))
    tape = tape_from_trajectory(Trajectory("r", "t", "k", "attribute:x", "svc", None, None, "pay", "paid", (), tuple(steps)))
    assert [s.text for s in tape.model_steps] == ["", "", "done", "Paid INV-1."]


@pytest.mark.parametrize(("schema", "text", "expected"), [
    ({"type": "object", "properties": {"result": {"type": "string"}}, "required": ["result"]}, '{"a": 1}', {"result": '{"a": 1}'}),
    ({"type": "object", "properties": {"result": {"type": "integer"}}, "required": ["result"]}, "3", {"result": 3}),
    ({"type": "object", "properties": {"a": {"type": "integer"}}}, '{"a": 1}', {"a": 1}),
    (None, '{"a": 1}', None),
    ({"type": "object", "properties": {"a": {"type": "integer"}}}, "not json", None),
])
def test_a_served_tool_result_gets_the_structured_content_its_output_schema_asks_for(schema: Any, text: str, expected: Any) -> None:
    assert structured_for(text, schema) == expected


@pytest.mark.parametrize(("api", "body", "path"), [
    ("chat", {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yes"}, {"role": "user", "content": "pay it"}]},
     lambda b: b["messages"][2]["content"]),
    ("responses", {"input": [{"role": "user", "content": "hi"}, {"role": "user", "content": [{"type": "input_text", "text": "pay it"}]}]},
     lambda b: b["input"][1]["content"][0]["text"]),
    ("messages", {"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "pay it"}]},
                               {"role": "user", "content": [{"type": "text", "text": "pay "}, {"type": "text", "text": "it"}]}]},
     lambda b: b["messages"][1]["content"][0]["text"]),
])
def test_a_user_turn_is_rewritten_in_each_api(api: Any, body: dict[str, Any], path: Any) -> None:
    assert user_texts(api, body)[-1] == "pay it"
    assert replace_user_text(api, body, "pay it", "please settle it") == 1
    assert path(body) == "please settle it" and user_texts(api, body)[-1] == "please settle it"
    assert replace_user_text(api, body, "something else", "x") == 0


def test_a_paraphrase_at_a_later_turn_hands_the_agent_the_task_s_own_request() -> None:
    from plumbline_otel.replay.jsonvalue import JsonValue
    from plumbline_otel.replay.perturb import Variant
    from plumbline_otel.replay.tape import ModelStep, Tape, branch_variants

    first: list[JsonValue] = [{"role": "user", "content": "Task: pay INV-1"}]  # the agent wraps its request: the recording is not the task's text
    second: list[JsonValue] = [*first, {"role": "assistant", "content": "looked"}, {"role": "user", "content": "Now pay invoice INV-1 please."}]
    tape = Tape("t", (ModelStep(1, 1, "looked", api="chat", request={"messages": first}),
                      ModelStep(2, 2, "paid", api="chat", request={"messages": second})))
    assert tape.user_turns() == {1: "Task: pay INV-1", 2: "Now pay invoice INV-1 please."}
    variants = [Variant("k", "baseline", "0-a", "pay INV-1"), Variant("k", "paraphrase", "0-b", "Hi, pay INV-1")]
    out = {v.perturbation: v for v in branch_variants(variants, tape, (2,))}
    turn = out["paraphrase@2"]
    assert turn.rejected is None and turn.text == "pay INV-1"  # the baseline's text: the task's request, unchanged
    paraphrased = turn.metadata["turn_paraphrase"]
    assert isinstance(paraphrased, dict) and paraphrased["original"] == "Now pay invoice INV-1 please."
    assert paraphrased["text"] != "Now pay invoice INV-1 please." and paraphrased["call"] == 2
    assert out["baseline@2"].text == "pay INV-1"


@pytest.mark.parametrize(("fixture", "said"), [
    ("mcp_openai_agents", "a run with an input can be replayed from any of its steps"),
    ("adk_nocontent", "24 of 24 LLM calls have no captured content and 19 of 19 tool calls no captured result, so a run holding "
                      "one can be branched only up to that step"),
])
def test_coverage_says_whether_stored_runs_can_be_replayed_from_a_step(tmp_path: Any, fixture: str, said: str) -> None:
    from pathlib import Path

    from plumbline_otel.coverage import coverage_report
    from plumbline_otel.ingest import ingest_files
    from plumbline_otel.store import Store

    trace = Path(__file__).resolve().parents[1] / "fixtures" / "frameworks" / fixture / "trace.otlp.jsonl"
    with Store(tmp_path / "c.duckdb") as store:
        ingest_files(store, [str(trace)])
        store.assemble()
        findings = coverage_report(store)["overall"]["findings"]
    assert any(said in f for f in findings), findings
