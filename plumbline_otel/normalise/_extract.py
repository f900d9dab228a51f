"""What a span means: the convention that wrote it, its step kind, and the step fields.

Detection is per span, in the order of the research notes: OpenInference first (it may dual-write
GenAI keys, which then only fill gaps), then current GenAI, Traceloop entity spans, older GenAI
forms; anything else is kept as a plain span. Each reader only fills fields still empty, so a
dual-written span takes the first convention's value and the other's gaps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from plumbline_otel.model import Convention, RunEvent, SpanRecord, StepKind, ToolCallRef, ToolDecision
from plumbline_otel.normalise._messages import Message, answer_in_order, parse_args, parse_messages, response_messages, result_is_error
from plumbline_otel.normalise._shapes import (
    TOOL_ERROR_SHAPE,
    answer_text,
    repr_messages,
    request_text,
    response_repr,
    tool_message_call,
    unwrap_args,
    unwrap_result,
    unwrap_scoped_result,
)
from plumbline_otel.normalise._values import as_text, count_of, is_redacted, maybe_json, text_of, unflatten

_GENAI_KINDS: dict[str, StepKind] = {
    "execute_tool": "tool_call",
    "chat": "llm_call",
    "text_completion": "llm_call",
    "generate_content": "llm_call",
    "completion": "llm_call",
    "invoke_agent": "agent",
    # A run of an in-process agent or workflow (semantic-conventions-genai's `gen_ai.invocation.internal`):
    # the release notes name the workflow operation `invoke_workflow`, the later change (#571) `handle_conversation_turn`.
    "invoke_workflow": "agent",
    "handle_conversation_turn": "agent",
    "create_agent": "other",
    # Agent planning and background-response polling: model work whose token usage counts.
    "plan": "llm_call",
    "fetch_response": "llm_call",
}
# Hand-off attributes (semantic-conventions-genai examples) and the span name OpenInference gives an OpenAI Agents hand-off.
# OpenTelemetry's openai-agents-v2 writes an `agent_handoff` span with `gen_ai.handoff.from_agent`/`.to_agent`.
HANDOFF_KEYS = ("gen_ai.agent.handoff.target.name", "gen_ai.transfer.target.name", "gen_ai.handoff.to_agent")
_HANDOFF_PREFIX = "handoff to "
_OI_KINDS: dict[str, StepKind] = {"TOOL": "tool_call", "LLM": "llm_call", "AGENT": "agent"}
# The Vercel AI SDK's own spans (AI SDK 6 and earlier, and AI SDK 7's `LegacyOpenTelemetry`; scope `ai`): the
# span's role is in `ai.operationId`. A generate/stream call is a run (an agent step when nested in a tool: a
# sub-agent), its doGenerate/doStream spans the model requests, `ai.toolCall` a tool.
_VERCEL_KINDS: dict[str, StepKind] = {
    "ai.toolCall": "tool_call",
    "ai.generateText": "agent", "ai.streamText": "agent", "ai.generateObject": "agent", "ai.streamObject": "agent",
    "ai.generateText.doGenerate": "llm_call", "ai.streamText.doStream": "llm_call",
    "ai.generateObject.doGenerate": "llm_call", "ai.streamObject.doStream": "llm_call",
}
_TRACELOOP_KINDS: dict[str, StepKind] = {"tool": "tool_call", "workflow": "agent", "agent": "agent"}
# Tools a framework calls to end a run, not tools of the user's: their argument is the answer (smolagents'
# `final_answer`; DSPy ReAct's `finish` and ReActV2's `submit`). They are no tool step; the answer is the run's.
_DSPY_SCOPE = "openinference.instrumentation.dspy"
_ANSWER_TOOLS = {("openinference.instrumentation.smolagents", "final_answer"), (_DSPY_SCOPE, "finish"), (_DSPY_SCOPE, "submit")}
# A tool span named after the method that ran it (DSPy's `lookup_order.__call__`): the tool is the part before it.
_METHOD_SUFFIXES = (".__call__", ".acall", ".__acall__")
# The classes LangChain JS makes tools of (`tool()`, `new DynamicStructuredTool`): a tracer that names tool spans by
# the tool's class (Traceloop for Node) names none of them; the tool's name is then its ToolMessage's, or the model's
# for the call whose arguments it ran (assembly).
_TOOL_CLASSES = {"DynamicStructuredTool", "DynamicTool", "StructuredTool"}
# Tool spans that summarise other tool spans: Google ADK's span over parallel calls' merged responses.
_SUMMARY_TOOLS = {("gcp.vertex.agent", "(merged tools)")}
# Langfuse's own convention (its SDKs since v3 export OTLP spans): `langfuse.observation.type` says what the span is,
# `.input`/`.output` what it was given and returned (JSON), `.model.name` and `.usage_details` a generation's model and
# tokens, `.level=ERROR` with `.status_message` a failure. The other types (span, chain, event, …) are no step.
LANGFUSE_TYPE = "langfuse.observation.type"
_LANGFUSE_KINDS: dict[str, StepKind] = {"generation": "llm_call", "tool": "tool_call", "agent": "agent"}
_LANGFUSE_IN, _LANGFUSE_OUT = "langfuse.observation.input", "langfuse.observation.output"
# What a model call's span records besides messages; a span with messages and none of these made no call itself.
_MODEL_CALL_KEYS = ("gen_ai.request.model", "gen_ai.response.model", "gen_ai.response.id", "gen_ai.provider.name", "gen_ai.system",
                    "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens", "gen_ai.usage.prompt_tokens",
                    "gen_ai.usage.completion_tokens", "gen_ai.response.finish_reasons")
_GENAI_MARKERS = ("gen_ai.operation.name", "gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.tool.name", "gen_ai.provider.name",
                  "gen_ai.input.messages_delta")
_EVENT_MESSAGES = {
    "gen_ai.system.message": "system",
    "gen_ai.user.message": "user",
    "gen_ai.assistant.message": "assistant",
    "gen_ai.tool.message": "tool",
}


def _run_wrapper(attrs: dict[str, Any]) -> bool:
    """Messages keys holding plain text (not a message list or message) on a span with nothing of a model call."""
    if any(key in attrs for key in _MODEL_CALL_KEYS):
        return False
    values = [attrs[k] for k in ("gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.input.messages_delta") if k in attrs]
    return bool(values) and all(isinstance(v, str) and isinstance(maybe_json(v), str) for v in values)


def _placeholder_name(name: str | None) -> bool:
    """A tool name that no model can call: wholly in parentheses (`(merged tools)`); model APIs name functions by
    letters, digits, `_` and `-`, and a display name (CrewAI's) has no parentheses around it."""
    return bool(name) and name is not None and name.startswith("(") and name.endswith(")")


def detect(attrs: dict[str, Any]) -> tuple[Convention, StepKind]:
    """The convention a span was written in and what kind of step it is."""
    oi_kind = attrs.get("openinference.span.kind")
    if isinstance(oi_kind, str):
        handoff = str(attrs.get("tool.name", "")).startswith(_HANDOFF_PREFIX) or any(key in attrs for key in HANDOFF_KEYS)
        return "openinference", "agent" if handoff else _OI_KINDS.get(oi_kind.upper(), "other")
    operation = attrs.get("gen_ai.operation.name")
    if "a2a.method.name" in attrs and operation is None:  # an A2A client or server span: a call of a (remote) agent
        return "genai", "agent"
    vercel = attrs.get("ai.operationId")
    if isinstance(vercel, str) and operation is None:
        return "vercel_ai", _VERCEL_KINDS.get(vercel, "other")
    if attrs.get("mcp.method.name") == "tools/call":
        operation = "execute_tool"
    if any(key in attrs for key in HANDOFF_KEYS):
        return "genai", "agent"
    tl_kind = attrs.get("traceloop.span.kind")
    langfuse = attrs.get(LANGFUSE_TYPE)
    if isinstance(langfuse, str) and operation is None and not any(key in attrs for key in _GENAI_MARKERS):
        return "genai", _LANGFUSE_KINDS.get(langfuse, "other")  # a vendor's keys, read like GenAI's
    if any(key in attrs for key in _GENAI_MARKERS):
        if operation is None and "gen_ai.tool.name" in attrs:
            operation = "execute_tool"
        elif operation is None and ("gen_ai.input.messages" in attrs or "gen_ai.output.messages" in attrs or "gen_ai.input.messages_delta" in attrs):
            if _run_wrapper(attrs):
                # Nothing of a model call (no model, provider, tokens or response id) and "messages" that are plain
                # text, no message list: a span around a run recording what it answered (OpenLIT's `start_trace` with
                # `set_result`), not a model call; the calls are the spans beneath it.
                return "genai", "other"
            operation = "chat"
        if operation == "agent_step" and ("mastra.model_step.input" in attrs or "mastra.model_step.output" in attrs):
            # Mastra's model step: the request and response (with the proposed calls) of the chat span inside
            # it, whose own output messages lose the tool calls; assembly merges the two into one model call.
            return "genai", "llm_call"
        if operation is not None:
            return "genai", _GENAI_KINDS.get(str(operation), "other")
        if not isinstance(tl_kind, str):  # a provider name alone says nothing about what the span did
            return "genai", "other"
    if isinstance(tl_kind, str):
        return "traceloop", _TRACELOOP_KINDS.get(tl_kind, "other")
    if "llm.request.type" in attrs or "gen_ai.system" in attrs or any(k.startswith(("gen_ai.prompt.", "gen_ai.completion.")) for k in attrs):
        return "genai_legacy", "llm_call"
    return "unknown", "other"


def _first(attrs: dict[str, Any], *keys: str) -> Any:
    for key in keys:
        value = attrs.get(key)
        if value is not None and value != "":
            return value
    return None


# A field is filled once (the first convention read wins) and holds its own type: an attribute may
# hold any type (a tool name written as a number, a count as text). Each field is named at its call
# site, so mypy checks its type there and the compiled code reads and sets its slot directly.


def _or_text(current: str | None, value: Any) -> str | None:
    """`current` when it is set; else `value` as text (None stays None)."""
    if current or value is None:
        return current
    text = as_text(value)
    return current if text is None else text


def _or_count(current: int | None, value: Any) -> int | None:
    """`current` when it is set (not 0); else `value` as a count (`count_of`), when it is one."""
    if current or value is None:
        return current
    count = count_of(value)
    return current if count is None else count


def _note(rec: SpanRecord, what: str, shape: str | None) -> None:
    """Remember a wrapper or dump we unwrapped (or a shape we kept as it came) for coverage."""
    if shape and f"{what}:{shape}" not in rec.shapes:
        rec.shapes.append(f"{what}:{shape}")


def _evidence(rec: SpanRecord, what: str, key: str) -> None:
    """Remember which key (or event, or log record) a field was read from, for coverage."""
    rec.evidence = [e for e in rec.evidence if not e.startswith(what + ":")] + [f"{what}:{key}"]


def _set_args(rec: SpanRecord, raw: Any, key: str = "") -> None:
    if rec.args_state in ("structured", "unparsed"):
        return
    value, call_id, shape = (raw, None, None) if is_redacted(raw) else unwrap_args(raw)
    args, state = parse_args(value)
    if state != "absent" or rec.args_state == "absent":
        rec.args, rec.args_state = args, state
        _note(rec, "args", shape or ("scalar" if state == "unparsed" else None))
        rec.call_id = _or_text(rec.call_id, call_id)
        if state != "absent" and key:
            _evidence(rec, "args", key)


def _set_result(rec: SpanRecord, raw: Any, key: str = "") -> None:
    if rec.result is None and raw is not None:
        rec.result, shape = unwrap_result(raw)
        _note(rec, "result", shape)
        rec.result, shape = unwrap_scoped_result(rec.result, rec.scope_name)
        _note(rec, "result", shape)
        if key and rec.result is not None:
            _evidence(rec, "result", key)


def _first_key(attrs: dict[str, Any], *keys: str) -> tuple[Any, str]:
    """The first present value among `keys`, with the key it came from."""
    for key in keys:
        value = attrs.get(key)
        if value is not None and value != "":
            return value, key
    return None, ""


def _entity_value(raw: Any) -> tuple[Any, str | None]:
    """Traceloop entity payloads: `{"args": [x], "kwargs": {}}` and LangChain's `{"inputs"|"outputs": x, …}`."""
    value = maybe_json(raw)
    if isinstance(value, dict):
        for key in ("inputs", "outputs"):
            if key in value and set(value) - {key} <= {"tags", "metadata", "kwargs", "args"}:
                return value[key], "traceloop_entity"
        if "args" in value and not value.get("kwargs") and len(value["args"] or []) == 1:
            return value["args"][0], None
    return value, None


def _run_texts(rec: SpanRecord, raw_input: Any, raw_output: Any) -> None:
    """The run's request and answer from an agent (or root) span's recorded input and output."""
    if rec.input_text is None:
        rec.input_text = _run_text(rec, "input", raw_input, request_text)
    if rec.output_text is None:
        rec.output_text = _run_text(rec, "output", raw_output, answer_text)


def _run_text(rec: SpanRecord, field: str, raw: Any, read: Callable[[Any], tuple[str | None, str | None]]) -> str | None:
    """One side of a run (`read` knows its dump shapes), noting the shape it came in; else the value as text."""
    if raw is None or is_redacted(raw):
        return None
    value, outer = _entity_value(raw)
    text, shape = read(value)
    _note(rec, field, shape or outer)
    return text if text is not None else text_of(value)


def _crew_request(raw_tasks: Any, raw_inputs: Any) -> str | None:
    """A CrewAI kickoff's request: its first task's description, with the kickoff inputs put into its `{placeholders}`."""
    tasks = maybe_json(raw_tasks)
    first = tasks[0] if isinstance(tasks, list) and tasks and isinstance(tasks[0], dict) else {}
    description = first.get("description")
    if not isinstance(description, str):
        return None
    inputs = maybe_json(raw_inputs)
    if isinstance(inputs, dict):
        for key, value in inputs.items():
            description = description.replace("{" + str(key) + "}", value if isinstance(value, str) else str(value))
    return description


def _task_output_request(rec: SpanRecord, raw_output: Any) -> None:
    """A CrewAI agent span (it records no task in its input): the task's description from the TaskOutput it returned."""
    task = maybe_json(raw_output)
    if rec.input_text is None and isinstance(task, dict) and isinstance(task.get("description"), str) and "expected_output" in task:
        rec.input_text = str(task["description"])
        _note(rec, "input", "crewai_task_output")


# --- tool spans -------------------------------------------------------------------------------


def _tool_openinference(rec: SpanRecord, attrs: dict[str, Any]) -> None:
    rec.tool_name = _or_text(rec.tool_name, attrs.get("tool.name"))
    rec.call_id = _or_text(rec.call_id, _first(attrs, "tool.id", "tool_call.id"))
    _set_args(rec, attrs.get("input.value"), "input.value")
    params = maybe_json(attrs.get("tool.parameters"))
    looks_like_schema = isinstance(params, dict) and ("properties" in params or params.get("type") == "object")
    if not looks_like_schema:
        _set_args(rec, params, "tool.parameters")
    _set_result(rec, attrs.get("output.value"), "output.value")


# Vendor keys we map onto the GenAI ones: pydantic-ai before its GenAI alignment, older Google ADK releases.
# A Langfuse tool observation's input (the decorated function's `{args, kwargs}`) and output are its arguments and result.
VENDOR_ARGS_KEYS = ("tool_arguments", "gcp.vertex.agent.tool_call_args", _LANGFUSE_IN)
VENDOR_RESULT_KEYS = ("tool_response", "gcp.vertex.agent.tool_response", _LANGFUSE_OUT)


def _tool_genai(rec: SpanRecord, attrs: dict[str, Any]) -> None:
    rec.tool_name = _or_text(rec.tool_name, attrs.get("gen_ai.tool.name"))
    rec.call_id = _or_text(rec.call_id, attrs.get("gen_ai.tool.call.id"))
    _set_args(rec, *_first_key(attrs, "gen_ai.tool.call.arguments", *VENDOR_ARGS_KEYS))
    _set_result(rec, *_first_key(attrs, "gen_ai.tool.call.result", *VENDOR_RESULT_KEYS))


def _tool_vercel(rec: SpanRecord, attrs: dict[str, Any]) -> None:
    rec.tool_name = _or_text(rec.tool_name, attrs.get("ai.toolCall.name"))
    rec.call_id = _or_text(rec.call_id, attrs.get("ai.toolCall.id"))
    _set_args(rec, attrs.get("ai.toolCall.args"), "ai.toolCall.args")  # `JSON.stringify(input)`
    _set_result(rec, attrs.get("ai.toolCall.result"), "ai.toolCall.result")  # `JSON.stringify(output)`


def _tool_traceloop(rec: SpanRecord, attrs: dict[str, Any]) -> None:
    rec.tool_name = _or_text(rec.tool_name, _first(attrs, "gen_ai.tool.name", "traceloop.entity.name"))
    _set_args(rec, attrs.get("traceloop.entity.input"), "traceloop.entity.input")
    _set_result(rec, attrs.get("traceloop.entity.output"), "traceloop.entity.output")


def _tool_from_events(rec: SpanRecord, events: list[tuple[str, dict[str, Any]]], origin: str = "event") -> None:
    """Tool spans whose arguments and result are in events: strands' span events, or log records.

    Three forms: the older per-message events (`gen_ai.tool.message` {content, id} and
    `gen_ai.choice` {message}), any event carrying `gen_ai.tool.call.arguments` / `.result`, and
    `operation.details` with `tool_call` / `tool_call_response` parts.
    """
    for name, eattrs in events:
        where = f"{origin}:{name}"
        if name == "gen_ai.tool.message":
            _set_args(rec, eattrs.get("content"), where)
            rec.call_id = _or_text(rec.call_id, eattrs.get("id"))
        elif name == "gen_ai.choice":
            _set_result(rec, eattrs.get("message"), where)
        _set_args(rec, eattrs.get("gen_ai.tool.call.arguments"), where)
        _set_result(rec, eattrs.get("gen_ai.tool.call.result"), where)
        if name == "gen_ai.client.inference.operation.details":
            inputs, outputs = _messages_genai(eattrs, [])
            calls = [c for m in inputs + outputs for c in m.calls if c.call_id in (None, rec.call_id)]
            results = [r for m in inputs + outputs for r in m.results if r.call_id == rec.call_id]
            if calls:
                _set_args(rec, calls[0].args, where)
            if results:
                _set_result(rec, results[0].result, where)


# --- LLM spans --------------------------------------------------------------------------------


def _messages_genai(attrs: dict[str, Any], events: list[tuple[str, dict[str, Any]]]) -> tuple[list[Message], list[Message]]:
    # `gen_ai.input.messages_delta` (semantic-conventions-genai #365): only what this request appended to the
    # conversation; the new tool results and user message are in it, which is what a step needs.
    inputs = parse_messages(_first(attrs, "gen_ai.input.messages", "gen_ai.input.messages_delta"))
    outputs = parse_messages(attrs.get("gen_ai.output.messages"))
    for name, eattrs in events:
        if name == "gen_ai.client.inference.operation.details":
            inputs = inputs or parse_messages(eattrs.get("gen_ai.input.messages"))
            outputs = outputs or parse_messages(eattrs.get("gen_ai.output.messages"))
        elif name in _EVENT_MESSAGES:
            body = maybe_json(eattrs.get("content"))
            body = body if isinstance(body, dict) else {"content": body}
            inputs += parse_messages({"role": _EVENT_MESSAGES[name], **eattrs, **body})
        elif name == "gen_ai.choice":  # strands: a plain string on agent spans, content blocks on chat spans
            body = maybe_json(eattrs.get("content")) if "message" not in eattrs else None
            if isinstance(body, dict):  # a log record's body given as JSON text (Semantic Kernel's): {message, finish_reason}
                eattrs = {**eattrs, **body}
            message = maybe_json(eattrs.get("message"))
            if not isinstance(message, dict):
                message = {"role": "assistant", "content": message, "tool_calls": maybe_json(eattrs.get("tool_calls"))}
            elif not message.get("tool_calls") and eattrs.get("tool_calls"):  # Traceloop's: the calls beside the message
                message = {**message, "tool_calls": maybe_json(eattrs["tool_calls"])}
            outputs += parse_messages(message)
        elif name == "gen_ai.content.prompt":
            inputs += parse_messages(eattrs.get("gen_ai.prompt"))
        elif name == "gen_ai.content.completion":
            outputs += parse_messages(eattrs.get("gen_ai.completion"))
    return (answer_in_order(inputs) if events else inputs), outputs


def _messages_flat(attrs: dict[str, Any], in_prefix: str, out_prefix: str) -> tuple[list[Message], list[Message]]:
    def read(prefix: str) -> list[Message]:
        whole = attrs.get(prefix)  # some producers send the unflattened list under the prefix itself
        return parse_messages(whole if whole is not None else unflatten(attrs, prefix))

    return read(in_prefix), read(out_prefix)


def _llm_fields(rec: SpanRecord, attrs: dict[str, Any]) -> None:
    rec.model = _or_text(rec.model, _first(attrs, "gen_ai.response.model", "llm.response.model_name", "llm.model_name",
                                           "gen_ai.request.model", "llm.request.model_name", "ai.response.model", "ai.model.id"))
    provider = str(_first(attrs, "gen_ai.provider.name", "gen_ai.system", "llm.provider", "llm.system") or "").lower()
    rec.provider = _or_text(rec.provider, provider or None)
    rec.response_id = _or_text(rec.response_id, attrs.get("gen_ai.response.id"))
    # `ai.usage.*`: the Vercel AI SDK's own (promptTokens/completionTokens before AI SDK 5).
    rec.input_tokens = _or_count(rec.input_tokens, _first(attrs, "gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens", "llm.token_count.prompt",
                                                          "ai.usage.inputTokens", "ai.usage.promptTokens"))
    rec.output_tokens = _or_count(rec.output_tokens, _first(attrs, "gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens",
                                                            "llm.token_count.completion", "ai.usage.outputTokens", "ai.usage.completionTokens"))
    # `cache_write` since semantic-conventions-genai #440; `cache_creation` in semconv 1.40-1.41; strands' own names.
    rec.cache_read_tokens = _or_count(rec.cache_read_tokens, _first(attrs, "gen_ai.usage.cache_read.input_tokens",
                                                                    "gen_ai.usage.cache_read_input_tokens", "llm.token_count.prompt_details.cache_read"))
    rec.cache_write_tokens = _or_count(rec.cache_write_tokens, _first(attrs, "gen_ai.usage.cache_write.input_tokens", "gen_ai.usage.cache_creation.input_tokens",
                                                                      "gen_ai.usage.cache_write_input_tokens", "llm.token_count.prompt_details.cache_write"))
    _cost(rec, attrs)
    reasons = _first(attrs, "gen_ai.response.finish_reasons", "llm.finish_reason", "ai.response.finishReason")
    if reasons and not rec.finish_reasons:
        reasons = maybe_json(reasons)
        rec.finish_reasons = [str(r) for r in reasons] if isinstance(reasons, list) else [str(reasons)]


def _cost(rec: SpanRecord, attrs: dict[str, Any]) -> None:
    """`gen_ai.usage.cost.*` (semantic-conventions-genai #443): the amount, its currency and who priced it (`provider`:
    the response carried it; `local`: the emitter computed it). Kept as reported; an amount that is no number is none."""
    amount = attrs.get("gen_ai.usage.cost.amount")
    if rec.cost_amount is not None or amount is None or isinstance(amount, bool):
        return
    try:
        rec.cost_amount = float(amount)
    except (TypeError, ValueError):
        return
    rec.cost_currency = as_text(attrs.get("gen_ai.usage.cost.currency"))
    rec.cost_source = as_text(attrs.get("gen_ai.usage.cost.source"))


_ASSISTANT_ROLES = ("assistant", "model", "ai")


def begins_new_turn(inputs: list[Message], answer_tools: frozenset[str] = frozenset()) -> bool:
    """A request that opens a new user turn of a conversation: its history holds a user's message the model
    answered in full, and the user has spoken since the model last did. An answer in full is an assistant message
    with text and no tool calls, or one that only calls the framework's tool for the answer (`answer_tools`: DSPy
    ReActV2 sends its `submit` call and result back as the history of the turn it closed). The model's last message
    must be that answer: a framework that ends every request with a user message of its own template (DSPy's
    "Respond with the corresponding output fields") sends one after the model's tool calls too. The new message must
    differ from the one the model answered: the same request sent again is the turn going on.

    Each turn of a conversation sends the history so far, so the first model call of every turn after the first
    reads so; assembly splits a trace's runs there (`assemble.split_runs`) when no span marks the turns itself.
    """
    said = [m for m in inputs if m.role != "system"]
    if len(said) < 3 or said[-1].role != "user" or not said[-1].texts or said[-1].results:
        return False

    def answers(m: Message) -> bool:
        if m.calls:
            return all(c.name in answer_tools for c in m.calls)
        return bool(m.texts)

    answered = next((i for i in range(len(said) - 2, 0, -1) if said[i].role in _ASSISTANT_ROLES), None)
    if answered is None or not answers(said[answered]):
        return False
    asked = [m for m in said[:answered] if m.role == "user" and m.texts and not m.results]
    # The request the model answered, sent again (the previous call's input already held it): the same turn going
    # on (OpenTelemetry's openai-v2 under the Agents SDK records such a resend), not a new one.
    return bool(asked) and asked[-1].texts != said[-1].texts


def _apply_messages(rec: SpanRecord, inputs: list[Message], outputs: list[Message]) -> None:
    if not (inputs or outputs):
        return
    if rec.step_kind == "llm_call" and begins_new_turn(inputs, _answer_tools(rec.scope_name)):
        _note(rec, "step", "new_user_turn")
    rec.content_captured = rec.content_captured or any(m.texts or m.calls or m.results for m in inputs + outputs)
    if not rec.proposed_calls:  # renumbered across output messages: the order the model proposed them
        calls = [c for m in outputs for c in m.calls]
        rec.proposed_calls = [c if c.index == i else ToolCallRef(c.name, c.args, c.call_id, i) for i, c in enumerate(calls)]
    if not rec.tool_results:
        rec.tool_results = [r for m in inputs for r in m.results]
    users = [m for m in inputs if m.role == "user" and m.texts]
    if users and rec.input_text is None:
        rec.input_text = "\n".join(users[-1].texts)
    if rec.step_kind != "llm_call":
        # A run's span may hold the whole thread (a conversation's graph state: every assistant message so far); its
        # answer is its last assistant message, not all of them.
        said = [m for m in outputs if m.texts and (m.role is None or m.role in _ASSISTANT_ROLES)]  # mypyc: no starred tuple in `in`
        _note(rec, "output", "whole_thread" if len(said) > 1 and rec.output_text is None else None)
        outputs = said[-1:]
    texts = [t for m in outputs for t in m.texts]
    if texts and rec.output_text is None:
        rec.output_text = "\n".join(texts)


def _raw_gemini_reply(rec: SpanRecord, attrs: dict[str, Any]) -> list[Message]:
    """The reply as the raw response in `output.value` records it, when it is a Gemini response (`{content: {role,
    parts}}`): it decides over the flattened output messages, whose keys can outlive the call that wrote them
    (OpenInference on ADK 2 writes every model call of a run onto one span; a later reply's flattened keys leave an
    earlier one's `tool_calls.1` in place)."""
    reply = maybe_json(attrs.get("output.value"))
    content = reply.get("content") if isinstance(reply, dict) else None
    if not (isinstance(content, dict) and isinstance(content.get("parts"), list)):
        return []
    parts: list[Any] = []
    for part in content["parts"]:
        call = part.get("function_call") if isinstance(part, dict) else None
        if isinstance(call, dict):
            parts.append({"type": "tool_call", "id": call.get("id"), "name": call.get("name"), "arguments": call.get("args")})
        elif isinstance(part, dict) and isinstance(part.get("text"), str) and not part.get("thought"):
            parts.append({"type": "text", "content": part["text"]})
    _note(rec, "output", "gemini_response" if parts else None)
    return parse_messages({"role": "assistant", "parts": parts}) if parts else []


def _unrepr_responses(rec: SpanRecord, outputs: list[Message]) -> list[Message]:
    """Output messages whose one text is a Responses object's Python repr, read as that response's output items: the
    text is a dump of the reply, not the reply (OpenTelemetry's openai-agents-v2 on a streamed run)."""
    out: list[Message] = []
    for m in outputs:
        dump = response_repr(m.texts[0]) if len(m.texts) == 1 and not m.calls else None
        read = response_messages(dump) if dump is not None else []
        if read:
            _note(rec, "output", "responses_repr")
        out += read or [m]
    return out


def _raw_reply_ids(rec: SpanRecord, attrs: dict[str, Any]) -> None:
    """Haystack's flattened output messages drop the tool calls' ids; its raw replies (message reprs) keep them."""
    if not rec.proposed_calls or all(c.call_id for c in rec.proposed_calls):
        return
    reply = maybe_json(attrs.get("output.value"))
    if not (isinstance(reply, dict) and isinstance(reply.get("replies"), list)):
        return
    raw, reprs = repr_messages(reply["replies"])
    calls = [c for m in parse_messages(raw) for c in m.calls] if reprs else []
    if [c.name for c in calls] == [c.name for c in rec.proposed_calls]:
        rec.proposed_calls = [ToolCallRef(c.name, c.args, c.call_id or mine.call_id, i) for i, (c, mine) in enumerate(zip(calls, rec.proposed_calls))]
        _note(rec, "output", "message_reprs")


def _raw_request_results(rec: SpanRecord, attrs: dict[str, Any]) -> None:
    """OpenInference flattening drops `is_error` from tool results, or the results themselves (Haystack's flattened
    messages keep only their roles); the raw request in `input.value` keeps them (Haystack's as message reprs)."""
    request = maybe_json(attrs.get("input.value"))
    if not (isinstance(request, dict) and isinstance(request.get("messages"), list)):
        return
    raw, reprs = repr_messages(request["messages"])
    if not (rec.tool_results or reprs):
        return
    results = [r for m in parse_messages(raw) for r in m.results]
    if not rec.tool_results:
        rec.tool_results = results
        _note(rec, "input", "message_reprs" if results else None)
        return
    failed = {r.call_id for r in results if r.error}
    rec.tool_results = [replace(r, error=True) if r.call_id in failed else r for r in rec.tool_results]


def _program_call(rec: SpanRecord, attrs: dict[str, Any]) -> bool:
    """A DSPy program's call (`{"input_args": …}`, its input fields) records the run's request and answer wherever it
    runs: under an app's span, each turn of a conversation is one (its inner modules record other inputs)."""
    raw = attrs.get("input.value")
    return rec.scope_name == _DSPY_SCOPE and isinstance(raw, str) and raw.startswith('{"input_args": ')


def _raw_request_turn(rec: SpanRecord, attrs: dict[str, Any]) -> None:
    """A turn closed by the framework's answer tool shows only in the raw request: OpenInference flattening keeps no
    tool calls of the assistant messages DSPy sends back (`input.value` keeps them)."""
    answer_tools = _answer_tools(rec.scope_name)
    if not answer_tools or "step:new_user_turn" in rec.shapes:
        return
    request = maybe_json(attrs.get("input.value"))
    if isinstance(request, dict) and isinstance(request.get("messages"), list) \
            and begins_new_turn(parse_messages(request["messages"]), answer_tools):
        _note(rec, "step", "new_user_turn")


def _answer_tools(scope: str) -> frozenset[str]:
    return frozenset(name for instrumentation, name in _ANSWER_TOOLS if instrumentation == scope)


def _vercel_outputs(attrs: dict[str, Any]) -> list[Message]:
    """A Vercel AI SDK response: `ai.response.text` and `ai.response.toolCalls` (`input` a JSON string or an object)."""
    return _text_and_calls(attrs.get("ai.response.text"), attrs.get("ai.response.toolCalls"))


def _text_and_calls(text: Any, raw_calls: Any) -> list[Message]:
    """A response given as its text and its tool calls (AI SDK tool-call objects: toolCallId, toolName, input or args)."""
    content: list[Any] = []
    if isinstance(text, str) and text:
        content.append({"type": "text", "text": text})
    calls = maybe_json(raw_calls)
    if isinstance(calls, list):
        content += [{**c, "type": "tool-call"} for c in calls if isinstance(c, dict)]
    return parse_messages({"role": "assistant", "content": content}) if content else []


def _vercel_request(rec: SpanRecord, raw: Any) -> str | None:
    """A Vercel AI SDK run's `ai.prompt`: `{system, prompt}` (a string or messages) or `{system, messages}`."""
    prompt = maybe_json(raw)
    if not isinstance(prompt, dict):
        return None
    _note(rec, "input", "vercel_ai_prompt")
    if isinstance(prompt.get("prompt"), str):
        return str(prompt["prompt"])
    messages = prompt.get("messages") if isinstance(prompt.get("messages"), list) else prompt.get("prompt")
    users = [m for m in parse_messages(messages) if m.role == "user" and m.texts]
    return "\n".join(users[-1].texts) if users else None


def _langfuse_generation(rec: SpanRecord, attrs: dict[str, Any]) -> None:
    """A Langfuse generation: its input is the request (`{messages, tools}` from Langfuse's OpenAI integration, or a
    message list), its output the response message or its text; model and tokens under Langfuse's own keys."""
    rec.model = _or_text(rec.model, attrs.get("langfuse.observation.model.name"))
    usage = maybe_json(attrs.get("langfuse.observation.usage_details"))
    if isinstance(usage, dict):
        rec.input_tokens = _or_count(rec.input_tokens, _first(usage, "input", "prompt_tokens", "input_tokens"))
        rec.output_tokens = _or_count(rec.output_tokens, _first(usage, "output", "completion_tokens", "output_tokens"))
    reason = maybe_json(attrs.get("langfuse.observation.metadata.finish_reason"))
    if isinstance(reason, str) and reason and not rec.finish_reasons:
        rec.finish_reasons = [reason]
    request = maybe_json(attrs.get(_LANGFUSE_IN))
    inputs = parse_messages(request["messages"] if isinstance(request, dict) and "messages" in request else request)
    reply = maybe_json(attrs.get(_LANGFUSE_OUT))
    outputs = [Message("assistant", [reply])] if isinstance(reply, str) and reply else parse_messages(reply)
    if inputs or outputs:
        _evidence(rec, "content", _LANGFUSE_IN)
    _apply_messages(rec, inputs, [m if m.role else Message("assistant", m.texts, m.calls, m.results) for m in outputs])


def _llm(rec: SpanRecord, attrs: dict[str, Any], events: list[tuple[str, dict[str, Any]]]) -> None:
    _llm_fields(rec, attrs)
    if LANGFUSE_TYPE in attrs:
        _langfuse_generation(rec, attrs)
    if rec.convention == "vercel_ai":
        _apply_messages(rec, parse_messages(attrs.get("ai.prompt.messages")), _vercel_outputs(attrs))
    if "mastra.model_step.input" in attrs or "mastra.model_step.output" in attrs:  # Mastra: `{text, toolCalls}`
        step = maybe_json(attrs.get("mastra.model_step.output"))
        outputs = _text_and_calls(step.get("text"), step.get("toolCalls")) if isinstance(step, dict) else []
        _apply_messages(rec, parse_messages(attrs.get("mastra.model_step.input")), outputs)
        _note(rec, "content", "mastra_model_step")
    if rec.convention == "openinference":
        inputs, outputs = _messages_flat(attrs, "llm.input_messages", "llm.output_messages")
        _apply_messages(rec, inputs, _raw_gemini_reply(rec, attrs) or outputs)
        if rec.output_text is None and not rec.proposed_calls:  # a streamed response: only the Responses dump
            outputs = response_messages(attrs.get("output.value"))
            _apply_messages(rec, [], outputs)
            _note(rec, "output", "responses_dump" if outputs else None)
        _raw_request_results(rec, attrs)
        _raw_request_turn(rec, attrs)
        _raw_reply_ids(rec, attrs)
        if rec.content_captured:
            return  # GenAI keys on an OpenInference span only fill gaps
        if rec.input_tokens is None and rec.output_tokens is None and "input.value" in attrs:
            # Its payload was recorded and holds no chat: local work such as LlamaIndex's
            # `_prepare_chat_with_tools`, not a model request (assembly drops it beside the real call).
            _note(rec, "step", "no_model_request")
    inputs, outputs = _messages_genai(attrs, events)
    _apply_messages(rec, inputs, _unrepr_responses(rec, outputs))
    if not rec.content_captured:  # the older indexed form is only looked for when nothing newer was there
        _apply_messages(rec, *_messages_flat(attrs, "gen_ai.prompt", "gen_ai.completion"))
    elif not rec.proposed_calls and any(k.startswith("gen_ai.completion.") for k in attrs):
        # A response whose calls are only in the older indexed form, its output messages empty parts beside them
        # (LiteLLM's callback: `gen_ai.completion.{j}.function_call.name/arguments`, one j per call, no ids).
        _, flat = _messages_flat(attrs, "gen_ai.prompt", "gen_ai.completion")
        _apply_messages(rec, [], [Message("assistant", [], [c for m in flat for c in m.calls])] if any(m.calls for m in flat) else [])
        _note(rec, "output", "indexed_function_calls" if rec.proposed_calls else None)


def call_messages(attrs: dict[str, Any], events: list[tuple[str, dict[str, Any]]]) -> tuple[list[Message], list[Message]]:
    """A model call's request and response messages as `_llm` reads them, from the first convention that holds any
    (OpenInference's flattened list, GenAI's attributes and events or log records, the older indexed `gen_ai.prompt`,
    Langfuse's, the Vercel AI SDK's, Mastra's): what `threads` keys a per-call trace by."""
    inputs, outputs = _messages_flat(attrs, "llm.input_messages", "llm.output_messages")
    if not (inputs or outputs):
        inputs, outputs = _messages_genai(attrs, events)
    if not (inputs or outputs):
        inputs, outputs = _messages_flat(attrs, "gen_ai.prompt", "gen_ai.completion")
    if not (inputs or outputs):
        request, reply = maybe_json(attrs.get(_LANGFUSE_IN)), maybe_json(attrs.get(_LANGFUSE_OUT))
        inputs = parse_messages(request["messages"] if isinstance(request, dict) and "messages" in request else request)
        outputs = [Message("assistant", [reply])] if isinstance(reply, str) and reply else parse_messages(reply)
    if not (inputs or outputs):
        inputs, outputs = parse_messages(attrs.get("ai.prompt.messages")), _vercel_outputs(attrs)
    if not (inputs or outputs):
        step = maybe_json(attrs.get("mastra.model_step.output"))
        inputs = parse_messages(attrs.get("mastra.model_step.input"))
        outputs = _text_and_calls(step.get("text"), step.get("toolCalls")) if isinstance(step, dict) else []
    return inputs, [m if m.role else Message("assistant", m.texts, m.calls, m.results) for m in outputs]


# --- agent spans ------------------------------------------------------------------------------


def _agent(rec: SpanRecord, attrs: dict[str, Any], events: list[tuple[str, dict[str, Any]]]) -> None:
    target = _first(attrs, *HANDOFF_KEYS) or str(attrs.get("tool.name", "")).removeprefix(_HANDOFF_PREFIX)
    if target:  # control passes to another agent: a step of the run, not a tool of the user's
        rec.handoff_to = str(target)
        _note(rec, "step", "handoff")
        return
    if attrs.get("gen_ai.operation.name") == "handle_conversation_turn":  # one turn is one run
        _note(rec, "step", "conversation_turn")
    if "a2a.method.name" in attrs:  # an A2A client's or server's span of a call of a remote agent: one layer of it
        _note(rec, "step", "a2a")
    rec.agent_name = _or_text(rec.agent_name, _first(attrs, "gen_ai.agent.name", "agent.name", "graph.node.id"))
    if "task_id" in attrs and "crew_id" in attrs:
        _task_output_request(rec, attrs.get("output.value"))
    if rec.input_text is None and ("crewai.crew.tasks" in attrs or "crewai.task.description" in attrs):
        # CrewAI under Traceloop: the request is the (first) task's description, as under OpenInference, never the
        # prompt CrewAI's template makes of it (`Current Task: …`); the crew's result is its answer.
        rec.input_text = _crew_request(attrs.get("crewai.crew.tasks"), attrs.get("crewai.crew.inputs")) \
            or as_text(attrs.get("crewai.task.description"))
        _note(rec, "input", "crewai_tasks" if rec.input_text else None)
        rec.output_text = _or_text(rec.output_text, attrs.get("crewai.crew.result"))
    if rec.convention == "vercel_ai":
        rec.agent_name = _or_text(rec.agent_name, attrs.get("ai.telemetry.functionId"))
        rec.input_text = rec.input_text or _vercel_request(rec, attrs.get("ai.prompt"))
        answer = attrs.get("ai.response.text")
        rec.output_text = rec.output_text or (answer if isinstance(answer, str) and answer else None)
    _run_texts(rec, attrs.get("input.value"), attrs.get("output.value"))
    # Mastra's exporter puts the run's request and answer only under its own keys.
    _run_texts(rec, _first(attrs, "mastra.agent_run.input", "mastra.workflow_run.input"),
               _first(attrs, "mastra.agent_run.output", "mastra.workflow_run.output"))
    if rec.convention == "traceloop" or "traceloop.entity.input" in attrs:
        rec.agent_name = _or_text(rec.agent_name, attrs.get("traceloop.entity.name"))
        _run_texts(rec, attrs.get("traceloop.entity.input"), attrs.get("traceloop.entity.output"))
    if LANGFUSE_TYPE in attrs:  # the observation's, else the trace's input and output (set on the root)
        _run_texts(rec, _first(attrs, _LANGFUSE_IN, "langfuse.trace.input"), _first(attrs, _LANGFUSE_OUT, "langfuse.trace.output"))
    inputs, outputs = _messages_genai(attrs, events)
    _apply_messages(rec, inputs, outputs)
    _run_texts(rec, None, attrs.get("final_result"))
    rec.proposed_calls, rec.tool_results = [], []  # an agent span's history repeats its LLM calls'


# --- errors -----------------------------------------------------------------------------------


def _error(rec: SpanRecord, attrs: dict[str, Any], events: list[tuple[str, dict[str, Any]]]) -> str | None:
    """Status ERROR, `error.type`, an `exception` event, or an error-marked result all count."""
    for name, eattrs in events:
        if name == "exception":
            kind, message = eattrs.get("exception.type"), eattrs.get("exception.message")
            return ": ".join(str(x) for x in (kind, message) if x) or "exception"
    if rec.status_code == 2:
        return rec.status_message or str(attrs.get("error.type") or "error")
    if attrs.get("error.type"):
        return str(attrs["error.type"])
    if attrs.get("langfuse.observation.level") == "ERROR":
        return str(attrs.get("langfuse.observation.status_message") or "level ERROR")
    if attrs.get("gen_ai.tool.status") == "error":
        return "tool status error"
    if rec.step_kind == "tool_call" and (result_is_error(rec.result) or f"result:{TOOL_ERROR_SHAPE}" in rec.shapes):
        return "error result"
    return None


_TOOL_READERS: dict[str, list[Callable[[SpanRecord, dict[str, Any]], None]]] = {
    "openinference": [_tool_openinference, _tool_genai],
    "genai": [_tool_genai, _tool_traceloop, _tool_openinference],
    "traceloop": [_tool_traceloop, _tool_genai],
    "vercel_ai": [_tool_vercel, _tool_genai],
}
# The keys each tool reader reads: a reader none of whose keys a span has would change nothing on it.
_READER_KEYS: dict[Callable[[SpanRecord, dict[str, Any]], None], frozenset[str]] = {
    _tool_openinference: frozenset({"tool.name", "tool.id", "tool_call.id", "input.value", "tool.parameters", "output.value"}),
    _tool_genai: frozenset({"gen_ai.tool.name", "gen_ai.tool.call.id", "gen_ai.tool.call.arguments", "gen_ai.tool.call.result",
                            *VENDOR_ARGS_KEYS, *VENDOR_RESULT_KEYS}),
    _tool_traceloop: frozenset({"gen_ai.tool.name", "traceloop.entity.name", "traceloop.entity.input", "traceloop.entity.output"}),
    _tool_vercel: frozenset({"ai.toolCall.name", "ai.toolCall.id", "ai.toolCall.args", "ai.toolCall.result"}),
}


def extract(rec: SpanRecord, attrs: dict[str, Any], events: list[tuple[str, dict[str, Any]]]) -> None:
    """Fill the step fields of `rec` from its attributes and events."""
    if rec.step_kind == "tool_call":
        if attrs.get("mcp.method.name") == "tools/call":  # an MCP client's or server's span of a call: one layer of it
            _note(rec, "step", "mcp_tools_call")
        for reader in _TOOL_READERS.get(rec.convention, [_tool_genai]):
            if not _READER_KEYS[reader].isdisjoint(attrs):
                reader(rec, attrs)
        if events:
            _tool_from_events(rec, events)
        if rec.tool_name is None:
            _note(rec, "step", "tool_named_by_span")  # no tool-name key: inside another tool span, an event of that call
            name = rec.name.removeprefix("execute_tool ").removeprefix("tools/call ").strip()
            for suffix in _METHOD_SUFFIXES:
                name = name.removesuffix(suffix)
            rec.tool_name = name or rec.name
        if rec.call_id is None or rec.tool_name in _TOOL_CLASSES:
            named, call_id = tool_message_call(_first(attrs, "traceloop.entity.output", "gen_ai.tool.call.result", "output.value"))
            rec.call_id = _or_text(rec.call_id, call_id)
            if rec.tool_name in _TOOL_CLASSES:
                rec.tool_name = named
                _note(rec, "step", "tool_named_by_class")
        if is_redacted(rec.result):
            rec.result = None
        if (rec.scope_name, rec.tool_name) in _ANSWER_TOOLS:  # the run's answer, not a tool call
            rec.step_kind, rec.output_text = "other", answer_text(rec.result)[0] or text_of(rec.result)
            _note(rec, "step", "answer_tool")
        elif (rec.scope_name, rec.tool_name) in _SUMMARY_TOOLS or _placeholder_name(rec.tool_name):
            # The calls it merges have their own spans; a name in parentheses, no function's (`(merged tools)`, under
            # ADK's own tracing or OpenInference's), is a span about calls, not one.
            rec.step_kind = "other"
            _note(rec, "step", "merged_tools_summary")
    elif rec.step_kind == "llm_call":
        _llm(rec, attrs, events)
    elif rec.step_kind == "agent":
        _agent(rec, attrs, events)
    elif rec.parent_span_id is None or _program_call(rec, attrs):  # a root chain or workflow span: the run's request and answer
        _run_texts(rec, _first(attrs, "input.value", "traceloop.entity.input", _LANGFUSE_IN, "langfuse.trace.input"),
                   _first(attrs, "output.value", "traceloop.entity.output", _LANGFUSE_OUT, "langfuse.trace.output"))
        if rec.convention == "genai" and _run_wrapper(attrs):  # its texts are the run's request and answer
            _note(rec, "step", "run_wrapper")
            _run_texts(rec, attrs.get("gen_ai.input.messages"), attrs.get("gen_ai.output.messages"))
        if rec.input_text is None and "crew_tasks" in attrs:  # a CrewAI kickoff: the request is its tasks' description
            rec.input_text = _crew_request(attrs.get("crew_tasks"), attrs.get("crew_inputs"))
            _note(rec, "input", "crewai_tasks" if rec.input_text else None)
        if rec.input_text is not None and rec.parent_span_id is None:  # it holds one run, whatever agents run beneath it
            _note(rec, "step", "run_root")                                # (assembly does not split it)
    rec.error = _error(rec, attrs, events)
    decisions = [(name, eattrs) for name, eattrs in events if name == DECISION_EVENT]
    if decisions:  # the same event as a span event
        fold_events(rec, decisions)


# --- guardrail results and execution-state changes ---------------------------------------------

GUARDRAIL_EVENT = "gen_ai.guardrail.result"
RUN_EVENTS = (GUARDRAIL_EVENT, "gen_ai.execution.state.changed")


def guardrail_span(rec: SpanRecord, attrs: dict[str, Any]) -> None:
    """An `apply_guardrail` span is a guardrail result of its own: its `gen_ai.guardrail.*` keys (and `error.type`
    when the guardrail call failed), at its end, when the result was known."""
    if attrs.get("gen_ai.operation.name") == "apply_guardrail":
        own = {k: v for k, v in attrs.items() if k.startswith("gen_ai.guardrail.") or k == "error.type"}
        rec.run_events.append(RunEvent(GUARDRAIL_EVENT, own, rec.end_ns))


def add_run_events(rec: SpanRecord, events: list[tuple[str, dict[str, Any], int]]) -> None:
    """Guardrail results and execution-state changes among a span's events or log records, at their time (the
    span's end when they have none); one already held (a log record repeating a span event) is not added again."""
    for name, eattrs, time_ns in events:
        if name in RUN_EVENTS:
            event = RunEvent(name, dict(eattrs), time_ns or rec.end_ns)
            if event not in rec.run_events:
                rec.run_events.append(event)


# --- log records ------------------------------------------------------------------------------

DECISION_EVENT = "gen_ai.tool.call.decision"


def fold_events(rec: SpanRecord, events: list[tuple[str, dict[str, Any]]]) -> None:
    """Content a producer sent in log records of this span, read as the span's own events would be.

    Only fields still empty are filled, so folding twice, or a record that repeats the span, changes nothing.
    Tool call decisions are kept apart: they say whether a proposed call was allowed to run.
    """
    for name, eattrs in events:
        if name == DECISION_EVENT and eattrs.get("gen_ai.tool.call.decision.outcome"):
            rec.decisions.append(ToolDecision(
                outcome=str(eattrs["gen_ai.tool.call.decision.outcome"]),
                call_id=str(eattrs["gen_ai.tool.call.id"]) if eattrs.get("gen_ai.tool.call.id") else None,
                tool_name=str(eattrs["gen_ai.tool.name"]) if eattrs.get("gen_ai.tool.name") else None))
    events = [(n, a) for n, a in events if n != DECISION_EVENT and n not in RUN_EVENTS]
    if not events:
        return
    if rec.step_kind == "tool_call":
        _tool_from_events(rec, events, "log")
        return
    had_content = rec.content_captured
    if rec.step_kind == "llm_call":
        for _, eattrs in events:
            _llm_fields(rec, eattrs)
    inputs, outputs = _messages_genai({}, events)
    _apply_messages(rec, inputs, outputs)
    if rec.step_kind == "agent":
        rec.proposed_calls, rec.tool_results = [], []
    if rec.content_captured and not had_content:
        _evidence(rec, "content", "log:" + events[0][0])
