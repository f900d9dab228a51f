"""A loopback stand-in for the Anthropic Messages API, so the arms run offline on the real client.

``AnthropicStandIn`` binds ``127.0.0.1`` on a free port and answers ``POST /v1/messages`` with
real Messages API JSON (``id``, ``type: message``, ``content`` blocks including ``tool_use``,
``stop_reason``, ``usage``), produced by a *responder*: any callable taking the request body and
headers and returning ``(content_blocks, stop_reason)``. The responder this domain ships is
:class:`domains.accounts_payable.simulated_model.SimulatedModel`.

Everything it answers is labelled simulated: the response ``model`` is the responder's model name
(``simulated-ap-policy-v1``), the body carries ``"simulated": true`` and the response has an
``x-plumbline-simulated: true`` header. The agents talk to it through
``anthropic.Anthropic(base_url=standin.base_url, api_key=...)``: the code path is the one used
against the real API.

Errors come back in the API's error shape (``{"type": "error", "error": {...}}``) with the API's
status codes, so the client raises the same exception classes it would against the real service.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol


class Responder(Protocol):
    """What the stand-in serves: a model that answers one Messages API request."""

    model_name: str

    def respond(
        self, request: Mapping[str, Any], headers: Mapping[str, str]
    ) -> tuple[list[dict[str, Any]], str]:
        """Return ``(content_blocks, stop_reason)`` for one request body."""
        ...


class RequestRejected(Exception):
    """Raised by a responder for a request the real API would refuse (answered as HTTP 400)."""


def _estimate_tokens(value: Any) -> int:
    """A rough token count (~4 characters a token) so usage numbers are plausible, not zero."""
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    return max(1, len(text) // 4)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in separate writes

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        return  # quiet: tests and CLI output stay readable

    def _send(self, status: int, body: Mapping[str, Any], extra: Mapping[str, str] = {}) -> None:
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(raw)))
        self.send_header("request-id", f"req_sim_{next(self.server.request_ids):08d}")
        self.send_header("x-plumbline-simulated", "true")
        for key, value in extra.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(raw)

    def _error(self, status: int, kind: str, message: str) -> None:
        self._send(status, {"type": "error", "error": {"type": kind, "message": message}})

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        if self.path.split("?")[0].rstrip("/") == "/v1/models":
            name = self.server.responder.model_name
            model = {"type": "model", "id": name, "display_name": f"{name} (simulated)",
                     "created_at": "2026-01-01T00:00:00Z"}
            self._send(200, {"data": [model], "has_more": False, "first_id": name, "last_id": name})
            return
        self._error(404, "not_found_error", f"no route GET {self.path}")

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        if self.path.split("?")[0].rstrip("/") != "/v1/messages":
            self._error(404, "not_found_error", f"no route {self.path}")
            return
        length = int(self.headers.get("content-length") or 0)
        try:
            request = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            self._error(400, "invalid_request_error", "body is not JSON")
            return
        problem = _validate(request)
        if problem:
            self._error(400, "invalid_request_error", problem)
            return
        headers = {k.lower(): v for k, v in self.headers.items()}
        try:
            content, stop_reason = self.server.responder.respond(request, headers)
        except RequestRejected as exc:
            self._error(400, "invalid_request_error", str(exc))
            return
        except Exception as exc:  # a responder bug is a server error, not a hung client
            self._error(500, "api_error", f"{type(exc).__name__}: {exc}")
            return
        self._send(200, self.server.message(request, content, stop_reason))


def _validate(request: Mapping[str, Any]) -> str | None:
    if not request.get("model"):
        return "model: field required"
    if not isinstance(request.get("max_tokens"), int):
        return "max_tokens: field required"
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages: at least one message is required"
    if request.get("stream"):
        return "stream: streaming is not supported by the offline stand-in"
    return None


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, responder: Responder) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.responder = responder
        self.counter = itertools.count(1)
        self.request_ids = itertools.count(1)

    def message(
        self, request: Mapping[str, Any], content: list[dict[str, Any]], stop_reason: str
    ) -> dict[str, Any]:
        n = next(self.counter)
        prompt = {k: request.get(k) for k in ("system", "messages", "tools")}
        return {
            "id": f"msg_sim_{n:010d}",
            "type": "message",
            "role": "assistant",
            "model": self.responder.model_name,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": {
                "input_tokens": _estimate_tokens(prompt),
                "output_tokens": _estimate_tokens(content),
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
            },
            "simulated": True,
        }


class AnthropicStandIn:
    """Serve a responder on ``http://127.0.0.1:<free port>``; use as a context manager.

    ``base_url`` is what ``anthropic.Anthropic(base_url=...)`` takes. Requests are handled on
    daemon threads, so concurrent trials are fine as long as the responder is thread-safe
    (``SimulatedModel`` keeps no per-request state).
    """

    def __init__(self, responder: Responder) -> None:
        self._server = _Server(responder)
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host.decode() if isinstance(host, bytes) else host}:{port}"

    def start(self) -> AnthropicStandIn:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._server.serve_forever,
                kwargs={"poll_interval": 0.05},
                name="anthropic-standin",
                daemon=True,
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._server.server_close()

    def __enter__(self) -> AnthropicStandIn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
