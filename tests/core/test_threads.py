"""An agent loop traced per model call is one run per conversation (issue 40 item 12).

Under only an SDK's zero-code instrumentation (OpenTelemetry's openai-v2 over the OpenAI client, no span of the app's),
every model call is a trace of its own. A trace whose request continues another's conversation (its input messages
begin with that call's input and output, then the tool results) is linked to it in the store, and the linked traces
are assembled as one run with the first trace's id (`threads.py`). The fixtures are tests/fixtures/frameworks/
openai_v2_loop*/ (generate_openai_loop.py): the six scenarios in turn, two pairs of runs interleaved in time, and two
runs with the same first user message interleaved.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from plumbline_otel.coverage import coverage_report
from plumbline_otel.ingest import ingest_files
from plumbline_otel.model import Trajectory
from plumbline_otel.normalise import parse_messages
from plumbline_otel.store import Store
from plumbline_otel.threads import ThreadKeys, continuation_links, thread_keys

FRAMEWORKS = Path(__file__).resolve().parents[1] / "fixtures" / "frameworks"
LOOPS = ["openai_v2_loop", "openai_v2_loop_events", "openai_v2_loop_interleaved", "openai_v2_loop_same_request"]
# The same loop under other instrumentations (generate_per_call_loop.py): OpenInference's and Traceloop's over the
# OpenAI SDK, OpenInference's over the Anthropic SDK; in each `<x>_loop`, skipped_check streams. Then Traceloop's
# messages as log records (one per message), OpenLIT's (assistant messages dropped from the request) and an older
# Traceloop's (the indexed `gen_ai.prompt.{i}.*`).
OTHER_LOOPS = [f"{kind}_loop{variant}" for kind in ("openai_openinference", "openai_traceloop", "anthropic_openinference")
               for variant in ("", "_interleaved", "_same_request")] + ["openai_traceloop_loop_events"] + \
    [f"{kind}_loop{v}" for kind in ("openai_openlit", "openai_traceloop_indexed", "anthropic_native") for v in ("", "_interleaved", "_same_request")]


def _expected(setup: str) -> dict[str, Any]:
    return json.loads((FRAMEWORKS / setup / "expected.json").read_text())


def _spans(setup: str) -> list[dict[str, Any]]:
    """Every span of the fixture as OTLP JSON, with its resource and scope, one export request each."""
    out = []
    for line in (FRAMEWORKS / setup / "trace.otlp.jsonl").read_text().splitlines():
        for rs in json.loads(line)["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for span in ss["spans"]:
                    out.append({"resourceSpans": [{**rs, "scopeSpans": [{**ss, "spans": [span]}]}]})
    return out


def _first_trace(setup: str, label: str) -> str:
    """The trace of a run's first model call: as the recorder noted it (`trace_ids`), else the trace whose span holds
    the stand-in's response id `chatcmpl-<label>-0`."""
    run = next(r for r in _expected(setup)["runs"] if r["label"] == label)
    if run.get("trace_ids"):
        return str(run["trace_ids"][0])
    for request in _spans(setup):
        span = request["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
        ids = [a["value"].get("stringValue") for a in span["attributes"] if a["key"] == "gen_ai.response.id"]
        if ids == [f"chatcmpl-{label}-0"]:
            return str(span["traceId"])
    raise AssertionError(f"{setup}: no first call of {label}")


def _assert_runs(setup: str, got: list[Trajectory]) -> None:
    runs = _expected(setup)["runs"]
    assert len(got) == len(runs), f"{setup}: {len(got)} runs for {len(runs)} conversations"
    for run, t in zip(runs, got):
        where = f"{setup}/{run['label']}"
        assert [(s.name, s.args, s.failed) for s in t.tool_steps] == \
            [(c["name"], c["args"], c["failed"]) for c in run["tool_calls"]], where
        assert [s.call_id for s in t.tool_steps] == [c["call_id"] for c in run["tool_calls"]], where
        assert sum(1 for s in t.steps if s.kind == "llm_call") == run["llm_calls"], where
        assert (t.input, t.final_output) == (run["input"], run["final_output"]), where
        assert t.trajectory_id == t.trace_id == _first_trace(setup, run["label"]), where


@pytest.mark.parametrize("setup", LOOPS + OTHER_LOOPS)
def test_each_conversation_of_per_call_traces_is_one_run_with_its_first_trace_id(setup: str, store: Store) -> None:
    summary = ingest_files(store, [str(p) for p in sorted((FRAMEWORKS / setup).glob("*.otlp.jsonl"))])
    assert summary.problems == [] and summary.exit_code == 0
    _assert_runs(setup, list(store.trajectories()))
    assert store.pending_traces() == 0


@pytest.mark.parametrize("setup", ["openai_v2_loop_events", "openai_traceloop_loop_events"])
@pytest.mark.parametrize("logs_first", [False, True])
def test_calls_whose_messages_are_in_log_records_are_joined_whichever_of_span_and_record_comes_first(
        logs_first: bool, setup: str, store: Store) -> None:
    """openai-v2 with content captured as events: each call's messages are only in its log record
    (`gen_ai.client.inference.operation.details`); Traceloop's `use_attributes=False`: one record per message, the
    older GenAI events (`gen_ai.user.message` … `gen_ai.choice`, its tool calls beside its `message`, the `tool`
    messages with no call id: each answers the next call in order). The span or the records, whichever is stored
    second, key the call, read as normalise reads them."""
    files = [FRAMEWORKS / setup / "trace.otlp.jsonl", FRAMEWORKS / setup / "logs.otlp.jsonl"]
    for path in reversed(files) if logs_first else files:
        assert ingest_files(store, [str(path)]).exit_code == 0
    _assert_runs(setup, list(store.trajectories()))


@pytest.mark.parametrize("setup", ["openai_v2_loop_interleaved", *(s for s in OTHER_LOOPS if s.endswith("_interleaved"))])
@pytest.mark.parametrize("last_first", [False, True])
def test_interleaved_conversations_are_joined_whatever_order_their_traces_arrive_in(
        last_first: bool, setup: str, store: Store, tmp_path: Path) -> None:
    """Each model call's trace in a request of its own, each ingested and assembled on its own (in call order, or the
    last first): a trace continuing one stored and assembled before, and one continued by a trace already stored, are
    joined all the same, the earlier run's trajectory replaced by the joined one."""
    requests = _spans(setup)
    for i, request in enumerate(reversed(requests) if last_first else requests):
        path = tmp_path / f"{i:02d}.otlp.jsonl"
        path.write_text(json.dumps(request) + "\n")
        assert ingest_files(store, [str(path)]).exit_code == 0
        store.assemble()
    _assert_runs(setup, list(store.trajectories()))


def test_two_runs_with_the_same_first_user_message_are_two_runs_of_one_task(store: Store) -> None:
    setup = "openai_v2_loop_same_request"
    ingest_files(store, [str(FRAMEWORKS / setup / "trace.otlp.jsonl")])
    clean, repeat = store.trajectories()
    assert clean.input == repeat.input and clean.task_key == repeat.task_key
    assert clean.trajectory_id != repeat.trajectory_id
    assert {s.call_id[:len("call_clean_0")] for s in clean.tool_steps if s.call_id} == {"call_clean_0", "call_clean_1",
                                                                                       "call_clean_2"}
    assert all(s.call_id and s.call_id.startswith("call_clean_repeat_") for s in repeat.tool_steps)


def test_coverage_says_how_many_runs_were_joined_from_per_call_traces(store: Store) -> None:
    ingest_files(store, [str(FRAMEWORKS / "openai_v2_loop" / "trace.otlp.jsonl")])
    section = coverage_report(store)["overall"]
    assert section["trajectories"]["joined_runs"] == 6 and section["trajectories"]["joined_traces"] == 24
    findings = "\n".join(section["findings"])
    assert "6 runs were assembled from 24 traces of one model call each" in findings
    assert "hold no steps" not in findings  # the joined traces are runs' traces, not traces of nothing


def test_a_run_of_its_own_trace_is_not_keyed_beside_per_call_traces_that_are(store: Store) -> None:
    """A model call under an agent's span (the OpenAI Agents SDK under openai-v2) is part of that trace's run already:
    only the plain loop's root model calls are keyed, and each store holds both set-ups' six runs."""
    ingest_files(store, [str(FRAMEWORKS / "openai_agents_otel_chat" / "trace.otlp.jsonl"),
                         str(FRAMEWORKS / "openai_v2_loop" / "trace.otlp.jsonl")])
    keyed = store.connection.execute("SELECT count(DISTINCT trace_id) FROM conversation_keys").fetchone()
    assert keyed == (24,)
    runs = list(store.trajectories())
    assert len(runs) == 12 and sorted(len(t.tool_steps) for t in runs) == sorted(
        len(r["tool_calls"]) for setup in ("openai_agents_otel_chat", "openai_v2_loop") for r in _expected(setup)["runs"])


# --- synthetic per-call traces ------------------------------------------------------------------------------------

SYSTEM = {"role": "system", "parts": [{"type": "text", "content": "You pay invoices."}]}


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "parts": [{"type": "text", "content": text}]}


def _answer(text: str) -> dict[str, Any]:
    return {"role": "assistant", "parts": [{"type": "text", "content": text}], "finish_reason": "stop"}


def _asks(call_id: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "parts": [{"type": "tool_call", "id": call_id, "name": name, "arguments": args}],
            "finish_reason": "tool_calls"}


def _result(call_id: str, text: str) -> dict[str, Any]:
    return {"role": "tool", "parts": [{"type": "tool_call_response", "id": call_id, "response": text}]}


def _call_trace(n: int, inputs: list[dict[str, Any]], output: dict[str, Any]) -> dict[str, Any]:
    """openai-v2's span of one model call, alone in its trace, started n seconds in."""
    def s(key: str, value: str) -> dict[str, Any]:
        return {"key": key, "value": {"stringValue": value}}

    span = {"traceId": f"{n:032x}", "spanId": f"{n:016x}", "name": "chat gpt-4o-mini", "kind": 3,
            "startTimeUnixNano": str(1_764_700_000_000_000_000 + n * 10**9),
            "endTimeUnixNano": str(1_764_700_000_500_000_000 + n * 10**9),
            "attributes": [s("gen_ai.operation.name", "chat"), s("gen_ai.provider.name", "openai"),
                           s("gen_ai.request.model", "gpt-4o-mini"), s("gen_ai.response.id", f"chatcmpl-{n}"),
                           s("gen_ai.input.messages", json.dumps(inputs)), s("gen_ai.output.messages", json.dumps([output]))],
            "status": {}}
    return {"resourceSpans": [{"resource": {"attributes": [s("service.name", "loop")]},
                               "scopeSpans": [{"scope": {"name": "opentelemetry.util.genai.handler"}, "spans": [span]}]}]}


def _ingest_calls(store: Store, tmp_path: Path, calls: list[dict[str, Any]]) -> list[Trajectory]:
    path = tmp_path / "calls.otlp.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in calls))
    assert ingest_files(store, [str(path)]).exit_code == 0
    return list(store.trajectories())


def test_the_same_first_user_message_alone_never_joins_but_a_request_that_continues_a_call_does(
        store: Store, tmp_path: Path) -> None:
    """Two calls ask the same and get the same reply, call id and all (two runs alike so far); a third sends the tool's
    result back: it could continue either, so it joins neither. A fourth asks the same as the first two and continues
    nothing (a first request). Beside them a tool loop whose second request continues its first: one run."""
    hello = [SYSTEM, _user("Please pay INV-1.")]
    asks = _asks("call_x", "lookup_invoice", {"invoice_id": "INV-1"})
    loop = [SYSTEM, _user("Please pay INV-2.")]
    runs = _ingest_calls(store, tmp_path, [
        _call_trace(1, hello, asks),
        _call_trace(2, hello, asks),
        _call_trace(3, [*hello, asks, _result("call_x", '{"amount": 1}')], _answer("Paid.")),
        _call_trace(4, hello, _answer("Which account?")),
        _call_trace(5, loop, _asks("call_a", "lookup_invoice", {"invoice_id": "INV-2"})),
        _call_trace(6, [*loop, _asks("call_a", "lookup_invoice", {"invoice_id": "INV-2"}), _result("call_a", '{"amount": 5}')],
                    _answer("INV-2 is paid.")),
    ])
    assert [t.trace_id for t in runs] == [f"{n:032x}" for n in (1, 2, 3, 4, 5)]
    assert len({t.task_key for t in runs[:4]}) == 1  # one task, four runs
    joined = runs[4]
    assert [(s.name, s.args, s.call_id) for s in joined.tool_steps] == [("lookup_invoice", {"invoice_id": "INV-2"}, "call_a")]
    assert joined.final_output == "INV-2 is paid." and sum(1 for s in joined.steps if s.kind == "llm_call") == 2


def test_a_conversation_of_per_call_traces_is_one_run_per_user_turn_each_with_its_first_trace_id(
        store: Store, tmp_path: Path) -> None:
    """Three calls of one conversation: the second opens a new user turn (a run of its own, as rule 6 makes it in one
    trace) and the third carries out its tool call; without the join the third would be a run of its own."""
    first = [SYSTEM, _user("Please pay INV-1.")]
    second = [*first, _answer("INV-1 is paid."), _user("Now pay INV-2.")]
    third = [*second, _asks("call_b", "schedule_payment", {"invoice_id": "INV-2"}), _result("call_b", "ok")]
    runs = _ingest_calls(store, tmp_path, [
        _call_trace(1, first, _answer("INV-1 is paid.")),
        _call_trace(2, second, _asks("call_b", "schedule_payment", {"invoice_id": "INV-2"})),
        _call_trace(3, third, _answer("INV-2 is paid.")),
    ])
    assert [(t.input, t.final_output) for t in runs] == [("Please pay INV-1.", "INV-1 is paid."), ("Now pay INV-2.", "INV-2 is paid.")]
    assert [t.trajectory_id for t in runs] == [f"{1:032x}", f"{2:032x}"]
    assert [s.call_id for s in runs[1].tool_steps] == ["call_b"]
    assert sum(1 for s in runs[1].steps if s.kind == "llm_call") == 2


# --- the keys --------------------------------------------------------------------------------------------------------


def _keys(inputs: list[dict[str, Any]], output: dict[str, Any]) -> ThreadKeys:
    return thread_keys(parse_messages(inputs), parse_messages([output]))


def test_a_request_continues_the_call_whose_input_and_output_it_begins_with_however_each_was_written() -> None:
    call = _asks("call_a", "lookup_invoice", {"invoice_id": "INV-2", "full": True})
    first = _keys([SYSTEM, _user("Please  pay\nINV-2. ")], call)
    # the next request as another instrumentation writes it: OpenAI-style messages, arguments as JSON text, spaces
    resent = [{"role": "system", "content": "You pay invoices."}, {"role": "user", "content": "Please pay INV-2."},
              {"role": "assistant", "content": None, "tool_calls": [{"id": "call_a", "type": "function", "function": {
                  "name": "lookup_invoice", "arguments": '{"full": true,  "invoice_id": "INV-2"}'}}]},
              {"role": "tool", "tool_call_id": "call_a", "content": '{"amount": 5}'}]
    second = thread_keys(parse_messages(resent), parse_messages([_answer("Paid.")]))
    assert first.continues is None and first.after is not None
    assert second.continues == first.after and second.continues_loose == first.after_loose
    # the model's call ids tell apart what is otherwise alike; the loose keys do not
    other = _keys([SYSTEM, _user("Please pay INV-2.")], _asks("call_z", "lookup_invoice", {"invoice_id": "INV-2", "full": True}))
    assert other.after != first.after and other.after_loose == first.after_loose


def test_links_prefer_the_call_ids_and_join_nothing_ambiguous() -> None:
    a = ThreadKeys(None, None, "A", "L")
    b = ThreadKeys(None, None, "B", "L")
    wants_a = ThreadKeys("A", "L", None, None)
    wants_lost_id = ThreadKeys("X", "L", None, None)
    calls = [("ta", "1", 0, 1, a), ("tb", "2", 0, 1, b), ("tc", "3", 2, 3, wants_a), ("td", "4", 2, 3, wants_lost_id)]
    assert continuation_links(calls) == [("tc", "ta")]  # td could continue either by its loose key: neither
    assert continuation_links([calls[0], calls[3]]) == [("td", "ta")]  # the one loose match
    assert continuation_links([("ta", "1", 5, 6, a), calls[2]]) == []  # a call continues only one that ended before it


def test_where_one_side_was_not_recorded_a_request_still_continues_the_one_call_it_follows() -> None:
    """A request whose history lost the model's messages (OpenLIT keeps only the tool results) continues the call whose
    reply called exactly the ids its results answer; a call whose reply was not recorded (a streamed call under the
    Anthropic SDK's own tracing) is continued by the request whose history is its request and then the model's
    messages. Neither joins a call whose request or ids differ."""
    ask = [SYSTEM, _user("Please pay INV-2.")]
    asks = _asks("call_a", "lookup_invoice", {"invoice_id": "INV-2"})
    called = thread_keys(parse_messages(ask), parse_messages([asks]))
    lost = thread_keys(parse_messages([*ask, _result("call_a", '{"amount": 5}')]), parse_messages([_answer("Paid.")]))
    assert lost.continues is None and lost.gap_continues == called.gap_after
    assert continuation_links([("t1", "1", 0, 1, called), ("t2", "2", 2, 3, lost)]) == [("t2", "t1")]
    unrecorded = thread_keys(parse_messages(ask), [])
    follows = thread_keys(parse_messages([*ask, asks, _result("call_a", '{"amount": 5}')]), parse_messages([_answer("Paid.")]))
    assert unrecorded.after is None and follows.gap_continues == unrecorded.gap_after
    assert continuation_links([("t1", "1", 0, 1, unrecorded), ("t2", "2", 2, 3, follows)]) == [("t2", "t1")]
    other = thread_keys(parse_messages([SYSTEM, _user("Please pay INV-3.")]), [])
    assert continuation_links([("t0", "0", 0, 1, other), ("t2", "2", 2, 3, follows)]) == []
