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
from typing import Any, Literal

import orjson

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


# --- sampling ----------------------------------------------------------------------------------


# What each API does when a parameter is left out: a variant that sets a parameter to its default changes nothing
# the provider does, so it is no change (the seed has no default: any seed is one).
_SAMPLING_DEFAULTS: dict[Api, dict[str, float]] = {"chat": {"temperature": 1.0, "top_p": 1.0},
                                                   "responses": {"temperature": 1.0, "top_p": 1.0},
                                                   "messages": {"temperature": 1.0, "top_p": 1.0}}
# OpenAI reasoning models refuse temperature and top_p (400 "Unsupported parameter"): sending them would fail the
# call, so for these the parameters are skipped (the trial then shows no change and is not scored).
_NO_SAMPLING_MODELS = re.compile(r"^(o\d|gpt-5(?!-chat))", re.I)


def _unhonoured(api: Api, body: Mapping[str, Any], param: str, planned: Mapping[str, Any]) -> str | None:
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


def apply_sampling(api: Api, body: dict[str, Any], metadata: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Set the trial's ``temperature`` / ``top_p`` / ``seed`` where the API honours them; each as before → after.

    An entry is ``changed`` only when the provider now gets a different value than the unperturbed request
    would have had (its own value, else the API's default): ``temperature`` 1.0 on a request that sets none is
    no change on any of the three APIs. A parameter the API (or the model) does not take is not sent, since
    the provider would reject the whole call, and is reported with ``skipped``. Only changed entries are
    evidence that the perturbation reached the provider.
    """
    planned = {p: metadata[p] for p in ("temperature", "top_p", "seed") if metadata.get(p) is not None}
    changes: list[dict[str, Any]] = []
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


def _spec_parts(spec: Mapping[str, Any]) -> tuple[str, str, dict[str, Any]]:
    """(name, description, JSON schema) of a tool spec in any of the three schemas."""
    inner = spec.get("function") if isinstance(spec.get("function"), Mapping) else spec
    assert isinstance(inner, Mapping)
    schema = inner.get("input_schema") or inner.get("parameters") or {"type": "object", "properties": {}}
    return str(inner.get("name") or ""), str(inner.get("description") or ""), dict(schema)


def tool_name(api: Api, tool: Mapping[str, Any]) -> str | None:
    if api == "chat" and isinstance(tool.get("function"), Mapping):
        return str(tool["function"].get("name"))
    return str(tool["name"]) if tool.get("name") is not None else None


def provider_tool(api: Api, spec: Mapping[str, Any]) -> dict[str, Any]:
    """A tool spec in ``api``'s own tool schema."""
    name, description, schema = _spec_parts(spec)
    if api == "chat":
        return {"type": "function", "function": {"name": name, "description": description, "parameters": schema}}
    if api == "responses":
        return {"type": "function", "name": name, "description": description, "parameters": schema, "strict": False}
    return {"name": name, "description": description, "input_schema": schema}


def add_decoys(api: Api, body: dict[str, Any], decoys: Iterable[Mapping[str, Any]]) -> list[str]:
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
    arguments: Any = None


@dataclass
class Reply:
    """What the model answered: text, proposed tool calls, finish reason, which model and response."""

    text: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    model: str | None = None
    response_id: str | None = None


def reply_from_body(api: Api, body: Mapping[str, Any]) -> Reply:
    reply = Reply(model=_str(body.get("model")), response_id=_str(body.get("id")))
    if api == "chat":
        for choice in body.get("choices") or []:
            message = choice.get("message") or {}
            reply.text += message.get("content") or ""
            reply.finish_reason = choice.get("finish_reason") or reply.finish_reason
            for call in message.get("tool_calls") or []:
                fn = call.get("function") or {}
                reply.tool_calls.append(ToolCall(str(call.get("id")), str(fn.get("name")), fn.get("arguments")))
    elif api == "responses":
        reply.finish_reason = _str(body.get("status"))
        for item in body.get("output") or []:
            if item.get("type") == "function_call":
                reply.tool_calls.append(ToolCall(str(item.get("call_id")), str(item.get("name")), item.get("arguments")))
            elif item.get("type") == "message":
                reply.text += "".join(str(c.get("text") or "") for c in item.get("content") or [] if isinstance(c, Mapping))
    else:
        reply.finish_reason = _str(body.get("stop_reason"))
        for block in body.get("content") or []:
            if block.get("type") == "text":
                reply.text += str(block.get("text") or "")
            elif block.get("type") == "tool_use":
                reply.tool_calls.append(ToolCall(str(block.get("id")), str(block.get("name")), block.get("input")))
    return reply


def reply_from_events(api: Api, events: Iterable[Mapping[str, Any]]) -> Reply:
    """The same from a stream's SSE events (tool-call names and arguments assembled from deltas)."""
    reply = Reply()
    calls: dict[tuple[int, int], ToolCall] = {}
    for event in events:
        if api == "responses":
            if event.get("type") in ("response.completed", "response.incomplete") and isinstance(event.get("response"), Mapping):
                return reply_from_body(api, event["response"])
            if event.get("type") == "response.output_text.delta":
                reply.text += str(event.get("delta") or "")
        elif api == "chat":
            reply.model = reply.model or _str(event.get("model"))
            reply.response_id = reply.response_id or _str(event.get("id"))
            for choice in event.get("choices") or []:
                delta = choice.get("delta") or {}
                reply.text += delta.get("content") or ""
                reply.finish_reason = choice.get("finish_reason") or reply.finish_reason
                for part in delta.get("tool_calls") or []:
                    call = calls.setdefault((int(choice.get("index") or 0), int(part.get("index") or 0)), ToolCall("", "", ""))
                    fn = part.get("function") or {}
                    call.id = part.get("id") or call.id
                    call.name = fn.get("name") or call.name
                    call.arguments = str(call.arguments or "") + (fn.get("arguments") or "")
        else:
            _messages_event(event, reply, calls)
    reply.tool_calls = [calls[k] for k in sorted(calls)] or reply.tool_calls
    return reply


def _messages_event(event: Mapping[str, Any], reply: Reply, calls: dict[tuple[int, int], ToolCall]) -> None:
    kind = event.get("type")
    if kind == "message_start":
        message = event.get("message") or {}
        reply.model, reply.response_id = _str(message.get("model")), _str(message.get("id"))
    elif kind == "content_block_start":
        block = event.get("content_block") or {}
        if block.get("type") == "tool_use":
            calls[(0, int(event.get("index") or 0))] = ToolCall(str(block.get("id")), str(block.get("name")), "")
    elif kind == "content_block_delta":
        delta = event.get("delta") or {}
        if delta.get("type") == "text_delta":
            reply.text += str(delta.get("text") or "")
        elif delta.get("type") == "input_json_delta" and (0, int(event.get("index") or 0)) in calls:
            call = calls[(0, int(event.get("index") or 0))]
            call.arguments = str(call.arguments or "") + str(delta.get("partial_json") or "")
    elif kind == "message_delta":
        reply.finish_reason = _str((event.get("delta") or {}).get("stop_reason")) or reply.finish_reason


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


# --- tool results (tool_result_fault) -------------------------------------------------------------


def request_tool_calls(api: Api, body: Mapping[str, Any]) -> list[ToolCall]:
    """The tool calls already in the conversation the request carries, in order."""
    out: list[ToolCall] = []
    if api == "chat":
        for message in body.get("messages") or []:
            for call in (message.get("tool_calls") or []) if isinstance(message, Mapping) else []:
                fn = call.get("function") or {}
                out.append(ToolCall(str(call.get("id")), str(fn.get("name")), fn.get("arguments")))
    elif api == "responses":
        items = body.get("input")
        for item in items if isinstance(items, list) else []:
            if isinstance(item, Mapping) and item.get("type") == "function_call":
                out.append(ToolCall(str(item.get("call_id")), str(item.get("name")), item.get("arguments")))
    else:
        for message in body.get("messages") or []:
            content = message.get("content") if isinstance(message, Mapping) else None
            for block in content if isinstance(content, list) else []:
                if isinstance(block, Mapping) and block.get("type") == "tool_use":
                    out.append(ToolCall(str(block.get("id")), str(block.get("name")), block.get("input")))
    return out


def replace_tool_results(api: Api, body: dict[str, Any], call_id: str, error: str) -> int:
    """Replace every result of tool call ``call_id`` in the request with ``error``; how many were."""
    replaced = 0
    if api == "chat":
        for message in body.get("messages") or []:
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
        for message in body.get("messages") or []:
            content = message.get("content") if isinstance(message, dict) else None
            for block in content if isinstance(content, list) else []:
                if isinstance(block, dict) and block.get("type") == "tool_result" and block.get("tool_use_id") == call_id:
                    block["content"] = error
                    block["is_error"] = True
                    replaced += 1
    return replaced


# --- GenAI message JSON (semantic conventions v1.37+) ------------------------------------------


def _arguments(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return value
    return value


def _text_parts(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "content": content}]
    parts: list[dict[str, Any]] = []
    for block in content if isinstance(content, list) else []:
        if not isinstance(block, Mapping):
            continue
        kind = block.get("type")
        if kind in ("text", "input_text", "output_text"):
            parts.append({"type": "text", "content": block.get("text")})
        elif kind == "tool_use":
            parts.append({"type": "tool_call", "id": block.get("id"), "name": block.get("name"), "arguments": block.get("input")})
        elif kind == "tool_result":
            parts.append({"type": "tool_call_response", "id": block.get("tool_use_id"), "response": block.get("content")})
        else:
            parts.append({"type": str(kind)})
    return parts


def input_messages(api: Api, body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``gen_ai.input.messages`` for a request: roles and parts, tool calls and their results included."""
    out: list[dict[str, Any]] = []
    if api == "messages" and body.get("system"):
        out.append({"role": "system", "parts": _text_parts(body["system"])})
    if api == "responses":
        if body.get("instructions"):
            out.append({"role": "system", "parts": _text_parts(body["instructions"])})
        items = body.get("input")
        for item in [{"role": "user", "content": items}] if isinstance(items, str) else (items or []):
            out.append(_responses_item(item))
        return out
    for message in body.get("messages") or []:
        if not isinstance(message, Mapping):
            continue
        role = str(message.get("role"))
        if api == "chat" and role == "tool":
            out.append({"role": "tool", "parts": [{"type": "tool_call_response", "id": message.get("tool_call_id"),
                                                   "response": message.get("content")}]})
            continue
        parts = _text_parts(message.get("content"))
        for call in message.get("tool_calls") or []:
            fn = call.get("function") or {}
            parts.append({"type": "tool_call", "id": call.get("id"), "name": fn.get("name"), "arguments": _arguments(fn.get("arguments"))})
        out.append({"role": role, "parts": parts})
    return out


def _responses_item(item: Any) -> dict[str, Any]:
    if not isinstance(item, Mapping):
        return {"role": "user", "parts": []}
    kind = item.get("type")
    if kind == "function_call":
        return {"role": "assistant", "parts": [{"type": "tool_call", "id": item.get("call_id"), "name": item.get("name"),
                                                "arguments": _arguments(item.get("arguments"))}]}
    if kind == "function_call_output":
        return {"role": "tool", "parts": [{"type": "tool_call_response", "id": item.get("call_id"), "response": item.get("output")}]}
    return {"role": str(item.get("role") or "user"), "parts": _text_parts(item.get("content"))}


def output_messages(reply: Reply) -> list[dict[str, Any]]:
    """``gen_ai.output.messages``: the answer's text and the tool calls the model proposed."""
    parts: list[dict[str, Any]] = [{"type": "text", "content": reply.text}] if reply.text else []
    parts += [{"type": "tool_call", "id": c.id, "name": c.name, "arguments": _arguments(c.arguments)} for c in reply.tool_calls]
    finish = "tool_call" if reply.tool_calls else (reply.finish_reason or "stop")
    return [{"role": "assistant", "parts": parts, "finish_reason": finish}]
