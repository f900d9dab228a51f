"""A simulated model provider on 127.0.0.1: the three APIs, plain and streamed, answered by a script.

It stands in for OpenAI and Anthropic behind the proxy in tests, benchmarks and offline demos, so
the real SDKs and the real proxy code path run with no key and no network. Its answers are
shaped like the providers' (the SDKs parse them), its usage is scripted (cache reads and writes
included), and it keeps every request it received, so a test can see what the proxy forwarded.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson

from plumbline_otel.replay.jsonvalue import JsonObject, JsonValue
from plumbline_otel.replay.proxy.wire import Api, api_for, request_tool_calls, tool_name


@dataclass
class SimReply:
    """What the simulated model answers: text and/or tool calls (name, arguments), and its usage."""

    text: str = ""
    tool_calls: list[tuple[str, JsonObject]] = field(default_factory=list)
    input_tokens: int | None = None  # None: a quarter of the request's bytes
    output_tokens: int = 20
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0


Script = Callable[[Api, JsonObject], SimReply]


def default_script(api: Api, body: Mapping[str, object]) -> SimReply:
    """Call the first offered tool once, then answer "done" (enough for an agent loop to finish)."""
    tools = body.get("tools") or []
    if isinstance(tools, list) and tools and not request_tool_calls(api, body):
        return SimReply(tool_calls=[(str(tool_name(api, tools[0])), {"id": "INV-1"})])
    return SimReply(text="done")


def _usage(api: Api, reply: SimReply, size: int) -> dict[str, Any]:
    uncached = reply.input_tokens if reply.input_tokens is not None else max(1, size // 4)
    if api == "messages":
        return {"input_tokens": uncached, "output_tokens": reply.output_tokens,
                "cache_creation_input_tokens": reply.cache_write_tokens, "cache_read_input_tokens": reply.cache_read_tokens}
    total = uncached + reply.cache_read_tokens
    if api == "chat":
        return {"prompt_tokens": total, "completion_tokens": reply.output_tokens, "total_tokens": total + reply.output_tokens,
                "prompt_tokens_details": {"cached_tokens": reply.cache_read_tokens}}
    return {"input_tokens": total, "input_tokens_details": {"cached_tokens": reply.cache_read_tokens},
            "output_tokens": reply.output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": total + reply.output_tokens}


def body_for(api: Api, model: str, reply: SimReply, usage: Mapping[str, JsonValue], n: int) -> JsonObject:
    """A whole response in ``api``'s shape."""
    body: JsonObject = _body(api, model, reply, usage, n)
    return body


def _body(api: Api, model: str, reply: SimReply, usage: Mapping[str, JsonValue], n: int) -> dict[str, Any]:
    """`body_for`, as this module reads it back (`stream_for` splits it into events)."""
    calls = [(f"call_{n}_{i}", name, args) for i, (name, args) in enumerate(reply.tool_calls)]
    if api == "chat":
        message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
        if calls:
            message["tool_calls"] = [{"id": c, "type": "function", "function": {"name": name, "arguments": orjson.dumps(a).decode()}}
                                     for c, name, a in calls]
        return {"id": f"chatcmpl-sim-{n}", "object": "chat.completion", "created": 0, "model": model,
                "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop", "logprobs": None}],
                "usage": usage}
    if api == "responses":
        output: list[dict[str, Any]] = []
        if reply.text:
            output.append({"type": "message", "id": f"msg_sim_{n}", "status": "completed", "role": "assistant",
                           "content": [{"type": "output_text", "text": reply.text, "annotations": []}]})
        output += [{"type": "function_call", "id": f"fc_{c}", "call_id": c, "name": name, "arguments": orjson.dumps(a).decode(),
                    "status": "completed"} for c, name, a in calls]
        return {"id": f"resp_sim_{n}", "object": "response", "created_at": 0, "status": "completed", "model": model,
                "output": output, "usage": usage, "parallel_tool_calls": True, "tool_choice": "auto", "tools": []}
    content: list[dict[str, Any]] = [{"type": "text", "text": reply.text}] if reply.text else []
    content += [{"type": "tool_use", "id": c, "name": name, "input": a} for c, name, a in calls]
    return {"id": f"msg_sim_{n}", "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": "tool_use" if calls else "end_turn", "stop_sequence": None, "usage": usage}


def _sse(data: dict[str, Any], event: str | None = None) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + orjson.dumps(data) + b"\n\n"


def stream_for(api: Api, model: str, reply: SimReply, usage: Mapping[str, JsonValue], n: int, include_usage: bool) -> list[bytes]:
    """The same answer as SSE events, split the way each provider streams."""
    whole = _body(api, model, reply, usage, n)
    words = [w + " " for w in reply.text.split(" ")] if reply.text else []
    if api == "chat":
        base = {"id": whole["id"], "object": "chat.completion.chunk", "created": 0, "model": model}
        tail = {"usage": None} if include_usage else {}
        out = [_sse({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}], **tail})]
        out += [_sse({**base, "choices": [{"index": 0, "delta": {"content": w}, "finish_reason": None}], **tail}) for w in words]
        for i, call in enumerate(whole["choices"][0]["message"].get("tool_calls") or []):
            fn = call["function"]
            out.append(_sse({**base, "choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": i, "id": call["id"], "type": "function", "function": {"name": fn["name"], "arguments": ""}}]}, "finish_reason": None}], **tail}))
            out.append(_sse({**base, "choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": i, "function": {"arguments": fn["arguments"]}}]}, "finish_reason": None}], **tail}))
        out.append(_sse({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": whole["choices"][0]["finish_reason"]}], **tail}))
        if include_usage:
            out.append(_sse({**base, "choices": [], "usage": usage}))
        return [*out, b"data: [DONE]\n\n"]
    if api == "responses":
        started = {**whole, "status": "in_progress", "output": [], "usage": None}
        out = [_sse({"type": "response.created", "sequence_number": 0, "response": started}, "response.created")]
        out += [_sse({"type": "response.output_text.delta", "sequence_number": i + 1, "item_id": f"msg_sim_{n}", "output_index": 0,
                      "content_index": 0, "delta": w}, "response.output_text.delta") for i, w in enumerate(words)]
        out.append(_sse({"type": "response.completed", "sequence_number": len(out), "response": whole}, "response.completed"))
        return out
    start_usage = {**usage, "output_tokens": 1}
    out = [_sse({"type": "message_start", "message": {**whole, "content": [], "stop_reason": None, "usage": start_usage}}, "message_start")]
    for i, block in enumerate(whole["content"]):
        if block["type"] == "text":
            out.append(_sse({"type": "content_block_start", "index": i, "content_block": {"type": "text", "text": ""}}, "content_block_start"))
            out += [_sse({"type": "content_block_delta", "index": i, "delta": {"type": "text_delta", "text": w}}, "content_block_delta")
                    for w in words]
        else:
            out.append(_sse({"type": "content_block_start", "index": i, "content_block": {**block, "input": {}}}, "content_block_start"))
            out.append(_sse({"type": "content_block_delta", "index": i,
                             "delta": {"type": "input_json_delta", "partial_json": orjson.dumps(block["input"]).decode()}}, "content_block_delta"))
        out.append(_sse({"type": "content_block_stop", "index": i}, "content_block_stop"))
    out.append(_sse({"type": "message_delta", "delta": {"stop_reason": whole["stop_reason"], "stop_sequence": None},
                     "usage": {"output_tokens": reply.output_tokens}}, "message_delta"))
    return [*out, _sse({"type": "message_stop"}, "message_stop")]


class SimulatedProvider:
    """The stand-in provider: ``url`` for the proxy's upstreams (``openai_url`` adds ``/v1``)."""

    def __init__(self, script: Script | None = None) -> None:
        self.script = script or default_script
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._server = _SimServer(("127.0.0.1", 0), _SimHandler)
        self._server.sim = self
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), name="simulated-provider", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def openai_url(self) -> str:
        return f"{self.url}/v1"

    def upstreams(self) -> dict[str, str]:
        return {"openai": self.openai_url, "anthropic": self.url}

    def start(self) -> SimulatedProvider:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def answer(self, path: str, headers: dict[str, str], raw: bytes) -> tuple[int, str, list[bytes]]:
        """(status, content type, body chunks) for one request."""
        api = api_for(path)
        body = orjson.loads(raw) if raw else {}
        with self._lock:
            self.requests.append({"path": path, "headers": headers, "body": body})
            n = len(self.requests)
        if api is None:
            return 200, "application/json", [orjson.dumps({"object": "list", "data": [{"id": "simulated-model"}]})]
        reply = self.script(api, body)
        usage = _usage(api, reply, len(raw))
        model = str(body.get("model") or "simulated-model")
        if body.get("stream"):
            include = bool((body.get("stream_options") or {}).get("include_usage"))
            return 200, "text/event-stream", stream_for(api, model, reply, usage, n, include)
        return 200, "application/json", [orjson.dumps(body_for(api, model, reply, usage, n))]


class _SimServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024
    sim: SimulatedProvider


class _SimHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in separate writes: no 40 ms delayed-ACK stall
    server: _SimServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        return

    def _serve(self) -> None:
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        status, ctype, chunks = self.server.sim.answer(self.path.split("?")[0], dict(self.headers.items()), raw)
        self.send_response(status)
        self.send_header("content-type", ctype)
        if ctype == "text/event-stream":
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            for chunk in chunks:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            self.wfile.write(b"0\r\n\r\n")
            return
        payload = b"".join(chunks)
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_POST(self) -> None:  # noqa: N802
        self._serve()

    def do_GET(self) -> None:  # noqa: N802
        self._serve()
