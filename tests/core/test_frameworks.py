"""Real agent frameworks under their usual tracing give exact trajectories (issue 15).

Every directory under tests/fixtures/frameworks/ holds one set-up's trace file, written by the
real framework and its real instrumentation against a loopback stand-in of the model API (a
scripted, simulated model; see the generate_*.py scripts there), and expected.json, derived from
the script and the tool functions, not from the spans. A run is exact when its tool calls carry
the arguments the tool function received, once each and in order, only the call that raised is
marked failed, its input is the user's request and its final output the agent's answer, its LLM
call count equals the model requests made, and runs of one task share a task key while different
tasks do not. Each set-up goes through the ordinary ingest path into a real DuckDB store.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from plumbline_otel.coverage import coverage_report
from plumbline_otel.ingest import ingest_files
from plumbline_otel.model import Trajectory
from plumbline_otel.normalise import maybe_json
from plumbline_otel.store import Store

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "frameworks"
# A set-up with a logs.otlp.jsonl (ADK with capture on reads as EVENT_ONLY) carries its content in log
# records: ingest stores them from the file and assembly folds them into their spans (issue 11).
NAMES = [p.parent.name for p in sorted(FIXTURES.glob("*/expected.json"))]  # every set-up, none excused


def _expected(setup: str) -> dict[str, Any]:
    return json.loads((FIXTURES / setup / "expected.json").read_text())


def _ingest(store: Store, setup: str) -> list[Trajectory]:
    summary = ingest_files(store, [str(p) for p in sorted((FIXTURES / setup).glob("*.otlp.jsonl"))])
    assert summary.problems == [] and summary.exit_code == 0, summary.problems
    return list(store.trajectories())


def _value(value: Any) -> Any:
    """A tool result as a user compares it: JSON text and the structure it encodes are the same value, at any depth
    (Mastra's exporter writes the JSON text of the tools inside a sub-agent's result without its spaces)."""
    if isinstance(value, str):
        parsed = maybe_json(value.strip())
        return parsed if isinstance(parsed, str) else _value(parsed)
    if isinstance(value, dict):
        return {k: _value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_value(v) for v in value]
    return value


def _without_content(run: dict[str, Any]) -> dict[str, Any]:
    """What a trace with content capture off can give: names, order, failures and counts, no values."""
    calls = [{**c, "args": None, "result": None} for c in run["tool_calls"]]
    return {**run, "input": None, "final_output": None, "tool_calls": calls}


def _as_recorded(run: dict[str, Any], absent: list[str]) -> dict[str, Any]:
    """The run as its trace can give it: fields the instrumentation never writes (expected.json's
    `absent_from_trace`: Traceloop's OpenAI Agents instrumentation writes no model output on Chat
    Completions, so the answer is nowhere in the trace; OpenInference on ADK 2 writes every model call of a run
    onto one span, so the trace holds one of them) are expected absent; everything else exactly.
    """
    calls = [{**c, **{k: None for k in ("args", "result") if k in absent}} for c in run["tool_calls"]]
    return {**run, **{k: None for k in ("input", "final_output", "llm_calls") if k in absent}, "tool_calls": calls}


def _mismatches(run: dict[str, Any], got: Trajectory) -> list[str]:
    """Every way `got` differs from the expected run, named, so one failure shows them all."""
    out = []
    calls = [(s.name, s.args, s.failed) for s in got.tool_steps]
    want = [(c["name"], c["args"], c["failed"]) for c in run["tool_calls"]]
    if calls != want:
        out.append(f"tool calls {calls} != {want}")
    results = [_value(s.result) for s in got.tool_steps if not s.failed]
    want_results = [_value(c["result"]) for c in run["tool_calls"] if not c["failed"]]
    if results != want_results:
        out.append(f"results {results} != {want_results}")
    if got.input != run["input"]:
        out.append(f"input {got.input!r} != {run['input']!r}")
    if got.final_output != run["final_output"]:
        out.append(f"final output {got.final_output!r} != {run['final_output']!r}")
    llm_calls = sum(1 for s in got.steps if s.kind == "llm_call")
    if run["llm_calls"] is not None and llm_calls != run["llm_calls"]:  # None: the trace does not keep them apart
        out.append(f"LLM calls {llm_calls} != {run['llm_calls']} model requests")
    return out


@pytest.mark.parametrize("setup", NAMES)
def test_every_run_is_exact(setup: str, store: Store) -> None:
    expected = _expected(setup)
    got = _ingest(store, setup)
    absent = expected.get("absent_from_trace", [])
    runs = [_as_recorded(r, absent) for r in expected["runs"]] if expected["content_captured"] else [_without_content(r) for r in expected["runs"]]
    assert len(got) == len(runs), f"{setup}: {len(got)} trajectories for {len(runs)} runs"
    wrong = {run["label"]: m for run, t in zip(runs, got) if (m := _mismatches(run, t))}
    assert wrong == {}, f"{setup}: runs that are not exact"
    if not expected["content_captured"]:  # no request to hash and no key set: no task grouping to claim
        assert {t.task_key_source for t in got} == {"none"}
        return
    for a, ta in zip(runs, got):
        for b, tb in zip(runs, got):
            same = a["task"] == b["task"]
            assert (ta.task_key == tb.task_key) == same, f"{setup}: {a['label']} and {b['label']} {'share' if same else 'differ in'} a task"


@pytest.mark.parametrize("setup", NAMES)
def test_coverage_names_evidence_task_key_source_and_shapes(setup: str, store: Store) -> None:
    _ingest(store, setup)
    section = coverage_report(store)["overall"]
    findings = "\n".join(section["findings"])
    runs = _expected(setup)["runs"]
    n_calls = sum(len(r["tool_calls"]) for r in runs)
    assert sum(section["evidence_sources"].values()) == n_calls
    if n_calls:
        assert "Evidence for tool calls:" in findings
    assert sum(section["task_key_sources"].values()) == len(runs) and "Task keys:" in findings
    if section["shapes"]["unwrapped"]:
        assert "Recognised framework wrappers and dumps" in findings
        assert all(shape in findings for shape in section["shapes"]["unwrapped"])
    if section["shapes"]["kept_as_is"]:
        assert all(shape in findings for shape in section["shapes"]["kept_as_is"])
    # Per step, where its evidence came from; per missing value, why (issue 11 item 4).
    evidence, n_llm = section["step_evidence"], sum(r["llm_calls"] for r in runs)
    assert sum(evidence["tool_call"].values()) == n_calls
    if "llm_calls" not in _expected(setup).get("absent_from_trace", []):
        assert sum(evidence["llm_call"].values()) == n_llm
    if n_calls:
        assert "Evidence for tool call arguments:" in findings and "Evidence for LLM call contents:" in findings
    if (FIXTURES / setup / "logs.otlp.jsonl").exists():  # content only in log records: folded, and said so
        assert evidence["llm_call"] == {"log_record": n_llm} and "log records folded into their span" in findings
    if _expected(setup)["content_captured"]:
        assert "none" not in evidence["tool_call"] and section["gaps"] == {}
    else:
        n_results = sum(1 for r in runs for c in r["tool_calls"] if not c["failed"])
        assert evidence == {"tool_call": {"none": n_calls}, "llm_call": {"none": n_llm}}
        assert section["gaps"] == {"args:content_capture_off": n_calls, "result:content_capture_off": n_results,
                                   "content:content_capture_off": n_llm}
        assert "Missing values and why:" in findings and "tool arguments: content capture is off" in findings
    if not _expected(setup)["content_captured"]:  # what is missing, and the setting that adds it
        assert "have no message content: content capture is off" in findings
        assert "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT" in findings
        assert "no task key and no recorded request" in findings
        return
    if "final_output" in _expected(setup).get("absent_from_trace", []):
        assert f"{len(runs)} of {len(runs)} trajectories have no final output" in findings
    structured = sum(1 for r in runs for c in r["tool_calls"] if isinstance(c["args"], dict))
    assert section["tool_calls"]["with_structured_args"] == structured


@pytest.mark.parametrize("setup", ["openai_agents_js_handoff", "openai_agents_otel_handoff"])
def test_a_recorded_hand_off_is_a_step_named_by_the_function_the_model_called(setup: str, store: Store) -> None:
    """The model hands the run to `payer` by calling `transfer_to_payer` (the framework's function, no tool of the user's):
    one agent step of that name, with the model's call id, in the model turn the script gave it, and `payer` after it."""
    for run, got in zip(_expected(setup)["runs"], _ingest(store, setup)):
        llm_turn = -1
        steps = []
        for s in got.steps:
            llm_turn += s.kind == "llm_call"
            steps.append((s.kind, s.name, s.call_id, llm_turn))
        (handoff,) = [s for s in steps if s[1] == "transfer_to_payer"]
        turn = next(c["model_turn"] for c in run["tool_calls"] if c["name"] in ("schedule_payment", "flag_exception")) - 1
        assert handoff == ("agent", "transfer_to_payer", f"call_{run['label']}_{turn}_0", turn), run["label"]
        assert ("agent", "payer") in [s[:2] for s in steps[steps.index(handoff):]], run["label"]


# OpenInference's LangChain JS instrumentation marks a createAgent graph a CHAIN, and the sub-agent's metadata names the
# calling agent (`lc_agent_name` comes with the tool's config): nothing in the trace says `payer` is an agent, so its
# model requests and tools are the run's steps with no agent step of its own.
# CrewAI's delegation runs the coworker with no agent span (its model requests and tools sit under the delegation's
# TOOL span); Semantic Kernel's agent function holds the sub-agent's `invoke_agent payer`. Haystack traces no tools and
# an Agent's run is a CHAIN: the sub-agent's `Agent.run` sits beside the caller's model requests, no agent step. DSPy's
# tool is a TOOL span holding the sub-agent's `ReActV2.forward` CHAIN (no agent step) and, like every DSPy tool span,
# no call id: the model's ids are only in the reprs of `LM.__call__`'s output, which no step takes them from yet.
# An MCP server's tool that runs an OpenAI Agents SDK agent: its `tools/call payer` SERVER span holds the sub-agent's
# own `Agent workflow` and `payer` AGENT spans (both read as agent steps).
@pytest.mark.parametrize(("setup", "agent_step", "call_id"),
                         [("mastra_subagent", True, True), ("langgraph_openinference_subagent", False, True),
                          ("aisdk7_otel_subagent", True, True), ("aisdk6_subagent", True, True),
                          ("semantic_kernel_subagent", True, True), ("crewai_delegation", False, True),
                          ("haystack_subagent", False, True), ("dspy_subagent", False, False),
                          ("mcp_subagent", True, True)])
def test_a_recorded_sub_agent_called_as_a_tool_is_its_call_then_the_sub_agent_with_its_own_calls(
        setup: str, agent_step: bool, call_id: bool, store: Store) -> None:
    """The model calls the sub-agent as a tool (Mastra's `agent-payer`; a LangChain, AI SDK, Haystack, DSPy or MCP tool
    `payer` that runs an agent): one tool step with the model's call id (where the trace gives tool steps one), then
    the sub-agent (an agent step where the trace names it one), whose model requests and tools are steps of the same
    run."""
    for run, got in zip(_expected(setup)["runs"], _ingest(store, setup)):
        steps = [(s.kind, s.name, s.call_id) for s in got.steps]
        (delegate,) = [c for c in run["tool_calls"] if c["name"] in ("agent-payer", "payer", "ap-payer", "delegate_work_to_coworker")]
        at = steps.index(("tool_call", delegate["name"], delegate["call_id"] if call_id else None))
        payer_at = next(i for i, s in enumerate(steps) if _payer_tool(s[1]))
        assert (("agent", "payer", None) in steps[at:payer_at]) == agent_step, run["label"]  # it may start in the call's millisecond
        payer_calls = [s[1] for s in steps[at:] if s[0] == "tool_call" and _payer_tool(s[1])]
        assert payer_calls == [c["name"] for c in run["tool_calls"] if _payer_tool(c["name"])]


def _payer_tool(name: str | None) -> bool:
    """schedule_payment or flag_exception, plugin-qualified or not (Semantic Kernel's `ap-schedule_payment`)."""
    return (name or "").rsplit("-", 1)[-1] in ("schedule_payment", "flag_exception")
