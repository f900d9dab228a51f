"""The three model APIs the proxy speaks, as pure functions over their JSON: OpenAI Chat
Completions (``chat``), OpenAI Responses (``responses``) and Anthropic Messages (``messages``).

Everything that differs between them lives here (error bodies, sampling parameters, tool schemas,
where tool calls and tool results sit), so the server stays one code path and each rewrite can
be tested without a socket. Rewrites mutate the request body in place and return what changed,
which becomes the trial's evidence.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

import orjson

from plumbline_otel.replay.jsonvalue import JsonObject, JsonValue, to_int

Api = Literal["chat", "responses", "messages"]
API_PATHS: dict[str, Api] = {"/v1/chat/completions": "chat", "/v1/responses": "responses", "/v1/messages": "messages"}
PROVIDER: dict[Api, str] = {"chat": "openai", "responses": "openai", "messages": "anthropic"}
_SAMPLING: dict[Api, frozenset[str]] = {"chat": frozenset({"temperature", "top_p", "seed"}),
                                       "responses": frozenset({"temperature", "top_p"}),
                                       "messages": frozenset({"temperature", "top_p"})}


def api_for(path: str) -> Api | None:
    """The API a request path (after any ``/t/<token>`` prefix) speaks, or None."""
    return API_PATHS.get(path.rstrip("/"))


def error_body(provider: str, status: int, kind: str, message: str) -> bytes:
    """An error in the provider's own shape, so the agent's SDK raises its usual exception."""
    if provider == "anthropic":
        return orjson.dumps({"type": "error", "error": {"type": kind, "message": message}})
    return orjson.dumps({"error": {"message": message, "type": kind, "param": None, "code": kind}})


# --- reading provider JSON ------------------------------------------------------------------------


class WireShapeError(TypeError):
    """Provider JSON of a shape its API never gives (text where an object belongs, a number where a list does).

    Reading such JSON fails as it always did (it was an AttributeError or a TypeError deep in the reading); the
    error now says where."""


def _object(value: object, where: str) -> Mapping[str, object]:
    """``value`` as the JSON object the API puts at ``where``; WireShapeError for anything else."""
    if isinstance(value, Mapping):
        return value
    raise WireShapeError(f"{where}: a JSON object was expected, not {type(value).__name__} {value!r:.80}")


def _iterate(value: object, where: str) -> list[object]:
    """What ``for x in value or []`` walks (a list's items; text's characters, an object's keys, which no reader
    takes for an item); WireShapeError for a value that cannot be walked (a number, true)."""
    if not value:
        return []
    if isinstance(value, list):
        return value
    if isinstance(value, str | Mapping):
        return list(value)
    raise WireShapeError(f"{where}: a JSON list was expected, not {type(value).__name__} {value!r:.80}")


def _objects(value: object, where: str) -> list[Mapping[str, object]]:
    """The JSON objects of the list at ``where`` (absent or empty: none); WireShapeError for an item not an object."""
    return [_object(item, f"{where}[]") for item in _iterate(value, where)]


def _text(value: object, where: str) -> str:
    """The text at ``where`` (absent, null or empty: ""); WireShapeError for anything else (text is appended to)."""
    if not value:
        return ""
    if isinstance(value, str):
        return value
    raise WireShapeError(f"{where}: text was expected, not {type(value).__name__} {value!r:.80}")


def _json(value: object) -> JsonValue:
    """``value`` (read from parsed JSON) as a JsonValue; WireShapeError for what JSON cannot hold."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, Mapping):
        out: JsonObject = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise WireShapeError(f"a JSON object's key is text, not {type(key).__name__} {key!r:.80}")
            out[key] = _json(item)
        return out
    if isinstance(value, list | tuple):
        return [_json(item) for item in value]
    raise WireShapeError(f"not JSON: {type(value).__name__} {value!r:.80}")


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


# --- sampling ----------------------------------------------------------------------------------


# What each API does when a parameter is left out: a variant that sets a parameter to its default changes nothing
# the provider does, so it is no change (the seed has no default: any seed is one).
_SAMPLING_DEFAULTS: dict[Api, dict[str, float]] = {"chat": {"temperature": 1.0, "top_p": 1.0},
                                                   "responses": {"temperature": 1.0, "top_p": 1.0},
                                                   "messages": {"temperature": 1.0, "top_p": 1.0}}
# OpenAI reasoning models refuse temperature and top_p (400 "Unsupported parameter"): sending them would fail the
# call, so for these the parameters are skipped (the trial then shows no change and is not scored).
_NO_SAMPLING_MODELS = re.compile(r"^(o\d|gpt-5(?!-chat))", re.I)


def _unhonoured(api: Api, body: Mapping[str, object], param: str, planned: Mapping[str, object]) -> str | None:
    """Why ``api`` would not honour ``param`` on this request (None: it would)."""
    if param not in _SAMPLING[api]:
        return f"the {api} API takes no {param}"
    model = str(body.get("model") or "")
    if api != "messages" and param in ("temperature", "top_p") and _NO_SAMPLING_MODELS.match(model):
        return f"OpenAI reasoning model {model} takes no {param}"
    if api == "messages":
        thinking = body.get("thinking")
        if isinstance(thinking, Mapping) and thinking.get("type") == "enabled":
            return f"Anthropic extended thinking fixes {param}"
        other = "top_p" if param == "temperature" else "temperature" if param == "top_p" else None
        if other is not None and body.get(other) is not None and other not in planned:
            return f"Anthropic models take temperature or top_p, not both; the request sets {other}"
    return None


def apply_sampling(api: Api, body: JsonObject, metadata: Mapping[str, JsonValue]) -> list[JsonObject]:
    """Set the trial's ``temperature`` / ``top_p`` / ``seed`` where the API honours them; each as before → after.

    An entry is ``changed`` only when the provider now gets a different value than the unperturbed request
    would have had (its own value, else the API's default): ``temperature`` 1.0 on a request that sets none is
    no change on any of the three APIs. A parameter the API (or the model) does not take is not sent, since
    the provider would reject the whole call, and is reported with ``skipped``. Only changed entries are
    evidence that the perturbation reached the provider.
    """
    planned = {p: metadata[p] for p in ("temperature", "top_p", "seed") if metadata.get(p) is not None}
    changes: list[JsonObject] = []
    for param, after in planned.items():
        before = body.get(param)
        why = _unhonoured(api, body, param, planned)
        if why is not None:
            changes.append({"param": param, "before": before, "after": None, "changed": False, "skipped": why})
            continue
        effective = before if before is not None else _SAMPLING_DEFAULTS[api].get(param)
        body[param] = after
        changes.append({"param": param, "before": before, "after": after, "changed": effective != after})
    return changes


# --- tools ---------------------------------------------------------------------------------------


def _spec_parts(spec: Mapping[str, object]) -> tuple[str, str, JsonObject]:
    """(name, description, JSON schema) of a tool spec in any of the three schemas."""
    function = spec.get("function")
    inner = function if isinstance(function, Mapping) else spec
    schema = inner.get("input_schema") or inner.get("parameters") or {"type": "object", "properties": {}}
    parameters = _json(_object(schema, "a tool's schema"))
    assert isinstance(parameters, dict)  # an object's JSON is an object
    return str(inner.get("name") or ""), str(inner.get("description") or ""), parameters


def tool_name(api: Api, tool: Mapping[str, object]) -> str | None:
    function = tool.get("function")
    if api == "chat" and isinstance(function, Mapping):
        return str(function.get("name"))
    return str(tool["name"]) if tool.get("name") is not None else None


def provider_tool(api: Api, spec: Mapping[str, object]) -> JsonObject:
    """A tool spec in ``api``'s own tool schema."""
    name, description, schema = _spec_parts(spec)
    if api == "chat":
        return {"type": "function", "function": {"name": name, "description": description, "parameters": schema}}
    if api == "responses":
        return {"type": "function", "name": name, "description": description, "parameters": schema, "strict": False}
    return {"name": name, "description": description, "input_schema": schema}


def add_decoys(api: Api, body: JsonObject, decoys: Iterable[Mapping[str, object]]) -> list[str]:
    """Append the decoys to the request's tools; the names added.

    Only a request that already offers tools gets decoys: a call made without tools (a summary, a
    final answer) would change in kind, not just in choice, if tools appeared. A decoy whose name
    the agent already uses is left out.
    """
    tools = body.get("tools")
    if not isinstance(tools, list) or not tools:
        return []
    taken = {tool_name(api, t) for t in tools if isinstance(t, Mapping)}
    added: list[str] = []
    for spec in decoys:
        name = _spec_parts(spec)[0]
        if name and name not in taken:
            tools.append(provider_tool(api, spec))
            taken.add(name)
            added.append(name)
    return added


@dataclass
class ToolCall:
    """A tool call the model proposed (``arguments`` as the API gave them: text or an object)."""

    id: str
    name: str
    arguments: JsonValue = None


@dataclass
class Reply:
    """What the model answered: text, proposed tool calls, finish reason, which model and response."""

    text: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    model: str | None = None
    response_id: str | None = None


def reply_from_body(api: Api, body: Mapping[str, object]) -> Reply:
    """What an answer's body says; WireShapeError for a body of a shape the API never gives."""
    reply = Reply(model=_str(body.get("model")), response_id=_str(body.get("id")))
    if api == "chat":
        for choice in _objects(body.get("choices"), "choices"):
            message = _object(choice.get("message") or {}, "choices[].message")
            reply.text += _text(message.get("content"), "choices[].message.content")
            reply.finish_reason = _str(choice.get("finish_reason")) or reply.finish_reason
            for call in _objects(message.get("tool_calls"), "choices[].message.tool_calls"):
                fn = _object(call.get("function") or {}, "tool_calls[].function")
                reply.tool_calls.append(ToolCall(str(call.get("id")), str(fn.get("name")), _json(fn.get("arguments"))))
    elif api == "responses":
        reply.finish_reason = _str(body.get("status"))
        for item in _objects(body.get("output"), "output"):
            if item.get("type") == "function_call":
                reply.tool_calls.append(ToolCall(str(item.get("call_id")), str(item.get("name")), _json(item.get("arguments"))))
            elif item.get("type") == "message":
                reply.text += "".join(str(c.get("text") or "") for c in _iterate(item.get("content"), "output[].content")
                                      if isinstance(c, Mapping))
    else:
        reply.finish_reason = _str(body.get("stop_reason"))
        for block in _objects(body.get("content"), "content"):
            if block.get("type") == "text":
                reply.text += str(block.get("text") or "")
            elif block.get("type") == "tool_use":
                reply.tool_calls.append(ToolCall(str(block.get("id")), str(block.get("name")), _json(block.get("input"))))
    return reply


def reply_from_events(api: Api, events: Iterable[Mapping[str, object]]) -> Reply:
    """The same from a stream's SSE events (tool-call names and arguments assembled from deltas); WireShapeError
    for an event of a shape the API never gives."""
    reply = Reply()
    calls: dict[tuple[int, int], ToolCall] = {}
    for event in events:
        if api == "responses":
            response = event.get("response")
            if event.get("type") in ("response.completed", "response.incomplete") and isinstance(response, Mapping):
                return reply_from_body(api, response)
            if event.get("type") == "response.output_text.delta":
                reply.text += str(event.get("delta") or "")
        elif api == "chat":
            reply.model = reply.model or _str(event.get("model"))
            reply.response_id = reply.response_id or _str(event.get("id"))
            for choice in _objects(event.get("choices"), "choices"):
                delta = _object(choice.get("delta") or {}, "choices[].delta")
                reply.text += _text(delta.get("content"), "choices[].delta.content")
                reply.finish_reason = _str(choice.get("finish_reason")) or reply.finish_reason
                for part in _objects(delta.get("tool_calls"), "choices[].delta.tool_calls"):
                    call = calls.setdefault((to_int(choice.get("index") or 0), to_int(part.get("index") or 0)), ToolCall("", "", ""))
                    fn = _object(part.get("function") or {}, "tool_calls[].function")
                    call.id = _text(part.get("id"), "tool_calls[].id") or call.id
                    call.name = _text(fn.get("name"), "tool_calls[].function.name") or call.name
                    call.arguments = str(call.arguments or "") + _text(fn.get("arguments"), "tool_calls[].function.arguments")
        else:
            _messages_event(event, reply, calls)
    reply.tool_calls = [calls[k] for k in sorted(calls)] or reply.tool_calls
    return reply


def _messages_event(event: Mapping[str, object], reply: Reply, calls: dict[tuple[int, int], ToolCall]) -> None:
    kind = event.get("type")
    if kind == "message_start":
        message = _object(event.get("message") or {}, "message_start.message")
        reply.model, reply.response_id = _str(message.get("model")), _str(message.get("id"))
    elif kind == "content_block_start":
        block = _object(event.get("content_block") or {}, "content_block_start.content_block")
        if block.get("type") == "tool_use":
            calls[(0, to_int(event.get("index") or 0))] = ToolCall(str(block.get("id")), str(block.get("name")), "")
    elif kind == "content_block_delta":
        delta = _object(event.get("delta") or {}, "content_block_delta.delta")
        if delta.get("type") == "text_delta":
            reply.text += str(delta.get("text") or "")
        elif delta.get("type") == "input_json_delta" and (0, to_int(event.get("index") or 0)) in calls:
            call = calls[(0, to_int(event.get("index") or 0))]
            call.arguments = str(call.arguments or "") + str(delta.get("partial_json") or "")
    elif kind == "message_delta":
        reply.finish_reason = _str(_object(event.get("delta") or {}, "message_delta.delta").get("stop_reason")) or reply.finish_reason


# --- tool results (tool_result_fault) -------------------------------------------------------------


def request_tool_calls(api: Api, body: Mapping[str, object]) -> list[ToolCall]:
    """The tool calls already in the conversation the request carries, in order."""
    out: list[ToolCall] = []
    if api == "chat":
        for message in _iterate(body.get("messages"), "messages"):
            for call in _objects(message.get("tool_calls"), "messages[].tool_calls") if isinstance(message, Mapping) else []:
                fn = _object(call.get("function") or {}, "tool_calls[].function")
                out.append(ToolCall(str(call.get("id")), str(fn.get("name")), _json(fn.get("arguments"))))
    elif api == "responses":
        items = body.get("input")
        for item in items if isinstance(items, list) else []:
            if isinstance(item, Mapping) and item.get("type") == "function_call":
                out.append(ToolCall(str(item.get("call_id")), str(item.get("name")), _json(item.get("arguments"))))
    else:
        for message in _iterate(body.get("messages"), "messages"):
            content = message.get("content") if isinstance(message, Mapping) else None
            for block in content if isinstance(content, list) else []:
                if isinstance(block, Mapping) and block.get("type") == "tool_use":
                    out.append(ToolCall(str(block.get("id")), str(block.get("name")), _json(block.get("input"))))
    return out


def replace_tool_results(api: Api, body: JsonObject, call_id: str, error: str) -> int:
    """Replace every result of tool call ``call_id`` in the request with ``error``; how many were."""
    replaced = 0
    if api == "chat":
        for message in _iterate(body.get("messages"), "messages"):
            if isinstance(message, dict) and message.get("role") == "tool" and message.get("tool_call_id") == call_id:
                message["content"] = error
                replaced += 1
    elif api == "responses":
        items = body.get("input")
        for item in items if isinstance(items, list) else []:
            if isinstance(item, dict) and item.get("type") == "function_call_output" and item.get("call_id") == call_id:
                item["output"] = error
                replaced += 1
    else:
        for message in _iterate(body.get("messages"), "messages"):
            content = message.get("content") if isinstance(message, dict) else None
            for block in content if isinstance(content, list) else []:
                if isinstance(block, dict) and block.get("type") == "tool_result" and block.get("tool_use_id") == call_id:
                    block["content"] = error
                    block["is_error"] = True
                    replaced += 1
    return replaced


# --- GenAI message JSON (semantic conventions v1.37+) ------------------------------------------


def _arguments(value: JsonValue) -> JsonValue:
    if isinstance(value, str):
        try:
            parsed: JsonValue = orjson.loads(value)
        except orjson.JSONDecodeError:
            return value
        return parsed
    return value


def _text_parts(content: object) -> list[JsonValue]:
    if isinstance(content, str):
        return [{"type": "text", "content": content}]
    parts: list[JsonValue] = []
    for block in content if isinstance(content, list) else []:
        if not isinstance(block, Mapping):
            continue
        kind = block.get("type")
        if kind in ("text", "input_text", "output_text"):
            parts.append({"type": "text", "content": _json(block.get("text"))})
        elif kind == "tool_use":
            parts.append({"type": "tool_call", "id": _json(block.get("id")), "name": _json(block.get("name")),
                          "arguments": _json(block.get("input"))})
        elif kind == "tool_result":
            parts.append({"type": "tool_call_response", "id": _json(block.get("tool_use_id")), "response": _json(block.get("content"))})
        else:
            parts.append({"type": str(kind)})
    return parts


def input_messages(api: Api, body: Mapping[str, object]) -> list[JsonObject]:
    """``gen_ai.input.messages`` for a request: roles and parts, tool calls and their results included; WireShapeError
    for a request of a shape the API never takes."""
    out: list[JsonObject] = []
    if api == "messages" and body.get("system"):
        out.append({"role": "system", "parts": _text_parts(body["system"])})
    if api == "responses":
        if body.get("instructions"):
            out.append({"role": "system", "parts": _text_parts(body["instructions"])})
        items = body.get("input")
        for item in [{"role": "user", "content": items}] if isinstance(items, str) else _iterate(items, "input"):
            out.append(_responses_item(item))
        return out
    for message in _iterate(body.get("messages"), "messages"):
        if not isinstance(message, Mapping):
            continue
        role = str(message.get("role"))
        if api == "chat" and role == "tool":
            out.append({"role": "tool", "parts": [{"type": "tool_call_response", "id": _json(message.get("tool_call_id")),
                                                   "response": _json(message.get("content"))}]})
            continue
        parts = _text_parts(message.get("content"))
        for call in _objects(message.get("tool_calls"), "messages[].tool_calls"):
            fn = _object(call.get("function") or {}, "tool_calls[].function")
            parts.append({"type": "tool_call", "id": _json(call.get("id")), "name": _json(fn.get("name")),
                          "arguments": _arguments(_json(fn.get("arguments")))})
        out.append({"role": role, "parts": parts})
    return out


def _responses_item(item: object) -> JsonObject:
    if not isinstance(item, Mapping):
        return {"role": "user", "parts": []}
    kind = item.get("type")
    if kind == "function_call":
        return {"role": "assistant", "parts": [{"type": "tool_call", "id": _json(item.get("call_id")), "name": _json(item.get("name")),
                                                "arguments": _arguments(_json(item.get("arguments")))}]}
    if kind == "function_call_output":
        return {"role": "tool", "parts": [{"type": "tool_call_response", "id": _json(item.get("call_id")),
                                           "response": _json(item.get("output"))}]}
    return {"role": str(item.get("role") or "user"), "parts": _text_parts(item.get("content"))}


def output_messages(reply: Reply) -> list[JsonObject]:
    """``gen_ai.output.messages``: the answer's text and the tool calls the model proposed."""
    parts: list[JsonValue] = [{"type": "text", "content": reply.text}] if reply.text else []
    parts += [{"type": "tool_call", "id": c.id, "name": c.name, "arguments": _arguments(c.arguments)} for c in reply.tool_calls]
    finish = "tool_call" if reply.tool_calls else (reply.finish_reason or "stop")
    return [{"role": "assistant", "parts": parts, "finish_reason": finish}]
