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

import ast
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


# --- Python reprs of framework messages (Haystack's OpenInference tracing dumps them with `str()`) ---------------

# An enum's repr, `<ChatRole.USER: 'user'>`: its value stands in for it, so the rest parses as a Python expression.
_ENUM_REPR = re.compile(r"<[A-Za-z_][\w.]*: ('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|-?\d+)>")
_REPR_MESSAGE = re.compile(r"^\s*[A-Za-z_]\w*Message\(")


def _repr_value(node: ast.AST) -> Any:
    """A parsed repr as data: constants, lists, dicts, and calls `Cls(k=v, …)` as `{"__class__": "Cls", "k": v}`."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_repr_value(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        return {_repr_value(k) if k is not None else None: _repr_value(v) for k, v in zip(node.keys, node.values)}
    if isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute)):
        name = node.func.id if isinstance(node.func, ast.Name) else node.func.attr
        out: dict[str, Any] = {"__class__": name}
        for kw in node.keywords:
            if kw.arg is not None:
                out[kw.arg] = _repr_value(kw.value)
        if node.args:
            out["args"] = [_repr_value(a) for a in node.args]
        return out
    return None


def _repr_part(part: Any) -> Any:
    """A Haystack content part (`TextContent`, `ToolCall`, `ToolCallResult`, `ReasoningContent`) as a message part."""
    if not isinstance(part, dict):
        return part
    kind = part.get("__class__")
    if kind == "TextContent":
        return {"type": "text", "text": part.get("text")}
    if kind == "ToolCall":
        return {"type": "tool_call", "id": part.get("id"), "name": part.get("tool_name"), "arguments": part.get("arguments")}
    if kind == "ToolCallResult":
        origin: dict[str, Any] = part["origin"] if isinstance(part.get("origin"), dict) else {}
        return {"type": "tool_call_response", "id": origin.get("id"), "response": part.get("result"), "is_error": bool(part.get("error"))}
    if kind == "ReasoningContent":
        return {"type": "reasoning", "content": part.get("reasoning_text")}
    return part


def repr_message(value: Any) -> Any:
    """A framework message recorded as its Python repr (Haystack's `ChatMessage(_role=<ChatRole.USER: 'user'>,
    _content=[TextContent(text='…')], …)`) as a message dict; anything else unchanged."""
    if not (isinstance(value, str) and _REPR_MESSAGE.match(value)):
        return value
    try:
        parsed = _repr_value(ast.parse(_ENUM_REPR.sub(r"\1", value.strip()), mode="eval").body)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return value
    if not isinstance(parsed, dict):
        return value
    role = parsed.get("_role", parsed.get("role"))
    content = parsed.get("_content", parsed.get("content"))
    parts = [_repr_part(p) for p in content] if isinstance(content, list) else content
    return {"role": role, "content": parts, "name": parsed.get("_name")}


_RESPONSE_REPR = re.compile(r"^\{'id': '[^']*',.*'object': 'response'", re.DOTALL)


def response_repr(text: str) -> Any:
    """An OpenAI Responses object written as the Python repr of its dict (OpenTelemetry's openai-agents-v2 processor
    records a streamed run's `str(response)` as the output text) as the dict; None for any other text."""
    if not _RESPONSE_REPR.match(text):
        return None
    try:  # not `ast.literal_eval`: its nested converters make reference cycles, and shard workers leave the collector off
        value = _repr_value(ast.parse(text, mode="eval").body)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    return value if isinstance(value, dict) else None


def repr_messages(values: list[Any]) -> tuple[list[Any], bool]:
    """Each message that is a Python repr as a message dict; and whether any was."""
    out = [repr_message(v) for v in values]
    return out, any(isinstance(v, str) and not isinstance(o, str) for v, o in zip(values, out))


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
    if set(value) == {"input", "options"} and isinstance(value["input"], dict):
        return value["input"], None, "tool_run_input"  # BeeAI's `Tool.run(input, options)`, as OpenInference records it
    if set(value) == {"kwargs"} and isinstance(value["kwargs"], dict):
        return value["kwargs"], None, "kwargs_wrapper"
    if set(value) == {"args"} and isinstance(value["args"], list) and len(value["args"]) == 1:
        # Traceloop for Node's entity input, the function's positional arguments: a LangChain JS tool gets one,
        # the model's arguments as JSON text.
        only = maybe_json(value["args"][0])
        if isinstance(only, dict):
            return only, None, "positional_args"
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


# An MCP `TextContent` block as SDKs dump it: a tool's whole result when the server returned one block.
_TEXT_BLOCK_KEYS = frozenset({"type", "text", "annotations", "meta", "_meta"})


# A Gemini `FunctionResponse` as instrumentations dump it (OpenInference's ADK tool spans): the call's id and name
# beside the `response` the function returned.
_FUNCTION_RESPONSE_KEYS = frozenset({"id", "name", "response", "will_continue", "scheduling", "parts"})


_FIELDS_REPR = re.compile(r"^content=['\"\[]")


def fields_repr(text: str) -> dict[str, Any] | None:
    """A pydantic object's `str()`, its fields as `name=<Python literal>` separated by spaces (LangChain's
    `content='…' name='lookup_invoice' tool_call_id='call_1' status='error'`, which OpenLIT records as a tool's result),
    as a dict; None when the text is not one."""
    if not _FIELDS_REPR.match(text) or len(text) > 1_000_000:
        return None
    out, depth, quote, i = [], 0, "", 0
    while i < len(text):  # a comma before each field past the first: the text is then a call's keyword arguments
        ch = text[i]
        if quote:
            if ch == "\\":
                out.append(text[i:i + 2])
                i += 2
                continue
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == " " and depth == 0 and re.match(r" [A-Za-z_]\w*=", text[i:]):
            out.append(",")
        out.append(ch)
        i += 1
    try:
        parsed = _repr_value(ast.parse("f(" + "".join(out) + ")", mode="eval").body)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    if not isinstance(parsed, dict):
        return None
    parsed.pop("__class__", None)
    return parsed


def unwrap_result(raw: Any) -> tuple[Any, str | None]:
    """A tool's recorded output as (the tool's content, shape name)."""
    value = maybe_json(raw)
    if isinstance(value, str) and " tool_call_id=" in value:
        fields = fields_repr(value)
        if fields is not None and "content" in fields and "tool_call_id" in fields:  # a ToolMessage's str()
            inner, shape = unwrap_result({"content": fields["content"], "tool_call_id": fields["tool_call_id"],
                                          "status": fields.get("status")})
            return inner, TOOL_ERROR_SHAPE if shape == TOOL_ERROR_SHAPE else "langchain_tool_message_repr"
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
        if value.get("type") == "text" and isinstance(value.get("text"), str) and set(value) <= _TEXT_BLOCK_KEYS:
            return maybe_json(value["text"]), "content_blocks"  # one MCP content block (an MCP tool's result)
        if isinstance(value.get("response"), dict) and isinstance(value.get("name"), str) and set(value) <= _FUNCTION_RESPONSE_KEYS:
            return value["response"], "function_response"  # a Gemini FunctionResponse dump: what the function returned
        if isinstance(value.get("output"), (dict, str)) and set(value) <= {"output", "kwargs"}:
            inner, shape = unwrap_result(value["output"])
            return inner, shape or "output_wrapper"
    if isinstance(value, list) and value and all(isinstance(b, dict) and ("text" in b or "json" in b) for b in value):
        inner = _blocks_text(value)
        if inner is not None:
            return maybe_json(inner), "content_blocks"
    return value, None


def tool_message_call(raw: Any) -> tuple[str | None, str | None]:
    """The tool name and call id a tool's output names when it is a LangChain ToolMessage dump (either form, or
    inside Traceloop's `{"output": …}`): where the span names the tool by its class, only this names the tool."""
    if isinstance(raw, str) and "tool_call_id" not in raw and "\\u" not in raw:
        return None, None  # text without the key, written out or escaped: no parse can find it (most tools' results)
    value = maybe_json(raw)
    if isinstance(value, dict) and set(value) <= {"output", "kwargs"} and "output" in value:
        value = maybe_json(value["output"])
    lc = _lc_object(value)
    body = lc[1] if lc is not None else value
    if not (isinstance(body, dict) and "content" in body and body.get("tool_call_id")):
        return None, None
    name = body.get("name")
    return (str(name) if name else None), str(body["tool_call_id"])


# Frameworks that wrap a tool's non-object return value in an object of one key, by tracer scope:
# Google ADK returns `{"result": value}` to the model for a function that returned a plain value.
_SCOPE_RESULT_KEYS = {"gcp.vertex.agent": "result", "openinference.instrumentation.google_adk": "result"}


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
    for message in repr_messages(messages)[0][::-1]:  # not reversed(): mypyc cannot type it over list[Any]
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
    if isinstance(value, dict) and set(value) == {"data"} and isinstance(value["data"], dict) and len(value["data"]) == 1:
        inner, _ = request_text(next(iter(value["data"].values())))  # Haystack's `Pipeline.run` data: {component: inputs}
        if inner is not None:
            return inner, "pipeline_data"
    if isinstance(value, dict) and set(value) == {"input_args"} and isinstance(value["input_args"], dict):
        # A DSPy program's input fields; a conversation's `dspy.History` (ReActV2's `history`) comes as its repr.
        texts = [v for v in value["input_args"].values() if isinstance(v, str) and not v.startswith("messages=[")]
        if len(texts) == 1:
            return texts[0], "dspy_input_args"
    if isinstance(value, dict):
        if isinstance(value.get("messages"), list):
            shape = "message_reprs" if repr_messages(value["messages"])[1] else "graph_state"
            return _last_text(value["messages"], "user"), shape
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
        if isinstance(value.get("answer"), str):  # a DSPy Prediction with an `answer` field (and its `history`)
            return value["answer"], "prediction"
        if isinstance(value.get("raw"), str) and ("tasks_output" in value or "expected_output" in value):
            return value["raw"], "crewai_output"  # a CrewOutput or TaskOutput: `raw` is the answer
        content = value.get("content")
        if isinstance(content, dict) and isinstance(content.get("parts"), list):
            # A model response or a framework's event holding one (Google ADK's `LlmResponse`/`Event`: `{content:
            # {role, parts}, finish_reason, usage_metadata, …}`): its message's text is the answer.
            texts = [p["text"] for p in content["parts"] if isinstance(p, dict) and isinstance(p.get("text"), str)]
            if texts:
                return "".join(texts), "response_content"
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
