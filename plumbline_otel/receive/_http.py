"""OTLP/HTTP on a threaded stdlib server: POST /v1/traces and /v1/logs, GET /healthz, /metrics and the console.

Answers follow the OTLP/HTTP spec: 200 with an `Export*ServiceResponse` in the request's content
type (JSON `{}` on full success, `partialSuccess` when some spans were unusable), 400 with a
`google.rpc.Status` body for an undecodable request, 413 past the body limit, 415 for a content
type other than protobuf or JSON, 405 for a method other than POST, 401 without the bearer token,
503 with `Retry-After` when the queue is full. Connections past `max_connections` get a 503 at
once, so threads (and memory) stay bounded whatever the load. GET / and the console's other pages
(`report.console`) answer under the same bearer-token rule, from their own read connection.
"""

from __future__ import annotations

import contextlib
import logging
import math
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import orjson
from google.rpc import status_pb2
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsPartialSuccess, ExportLogsServiceResponse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTracePartialSuccess, ExportTraceServiceResponse

from plumbline_otel.receive._auth import bearer_ok
from plumbline_otel.receive._intake import Intake, Outcome

log = logging.getLogger("plumbline.receive")

_PROTOBUF, _JSON = "application/x-protobuf", "application/json"
_SIGNALS = {"/v1/traces": "traces", "/v1/logs": "logs"}
_OPEN_PATHS = ("/healthz",)
_GRPC_CODES = {400: 3, 401: 16, 404: 5, 405: 12, 413: 8, 415: 3, 503: 14}
_STATUS = {"ok": 200, "partial": 200, "invalid": 400, "too_large": 413, "overloaded": 503, "unavailable": 503}
# Console pages: no script, no request anywhere else, never cached (they show live data).
_PAGE_HEADERS = {"Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'",
                 "X-Content-Type-Options": "nosniff", "Cache-Control": "no-store"}
_BUSY = b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: %d\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class _BodyTooLarge(Exception):
    pass


def _media_type(content_type: str) -> str | None:
    media = content_type.split(";")[0].strip().lower()
    if media == _JSON:
        return _JSON
    if media in (_PROTOBUF, "application/protobuf"):
        return _PROTOBUF
    return None


def _success_body(signal: str, outcome: Outcome, media: str) -> bytes:
    if media == _JSON:
        if outcome.status == "ok":
            return b"{}"
        field = "rejectedSpans" if signal == "traces" else "rejectedLogRecords"
        return orjson.dumps({"partialSuccess": {field: str(outcome.rejected), "errorMessage": outcome.message}})
    if signal == "traces":
        partial = ExportTracePartialSuccess(rejected_spans=outcome.rejected, error_message=outcome.message)
        response: Any = ExportTraceServiceResponse(partial_success=partial) if outcome.status == "partial" else ExportTraceServiceResponse()
    else:
        partial = ExportLogsPartialSuccess(rejected_log_records=outcome.rejected, error_message=outcome.message)
        response = ExportLogsServiceResponse(partial_success=partial) if outcome.status == "partial" else ExportLogsServiceResponse()
    body: bytes = response.SerializeToString()
    return body


def _status_body(code: int, message: str, media: str) -> bytes:
    grpc_code = _GRPC_CODES.get(code, 2)
    if media == _JSON:
        return orjson.dumps({"code": grpc_code, "message": message})
    body: bytes = status_pb2.Status(code=grpc_code, message=message).SerializeToString()
    return body


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "plumbline"
    timeout = 60  # seconds a client may stall mid-request before its connection is closed
    server: HttpServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        log.debug("%s %s", self.address_string(), format % args)

    def setup(self) -> None:
        super().setup()
        if isinstance(self.connection, ssl.SSLSocket):
            self.connection.do_handshake()

    def _send(self, code: int, body: bytes, media: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", media)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, code: int, message: str, media: str = _JSON, headers: dict[str, str] | None = None) -> None:
        self._send(code, _status_body(code, message, media), media, headers)

    def _authorised(self) -> bool:
        expected = self.server.auth_header
        if expected is None or urlsplit(self.path).path in _OPEN_PATHS:
            return True
        return bearer_ok(self.headers.get("Authorization"), expected)

    def _discard_body(self, cap: int) -> None:
        """Read and drop a declared body up to `cap` bytes, so the client is reading when the 413 comes.

        Past the cap the connection is closed unread; a client still writing may then see a reset.
        """
        try:
            remaining = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            return
        if remaining > cap:
            return
        while remaining > 0:
            chunk = self.rfile.read(min(remaining, 1 << 16))
            if not chunk:
                return
            remaining -= len(chunk)

    def _read_body(self, limit: int) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            return self._read_chunked(limit)
        length = int(self.headers.get("Content-Length") or 0)
        if length > limit:
            raise _BodyTooLarge
        return self.rfile.read(length)

    def _read_chunked(self, limit: int) -> bytes:
        parts: list[bytes] = []
        total = 0
        while True:
            size = int(self.rfile.readline(1024).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                    pass
                return b"".join(parts)
            total += size
            if total > limit:
                raise _BodyTooLarge
            parts.append(self.rfile.read(size))
            self.rfile.readline(1024)

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        signal = _SIGNALS.get(urlsplit(self.path).path)
        if signal is None:
            self._error(404, f"no such path {self.path}; OTLP/HTTP takes POST /v1/traces and /v1/logs")
            return
        if not self._authorised():
            self.close_connection = True
            self._error(401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})
            return
        media = _media_type(self.headers.get("Content-Type") or "")
        if media is None:
            self.close_connection = True
            self._error(415, f"unsupported Content-Type {self.headers.get('Content-Type')!r}; use {_PROTOBUF} or {_JSON}")
            return
        limit = self.server.max_body_bytes
        try:
            body = self._read_body(limit)
        except _BodyTooLarge:
            self.close_connection = True
            self._discard_body(4 * limit)
            self._error(413, f"request body is larger than the {limit >> 20} MiB limit", media)
            return
        except ValueError:
            self.close_connection = True
            self._error(400, "malformed Content-Length or chunked body", media)
            return
        if self.server.draining:
            self.close_connection = True
            self._answer(signal, Outcome("unavailable", "the server is shutting down"), media)
            return
        encoding = self.headers.get("Content-Encoding") or ""
        intake = self.server.intake
        export = intake.traces if signal == "traces" else intake.logs
        with self.server.in_flight():
            outcome = export(body, media, encoding, "http", limit)
        self._answer(signal, outcome, media)

    def _answer(self, signal: str, outcome: Outcome, media: str) -> None:
        """The one place an `Outcome` becomes an HTTP answer."""
        code = _STATUS[outcome.status]
        if code == 200:
            self._send(200, _success_body(signal, outcome, media), media)
        elif code == 503:
            self._error(503, outcome.message, media, {"Retry-After": str(self.server.retry_after_header)})
        else:
            self.close_connection = code == 413
            self._error(code, outcome.message, media)

    def do_GET(self) -> None:  # noqa: N802
        path = urlsplit(self.path).path
        if path in _SIGNALS:
            self._error(405, "OTLP/HTTP export takes POST", headers={"Allow": "POST"})
        elif not self._authorised():
            self._error(401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})
        elif path == "/healthz":
            draining = self.server.draining
            body = orjson.dumps({"status": "draining" if draining else "ok"})
            self._send(503 if draining else 200, body, _JSON)
        elif path == "/metrics":
            self._send(200, self.server.render_metrics().encode(), "text/plain; version=0.0.4; charset=utf-8")
        elif self.server.console is not None and self.server.console.answers(path):
            status, page = self.server.console.handle(path, urlsplit(self.path).query)
            self._send(status, page.encode(), "text/html; charset=utf-8", _PAGE_HEADERS)
        else:
            self._error(404, f"no such path {path}")

    def _not_allowed(self) -> None:
        if urlsplit(self.path).path in _SIGNALS:
            self.close_connection = True
            self._error(405, f"OTLP/HTTP export takes POST, not {self.command}", headers={"Allow": "POST"})
        else:
            self._error(404, f"no such path {self.path}")

    do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _not_allowed  # noqa: N815

    def do_HEAD(self) -> None:  # noqa: N802
        self._not_allowed()


class HttpServer(ThreadingHTTPServer):
    """One thread per connection, at most `max_connections` at once; TLS handshakes run on those threads."""

    daemon_threads = True
    request_queue_size = 128

    def __init__(self, host: str, port: int, intake: Intake, *, max_body_bytes: int, max_connections: int,
                 retry_after: float, render_metrics: Callable[[], str], token: str | None = None,
                 ssl_context: ssl.SSLContext | None = None, console: Any | None = None) -> None:
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.intake, self.max_body_bytes, self.render_metrics = intake, max_body_bytes, render_metrics
        self.retry_after_header = max(1, math.ceil(retry_after))
        self.auth_header = token.encode() if token else None  # the token a request's bearer header must carry
        self.ssl_context = ssl_context
        self.console = console  # read-only pages under / (report.console.Console), or None
        self.draining = False
        self._slots = threading.BoundedSemaphore(max_connections)
        self._active = 0
        self._idle = threading.Condition()
        super().__init__((host, port), _Handler)

    def get_request(self) -> tuple[Any, Any]:
        sock, address = super().get_request()
        if self.ssl_context is not None:
            sock = self.ssl_context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, address

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            try:
                if self.ssl_context is None:  # a TLS client would need a handshake first; just close
                    request.sendall(_BUSY % self.retry_after_header)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    @contextlib.contextmanager
    def in_flight(self) -> Iterator[None]:
        """Count a request being processed, so `drain` can wait for it."""
        with self._idle:
            self._active += 1
        try:
            yield
        finally:
            with self._idle:
                self._active -= 1
                self._idle.notify_all()

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("connection from %s failed", client_address, exc_info=True)

    def drain(self, grace: float) -> None:
        """Stop accepting, answer 503 to new requests on open connections, wait for those being processed."""
        self.draining = True
        self.shutdown()
        with self._idle:
            self._idle.wait_for(lambda: self._active == 0, timeout=grace)
        self.server_close()


def make_ssl_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """A server-side TLS context (TLS 1.2+) from PEM files."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_file, key_file)
    return context


__all__ = ["HttpServer", "make_ssl_context"]
