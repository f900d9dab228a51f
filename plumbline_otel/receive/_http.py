"""OTLP/HTTP on a threaded stdlib server: POST /v1/traces and /v1/logs, GET /healthz, /metrics and the console.

Answers follow the OTLP/HTTP spec: 200 with an `Export*ServiceResponse` in the request's content
type (JSON `{}` on full success, `partialSuccess` when some spans were unusable), 400 with a
`google.rpc.Status` body for an undecodable request, 413 past the body limit, 415 for a content
type other than protobuf or JSON, 405 for a method other than POST, 401 without the bearer token,
503 with `Retry-After` when the queue is full. GET / and the console's other pages
(`report.console`) answer under the same bearer-token rule, from their own read connection, and so does
the console's one POST (starting a replay from a run's page, when the console allows it).

Hostile peers (`_budget.py` holds the shared pieces):
- A body is read only after the token check, and only as far as the memory budget allows: it holds
  budget for what arrived, each piece (at most `_PIECE`) or chunk reserved just before it is read, so
  a body declared large and sent slowly holds little; past the budget, even part-way, the answer is
  503 + Retry-After. Malformed framing (a chunk size that is not hex, a negative or
  doubled Content-Length, Transfer-Encoding with Content-Length) is a 400 at once.
- A client address may hold at most its share of the budget in bodies being read (`_budget.py`);
  past it, its next body is a 503 at once while other addresses are still read.
- A body must keep arriving: fewer than `body_min_rate` bytes a second over the last
  `rate_window` seconds (nothing at all for that long included) and it is cut with 408. When a
  request finds the budget spent, the server reclaims it from body reads that received less than
  `body_min_rate` bytes in the last `PRESSURE_WINDOW` seconds, slowest first: they are cut with
  503 + Retry-After and their reservations go to the requests waiting. Bodies held short of
  complete thus hold the budget for about a second while others need it, not until their deadline.
- Every phase of a connection has an absolute deadline that a trickle cannot extend: waiting for a
  request (`idle_timeout`), the TLS handshake and the request head (`header_timeout`, a head at most
  `max_head_bytes`), the body (`body_timeout`). The floor, its window and the head's size are
  `receivers.otlp.protocols.http.*` settings (defaults below).
- At most `max_connections` connections (`max_per_address` from one address) hold a thread. A new
  one past either cap takes the slot of the connection that has waited longest for a request or
  its head (else of the one reading a body the longest): slow connections make room for new ones
  instead of taking the port; only connections being answered keep their slots. With nothing to take, a few overflow threads answer `/healthz` (and 503 to
  anything else) under a short deadline; past those, an immediate 503.
"""

from __future__ import annotations

import contextlib
import http.client
import logging
import math
import re
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import orjson
from google.rpc import status_pb2
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsPartialSuccess, ExportLogsServiceResponse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTracePartialSuccess, ExportTraceServiceResponse

from plumbline_otel.receive._auth import bearer_ok
from plumbline_otel.receive._budget import Deadlines, MemoryBudget
from plumbline_otel.receive._intake import Intake, Outcome

log = logging.getLogger("plumbline.receive")

_PROTOBUF, _JSON = "application/x-protobuf", "application/json"
_SIGNALS = {"/v1/traces": "traces", "/v1/logs": "logs"}
_CONSOLE_POST_MAX = 4096  # a replay request from the console is a small form
_OPEN_PATHS = ("/healthz",)
_GRPC_CODES = {400: 3, 401: 16, 404: 5, 405: 12, 408: 4, 413: 8, 415: 3, 503: 14}
_STATUS = {"ok": 200, "partial": 200, "invalid": 400, "too_large": 413, "overloaded": 503, "exhausted": 503, "unavailable": 503}
# Console pages: no script, no request anywhere else, never cached (they show live data).
_PAGE_HEADERS = {"Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'",
                 "X-Content-Type-Options": "nosniff", "Cache-Control": "no-store"}
_BUSY = b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: %d\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
MAX_HEAD_BYTES = 64 << 10  # request line and headers together
_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,15}")
_LENGTH = re.compile(r"[0-9]{1,18}")
_MAX_TRAILER_BYTES = 8 << 10
_OVERFLOW_THREADS = 16  # past the connection caps: threads that answer /healthz (and 503 to the rest)
_OVERFLOW_TIMEOUT = 2.0
_EVICTABLE = ("setup", "idle", "headers")
BODY_MIN_RATE = 1024  # bytes a second a body must keep arriving at (0: no floor)
RATE_WINDOW = 5.0  # ... measured over this many seconds
PRESSURE_WINDOW = 1.0  # while others wait for the budget: over this many
_SAMPLE_EVERY = 0.25  # a body's progress is sampled this often
_PIECE = 1 << 18  # a body is read at most this much at a time


class _BodyTooLarge(Exception):
    pass


class _BadBody(Exception):
    """Malformed framing: a 400 at once, nothing more read."""


class _NoRoom(Exception):
    """The memory budget has no room for this body: 503, nothing more read."""


class _Gone(Exception):
    """The peer closed (or its deadline closed it) before the body was complete: no answer."""


class _Slow(Exception):
    """The body arrived slower than the floor (408), or was cut to reclaim its reservation (503)."""

    def __init__(self, reclaimed: bool) -> None:
        super().__init__("reclaimed" if reclaimed else "slow")
        self.reclaimed = reclaimed


class _Progress:
    """A body being read: bytes so far, when they came (sampled), the memory budget its read holds."""

    def __init__(self, window: float) -> None:
        self.window = window  # how far back the samples reach (the rate floor's window)
        self.began = time.monotonic()
        self.got = self.held = 0
        self.cut = False  # reclaimed: the reading thread answers 503 when its read ends
        self._samples: deque[tuple[float, int]] = deque([(self.began, 0)])  # (when, bytes so far), _SAMPLE_EVERY apart

    def advance(self, nbytes: int) -> None:
        now = time.monotonic()
        self.got += nbytes
        samples = self._samples
        if len(samples) > 1 and now - samples[-2][0] < _SAMPLE_EVERY:
            samples[-1] = (now, self.got)  # the latest sample always says when the last bytes came
        else:
            samples.append((now, self.got))
            while len(samples) > 2 and samples[1][0] <= now - self.window:
                samples.popleft()

    def arrived(self, window: float, now: float) -> int | None:
        """Bytes that arrived in the last `window` seconds; None for a body read for less than that."""
        if now - self.began < window:
            return None
        since, base = now - window, 0
        for when, got in tuple(self._samples):  # a copy: the reading thread appends
            if when > since:
                break
            base = got
        return self.got - base


@dataclass(eq=False)
class _Conn:
    """One accepted connection: where it is, since when (for the deadline and for eviction)."""

    sock: socket.socket
    address: str
    phase: str = "setup"  # setup (TLS handshake), idle, headers, body, busy
    since: float = field(default_factory=time.monotonic)
    evicted: bool = False
    overflow: bool = False
    thread: int = 0
    body: _Progress | None = None  # while its body is read

    def close(self) -> None:
        """Wake the connection's thread from any read or write: the socket is shut, the thread ends."""
        with contextlib.suppress(OSError):
            socket.socket.shutdown(self.sock, socket.SHUT_RDWR)  # the plain socket's, even under TLS


class _CappedReader:
    """The request head's reader: raises `LineTooLong` past `cap` bytes in all (the stdlib caps only each line)."""

    def __init__(self, raw: Any, cap: int) -> None:
        self._raw, self._left = raw, cap

    def readline(self, size: int = -1) -> bytes:
        if self._left <= 0:
            raise http.client.LineTooLong("request head")
        line: bytes = self._raw.readline(self._left + 1 if size < 0 else min(size, self._left + 1))
        self._left -= len(line)
        if self._left < 0:
            raise http.client.LineTooLong("request head")
        return line


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
        self.conn = self.server.connection_of(self.request)
        self.conn.thread = threading.get_ident()
        self._raw_rfile: Any = self.rfile
        self._served = 0
        self._body: _Progress | None = None  # the body being read (or last read) on this connection
        if self.conn.overflow:
            self.close_connection = True
        self.server.phase(self.conn, "setup")
        if isinstance(self.connection, ssl.SSLSocket):
            self.connection.do_handshake()

    def handle_one_request(self) -> None:
        """The stdlib's, with a deadline for the wait and for the head, and the head capped in bytes."""
        self.server.phase(self.conn, "idle" if self._served else "headers")  # a new connection's first request is due at once
        self._served += 1
        try:
            if not self._raw_rfile.peek(1):
                self.close_connection = True
                return
        except (OSError, ValueError):
            self.close_connection = True
            return
        self.server.phase(self.conn, "headers")
        self.rfile = _CappedReader(self._raw_rfile, self.server.max_head_bytes)  # type: ignore[assignment]
        try:
            super().handle_one_request()
        except http.client.LineTooLong:  # the request line itself (the stdlib answers 431 for headers)
            self.close_connection = True
        finally:
            self.rfile = self._raw_rfile
        if self.conn.overflow:
            self.close_connection = True

    def parse_request(self) -> bool:
        ok = super().parse_request()
        self.rfile = self._raw_rfile
        self.server.phase(self.conn, "busy")
        return ok

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

    @property
    def _body_got(self) -> int:
        """Bytes of the current request's body already read (a refusal can come part-way through it)."""
        return self._body.got if self._body is not None else 0

    def _discard_body(self, cap: int) -> None:
        """Read and drop the rest of a declared body up to `cap` bytes, so the client is reading when the answer comes.

        Past the cap the connection is closed unread; a client still writing may then see a reset.
        """
        try:
            remaining = int(self.headers.get("Content-Length") or 0) - self._body_got
        except ValueError:
            return
        if remaining > cap:
            return
        with contextlib.suppress(OSError, ValueError):
            while remaining > 0:
                chunk = self.rfile.read(min(remaining, 1 << 16))
                if not chunk:
                    return
                remaining -= len(chunk)

    def _declared_length(self) -> int | None:
        """Content-Length, or None for a chunked body; `_BadBody` for anything ambiguous."""
        encoding = self.headers.get_all("Transfer-Encoding")
        lengths = self.headers.get_all("Content-Length")
        if encoding:
            if lengths or [e.strip().lower() for e in encoding] != ["chunked"]:
                raise _BadBody("Transfer-Encoding must be chunked alone, without Content-Length")
            return None
        if not lengths:
            return 0
        values = {value.strip() for value in lengths}
        if len(values) != 1 or not _LENGTH.fullmatch(next(iter(values))):
            raise _BadBody(f"malformed Content-Length {', '.join(lengths)[:40]!r}")
        return int(values.pop())

    def _no_room(self, nbytes: int) -> _NoRoom:
        budget = self.server.budget
        if budget.owned(self.conn.address) + nbytes > budget.owner_limit:
            return _NoRoom(f"requests being read from this client address hold its share of the memory budget "
                           f"({budget.owner_limit >> 20} MiB of {budget.limit >> 20} MiB)")
        return _NoRoom("the memory budget for requests in flight is spent")

    def _read_body(self, limit: int) -> tuple[bytes, int]:
        """The body and the bytes of the memory budget it holds (the caller's to pass on or give back).

        `_Slow` when it arrives slower than the floor or its read was cut to reclaim the budget.
        """
        length = self._declared_length()
        window = self.server.rate_window
        progress = self._body = _Progress(window)
        floor = self.server.body_min_rate > 0
        self.server.body_started(self.conn, progress)
        try:
            if floor:  # a read waits at most a window: nothing in that long is below any floor
                self.connection.settimeout(window)
            if length is None:
                return self._read_chunked(limit, progress)
            if length > limit:
                raise _BodyTooLarge
            return self._read_sized(length, progress)
        except TimeoutError:
            raise _Slow(False) from None
        except (_Gone, OSError, ValueError):
            if progress.cut:
                raise _Slow(True) from None
            raise
        finally:
            self.server.body_ended(self.conn)
            if floor:
                with contextlib.suppress(OSError):
                    self.connection.settimeout(self.timeout)

    def _read_sized(self, length: int, progress: _Progress) -> tuple[bytes, int]:
        """A body of a declared `length`, holding budget only for what arrived (each piece reserved just
        before it is read), so a peer that declares a large body and sends little holds little."""
        budget, owner = self.server.budget, self.conn.address
        try:
            pieces = self._receive(length, progress, reserve=True)
            if len(pieces) > 1:  # the joined copy, while the pieces still exist
                if not budget.take(length, progress.held, owner=owner):
                    raise self._no_room(length)
                progress.held += length
                pieces[:] = [b"".join(pieces)]
                budget.give(length, owner)
                progress.held -= length
        except BaseException:
            budget.give(progress.held, owner)
            progress.held = 0
            raise
        budget.disown(progress.held, owner)
        return (pieces.pop() if pieces else b""), progress.held

    def _receive(self, size: int, progress: _Progress, reserve: bool = False) -> list[bytes]:
        """The next `size` bytes of the body in pieces as they arrive; `_Slow` below the rate floor.

        With `reserve`, each piece's bytes are taken from the memory budget (and the client address's
        share) before it is read and added to `progress.held`: the caller gives back what it holds.
        """
        pieces: list[bytes] = []
        rate, window = self.server.body_min_rate, self.server.rate_window
        budget, owner = self.server.budget, self.conn.address
        try:
            while size > 0:
                want = min(size, _PIECE)
                if reserve:
                    if not budget.take(want, progress.held, owner=owner):
                        raise self._no_room(want)
                    progress.held += want
                piece = self.rfile.read1(want)
                if reserve and len(piece) < want:  # only what came stays reserved
                    budget.give(want - len(piece), owner)
                    progress.held -= want - len(piece)
                if not piece:
                    raise _Gone
                pieces.append(piece)
                size -= len(piece)
                progress.advance(len(piece))
                if rate and size > 0:
                    arrived = progress.arrived(window, time.monotonic())
                    if arrived is not None and arrived < rate * window:
                        raise _Slow(False)
        except BaseException:
            pieces.clear()  # now, before the reservation is given back (the traceback keeps this frame)
            raise
        return pieces

    def _read_chunked(self, limit: int, progress: _Progress) -> tuple[bytes, int]:
        """A chunked body, each chunk's size checked, counted against `limit` and reserved before it is read."""
        budget, owner = self.server.budget, self.conn.address
        parts: list[bytes] = []
        total = held = 0
        try:
            while True:
                line = self.rfile.readline(1024)
                if not line.endswith(b"\n"):
                    raise _Gone if not line else _BadBody("chunk size line too long")
                size_text = line.split(b";", 1)[0].strip()
                if not _CHUNK_SIZE.fullmatch(size_text):
                    raise _BadBody(f"malformed chunk size {size_text[:20]!r}")
                size = int(size_text, 16)
                if size == 0:
                    break
                if total + size > limit:
                    raise _BodyTooLarge
                if not budget.take(size, held, owner=owner):
                    raise self._no_room(size)
                held += size
                progress.held = held
                parts += self._receive(size, progress)
                total += size
                if self.rfile.readline(3) not in (b"\r\n", b"\n"):
                    raise _BadBody("chunk data not followed by CRLF")
            trailers = 0
            while (line := self.rfile.readline(1024)) not in (b"\r\n", b"\n"):
                trailers += len(line)
                if not line.endswith(b"\n") or trailers > _MAX_TRAILER_BYTES:
                    raise _BadBody("malformed chunked trailer")
            if len(parts) > 1:
                if not budget.take(total, held, owner=owner):  # the joined copy, while the chunks still exist
                    raise self._no_room(total)
                held += total
                parts[:] = [b"".join(parts)]
                budget.give(total, owner)
                held -= total
            budget.disown(held, owner)
            return (parts.pop() if parts else b""), held
        except BaseException:
            parts.clear()
            budget.give(held, owner)
            raise

    def _console_post(self, console: Any, path: str) -> None:
        """The console's one POST (starting a replay from a run's page, ``Console.answers_post``), under the same
        bearer-token rule as OTLP/HTTP, with a small body: the console decides whether it is allowed at all."""
        if not self._authorised():
            self.close_connection = True
            self._error(401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= _CONSOLE_POST_MAX:
            self.close_connection = True
            self._error(413 if length > 0 else 411, f"a replay request is a Content-Length of at most {_CONSOLE_POST_MAX} bytes")
            return
        status, media, payload, headers = console.handle_post(path, self.rfile.read(length), self.headers)
        self._send(status, payload, media, headers)

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        path = urlsplit(self.path).path
        console = self.server.console
        if console is not None and path not in _SIGNALS and console.answers_post(path):
            self._console_post(console, path)
            return
        signal = _SIGNALS.get(path)
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
        if self.conn.overflow:
            self._error(503, "too many connections", media, {"Retry-After": str(self.server.retry_after_header)})
            return
        limit = self.server.max_body_bytes
        self._body = None
        self.server.phase(self.conn, "body")
        try:
            body, held = self._read_body(limit)
        except _BodyTooLarge:
            self.close_connection = True
            self._error(413, f"request body is larger than the {limit >> 20} MiB limit", media)
            self._discard_body(4 * limit)  # dropped as read, so the client reads the 413 rather than a reset
            return
        except _BadBody as exc:
            self.close_connection = True
            self._error(400, f"malformed request body: {exc}", media)
            return
        except _NoRoom as exc:
            self.close_connection = True
            self._answer(signal, Outcome("exhausted", str(exc)), media)
            self._discard_body(limit)
            return
        except _Slow as exc:
            self.close_connection = True
            self.server.intake.metrics.inc("plumbline_http_bodies_cut_total", reason=str(exc))
            with contextlib.suppress(OSError):
                if exc.reclaimed:
                    self._answer(signal, Outcome("exhausted", "the body stopped arriving while others waited for the memory budget; "
                                                             "its reservation went to them"), media)
                else:
                    rate = self.server.body_min_rate
                    self._error(408, f"the body arrived slower than {rate} bytes a second over {self.server.rate_window:g} s", media)
            return
        except (_Gone, OSError, ValueError):
            self.close_connection = True
            return
        self.server.phase(self.conn, "busy")
        if self.server.draining:
            self.server.budget.give(held)
            self.close_connection = True
            self._answer(signal, Outcome("unavailable", "the server is shutting down"), media)
            return
        encoding = self.headers.get("Content-Encoding") or ""
        intake = self.server.intake
        export = intake.traces if signal == "traces" else intake.logs
        bodies = [body]
        del body  # the intake lets go of the wire bytes once inflated; nothing here may keep them
        with self.server.in_flight():
            outcome = export(bodies.pop(), media, encoding, "http", limit, held)
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
        elif self.conn.overflow and path != "/healthz":
            self._error(503, "too many connections", headers={"Retry-After": str(self.server.retry_after_header)})
        elif path == "/healthz":
            problem = self.server.intake.queue.store_problem
            if self.server.draining:
                self._send(503, orjson.dumps({"status": "draining"}), _JSON)
            elif problem is not None:  # an invalidated store: requests are pushed back until it is attached again
                self._send(503, orjson.dumps({"status": "store unusable", "reason": problem}), _JSON,
                           {"Retry-After": str(self.server.retry_after_header)})
            else:
                self._send(200, orjson.dumps({"status": "ok"}), _JSON)
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
    block_on_close = False  # connections waiting for a request end at their deadline; stopping does not wait for them
    request_queue_size = 128

    def __init__(self, host: str, port: int, intake: Intake, *, max_body_bytes: int, max_connections: int,
                 retry_after: float, render_metrics: Callable[[], str], token: str | None = None,
                 ssl_context: ssl.SSLContext | None = None, console: Any | None = None, budget: MemoryBudget | None = None,
                 deadlines: Deadlines | None = None, max_per_address: int | None = None, idle_timeout: float = 60.0,
                 header_timeout: float = 10.0, body_timeout: float = 30.0, body_min_rate: int = BODY_MIN_RATE,
                 rate_window: float = RATE_WINDOW, max_head_bytes: int = MAX_HEAD_BYTES) -> None:
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.intake, self.max_body_bytes, self.render_metrics = intake, max_body_bytes, render_metrics
        self.budget = budget or intake.queue.budget
        self.deadlines = deadlines or Deadlines("plumbline-http-deadlines")
        self.retry_after_header = max(1, math.ceil(retry_after))
        self.auth_header = token.encode() if token else None  # the token a request's bearer header must carry
        self.ssl_context = ssl_context
        self.console = console  # read-only pages under / (report.console.Console), or None
        self.draining = False
        self.max_connections = max_connections
        self.max_per_address = max_per_address or max_connections
        self.body_min_rate, self.rate_window, self.max_head_bytes = body_min_rate, rate_window, max_head_bytes
        self._timeouts = {"setup": header_timeout, "idle": idle_timeout, "headers": header_timeout, "body": body_timeout}
        self._conns: dict[socket.socket, _Conn] = {}
        self._held = 0  # connections holding a slot (not evicted, not overflow)
        self._by_address: dict[str, int] = {}
        self._overflow = 0
        self._lock = threading.Lock()
        self.shed = self.evicted = self.reclaimed = 0
        self._active = 0
        self._idle = threading.Condition()
        super().__init__((host, port), _Handler)
        self.budget.add_reclaimer(self.reclaim)

    # --- bodies being read: the budget reclaimed from those that stopped arriving ---------------

    def body_started(self, conn: _Conn, progress: _Progress) -> None:
        with self._lock:
            conn.body = progress

    def body_ended(self, conn: _Conn) -> None:
        with self._lock:
            conn.body = None

    def reclaim(self, needed: int, address: Hashable | None = None) -> int:
        """Cut body reads (from `address`, when given) that received less than the rate floor's worth in the
        last `PRESSURE_WINDOW` seconds (nothing, with no floor), least arrived first, until `needed` bytes
        are freed; the bytes freed."""
        now, me = time.monotonic(), threading.get_ident()
        floor = max(1.0, self.body_min_rate * PRESSURE_WINDOW)
        freed = 0
        with self._lock:
            slow: list[tuple[int, int, _Conn, _Progress]] = []
            for conn in self._conns.values():
                body = conn.body
                if body is None or body.cut or body.held <= 0 or conn.thread == me or address not in (None, conn.address):
                    continue
                arrived = body.arrived(PRESSURE_WINDOW, now)
                if arrived is not None and arrived < floor:
                    slow.append((arrived, -body.held, conn, body))
            slow.sort(key=lambda entry: entry[:2])
            for _, _, conn, body in slow:
                if freed >= needed:
                    break
                log.debug("body from %s (%d bytes in %.1f s) cut to reclaim %d bytes of the memory budget",
                          conn.address, body.got, now - body.began, body.held)
                body.cut = True
                freed += body.held
                self.reclaimed += 1
                with contextlib.suppress(OSError):  # its read ends at once; the answer can still be written
                    socket.socket.shutdown(conn.sock, socket.SHUT_RD)
        return freed

    # --- connections: caps, eviction, deadlines -------------------------------------------------

    def connection_of(self, sock: socket.socket) -> _Conn:
        with self._lock:
            return self._conns[sock]

    def phase(self, conn: _Conn, name: str) -> None:
        """Enter a phase of `conn`: its deadline (if the phase has one) counts from now."""
        conn.phase, conn.since = name, time.monotonic()
        seconds = _OVERFLOW_TIMEOUT if conn.overflow and name != "busy" else self._timeouts.get(name)
        if seconds is None:
            self.deadlines.disarm(conn)
        else:
            self.deadlines.arm(conn, seconds, conn.close)

    def _victim(self, address: str | None) -> _Conn | None:
        """The slot holder that has waited longest for a request or its head, else the one reading a body the longest."""
        best: tuple[int, float] | None = None
        victim = None
        for conn in self._conns.values():
            if conn.evicted or conn.overflow or (address is not None and conn.address != address):
                continue
            if conn.phase in _EVICTABLE:
                rank = (0, conn.since)
            elif conn.phase == "body":
                rank = (1, conn.since)
            else:
                continue
            if best is None or rank < best:
                best, victim = rank, conn
        return victim

    def _evict(self, conn: _Conn) -> None:
        log.debug("connection from %s (%s for %.1f s) closed to make room", conn.address, conn.phase, time.monotonic() - conn.since)
        conn.evicted = True
        self._held -= 1
        self._by_address[conn.address] -= 1
        self.evicted += 1
        conn.close()

    def _admit(self, conn: _Conn) -> bool:
        """Give `conn` a slot, taking one from a slow connection past a cap; False when none can be taken."""
        if self._by_address.get(conn.address, 0) >= self.max_per_address:
            victim = self._victim(conn.address)
            if victim is None:
                return False
            self._evict(victim)
        if self._held >= self.max_connections:
            victim = self._victim(None)
            if victim is None:
                return False
            self._evict(victim)
        self._held += 1
        self._by_address[conn.address] = self._by_address.get(conn.address, 0) + 1
        return True

    def get_request(self) -> tuple[Any, Any]:
        sock, address = super().get_request()
        if self.ssl_context is not None:
            sock = self.ssl_context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, address

    def process_request(self, request: Any, client_address: Any) -> None:
        conn = _Conn(request, str(client_address[0]))
        with self._lock:
            if not self._admit(conn):
                conn.overflow = self._overflow < _OVERFLOW_THREADS
                log.debug("connection from %s past the caps (%d held): %s", conn.address, self._held, "overflow" if conn.overflow else "shed")
                if not conn.overflow:
                    self.shed += 1
                    self._shed(request)
                    return
                self._overflow += 1
            self._conns[request] = conn
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._forget(conn)
            raise

    def _shed(self, request: Any) -> None:
        with contextlib.suppress(OSError):
            if self.ssl_context is None:  # a TLS client would need a handshake first; just close
                request.setblocking(False)
                request.send(_BUSY % self.retry_after_header)
        self.shutdown_request(request)

    def _forget(self, conn: _Conn) -> None:
        self.deadlines.disarm(conn)
        with self._lock:
            self._conns.pop(conn.sock, None)
            if conn.overflow:
                self._overflow -= 1
            elif not conn.evicted:
                self._held -= 1
                self._by_address[conn.address] -= 1
            if not self._by_address.get(conn.address):
                self._by_address.pop(conn.address, None)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            conn = self._conns.get(request)
            if conn is not None:
                self._forget(conn)

    @property
    def connections(self) -> int:
        """Connections holding a slot now."""
        return self._held

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
        self.budget.remove_reclaimer(self.reclaim)
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
