"""Framework wrappers and dumps around the values we want: recognised, unwrapped, and named.

Agent frameworks and their tracers rarely record a tool's arguments, a run's request or a tool's
result as they are: smolagents records the call `{"args", "sanitize_inputs_outputs", "kwargs"}`,
LlamaIndex `{"kwargs"}`, LangChain under Traceloop its callback payload, LangGraph the whole graph
state, frameworks their result objects (`ToolMessage`, `ToolOutput`, content blocks). Each
function here takes such a value and returns the value a user means plus the name of the shape it
recognised (None when the value was plain), so coverage can say what was unwrapped and what was
kept as it came.
"""

from __future__ import annotations

import re
from typing import Any

from plumbline_otel.normalise._values import maybe_json

# LangChain message types (dumps and `lc` constructor ids) to chat roles.
_ROLES = {"human": "user", "humanmessage": "user", "user": "user", "ai": "assistant", "aimessage": "assistant",
          "assistant": "assistant", "aimessagechunk": "assistant", "model": "assistant",
          "tool": "tool", "toolmessage": "tool", "system": "system", "systemmessage": "system"}
# `repr()` of a Python object (LlamaIndex records `StopEvent(result=AgentOutput(…))` as text).
_PYTHON_REPR = re.compile(r"^[A-Za-z_][\w.]*\(\w+=")  # often cut short by the tracer: the start is enough
# A ToolMessage whose status says the tool raised: the call failed, whatever its text says.
TOOL_ERROR_SHAPE = "langchain_tool_message_error"
_RUN_KWARGS = {"stream", "reset", "images", "additional_args", "max_steps", "return_full_result"}


def _lc_object(value: Any) -> tuple[str | None, dict[str, Any]] | None:
    """A LangChain object dump, as (type, fields).

    Two forms: `dumpd` (`{"lc": 1, "type": "constructor", "id": [..., cls], "kwargs": {...}}`) and
    `message_to_dict` (`{"type": "tool", "data": {...}}`).
    """
    if isinstance(value, dict) and value.get("lc") == 1 and isinstance(value.get("kwargs"), dict):
        ids = value.get("id") if isinstance(value.get("id"), list) else []
        return (str(ids[-1]) if ids else None), value["kwargs"]
    if isinstance(value, dict) and isinstance(value.get("data"), dict) and isinstance(value.get("type"), str) and len(value) == 2:
        return value["type"], value["data"]
    return None


def unwrap_args(raw: Any) -> tuple[Any, str | None, str | None]:
    """A tool span's recorded input as (arguments, call id found inside, shape name)."""
    value = maybe_json(raw)
    if not isinstance(value, dict):
        return value, None, None
    if "sanitize_inputs_outputs" in value and set(value) <= {"args", "kwargs", "sanitize_inputs_outputs"}:
        return _call_args(value), None, "smolagents_call"
    if "input_str" in value:  # LangChain callback payload (on_tool_start), as Traceloop records it
        kwargs: dict[str, Any] = value["kwargs"] if isinstance(value.get("kwargs"), dict) else {}
        inputs = value.get("inputs")
        args = inputs if isinstance(inputs, dict) and inputs else maybe_json(value["input_str"])
        if isinstance(args, dict) and isinstance(args.get("args"), dict) and args.get("type") == "tool_call":
            args, kwargs = args["args"], {**kwargs, "tool_call_id": args.get("id")}
        call_id = kwargs.get("tool_call_id")
        return args, str(call_id) if call_id else None, "langchain_callback"
    if value.get("type") == "tool_call" and isinstance(value.get("args"), dict) and "name" in value:
        call_id = value.get("id")
        return value["args"], str(call_id) if call_id else None, "tool_call_object"
    if set(value) == {"kwargs"} and isinstance(value["kwargs"], dict):
        return value["kwargs"], None, "kwargs_wrapper"
    if set(value) == {"args", "kwargs"}:
        return _call_args(value), None, "args_kwargs_wrapper"
    return value, None, None


def _call_args(value: dict[str, Any]) -> Any:
    kwargs = value.get("kwargs") if isinstance(value.get("kwargs"), dict) else {}
    positional = value.get("args") if isinstance(value.get("args"), list) else []
    if kwargs or not positional:
        return kwargs
    if len(positional) == 1 and isinstance(positional[0], dict):
        return positional[0]
    return {"args": positional}


def _blocks_text(blocks: list[Any]) -> Any:
    """Content blocks (`{"text"}`, `{"json"}`, `{"type": "text", "text"}`) as one value."""
    values: list[Any] = []
    for block in blocks:
        if isinstance(block, dict) and "json" in block:
            values.append(block["json"])
        elif isinstance(block, dict) and isinstance(block.get("text"), str):
            values.append(block["text"])
        elif isinstance(block, str):
            values.append(block)
        else:
            return None
    if len(values) == 1:
        return values[0]
    return "\n".join(v if isinstance(v, str) else str(v) for v in values) if values else None


def unwrap_result(raw: Any) -> tuple[Any, str | None]:
    """A tool's recorded output as (the tool's content, shape name)."""
    value = maybe_json(raw)
    lc = _lc_object(value)
    if lc is not None and "content" in lc[1]:
        value = lc[1]
    if isinstance(value, dict):
        if "content" in value and "tool_call_id" in value:  # a LangChain ToolMessage, dumped
            return _content(value["content"]), TOOL_ERROR_SHAPE if value.get("status") == "error" else "langchain_tool_message"
        if "raw_output" in value and "tool_name" in value:
            inner = value["raw_output"] if value["raw_output"] is not None else value.get("content")
            return maybe_json(inner), "llamaindex_tool_output"
        if isinstance(value.get("toolResult"), dict):
            value = value["toolResult"]
        if "toolUseId" in value and isinstance(value.get("content"), list):
            return _content(value["content"]), "content_blocks"
        if isinstance(value.get("output"), (dict, str)) and set(value) <= {"output", "kwargs"}:
            inner, shape = unwrap_result(value["output"])
            return inner, shape or "output_wrapper"
    if isinstance(value, list) and value and all(isinstance(b, dict) and ("text" in b or "json" in b) for b in value):
        inner = _blocks_text(value)
        if inner is not None:
            return maybe_json(inner), "content_blocks"
    return value, None


# Frameworks that wrap a tool's non-object return value in an object of one key, by tracer scope:
# Google ADK returns `{"result": value}` to the model for a function that returned a plain value.
_SCOPE_RESULT_KEYS = {"gcp.vertex.agent": "result"}


def unwrap_scoped_result(value: Any, scope: str) -> tuple[Any, str | None]:
    """A result a framework wrapped in its one-key object (known by the tracer's scope), unwrapped."""
    key = _SCOPE_RESULT_KEYS.get(scope)
    if key and isinstance(value, dict) and set(value) == {key}:
        return maybe_json(value[key]), f"{scope}_result_wrapper"
    return value, None


def _content(content: Any) -> Any:
    if isinstance(content, list):
        inner = _blocks_text(content)
        return maybe_json(inner) if inner is not None else content
    return maybe_json(content)


def _role(message: dict[str, Any]) -> str | None:
    lc = _lc_object(message)
    if lc is not None:
        return _ROLES.get(str(lc[0]).lower()) or _ROLES.get(str(lc[1].get("type", "")).lower())
    for key in ("role", "type"):
        role = _ROLES.get(str(message.get(key, "")).lower())
        if role:
            return role
    return None


def _message_text(message: dict[str, Any]) -> str | None:
    lc = _lc_object(message)
    body = lc[1] if lc is not None else message
    content = body.get("content", body.get("contents"))
    if isinstance(content, list):
        content = _blocks_text([{"text": b["text"]} if isinstance(b, dict) and isinstance(b.get("text"), str) else b for b in content])
    return content if isinstance(content, str) and content.strip() else None


def _last_text(messages: list[Any], role: str) -> str | None:
    for message in messages[::-1]:  # not reversed(): mypyc cannot type it over list[Any]
        if isinstance(message, dict) and _role(message) == role:
            text = _message_text(message)
            if text is not None:
                return text
    return None


def request_text(raw: Any) -> tuple[str | None, str | None]:
    """A run's recorded input as (the user's request, shape name); structures we cannot read stay JSON."""
    value = maybe_json(raw)
    if isinstance(value, str):
        return (None, "unrecognised") if _PYTHON_REPR.match(value) else (value, None)
    if isinstance(value, dict):
        if isinstance(value.get("messages"), list):
            return _last_text(value["messages"], "user"), "graph_state"
        if isinstance(value.get("task"), str) and set(value) - {"task"} <= _RUN_KWARGS:
            return value["task"], "run_kwargs"
        for key in ("user_msg", "input", "query", "prompt"):
            if isinstance(value.get(key), str) and len(value) <= 4:
                return value[key], "run_kwargs"
    if isinstance(value, list) and value and all(isinstance(m, dict) for m in value):
        text = _last_text(value, "user")
        if text is not None:
            return text, "message_list"
    return None, "unrecognised"


def answer_text(raw: Any) -> tuple[str | None, str | None]:
    """A run's recorded output as (the agent's answer, shape name)."""
    value = maybe_json(raw)
    if isinstance(value, str):
        return (None, "unrecognised") if _PYTHON_REPR.match(value) else (value, None)
    if isinstance(value, dict):
        if isinstance(value.get("messages"), list):
            return _last_text(value["messages"], "assistant"), "graph_state"
        response = value.get("response")
        if isinstance(response, dict):  # LlamaIndex AgentOutput: {"response": ChatMessage, ...}
            text = _message_text({**response, "content": response.get("content") or response.get("blocks")})
            if text is not None:
                return text, "agent_output"
        if isinstance(value.get("final_output"), str):
            return value["final_output"], "run_result"
        if isinstance(value.get("text"), str) and "messages" not in value:  # Mastra's `{text, files, …}` result
            return value["text"], "run_result"
    if isinstance(value, list) and value:
        text = _last_text(value, "assistant") if all(isinstance(m, dict) for m in value) else None
        if text is None:
            text = _blocks_text(value) if all(isinstance(b, (dict, str)) for b in value) else None
            text = text if isinstance(text, str) else None
        if text is not None:
            return text, "message_list"
    return None, "unrecognised"
