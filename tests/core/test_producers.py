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
    assert sorted(got) == sorted(spec["traces"])
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
    ).fetchone()
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
