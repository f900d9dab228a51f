"""Chat messages in every shape producers write, read into one form.

GenAI `parts` messages, OpenAI-style `content`/`tool_calls`/`tool_call_id` messages, Anthropic
content blocks (`tool_use`, `tool_result`), and OpenInference's flattened `message.*` items all
become `Message`s. Calls and results are paired by part type and call id, never by role:
producers disagree on roles (tool results arrive on `user` messages) and on field names
(`response` vs `result`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from plumbline_otel.model import ArgsState, ToolCallRef, ToolResultRef
from plumbline_otel.normalise._shapes import unwrap_result
from plumbline_otel.normalise._values import is_redacted, maybe_json

# `Error: …` / `ValueError: …`, and frameworks' own wording for a failed tool (CrewAI's "Error executing tool",
# Haystack's "Failed to invoke Tool `…`"): all a model (and a trace without tool spans) sees of a failure.
_ERROR_TEXT = re.compile(r"\s*(?:[A-Za-z_.]*(Error|Exception)\s*:|Error executing tool\b|Failed to invoke Tool\b)")
# `tool-call` / `tool-result`: the Vercel AI SDK's prompt parts (`toolCallId`, `toolName`, `input` or `args`,
# `output` as `{type, value}` or `result` before AI SDK 5).
_CALL_TYPES = {"tool_call", "tool_use", "function_call", "tool-call"}
_RESULT_TYPES = {"tool_call_response", "tool_result", "function_call_output", "tool-result"}
# The Vercel AI SDK's tool output `{type, value}`; an `error-*` type is a failed call.
_AI_SDK_OUTPUTS = {"text", "json", "error-text", "error-json", "content", "execution-denied"}


@dataclass
class Message:
    role: str | None
    texts: list[str] = field(default_factory=list)
    calls: list[ToolCallRef] = field(default_factory=list)
    results: list[ToolResultRef] = field(default_factory=list)
    redacted: bool = False

    # Written out, as `SpanRecord`'s is, so that mypyc compiles it (a model span holds several messages).
    def __init__(
        self, role: str | None, texts: list[str] | None = None, calls: list[ToolCallRef] | None = None, results: list[ToolResultRef] | None = None,
        redacted: bool = False,
    ) -> None:
        self.role = role
        self.texts = [] if texts is None else texts
        self.calls = [] if calls is None else calls
        self.results = [] if results is None else results
        self.redacted = redacted


def parse_args(raw: Any) -> tuple[Any, ArgsState]:
    """Arguments as a JSON object when they are one; the raw text when they will not parse."""
    if raw is None or raw == "":
        return None, "absent"
    if is_redacted(raw):
        return None, "redacted"
    value = maybe_json(raw)
    if isinstance(value, dict):
        return value, "structured"
    return value, "unparsed"


def result_is_error(result: Any) -> bool:
    """Error markers: `is_error`, a truthy `error`, `status: error`, or text like `Error: …` or `ValueError: …`.

    The text form is how agents hand a failed tool back to the model (`Error: …` in OpenAI-style
    loops, `str(exception)` elsewhere) and, when the instrumentation drops `is_error` (Traceloop,
    flattened OpenInference), the only trace of the failure left.
    """
    if isinstance(result, str):
        return _ERROR_TEXT.match(result) is not None
    if not isinstance(result, dict):
        return False
    return bool(result.get("is_error") or result.get("isError") or result.get("error")) or result.get("status") == "error"


def _call(obj: dict[str, Any], index: int) -> ToolCallRef | None:
    obj = obj.get("tool_call", obj) if isinstance(obj.get("tool_call"), dict) else obj
    function: dict[str, Any] = obj["function"] if isinstance(obj.get("function"), dict) else {}
    name = obj.get("name") or function.get("name") or obj.get("toolName")
    if not name:
        return None
    raw = obj.get("arguments", obj.get("input", obj.get("args", function.get("arguments"))))
    args, _ = parse_args(raw)
    # A Responses API `function_call` item has its own `id`; the call's id is `call_id`.
    call_id = obj.get("call_id") or obj.get("id") if obj.get("type") == "function_call" else obj.get("id") or obj.get("call_id") or obj.get("toolCallId")
    return ToolCallRef(name=str(name), args=args, call_id=str(call_id) if call_id else None, index=index)


def _result(obj: dict[str, Any]) -> ToolResultRef | None:
    call_id = obj.get("id") or obj.get("tool_use_id") or obj.get("call_id") or obj.get("tool_call_id") or obj.get("toolCallId")
    if not call_id:
        return None
    failed = False
    for key in ("response", "result", "content", "output"):
        if key in obj:
            raw = obj[key]
            if isinstance(raw, dict) and set(raw) <= {"type", "value", "reason"} and raw.get("type") in _AI_SDK_OUTPUTS:
                failed = str(raw["type"]).startswith(("error", "execution-denied"))
                raw = raw.get("value", raw.get("reason"))
            value, _ = unwrap_result(raw)
            break
    else:
        value = None
    error = failed or bool(obj.get("is_error") or obj.get("isError")) or result_is_error(value)
    return ToolResultRef(call_id=str(call_id), result=value, error=error)


def _add_block(msg: Message, block: Any) -> None:
    if isinstance(block, str):
        msg.texts.append(block)
        return
    if not isinstance(block, dict):
        return
    if isinstance(block.get("message_content"), dict):  # OpenInference `contents` item
        block = block["message_content"]
    elif isinstance(block.get("tool_call"), dict) and "type" not in block:
        block = {"type": "tool_call", **block["tool_call"]}
    elif isinstance(block.get("toolUse"), dict):  # strands / Bedrock Converse content blocks
        use = block["toolUse"]
        block = {"type": "tool_call", "id": use.get("toolUseId"), "name": use.get("name"), "arguments": use.get("input")}
    elif isinstance(block.get("toolResult"), dict):
        res = block["toolResult"]
        block = {"type": "tool_result", "id": res.get("toolUseId"), "content": res.get("content"), "is_error": res.get("status") == "error"}
    kind = str(block.get("type", "text"))
    if kind in _CALL_TYPES:
        call = _call(block, len(msg.calls))
        if call:
            msg.calls.append(call)
    elif kind in _RESULT_TYPES:
        result = _result(block)
        if result:
            msg.results.append(result)
    elif kind in ("text", "reasoning", "output_text", "input_text"):
        text = block.get("text", block.get("content"))
        if isinstance(text, str) and text and kind != "reasoning":
            msg.texts.append(text)


def _add_content(msg: Message, content: Any) -> None:
    if is_redacted(content):
        msg.redacted = True
        return
    content = maybe_json(content) if isinstance(content, str) and content.lstrip()[:1] == "[" else content
    if isinstance(content, list):
        for block in content:
            _add_block(msg, block)
    elif isinstance(content, str):
        msg.texts.append(content)
    elif isinstance(content, dict):
        _add_block(msg, content)


def parse_message(obj: Any) -> Message | None:
    """One message in any known shape; None for things that are not messages."""
    if isinstance(obj, dict) and isinstance(obj.get("message"), dict) and "role" not in obj:
        obj = obj["message"]  # OpenInference item, or a gen_ai.choice body
    if not isinstance(obj, dict):
        return None
    role = obj.get("role")
    msg = Message(role=None if role is None else str(role))
    for part in obj.get("parts") or []:
        _add_block(msg, part)
    # OpenInference may write both `content` and `contents` for one message: the same text twice.
    content = obj.get("content")
    if content is None or content == "" or content == []:
        content = obj.get("contents")
    if content is not None:
        _add_content(msg, content)
    for raw in obj.get("tool_calls") or []:
        call = _call(raw, len(msg.calls)) if isinstance(raw, dict) else None
        if call:
            msg.calls.append(call)
    if isinstance(obj.get("function_call"), dict):  # OpenAI's older single call (LiteLLM's `gen_ai.completion.{j}.function_call`)
        call = _call(obj["function_call"], len(msg.calls))
        if call:
            msg.calls.append(call)
    if obj.get("tool_call_id"):
        # The content, or the text parts when the message is in parts with the id beside them (LiteLLM's `tool` messages).
        raw_content = obj.get("content")
        value = maybe_json(raw_content) if raw_content is not None or not msg.texts else maybe_json("\n".join(msg.texts))
        msg.results.append(ToolResultRef(str(obj["tool_call_id"]), value, result_is_error(value)))
        msg.texts = []
    return msg


def response_messages(value: Any) -> list[Message]:
    """The output items of OpenAI Responses objects (one, or a list of them) as messages."""
    value = maybe_json(value)
    responses = value if isinstance(value, list) else [value]
    items = [item for r in responses if isinstance(r, dict) and r.get("object") == "response"
             for item in (r.get("output") or []) if isinstance(item, dict)]
    return parse_messages([item if item.get("type") == "message" else {"role": "assistant", "content": [item]} for item in items])


def parse_messages(value: Any) -> list[Message]:
    """A message list given as JSON text, a structure, or a single message."""
    value = maybe_json(value)
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list):
        return []
    return answer_in_order([m for m in (parse_message(item) for item in value) if m is not None])


def answer_in_order(messages: list[Message]) -> list[Message]:
    """A `tool` message that names no call (Traceloop's `gen_ai.tool.message` records carry no id) answers the next
    unanswered call of the assistant message before it, in order: its text becomes that call's result."""
    pending: list[ToolCallRef] = []
    for m in messages:
        if m.calls:
            pending = [c for c in m.calls if c.call_id]
        elif m.role in ("tool", "function") and not m.results and m.texts and pending:
            call = pending.pop(0)
            value = maybe_json("\n".join(m.texts))
            m.results.append(ToolResultRef(str(call.call_id), value, result_is_error(value)))
            m.texts = []
        elif m.role not in ("tool", "function"):
            pending = []
    return messages
