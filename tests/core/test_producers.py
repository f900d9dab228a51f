"""Traces recorded from real instrumentation libraries give exactly the scripted tool calls.

The fixtures under tests/fixtures/producers were written by generate.py, which drove the real
OpenInference, OpenTelemetry GenAI (contrib openai-v2) and Traceloop instrumentations and the
real openai/anthropic SDKs against a loopback stand-in of the provider API. expected.json is
derived from the script's own data, not from the spans.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from plumbline_otel.ingest import ingest_files
from plumbline_otel.store import Store

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "producers"
EXPECTED: dict[str, Any] = json.loads((FIXTURES / "expected.json").read_text())["files"]
TRACE_FILES = sorted(name for name, spec in EXPECTED.items() if "traces" in spec or "same_as" in spec)


def _spec(name: str) -> dict[str, Any]:
    spec = EXPECTED[name]
    return EXPECTED[spec["same_as"]] if "same_as" in spec else spec


@pytest.mark.parametrize("name", TRACE_FILES)
def test_real_producer_traces_give_the_scripted_tool_calls(name: str, store: Store) -> None:
    store.set_task_keys(["session.id"])  # the generator names each task by its session
    summary = ingest_files(store, [str(FIXTURES / name)])
    assert summary.problems == [] and summary.exit_code == 0
    spec = _spec(name)
    got = {t.task_key: t for t in store.trajectories()}
    assert sorted(got, key=str) == sorted(spec["traces"])
    for task, expected in spec["traces"].items():
        trajectory = got[task]
        calls = [(s.name, s.args, s.failed) for s in trajectory.tool_steps]
        scripted = [(c["name"], c["arguments"], c["is_error"]) for c in expected["tool_calls"]]
        assert calls == (scripted if spec["content_captured"] else []), task
        llm_calls = [s for s in trajectory.steps if s.kind == "llm_call"]
        assert len(llm_calls) == expected["model_requests"], f"{task}: an LLM call counted twice or lost"
        if spec["content_captured"]:
            assert trajectory.input == expected["user_input"]
            assert trajectory.final_output == expected["final_output"]
            assert [s.call_id for s in trajectory.tool_steps] == [c["id"] for c in expected["tool_calls"]]
            assert all(s.source == "llm_output" for s in trajectory.tool_steps)


def test_tokens_add_up_once_when_the_sdk_and_the_instrumentor_both_trace_a_call(store: Store) -> None:
    store.set_task_keys(["session.id"])
    ingest_files(store, [str(FIXTURES / "openinference_anthropic.otlp.jsonl")])
    spans = store.connection.execute(
        "SELECT count(*), count(DISTINCT response_id) FROM spans WHERE step_kind = 'llm_call' AND scope_name = 'com.anthropic.sdk.python'"
    ).fetchall()[0]
    assert spans[0] > 0  # the double tracing is really in the fixture
    for trajectory in store.trajectories():
        llm_tokens = [s.input_tokens for s in trajectory.steps if s.kind == "llm_call"]
        assert len(llm_tokens) == EXPECTED["openinference_anthropic.otlp.jsonl"]["traces"][trajectory.task_key]["model_requests"]
        assert all(t is not None for t in llm_tokens)


def test_coverage_says_content_capture_is_off_for_the_default_genai_setup(store: Store) -> None:
    from plumbline_otel.coverage import coverage_report

    ingest_files(store, [str(FIXTURES / "genai_openai_v2_nocontent.otlp.jsonl")])
    report = coverage_report(store)["overall"]
    requests = sum(t["model_requests"] for t in EXPECTED["genai_openai_v2_nocontent.otlp.jsonl"]["traces"].values())
    assert report["llm_calls"]["llm_calls"] == requests and report["llm_calls"]["with_content"] == 0
    assert report["tool_calls"]["tool_calls"] == 0
    assert any("content capture is off by default" in f for f in report["findings"])
    assert any("No tool calls found" in f for f in report["findings"])


def _with_logs(name: str) -> list[str]:
    """The trace file and the log records file its producer wrote beside it, if any."""
    return [str(FIXTURES / name), *(str(FIXTURES / n) for n, spec in EXPECTED.items() if spec.get("logs_of") == name)]


@pytest.mark.parametrize("name", TRACE_FILES)
def test_coverage_names_each_steps_evidence_and_each_gaps_reason(name: str, store: Store) -> None:
    from plumbline_otel.coverage import coverage_report

    summary = ingest_files(store, _with_logs(name))
    assert summary.problems == [] and summary.exit_code == 0
    spec = _spec(name)
    n_llm = sum(t["model_requests"] for t in spec["traces"].values())
    section = coverage_report(store)["overall"]
    findings = "\n".join(section["findings"])
    if spec["content_captured"]:  # no tool spans: every call is a model's tool_call part; content on the spans
        n_calls = sum(len(t["tool_calls"]) for t in spec["traces"].values())
        assert section["step_evidence"] == {"tool_call": {"message_part": n_calls}, "llm_call": {"span": n_llm}}
        assert section["gaps"] == {} and "Missing values and why" not in findings
        assert "Evidence for tool call arguments: " + f"{n_calls} from the model's message parts" in findings
    else:
        assert section["step_evidence"] == {"tool_call": {}, "llm_call": {"none": n_llm}}
        assert section["gaps"] == {"content:content_capture_off": n_llm}
        assert f"Missing values and why: {n_llm} LLM call contents: content capture is off" in findings


def test_span_and_event_capture_stores_the_log_records_and_keeps_the_span_content(store: Store) -> None:
    """SPAN_AND_EVENT writes the content twice: the log records are stored and folded, nothing is counted twice."""
    name = "genai_openai_v2_events.otlp.jsonl"
    store.set_task_keys(["session.id"])
    summary = ingest_files(store, _with_logs(name))
    assert summary.log_records == sum(t["model_requests"] for t in EXPECTED[name]["traces"].values())
    got = {t.task_key: t for t in store.trajectories()}
    for task, expected in EXPECTED[name]["traces"].items():
        assert [(s.name, s.args) for s in got[task].tool_steps] == [(c["name"], c["arguments"]) for c in expected["tool_calls"]]
        assert sum(1 for s in got[task].steps if s.kind == "llm_call") == expected["model_requests"]
