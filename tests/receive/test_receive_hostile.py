"""Hostile peers at the edge (issue 30): malformed framing, bodies past the memory budget, idle gRPC
calls, slow HTTP connections. Each case runs against a real `plumbline serve` on loopback, bounded in
connections (a few hundred at most) and in time (seconds), and checks that normal clients and health
checks are still served during the attack and that memory stays under the stated budget."""

from __future__ import annotations

import http.client
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, suppress
from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from receive_support import TOKEN, ServeProcess, query
from waits import EVENT_DEADLINE_S

pytestmark = pytest.mark.slow

_TRACES = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
_MIB = 1 << 20


def _request(spans: int = 2, service: str = "hostile") -> bytes:
    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    resource_spans.resource.attributes.add(key="service.name").value.string_value = service
    scope = resource_spans.scope_spans.add()
    trace_id = os.urandom(16)
    for i in range(spans):
        scope.spans.add(trace_id=trace_id, span_id=os.urandom(8), name=f"span {i}", start_time_unix_nano=1, end_time_unix_nano=2)
    return request.SerializeToString()


def _connect(port: int, source: str = "127.0.0.1", timeout: float = 10.0) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    return sock


def _response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """Read one HTTP response from a raw socket (status, lower-cased headers, body)."""
    response = http.client.HTTPResponse(sock)
    response.begin()
    return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()


def _head(length: int | None = None, chunked: bool = False, extra: str = "") -> bytes:
    head = "POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
    if chunked:
        head += "Transfer-Encoding: chunked\r\n"
    if length is not None:
        head += f"Content-Length: {length}\r\n"
    return (head + extra + "\r\n").encode()


def _post(port: int, body: bytes, path: str = "/v1/traces", headers: dict[str, str] | None = None,
          timeout: float = EVENT_DEADLINE_S) -> tuple[int, dict[str, str]]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request("POST", path, body=body, headers={"Content-Type": "application/x-protobuf", **(headers or {})})
        response = connection.getresponse()
        response.read()
        return response.status, {k.lower(): v for k, v in response.getheaders()}
    finally:
        connection.close()


def _get(port: int, path: str, timeout: float = EVENT_DEADLINE_S) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


def _tree_rss_mib(pid: int) -> float:
    """Resident memory of a process and all its descendants."""
    total, stack = 0.0, [pid]
    while stack:
        current = stack.pop()
        with suppress(OSError):
            for line in Path(f"/proc/{current}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) / 1024
            for task in Path(f"/proc/{current}/task").iterdir():
                stack.extend(int(child) for child in (task / "children").read_text().split())
    return total


class _Peak:
    """Samples a process tree's RSS every 50 ms while in use."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self._stop = pid, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _tree_rss_mib(self.pid))
            time.sleep(0.05)

    def __enter__(self) -> _Peak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# --- 1. malformed chunked encoding and lengths: a 400 at once, nothing read past the limit ---------


_SMALL_WINDOW_S = 120


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    # A 120 s body-rate window (and a body deadline past it): "at once" (milliseconds, seconds on a loaded machine) is
    # told apart from a read that goes on until the window ends by a bound far from both.
    process = ServeProcess(tmp_path_factory.mktemp("hostile"), "--max-request-body-size-mib", "1", "--workers", "0",
                           "--http-body-rate-window", str(_SMALL_WINDOW_S), "--http-read-timeout", "600").start()
    yield process
    if process.proc and process.proc.poll() is None:
        process.kill()


@pytest.mark.parametrize("size_line", [b"-1", b"-0", b"zz", b"0x10", b"+5", b"1_0", b" ", b"fffffffffffffffffff"])
def test_a_malformed_chunk_size_is_400_at_once_without_reading_on(small: ServeProcess, size_line: bytes) -> None:
    # Chunk size -1 used to make the server read to the end of the stream (300 MiB sent: +700 MiB) before a 413.
    with _connect(small.http_port, timeout=EVENT_DEADLINE_S) as sock:
        sock.sendall(_head(chunked=True) + size_line + b"\r\n" + b"\0" * 4096)  # and the connection stays open
        began = time.monotonic()
        status, _, body = _response(sock)
    assert status == 400 and b"chunk" in body
    assert time.monotonic() - began < _SMALL_WINDOW_S / 2  # at once: not after the body-rate window a read on would end in


@pytest.mark.parametrize("lengths", [["-5"], ["5", "6"], ["0x10"], ["+5"], ["5 5"]])
def test_a_malformed_content_length_is_400(small: ServeProcess, lengths: list[str]) -> None:
    extra = "".join(f"Content-Length: {value}\r\n" for value in lengths)
    with _connect(small.http_port, timeout=EVENT_DEADLINE_S) as sock:
        sock.sendall(_head(extra=extra) + b"\0" * 16)
        status, _, _ = _response(sock)
    assert status == 400


def test_transfer_encoding_with_content_length_or_not_chunked_is_400(small: ServeProcess) -> None:
    for extra in ("Transfer-Encoding: chunked\r\nContent-Length: 5\r\n", "Transfer-Encoding: gzip, chunked\r\n"):
        with _connect(small.http_port, timeout=EVENT_DEADLINE_S) as sock:
            sock.sendall(_head(extra=extra) + b"5\r\nhello\r\n0\r\n\r\n")
            status, _, _ = _response(sock)
        assert status == 400, extra


def test_chunks_past_the_limit_are_413_before_the_chunk_is_read(small: ServeProcess) -> None:
    with _connect(small.http_port, timeout=EVENT_DEADLINE_S) as sock:
        sock.sendall(_head(chunked=True) + b"%x\r\n" % (_MIB + 1))  # announced, never sent
        began = time.monotonic()
        status, _, _ = _response(sock)
    assert status == 413 and time.monotonic() - began < _SMALL_WINDOW_S / 2  # before the chunk, not after the body-rate window


def test_a_well_formed_chunked_body_is_stored(small: ServeProcess) -> None:
    body = _request(3, service="chunked")
    framed = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(part), part) for part in (body[:10], body[10:])) + b"0\r\nX-Trailer: 1\r\n\r\n"
    with _connect(small.http_port, timeout=EVENT_DEADLINE_S) as sock:
        sock.sendall(_head(chunked=True) + framed)
        status, _, _ = _response(sock)
    assert status == 200


# --- 2. one memory budget for bytes in flight, enforced while reading ------------------------------


def _metric(port: int, name: str) -> float:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=EVENT_DEADLINE_S)
    connection.request("GET", "/metrics")
    text = connection.getresponse().read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


class _Normal:
    """A normal client while an attack runs: a 2-span export every 0.2 s on a fresh connection."""

    def __init__(self, port: int) -> None:
        self.port, self._stop = port, threading.Event()
        self.statuses: list[int] = []
        self.started: list[float] = []  # when each request was sent (monotonic), beside its status
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            began = time.monotonic()
            try:
                status = _post(self.port, _request(service="normal"))[0]
            except OSError:
                status = 0
            self.started.append(began)
            self.statuses.append(status)

    def since(self, moment: float) -> list[int]:
        """The statuses of the requests sent after `moment`."""
        return [status for began, status in zip(list(self.started), list(self.statuses)) if began >= moment]

    def __enter__(self) -> _Normal:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(EVENT_DEADLINE_S)  # ends after the export in flight


def test_bodies_held_one_byte_short_neither_grow_memory_nor_keep_normal_clients_out(tmp_path: Path) -> None:
    """40 bodies of 8 MiB held one byte short of complete (320 MiB sent) against a 32 MiB budget, from
    the normal client's own address: the tree grows by at most the budget (plus slack), the excess
    gets 503 + Retry-After, and a normal client sending once the bodies are held is served: the held
    bodies' reservations are reclaimed for it once they stop arriving (a second), not at their 20 s
    deadline. Before the reclaim, every normal export during the attack was a 503 (bench: 0/31). The
    normal client is judged on what it sends once the attack is in place, however long a loaded
    machine takes to send 320 MiB (a fixed 4 s window let it judge only the sending, issue 42)."""
    server = ServeProcess(tmp_path, "--queue-max-bytes-mib", "32", "--max-request-body-size-mib", "8", "--workers", "0",
                          "--http-read-timeout", "20", "--max-connections", "128").start()
    try:
        # The baseline is a server that has served: its first export imports the decoders and opens the store's
        # tables (memory that is not the attack's), however long a loaded machine takes to get there.
        assert _post(server.http_port, _request(service="normal"))[0] == 200
        baseline = _tree_rss_mib(server.proc.pid)  # type: ignore[union-attr]
        chunk = b"\0" * _MIB
        pushed_back: list[str] = []
        held: list[socket.socket] = []
        with ExitStack() as stack, _Peak(server.proc.pid) as peak:  # type: ignore[union-attr]
            began = time.monotonic()
            with _Normal(server.http_port) as normal:
                for _ in range(40):
                    sock = stack.enter_context(_connect(server.http_port, timeout=10))
                    sock.sendall(_head(8 * _MIB))
                    try:
                        for _ in range(7):
                            sock.sendall(chunk)
                        sock.sendall(chunk[:-1])
                    except OSError:  # the server answered 503 and stopped reading
                        pass
                    held.append(sock)
                for sock in held:
                    sock.settimeout(0.05)
                    with suppress(OSError, http.client.HTTPException):
                        status, headers, _ = _response(sock)
                        if status == 503:
                            pushed_back.append(headers.get("retry-after", ""))
                held_at = time.monotonic()
                deadline = held_at + EVENT_DEADLINE_S  # generous: ends as soon as the normal client sent 10 requests after the attack was in place
                while len(normal.since(held_at)) < 10 and time.monotonic() < deadline:
                    time.sleep(0.05)
            reclaimed = _metric(server.http_port, 'plumbline_http_bodies_cut_total{reason="reclaimed"}')
            budget_peak = _metric(server.http_port, "plumbline_memory_budget_peak_bytes")
            for sock in held:
                sock.close()
    finally:
        assert server.stop() == 0
    assert len(pushed_back) >= 30 and set(pushed_back) == {"1"}, pushed_back
    after = normal.since(held_at)
    print(f"normal exports: {normal.statuses.count(200)} of {len(normal.statuses)} served, "
          f"{after.count(200)} of {len(after)} once the bodies were held ({held_at - began:.1f} s after the attack began)")
    assert len(after) >= 10 and after.count(200) >= 0.6 * len(after), after
    assert set(normal.statuses) <= {200, 503}, normal.statuses
    served = normal.statuses.count(200)
    assert reclaimed >= 1
    assert budget_peak <= 32 * _MIB
    grown = peak.peak - baseline
    assert grown < 32 + 40, f"baseline {baseline:.0f} MiB, peak {peak.peak:.0f} MiB"
    assert query(server.db, "SELECT count(DISTINCT span_id) FROM spans")[0][0] == 2 * (served + 1)  # and the first export's


def test_a_body_slower_than_the_floor_is_cut_with_408(tmp_path: Path) -> None:
    """A body that stops (or trickles a byte every half second) is cut with 408 once a 5 s window
    passes with under 1 KiB/s, well before its deadline (400 s here), and its reservation is given back."""
    server = ServeProcess(tmp_path, "--workers", "0", "--http-read-timeout", "400").start()
    stop = threading.Event()
    try:
        with _connect(server.http_port, timeout=EVENT_DEADLINE_S) as stalled, _connect(server.http_port, timeout=EVENT_DEADLINE_S) as trickled:
            began = time.monotonic()
            stalled.sendall(_head(100_000) + b"\0" * 50_000)
            trickled.sendall(_head(100_000) + b"\0" * 50_000)

            def trickle() -> None:
                with suppress(OSError):
                    while not stop.wait(0.5):
                        trickled.sendall(b"\0")

            threading.Thread(target=trickle, daemon=True).start()
            answers = [_response(stalled), _response(trickled)]
            took = time.monotonic() - began
            stop.set()
        in_flight = _metric(server.http_port, "plumbline_queue_bytes")
        slow = _metric(server.http_port, 'plumbline_http_bodies_cut_total{reason="slow"}')
    finally:
        stop.set()
        assert server.stop() == 0
    assert [status for status, _, _ in answers] == [408, 408], answers
    assert all(headers.get("connection") == "close" for _, headers, _ in answers)
    assert 4.5 < took < 200, took  # cut by the 5 s window (never sooner), far from the 400 s deadline however loaded the machine
    assert in_flight == 0 and slow == 2


def test_chunked_bodies_are_charged_as_they_are_read(tmp_path: Path) -> None:
    """Chunked bodies get no free pass: each chunk is reserved before it is read, so 30 chunked
    bodies of 4 MiB each (held open) hold at most the 16 MiB budget."""
    server = ServeProcess(tmp_path, "--queue-max-bytes-mib", "16", "--max-request-body-size-mib", "8", "--workers", "0").start()
    try:
        piece = b"\0" * (_MIB // 2)
        with ExitStack() as stack:
            socks = [stack.enter_context(_connect(server.http_port, timeout=10)) for _ in range(30)]
            refused = 0
            for sock in socks:
                sock.sendall(_head(chunked=True))
                try:
                    for _ in range(8):
                        sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
                except OSError:
                    pass
            for sock in socks:
                sock.settimeout(0.5)
                with suppress(OSError, http.client.HTTPException):
                    if _response(sock)[0] == 503:
                        refused += 1
            text = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=EVENT_DEADLINE_S)
            text.request("GET", "/metrics")
            metrics = text.getresponse().read().decode()
        peak = next(float(line.split()[-1]) for line in metrics.splitlines() if line.startswith("plumbline_memory_budget_peak_bytes"))
    finally:
        assert server.stop() == 0
    assert refused >= 25
    assert peak <= 16 * _MIB


def test_one_address_reading_bodies_holds_only_its_share_and_others_are_served(tmp_path: Path) -> None:
    """Eight 4 MiB bodies from one address send 3 MiB each and then keep arriving (5 KiB/s, above the
    rate floor, so nothing reclaims them): a body holds what it received, and the address at most its
    share of the budget (half of 32 MiB), so some of them get 503 naming the client address part-way,
    the budget never holds more than the share, and a normal client on another address is served."""
    server = ServeProcess(tmp_path, "--queue-max-bytes-mib", "32", "--max-request-body-size-mib", "8", "--workers", "0",
                          "--http-read-timeout", "900").start()  # past the test's waits: the bodies are refused, never timed out
    stop = threading.Event()
    answers: list[tuple[int, bytes]] = []

    def send_slowly(sock: socket.socket) -> None:
        with suppress(OSError):
            sock.sendall(_head(4 * _MIB) + b"\0" * (3 * _MIB))
            while not stop.wait(0.2):
                sock.sendall(b"\0" * 1024)

    try:
        with ExitStack() as stack:
            socks = [stack.enter_context(_connect(server.http_port, "127.0.0.2", timeout=10)) for _ in range(8)]
            for sock in socks:
                threading.Thread(target=send_slowly, args=(sock,), daemon=True).start()
            deadline = time.monotonic() + EVENT_DEADLINE_S  # generous: until the address's bodies reached its share and were refused
            while _metric(server.http_port, "plumbline_memory_budget_address_refusals") < 4 and time.monotonic() < deadline:
                time.sleep(0.05)
            with _Normal(server.http_port) as normal:
                while len(normal.statuses) < 10 and time.monotonic() < deadline:
                    time.sleep(0.05)
            stop.set()
            for sock in socks:
                sock.settimeout(0.5)
                with suppress(OSError, http.client.HTTPException):
                    status, _, body = _response(sock)
                    answers.append((status, body))
            refusals = _metric(server.http_port, "plumbline_memory_budget_address_refusals")
            peak = _metric(server.http_port, "plumbline_memory_budget_peak_bytes")
    finally:
        stop.set()
        assert server.stop() == 0
    # 3 MiB and a 256 KiB piece each: at most four fit in the 16 MiB share, so at least four are refused.
    assert len(answers) >= 4 and all(status == 503 and b"client address" in body for status, body in answers), answers
    assert refusals == len(answers)
    assert peak <= 16 * _MIB + _MIB  # the share, and the normal client's small requests
    assert normal.statuses.count(200) == len(normal.statuses) >= 10, normal.statuses
    assert query(server.db, "SELECT count(DISTINCT span_id) FROM spans")[0][0] == 2 * len(normal.statuses)


# --- 3. idle gRPC calls: refused before a slot without the token, cancelled past the deadline -----


def _never(stop: threading.Event) -> Iterator[bytes]:
    stop.wait()
    return
    yield b""  # pragma: no cover - a generator that sends nothing until told to end


def _health(address: str, credentials: grpc.ChannelCredentials | None = None) -> int:
    with grpc.insecure_channel(address) as channel:
        return int(health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=EVENT_DEADLINE_S).status)


def test_idle_grpc_calls_are_cancelled_and_never_starve_health_or_exports(tmp_path: Path) -> None:
    """More idle export calls (headers, never a message) than the cap: the excess is refused at once
    with RetryInfo, health answers SERVING throughout, each idle call is cancelled at the message
    deadline, and a normal export succeeds once they are gone."""
    server = ServeProcess(tmp_path, "--max-concurrent-streams", "8", "--grpc-message-timeout", "2", "--workers", "0").start()
    stop = threading.Event()
    codes: list[grpc.StatusCode] = []
    retry_info: list[bool] = []
    lock = threading.Lock()
    try:
        with grpc.insecure_channel(server.grpc_address) as channel:
            export = channel.stream_unary(_TRACES, request_serializer=None, response_deserializer=None)
            calls = [export.future(_never(stop), timeout=EVENT_DEADLINE_S) for _ in range(40)]
            began = time.monotonic()
            time.sleep(0.5)
            assert _health(server.grpc_address) == health_pb2.HealthCheckResponse.SERVING
            for call in calls:
                with pytest.raises(grpc.RpcError) as caught:
                    call.result(timeout=EVENT_DEADLINE_S)
                with lock:
                    codes.append(caught.value.code())
                    trailers = dict(caught.value.trailing_metadata() or ())
                    retry_info.append("google.rpc.retryinfo-bin" in trailers)
            ended = time.monotonic() - began
            assert _health(server.grpc_address) == health_pb2.HealthCheckResponse.SERVING
            unary = channel.unary_unary(_TRACES, request_serializer=None, response_deserializer=None)
            unary(_request(service="after-idle"), timeout=EVENT_DEADLINE_S)
    finally:
        stop.set()
        assert server.stop() == 0
    assert codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) >= 32, codes  # past the cap of 8 (or the budget)
    assert all(info for code, info in zip(codes, retry_info) if code == grpc.StatusCode.RESOURCE_EXHAUSTED)
    assert codes.count(grpc.StatusCode.CANCELLED) >= 1  # the admitted ones, at the deadline
    # Cancelled at the 2 s message deadline, told apart from their own deadline (300 s) far from both, however loaded the machine.
    assert ended < EVENT_DEADLINE_S / 2, f"idle calls lasted {ended:.1f} s past a 2 s message deadline (their own is {EVENT_DEADLINE_S:g} s)"
    assert query(server.db, "SELECT count(*) FROM spans")[0][0] == 2


def test_unauthenticated_idle_grpc_calls_are_refused_before_they_hold_a_slot(tmp_path: Path) -> None:
    server = ServeProcess(tmp_path, "--max-concurrent-streams", "4", "--workers", "0", "--auth-token", TOKEN).start()
    stop = threading.Event()
    try:
        with grpc.insecure_channel(server.grpc_address) as channel:
            export = channel.stream_unary(_TRACES, request_serializer=None, response_deserializer=None)
            calls = [export.future(_never(stop), timeout=EVENT_DEADLINE_S) for _ in range(150)]
            codes = []
            for call in calls:
                with pytest.raises(grpc.RpcError) as caught:
                    call.result(timeout=EVENT_DEADLINE_S)
                codes.append(caught.value.code())
            assert _health(server.grpc_address) == health_pb2.HealthCheckResponse.SERVING
            unary = channel.unary_unary(_TRACES, request_serializer=None, response_deserializer=None)
            unary(_request(service="with-token"), timeout=EVENT_DEADLINE_S, metadata=(("authorization", f"Bearer {TOKEN}"),))
    finally:
        stop.set()
        assert server.stop() == 0
    assert set(codes) == {grpc.StatusCode.UNAUTHENTICATED}
    assert query(server.db, "SELECT count(*) FROM spans")[0][0] == 2


def _message(nbytes: int, service: str) -> bytes:
    """An export of two spans, one carrying a `nbytes` attribute: a message of about that size."""
    request = ExportTraceServiceRequest.FromString(_request(service=service))
    request.resource_spans[0].scope_spans[0].spans[0].attributes.add(key="blob").value.string_value = "x" * nbytes
    return request.SerializeToString()


def test_grpc_pushback_past_the_budget_is_resource_exhausted_with_retry_info(tmp_path: Path) -> None:
    """An HTTP body that sent 15.5 MiB of 16 and keeps trickling (above the rate floor, so nothing
    reclaims it) holds what it received of the 16 MiB budget: a 1 MiB gRPC export waits briefly and
    is pushed back (RESOURCE_EXHAUSTED + RetryInfo); once the body is gone the same export is stored."""
    server = ServeProcess(tmp_path, "--queue-max-bytes-mib", "16", "--max-request-body-size-mib", "16", "--max-recv-msg-size-mib", "8",
                          "--max-bytes-per-address-share", "1", "--http-min-body-rate", "1", "--http-read-timeout", "300",
                          "--workers", "0").start()
    stop = threading.Event()
    message = _message(_MIB, "past-the-budget")
    try:
        with grpc.insecure_channel(server.grpc_address) as channel:
            unary = channel.unary_unary(_TRACES, request_serializer=None, response_deserializer=None)
            with _connect(server.http_port, timeout=EVENT_DEADLINE_S) as sock:
                sock.sendall(_head(16 * _MIB) + b"\0" * (15 * _MIB + _MIB // 2))

                def trickle() -> None:
                    with suppress(OSError):
                        while not stop.wait(0.2):
                            sock.sendall(b"\0")

                threading.Thread(target=trickle, daemon=True).start()
                deadline = time.monotonic() + EVENT_DEADLINE_S  # generous: the body's read keeps up on any machine well before
                while _metric(server.http_port, "plumbline_queue_bytes") < 15 * _MIB + _MIB // 2 and time.monotonic() < deadline:
                    time.sleep(0.05)
                with pytest.raises(grpc.RpcError) as caught:
                    unary(message, timeout=EVENT_DEADLINE_S)  # pushed back by the server, not by this deadline
                stop.set()
            deadline = time.monotonic() + EVENT_DEADLINE_S
            while _metric(server.http_port, "plumbline_queue_bytes") > 0 and time.monotonic() < deadline:
                time.sleep(0.05)
            unary(message, timeout=EVENT_DEADLINE_S)
    finally:
        stop.set()
        assert server.stop() == 0
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    trailers = dict(caught.value.trailing_metadata() or ())
    assert error_details_pb2.RetryInfo.FromString(trailers["google.rpc.retryinfo-bin"]).retry_delay.seconds == 1
    assert query(server.db, "SELECT count(*) FROM spans")[0][0] == 2


def test_idle_grpc_calls_hold_nothing_and_are_cancelled_at_the_message_deadline(tmp_path: Path) -> None:
    """Two idle export calls (8 MiB messages, a 16 MiB budget: they used to reserve all of it and push
    every export back, issue 43) hold nothing: a normal export meanwhile is stored, the 2 s message
    deadline cancels them, and the idle callers still have not ended their streams."""
    server = ServeProcess(tmp_path, "--queue-max-bytes-mib", "16", "--max-recv-msg-size-mib", "8", "--grpc-message-timeout", "2",
                          "--max-bytes-per-address-share", "1", "--workers", "0").start()
    stop = threading.Event()
    try:
        with grpc.insecure_channel(server.grpc_address) as channel:
            export = channel.stream_unary(_TRACES, request_serializer=None, response_deserializer=None)
            calls = [export.future(_never(stop), timeout=EVENT_DEADLINE_S) for _ in range(2)]  # cancelled at 2 s, not at this
            unary = channel.unary_unary(_TRACES, request_serializer=None, response_deserializer=None)
            unary(_request(service="during"), timeout=EVENT_DEADLINE_S)
            held = _metric(server.http_port, "plumbline_queue_bytes")
            codes = []
            for call in calls:
                with pytest.raises(grpc.RpcError) as caught:
                    call.result(timeout=EVENT_DEADLINE_S)
                codes.append(caught.value.code())
            in_flight = _metric(server.http_port, "plumbline_queue_bytes")
            unary(_request(service="after"), timeout=EVENT_DEADLINE_S)
            assert not stop.is_set()  # the idle callers never ended their streams: the server let go of them
    finally:
        stop.set()
        assert server.stop() == 0
    assert held == 0 and in_flight == 0
    assert codes == [grpc.StatusCode.CANCELLED] * 2
    assert query(server.db, "SELECT count(*) FROM spans")[0][0] == 4


# --- 4. slow HTTP connections: deadlines a trickle cannot extend, slots for new connections --------


def _trickle(sock: socket.socket, stop: threading.Event, every: float) -> None:
    with suppress(OSError):
        sock.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\n")
        while not stop.wait(every):
            sock.sendall(b"X")


def test_a_trickled_request_head_is_closed_at_the_header_deadline(tmp_path: Path) -> None:
    server = ServeProcess(tmp_path, "--http-read-header-timeout", "2", "--workers", "0").start()
    stop = threading.Event()
    try:
        with _connect(server.http_port, timeout=EVENT_DEADLINE_S) as sock:  # a trickle that kept it open would hold it this long
            began = time.monotonic()
            threading.Thread(target=_trickle, args=(sock, stop, 0.3), daemon=True).start()
            data = b"x"
            with suppress(OSError):
                data = sock.recv(100)  # the server's close
            closed_after = time.monotonic() - began
    finally:
        stop.set()
        assert server.stop() == 0
    assert data == b"" or data.startswith(b"HTTP/1.1 4")
    assert 1.5 < closed_after < 60, closed_after  # at the 2 s deadline (never sooner), not held open by the trickle


def test_slow_connections_past_the_cap_do_not_stop_normal_requests_or_health(tmp_path: Path) -> None:
    """300 slow connections (heads trickled, bodies stalled, silent), 64 from a second address, against
    a cap of 32 connections (16 per address): 30 normal requests and /healthz are all served."""
    server = ServeProcess(tmp_path, "--max-connections", "32", "--max-connections-per-address", "16", "--workers", "0",
                          "--http-read-header-timeout", "30", "--http-read-timeout", "30", "--http-idle-timeout", "30").start()
    stop = threading.Event()
    statuses: list[int] = []
    health: list[int] = []
    try:
        with ExitStack() as stack:
            for i in range(300):
                source = "127.0.0.2" if i % 5 == 0 else "127.0.0.1"
                try:
                    sock = stack.enter_context(_connect(server.http_port, source=source, timeout=10))
                except OSError:
                    continue
                if i % 3 == 0:
                    threading.Thread(target=_trickle, args=(sock, stop, 1.0), daemon=True).start()
                elif i % 3 == 1:
                    with suppress(OSError):
                        sock.sendall(_head(1000) + b"\0" * 10)  # a body that never completes
            time.sleep(0.5)
            for i in range(30):
                statuses.append(_post(server.http_port, _request(service=f"normal-{i}"))[0])
                if i % 10 == 0:
                    health.append(_get(server.http_port, "/healthz"))
            stop.set()
    finally:
        stop.set()
        assert server.stop() == 0
    assert statuses == [200] * 30, statuses
    assert health == [200] * 3
    assert query(server.db, "SELECT count(*) FROM spans")[0][0] == 60


def test_stalled_bodies_in_every_slot_give_way_to_new_requests(tmp_path: Path) -> None:
    """Every slot held by a body that never completes: /healthz and a normal export are still served
    (the body read longest gives up its slot), and the stalled ones are closed, not answered."""
    server = ServeProcess(tmp_path, "--max-connections", "8", "--workers", "0").start()
    try:
        with ExitStack() as stack:
            stalled = []
            for _ in range(8):
                sock = stack.enter_context(_connect(server.http_port, timeout=10))
                sock.sendall(_head(1000) + b"\0")
                stalled.append(sock)
            time.sleep(0.2)
            assert _get(server.http_port, "/healthz") == 200
            assert _post(server.http_port, _request(service="past-stalled"))[0] == 200
            # The first stalled body made room: closed for the new request, or, when the machine was slow enough for it
            # to pass the body-rate floor first (5 s under 1 KiB/s), cut with a 408.
            reply = stalled[0].recv(100)
            assert reply == b"" or reply.startswith(b"HTTP/1.1 408"), reply
    finally:
        assert server.stop() == 0
