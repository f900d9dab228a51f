"""Coverage: what the stored traffic can and cannot support, in numbers and in sentences.

Every figure is SQL over the store, run by the store's read module (`Reader.coverage_counts`). The
sentences name the gap, the analysis it rules out and, where there is one, what the user can change
(usually a content-capture switch in their instrumentation).

The report is made in two steps so that several stores read as one: `Reader.coverage_counts` gives only
figures that add up across stores holding different traces (per-task run counts instead of a
distinct-task count, every unrecognised key instead of the top 25), and `report_from_counts`
derives the rest (task figures, the top keys, the sentences) once, from the summed counts.
"""

from __future__ import annotations

from typing import Any

from plumbline_otel.store import Reader


def _by_count(counts: dict[str, int]) -> list[tuple[str, int]]:
    """Most frequent first, then by name: the order one store's SQL gives, whatever was summed."""
    return sorted(counts.items(), key=lambda kv: (-kv[1], str(kv[0])))


def _section(counts: dict[str, Any]) -> dict[str, Any]:
    """A report section from its counts: task figures from the per-task runs, the top 25 keys, the sentences."""
    section = dict(counts)
    trajectories = dict(counts["trajectories"])
    task_runs = trajectories.pop("task_runs")
    trajectories["tasks"] = len(task_runs)
    trajectories["tasks_seen_more_than_once"] = sum(1 for n in task_runs.values() if n > 1)
    section["trajectories"] = trajectories
    spans = dict(counts["spans"])
    spans["by_convention"] = dict(sorted(spans["by_convention"].items(), key=lambda kv: (-kv[1]["spans"], str(kv[0]))))
    section["spans"] = spans
    section["unrecognised_keys"] = dict(_by_count(counts["unrecognised_keys"])[:25])
    section["evidence_sources"] = dict(_by_count(counts["evidence_sources"]))
    section["step_evidence"] = {kind: dict(_by_count(n)) for kind, n in counts["step_evidence"].items()}
    section["gaps"] = dict(_by_count(counts["gaps"]))
    section["task_key_sources"] = dict(_by_count(counts["task_key_sources"]))
    section["shapes"] = {kind: dict(_by_count(n)) for kind, n in counts["shapes"].items()}
    section["findings"] = findings(section)
    return section


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "n/a"


def findings(section: dict[str, Any]) -> list[str]:
    """Plain sentences: each gap, what it rules out, and what to change."""
    spans, tools, trajs, llm_calls = section["spans"], section["tool_calls"], section["trajectories"], section["llm_calls"]
    out: list[str] = []
    n_tools = tools["tool_calls"]
    no_args = n_tools - tools["with_structured_args"]
    logs = section["log_records"]
    if logs["without_span"]:
        out.append(f"{logs['without_span']} of {logs['records']} GenAI log records name a span that is not stored (yet):"
                   " their content is in no trajectory until that span arrives.")
    if spans["spans"] == 0:
        return [*out, "No spans stored yet: ingest trace files or point an OTLP exporter at `plumbline serve`."]
    if n_tools == 0:
        out.append("No tool calls found: neither tool spans nor tool calls in LLM output messages; conformance and consistency have nothing to check.")
    elif no_args:
        out.append(f"{_pct(no_args, n_tools)} of tool calls ({no_args} of {n_tools}) carry no structured arguments, so argument invariants (arg_equals, arg_satisfies) are unavailable for them.")
    if spans["tool_spans_without_args"]:
        recovered = tools["args_recovered_from_llm_output"]
        out.append(f"{spans['tool_spans_without_args']} tool spans carry no arguments; {recovered} of them were recovered from the parent LLM span's output messages.")
    if tools["only_in_llm_output"]:
        out.append(f"{tools['only_in_llm_output']} tool calls exist only in LLM output messages (no tool spans): their results come from later LLM inputs, and a call the agent never executed cannot be told apart from one that ran.")
    llm, content = llm_calls["llm_calls"], llm_calls["with_content"]
    if spans["llm_spans"] > llm:
        out.append(f"{spans['llm_spans'] - llm} LLM spans describe a call another span already records (a provider SDK's own span beside an instrumentation's) or made no request (no content and no tokens beside a sibling that has them, e.g. LlamaIndex's _prepare_chat_with_tools); each call counts once.")
    if llm and content < llm:
        text = (f"{_pct(llm - content, llm)} of LLM calls ({llm - content} of {llm}) have no message content: content capture is off by default in most instrumentations (OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT for the OpenTelemetry GenAI ones and Google ADK: SPAN_ONLY puts it on spans); without it, tool calls inside LLM spans and the run's input are invisible.")
        switches = _content_switches(spans.get("by_scope", {}))
        if switches:
            text += " For the instrumentations seen here: " + "; ".join(switches) + "."
        if section["unrecognised_keys"]:
            text += (" Check the unrecognised keys listed below first: content may be there, under keys plumbline does not read"
                     " (then no switch is needed, only a mapping).")
        if not logs["records"]:
            # Never blame capture alone: with capture set to events, the content is in log records, and none came.
            text += (" No GenAI log records were received: an instrumentation set to write content as events (EVENT_ONLY;"
                     " Google ADK's `true`; Semantic Kernel) puts it in log records, which must be sent too (the OTLP logs"
                     " signal to /v1/logs, or the logs file to `plumbline ingest`) before capture is the cause.")
        out.append(text)
    if llm and llm_calls["with_tokens"] < llm:
        out.append(f"{llm - llm_calls['with_tokens']} of {llm} LLM calls report no token usage, so cost figures undercount.")
    n = trajs["trajectories"]
    if trajs["traces_with_several_runs"]:
        out.append(f"{trajs['traces_with_several_runs']} traces held more than one run (several root agent spans, or a"
                   " conversation's turns): each run is its own trajectory, with id <trace id>:<root span id>.")
    if trajs.get("joined_runs"):
        out.append(f"{trajs['joined_runs']} runs were assembled from {trajs['joined_traces']} traces of one model call each"
                   " (an agent loop with no span of its own around a run, traced only per model call): each request's trace"
                   " joined the trace whose conversation it continues. A span around each run (e.g. `invoke_agent`) makes"
                   " the run a trace of its own.")
    # a joined run's traces are one run's, not traces holding no steps
    traces = spans["traces"] - trajs.get("joined_traces", 0) + trajs.get("joined_runs", 0)
    if traces > n:
        text = f"{traces - n} of {traces} traces hold no steps (no tool, LLM or agent call, e.g. a lone create_agent span) and are not runs."
        if section["unrecognised_keys"]:  # what was there and not read, not only that nothing came of it
            text += (" Their spans may say more under keys plumbline does not read: "
                     + ", ".join(list(section["unrecognised_keys"])[:5]) + " (present, not read).")
        out.append(text)
    if n_tools:
        out.append(_evidence_sentence(section["evidence_sources"]))
    out += _step_evidence_sentences(section["step_evidence"])
    if section["gaps"]:
        out.append(_gap_sentence(section["gaps"]))
    out += _shape_sentences(section["shapes"], tools)
    if n and trajs["with_input"] < n:
        out.append(f"{n - trajs['with_input']} of {n} trajectories have no recorded input, so they cannot be replayed.")
    out += _tape_sentences(n, llm, content, n_tools, tools["with_results"])
    if n and trajs["with_final_output"] < n:
        out.append(f"{n - trajs['with_final_output']} of {n} trajectories have no final output: neither the agent span nor the last"
                   " LLM response records the answer (content capture off, or an instrumentation that records no model output).")
    if n:
        out.append(_task_key_sentence(section["task_key_sources"], trajs))
    if n and trajs["tasks_seen_more_than_once"] == 0:
        out.append("No task was seen more than once, so consistency (agreement across runs of one task) cannot be measured yet.")
    out += _bug_sentences(spans)
    if spans["spans_with_dropped_attributes"]:
        out.append(f"{spans['spans_with_dropped_attributes']} spans lost attributes (dropped_attributes_count > 0): an SDK attribute limit or a rejected value; long message lists may be cut.")
    if section["unrecognised_keys"]:
        keys = ", ".join(list(section["unrecognised_keys"])[:5])
        more = len(section["unrecognised_keys"]) - 5
        out.append(f"Unrecognised keys on GenAI-looking spans (kept raw, not interpreted): {keys}"
                   + (f" and {more} more (see unrecognised_keys)" if more > 0 else "") + ".")
    return out


def _tape_sentences(runs: int, llm: int, content: int, n_tools: int, with_results: int) -> list[str]:
    """Whether stored runs can be taped for a branch-point replay (issue 44: `replay --branch-at`, the console's "replay
    from here"): the steps before the branch point are served from the run's recorded model outputs and tool results."""
    if not runs or not llm:
        return []
    no_content, no_result = llm - content, n_tools - with_results
    if not no_content and not no_result:
        return ["Every LLM call's content and every tool call's result were captured: a run with an input can be replayed"
                " from any of its steps (`replay --branch-at`), the steps before it served from its recording."]
    missing = " and ".join(part for part in (
        f"{no_content} of {llm} LLM calls have no captured content" if no_content else "",
        f"{no_result} of {n_tools} tool calls no captured result" if no_result else "") if part)
    return [f"Replay from a step (`replay --branch-at`) serves the steps before it from the run's recording: {missing}, so a"
            " run holding one can be branched only up to that step (the console's run page and `replay --branch-at` say which)."]


# Each instrumentation's own content switch, by the scope its spans carry (a prefix of it).
_CONTENT_SWITCHES = (
    ("openinference.", "OpenInference captures content by default: check OPENINFERENCE_HIDE_INPUTS / OPENINFERENCE_HIDE_OUTPUTS"
                       " (and …_HIDE_INPUT_MESSAGES / …_HIDE_OUTPUT_MESSAGES) are not set"),
    ("opentelemetry.instrumentation.", "Traceloop/OpenLLMetry: TRACELOOP_TRACE_CONTENT=true (its default)"),
    ("ai", "Vercel AI SDK: recordInputs / recordOutputs in experimental_telemetry (AI SDK 6) or telemetry (AI SDK 7) must"
           " not be false"),
    ("@mastra/", "Mastra: span input and output are exported unless a sensitive-data filter or span processor removes them"),
    ("pydantic-ai", "pydantic-ai: InstrumentationSettings(include_content=True) (its default)"),
    ("strands", "strands: content is in span events (or in gen_ai.client.inference.operation.details with"
                " OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental)"),
)


def _content_switches(by_scope: dict[str, int]) -> list[str]:
    out: list[str] = []
    for prefix, advice in _CONTENT_SWITCHES:
        if any(scope == prefix or (prefix.endswith((".", "/")) and scope.startswith(prefix)) or
               (prefix in ("pydantic-ai", "strands") and scope.startswith(prefix)) for scope in by_scope) and advice not in out:
            out.append(advice)
    return out


def _bug_sentences(spans: dict[str, Any]) -> list[str]:
    """Known instrumentation bugs, named when their signature is in the stored spans."""
    out = []
    lone = spans.get("lone_step_traces", 0)
    if lone >= 2:
        out.append(f"{lone} traces hold a single tool or model span and no agent span. Either the agent has no span of its"
                   " own (only an LLM client's instrumentation is on, e.g. zero-code OpenAI or LiteLLM: each model call is a"
                   " trace; wrap each run in a span of the app's, or trace the framework), or the instrumentation lost the"
                   " parent context, so every span became its own trace and a run's steps are split across traces (in Node,"
                   " register a context manager: NodeTracerProvider.register(), or AsyncLocalStorageContextManager from"
                   " @opentelemetry/context-async-hooks; in Python, spans started on another thread or task without the"
                   " context attached).")
    orphans = spans.get("spans_without_parent", 0)
    if orphans:
        out.append(f"{orphans} spans name a parent span that is not stored: a span that was never ended is never exported"
                   " (an instrumentation that does not end its tool or agent span, often on an exception or a cancelled"
                   " stream), or the parent is still in flight or was dropped; the run is assembled without it.")
    flat = spans.get("flat_langchain_traces", 0)
    if flat:
        out.append(f"{flat} traces hold LangChain spans all directly under one span, the chain and graph spans holding none"
                   " of the model and tool spans: the instrumentation lost the callback manager's parent spans (Traceloop for"
                   " Node's patch of CallbackManager._configureSync replaces a CallbackManager of inheritable handlers with its"
                   " own handler, dropping LangGraph's stream handler too, so streaming the graph does not stream the model)."
                   " Steps are ordered by time, so one agent's run is whole, but sub-agents and parallel branches cannot be"
                   " told apart by their parents; OpenInference's LangChain instrumentation"
                   " (@arizeai/openinference-instrumentation-langchain) keeps the tree and the stream.")
    by_class = spans.get("tool_spans_named_by_class", 0)
    if by_class:
        out.append(f"{by_class} tool spans are named by the tool's class (execute_tool DynamicStructuredTool: Traceloop for"
                   " Node's LangChain instrumentation), not by the tool: the tool's name and call id are taken from the"
                   " ToolMessage in the span's output, and a tool that raised (no output) is matched to the model's call by"
                   " its arguments. OpenInference's LangChain instrumentation names each tool span by the tool.")
    return out


_SOURCE_NAMES = {"tool_span": "their own tool spans", "tool_span+llm_output": "tool spans matched to the model's proposal",
                 "llm_output": "LLM output messages only", "span": "spans"}
_SHAPE_NAMES = {
    "smolagents_call": "smolagents call records {args, sanitize_inputs_outputs, kwargs}",
    "kwargs_wrapper": "{kwargs} wrappers (LlamaIndex)", "args_kwargs_wrapper": "{args, kwargs} wrappers",
    "langchain_callback": "LangChain callback payloads (input_str/inputs/kwargs)",
    "tool_call_object": "LangChain tool-call objects {name, args, id}",
    "langchain_tool_message": "LangChain ToolMessage dumps", "llamaindex_tool_output": "LlamaIndex ToolOutput dumps",
    "langchain_tool_message_error": "LangChain ToolMessage dumps with status error (marked failed)",
    "merged_tools_summary": "Google ADK's (merged tools) span over parallel calls (not a call: each call has its own span)",
    "answer_tool": "a framework's answer tool (smolagents final_answer: the run's answer, not a tool call)",
    "content_blocks": "content blocks", "responses_dump": "OpenAI Responses objects (a streamed response)",
    "gemini_response": "raw Gemini responses {content: {role, parts}} (deciding over flattened output keys)",
    "function_response": "Gemini FunctionResponse dumps {id, name, response}",
    "response_content": "response or event objects holding the answer message {content: {role, parts}} (Google ADK)",
    "whole_thread": "run spans holding the whole thread (every assistant message so far: the last is the run's answer)",
    "run_wrapper": "run wrappers (messages and nothing of a model call: OpenLIT's start_trace; not an LLM call, the calls are beneath it)",
    "langchain_tool_message_repr": "LangChain ToolMessage str() texts (content='…' tool_call_id='…', OpenLIT's tool results)",
    "tool_named_by_span": "tool spans with no tool-name key, named by the span's name (directly inside another tool span: an event of that call)",
    "tool_run_input": "BeeAI tool-run records {input, options}",
    "indexed_function_calls": "older indexed attributes (gen_ai.completion.N.function_call, LiteLLM's), the output messages empty",
    "responses_repr": "Python reprs of OpenAI Responses objects as the output text (openai-agents-v2, a streamed run)", "gcp.vertex.agent_result_wrapper": "Google ADK {result} wrappers of plain return values", "output_wrapper": "{output} wrappers",
    "graph_state": "graph-state dumps {messages}", "run_kwargs": "run() keyword dumps", "message_list": "message lists",
    "agent_output": "agent result objects", "run_result": "run result objects", "traceloop_entity": "Traceloop entity payloads",
    "scalar": "a bare value, not an object", "unrecognised": "a structure of unknown shape",
    "handoff": "agent hand-offs (an agent step, not a tool call)",
    "conversation_turn": "conversation turns (handle_conversation_turn: one run each)",
    "new_user_turn": "model calls opening a new user turn (a new message after an answer: each opens a run)",
}
_FIELD_NAMES = {"args": "tool arguments", "result": "tool results", "input": "run inputs", "output": "run outputs", "step": "spans"}


def _shape_phrase(shape: str, n: int) -> str:
    field, _, kind = shape.partition(":")
    return f"{n} {_FIELD_NAMES.get(field, field)} from {_SHAPE_NAMES.get(kind, kind)} ({shape})"


def _evidence_sentence(sources: dict[str, int]) -> str:
    parts = ", ".join(f"{n} from {_SOURCE_NAMES.get(s, s)}" for s, n in sources.items())
    return f"Evidence for tool calls: {parts}."


_EVIDENCE_NAMES = {"tool_span": "their tool spans' own attributes", "message_part": "the model's message parts (tool_call parts)",
                   "log_record": "log records folded into their span", "span_event": "span events", "span": "span attributes",
                   "none": "nowhere (see the gaps below)", "unknown": "not recorded (assembled by an older plumbline)"}
_GAP_REASONS = {
    "content_capture_off": "content capture is off (turn it on: OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT, or the"
                           " instrumentation's own switch)",
    "attribute_absent": "the producer does not write it (content was captured elsewhere in the trace, so this is the"
                        " instrumentation's gap, not a setting)",
}
_GAP_FIELDS = {"args": "tool arguments", "result": "tool results", "content": "LLM call contents"}


def _evidence_phrase(evidence: str) -> str:
    if evidence.startswith("vendor_key:"):
        return f"a vendor key we mapped ({evidence.split(':', 1)[1]}, not the GenAI key)"
    return _EVIDENCE_NAMES.get(evidence, evidence)


def _step_evidence_sentences(evidence: dict[str, dict[str, int]]) -> list[str]:
    out = []
    for kind, what in (("tool_call", "tool call arguments"), ("llm_call", "LLM call contents")):
        if evidence[kind]:
            parts = ", ".join(f"{n} from {_evidence_phrase(e)}" for e, n in evidence[kind].items())
            out.append(f"Evidence for {what}: {parts}.")
    return out


def _gap_reason(reason: str) -> str:
    if reason.startswith("unknown_key:"):
        return f"the span carries a key we could not map ({reason.split(':', 1)[1]}): the value may be there under a name we do not read"
    return _GAP_REASONS.get(reason, reason)


def _gap_sentence(gaps: dict[str, int]) -> str:
    parts = "; ".join(f"{n} {_GAP_FIELDS.get(g.split(':', 1)[0], g.split(':', 1)[0])}: {_gap_reason(g.split(':', 1)[1])}"
                      for g, n in gaps.items())
    return f"Missing values and why: {parts}."


def _shape_sentences(shapes: dict[str, dict[str, int]], tools: dict[str, Any]) -> list[str]:
    out = []
    if shapes["unwrapped"]:
        parts = "; ".join(_shape_phrase(s, n) for s, n in shapes["unwrapped"].items())
        out.append(f"Recognised framework wrappers and dumps, unwrapped to the value inside: {parts}.")
    kept = shapes["kept_as_is"]
    if kept:
        parts = "; ".join(_shape_phrase(s, n) for s, n in kept.items())
        text = f"Kept as they came (shape not recognised): {parts}."
        if any(s.startswith("args:") for s in kept):
            text += (f" {tools.get('bare_args_replaced_by_llm_output', 0)} bare tool arguments were replaced by the model's"
                     " proposed call object; arguments that stay bare cannot be checked by name.")
        if any(s.startswith(("input:", "output:")) for s in kept):
            text += " A run input or output kept as it came gives way to the LLM spans' request and answer where they have them."
        out.append(text)
    return out


def _task_key_sentence(sources: dict[str, int], trajs: dict[str, Any]) -> str:
    names = {"input_hash": "a hash of the normalised request", "none": "nothing (no key, no input)"}
    parts = ", ".join(f"{n} from {names.get(s, s.replace('attribute:', 'attribute '))}" for s, n in sources.items())
    text = f"Task keys: {parts}."
    if sources.get("none"):
        text += (f" {sources['none']} runs have no task key and no recorded request, so they cannot be grouped by task:"
                 " set plumbline.task.key, or turn content capture on so the request is recorded.")
    if trajs["task_key_from_attribute"] < trajs["trajectories"]:
        text += (" A hashed request splits a task whose request is reworded: set plumbline.task.key on the run's root span"
                 " or resource (or name your own attribute with --task-key / storage.task_keys).")
    if trajs["with_session_or_conversation_id"]:
        text += (f" {trajs['with_session_or_conversation_id']} runs carry a session or conversation id; it is kept in the run's"
                 " context, not used as the task key, because one conversation holds many tasks (pass --task-key session.id"
                 " if yours holds exactly one).")
    return text



def report_from_counts(counts: dict[str, Any]) -> dict[str, Any]:
    """The report from (possibly summed) counts: overall, per service when there are several, rejected input."""
    services = dict(sorted(counts["services"].items(), key=lambda kv: (kv[0] == "None", kv[0])))
    return {
        "version": counts["version"],
        "overall": _section(counts["overall"]),
        "services": {name: _section(c) for name, c in services.items()} if len(services) > 1 else {},
        "rejected_input": counts["rejected_input"],
    }


def coverage_report(store: Reader, since_ns: int | None = None) -> dict[str, Any]:
    """The whole report: overall, per service, and the input rejected on the way in (a `Store` is a `Reader`)."""
    return report_from_counts(store.coverage_counts(since_ns))


def render_text(report: dict[str, Any]) -> str:
    """The report as a person reads it: headline counts, then the findings."""
    lines: list[str] = []
    for title, section in [("All traffic", report["overall"]), *report["services"].items()]:
        spans, tools, trajs, llm = section["spans"], section["tool_calls"], section["trajectories"], section["llm_calls"]
        conventions = ", ".join(f"{c} {v['spans']}" for c, v in spans["by_convention"].items())
        lines += [
            f"== {title} ==",
            f"spans {spans['spans']} in {spans['traces']} traces ({conventions})",
            f"tool calls {tools['tool_calls']}: structured args {_pct(tools['with_structured_args'], tools['tool_calls'])}, "
            f"results {_pct(tools['with_results'], tools['tool_calls'])}, call ids {_pct(tools['with_call_ids'], tools['tool_calls'])}, "
            f"failed {tools['failed']}",
            f"LLM calls {llm['llm_calls']} (from {spans['llm_spans']} spans): content {_pct(llm['with_content'], llm['llm_calls'])}, "
            f"token usage {_pct(llm['with_tokens'], llm['llm_calls'])}",
            f"trajectories {trajs['trajectories']}: input {_pct(trajs['with_input'], trajs['trajectories'])}, "
            f"final output {_pct(trajs['with_final_output'], trajs['trajectories'])}, tasks {trajs['tasks']} "
            f"({trajs['tasks_seen_more_than_once']} seen more than once); task keys from "
            + (", ".join(f"{src} {n}" for src, n in section["task_key_sources"].items()) or "n/a"),
            *(f"- {f}" for f in section["findings"]),
            "",
        ]
    rejected = report["rejected_input"]
    if rejected["problems"]:
        lines.append(f"Rejected on the way in: {rejected['problems']} problems, {rejected['rejected_spans']} spans (see `plumbline ingest` output).")
    return "\n".join(lines).rstrip() + "\n"
