"""A model provider that misbehaves on purpose, for the proxy's failure tests and bench/proxy_memory.py.

Raw sockets, not an HTTP library, so a behaviour can send exactly the bytes a broken provider
sends: a head and then nothing, a stream cut mid-event, invalid UTF-8, an endless stream, a
body larger than its promise. Each connection's request is read (head and Content-Length body),
then handed with the socket to the behaviour, which writes what it likes; ``finished`` counts
behaviours that returned, so a test waits on events, never on the clock. Binds 127.0.0.1 only.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import orjson
from waits import EVENT_DEADLINE_S


@dataclass
class Request:
    """What the provider was sent: request line, headers (lower-case names), body."""

    line: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> dict:
        value = orjson.loads(self.body)
        assert isinstance(value, dict)
        return value


Behaviour = Callable[[socket.socket, Request, "Hostile"], None]


@dataclass
class Hostile:
    """The provider: ``behave`` answers every request (or ``script``: one behaviour per request, in order)."""

    behave: Behaviour | None = None
    script: list[Behaviour] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)
    finished: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))
    stopping: threading.Event = field(default_factory=threading.Event)
    sent_bytes: int = 0  # what behaviours reported writing (the endless stream counts itself here)
    _sock: socket.socket | None = None
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> Hostile:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        thread = threading.Thread(target=self._accept, daemon=True, name="hostile-provider")
        thread.start()
        return self

    @property
    def url(self) -> str:
        assert self._sock is not None
        return f"http://127.0.0.1:{self._sock.getsockname()[1]}"

    def upstreams(self) -> dict[str, str]:
        return {"openai": f"{self.url}/v1", "anthropic": self.url}

    def stop(self) -> None:
        self.stopping.set()
        if self._sock is not None:
            self._sock.close()
        for thread in self._threads:
            thread.join(10)

    def __enter__(self) -> Hostile:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def _accept(self) -> None:
        assert self._sock is not None
        while not self.stopping.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            request = _read_request(conn)
            if request is None:
                return
            with self._lock:
                self.requests.append(request)
                behave = self.script.pop(0) if self.script else self.behave
            assert behave is not None, "the hostile provider has no behaviour for this request"
            try:
                behave(conn, request, self)
            except OSError:
                pass  # the proxy hung up on us: what an endless stream waits for
        finally:
            self.finished.release()
            try:
                conn.close()
            except OSError:
                pass

    def wait_finished(self, n: int = 1, timeout: float = EVENT_DEADLINE_S) -> bool:
        """Whether ``n`` behaviours have returned within ``timeout`` (a generous deadline, not a pace)."""
        return all(self.finished.acquire(timeout=timeout) for _ in range(n))


def _read_request(conn: socket.socket) -> Request | None:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers.get("content-length") or 0)
    while len(rest) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        rest += chunk
    return Request(lines[0], headers, rest[:length])


# --- behaviours ---------------------------------------------------------------------------------


def head(status: int, ctype: str, length: int | None = None, extra: str = "") -> bytes:
    size = f"content-length: {length}\r\n" if length is not None else ""
    return f"HTTP/1.1 {status} X\r\ncontent-type: {ctype}\r\n{size}{extra}connection: close\r\n\r\n".encode()


def answer(status: int, body: bytes, ctype: str = "application/json") -> Behaviour:
    """A whole answer: ``body`` with its length."""
    def behave(conn: socket.socket, request: Request, provider: Hostile) -> None:
        conn.sendall(head(status, ctype, len(body)) + body)
    return behave


def chat_body(text: str = "paid", model: str = "gpt-4o-mini") -> bytes:
    return orjson.dumps({"id": "chatcmpl-h", "object": "chat.completion", "created": 0, "model": model,
                         "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                         "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}})


def chat_event(text: str, model: str = "gpt-4o-mini") -> bytes:
    event = {"id": "chatcmpl-h", "object": "chat.completion.chunk", "created": 0, "model": model,
             "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
    return b"data: " + orjson.dumps(event) + b"\n\n"


def chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def stream_then_cut(events: list[bytes], tail: bytes = b"") -> Behaviour:
    """A 200 SSE stream (chunked) of ``events``, then ``tail`` (half an event, say), then the connection dropped."""
    def behave(conn: socket.socket, request: Request, provider: Hostile) -> None:
        conn.sendall(head(200, "text/event-stream", extra="transfer-encoding: chunked\r\n"))
        for event in events:
            conn.sendall(chunked(event))
        if tail:
            conn.sendall(chunked(tail))
        conn.shutdown(socket.SHUT_RDWR)
    return behave


def endless_stream(event: bytes = b"") -> Behaviour:
    """A 200 SSE stream that never ends: it stops only when the other side hangs up (or the provider stops)."""
    def behave(conn: socket.socket, request: Request, provider: Hostile) -> None:
        conn.sendall(head(200, "text/event-stream", extra="transfer-encoding: chunked\r\n"))
        piece = chunked((event or chat_event("x" * 200)) * 64)
        while not provider.stopping.is_set():
            conn.sendall(piece)
            provider.sent_bytes += len(piece)
    return behave


def huge_answer(size: int, declare: bool = True) -> Behaviour:
    """A 200 JSON answer of ``size`` bytes (its length declared, or sent chunked with none)."""
    def behave(conn: socket.socket, request: Request, provider: Hostile) -> None:
        conn.sendall(head(200, "application/json", size if declare else None, "" if declare else "transfer-encoding: chunked\r\n"))
        block = b" " * (1 << 20)
        left = size
        while left > 0 and not provider.stopping.is_set():
            piece = block[:min(left, len(block))]
            conn.sendall(piece if declare else chunked(piece))
            provider.sent_bytes += len(piece)
            left -= len(piece)
        if not declare:
            conn.sendall(b"0\r\n\r\n")
    return behave


def hang(conn: socket.socket, request: Request, provider: Hostile) -> None:
    """Read the request, answer nothing until the provider is stopped."""
    provider.stopping.wait(60)


def reset(conn: socket.socket, request: Request, provider: Hostile) -> None:
    """Drop the connection with no answer at all."""
    conn.shutdown(socket.SHUT_RDWR)
