"""Hostile peers at the edge (issue 30): memory and normal clients' service under each attack, beside no attack.

    python bench/edge_hostile.py [--workers 0] [--only held,steady,steady-noshare,slow,grpc,idle,idle-http,large-json,burst]
                                 [--burst-spans 50000] [--json-spans 200000]

Each scenario starts its own `plumbline serve` on loopback, measures the server's process tree RSS
(sampled every 50 ms) and a normal client's requests while the attack runs, then stops the server:

- none:   no attack; the normal client alone (the reference row).
- held:   40 HTTP bodies of 8 MiB held one byte short of complete (320 MiB sent) against a 64 MiB
          memory budget (`--queue-max-bytes-mib 64`).
- steady: 8 HTTP bodies of 4 MiB from 127.0.0.2, each arriving at 5 KiB/s (above the rate floor,
          so nothing reclaims them) against a 32 MiB budget; the normal client is on 127.0.0.1.
          One address holds at most its share of the budget (`queue.max_bytes_per_address_share`).
- steady-noshare: the same with the share at 1 (no per-address share), for comparison.
- slow:   300 slow HTTP connections (heads trickled a byte a second, bodies stalled, silent ones),
          a fifth from a second address, against 32 connections (16 per address).
- grpc:   160 gRPC export calls that send headers and never a message (past the 128-call cap),
          with a 5 s message deadline; the normal client uses gRPC (export and health).
- idle, idle-http: issue 43's attack on a default serve (256 MiB budget, 128 export calls, 30 s
          message deadline): 4 idle gRPC exports from 127.0.0.2 and 127.0.0.3 (through relays) and
          200 from 127.0.0.1, the normal client's own address; the normal client uses gRPC (idle) or
          OTLP/HTTP (idle-http). Before issue 43, each idle call reserved 64 MiB for its deadline.
- large-json: one OTLP JSON request of `--json-spans` spans on a default serve (body limit raised to
          256 MiB, the queue to the request), sent twice: the answers, their times and the spans
          stored (once, if the resend is deduplicated). Before issue 43, 200,000 spans were answered
          503 "the store did not commit in time" after 35 s under load, though all were committed.
- burst:  one request of `--burst-spans` spans; the row's RSS columns are the idle tree before, the
          peak, and the idle tree 10 s after the answer (does memory go back? issue 30 item 7).
          Run it with `--workers 2` to include the shard workers.

The normal client sends a 20-span export and a health check every 0.2 s on fresh connections
(timeout 10 s). Printed per scenario: its exports answered 200 (of those sent), their latency
(median, 95th percentile, max), health checks answered OK, and the tree's RSS before and at peak.
The figures are for the code checked out now only (there is no "before" column: run it on an
older commit for that). Every load here is bounded (hundreds of connections, seconds) and local.
Results also go to bench/out/edge_hostile.json.
"""

from __future__ import annotations

import argparse
import http.client
import json
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, suppress
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from corpus import burst_request  # noqa: E402  (the bursts the memory test sends, too)
from receive_support import Relay  # noqa: E402  (the idle callers' other addresses, as the test makes them)

_TRACES = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
_MIB = 1 << 20
OUT = Path(__file__).resolve().parent / "out" / "edge_hostile.json"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _request(spans: int, text: int = 200) -> bytes:
    return burst_request(spans, text, service="bench-edge")


def tree_rss_mib(pid: int) -> float:
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


class Server:
    def __init__(self, workdir: Path, *args: str) -> None:
        self.grpc_port, self.http_port = _free_port(), _free_port()
        self.log = workdir / f"serve-{self.http_port}.log"
        command = [sys.executable, "-m", "plumbline_otel.cli.serve", "--db", str(workdir / f"{self.http_port}.duckdb"),
                   "--grpc-port", str(self.grpc_port), "--http-port", str(self.http_port), *args]
        self.proc = subprocess.Popen(command, stdout=self.log.open("wb"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while "plumbline serve: OTLP" not in self.log.read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"plumbline serve did not start:\n{self.log.read_text()}")
            time.sleep(0.05)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Peak:
    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self._stop = pid, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, tree_rss_mib(self.pid))
            time.sleep(0.05)

    def __enter__(self) -> Peak:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


class NormalClient:
    """A 20-span export and a health check every 0.2 s, over HTTP or gRPC, while the attack runs."""

    def __init__(self, server: Server, transport: str) -> None:
        self.server, self.transport = server, transport
        self.latencies: list[float] = []
        self.sent = self.ok = self.health_sent = self.health_ok = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")

    def _http(self, method: str, path: str, body: bytes | None = None) -> int:
        connection = http.client.HTTPConnection("127.0.0.1", self.server.http_port, timeout=10)
        try:
            connection.request(method, path, body=body, headers={"Content-Type": "application/x-protobuf"} if body else {})
            response = connection.getresponse()
            response.read()
            return response.status
        finally:
            connection.close()

    def _grpc(self, health: bool) -> bool:  # one channel for the client's life, as an exporter keeps one
        if health:
            answer = health_pb2_grpc.HealthStub(self._channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
            return bool(answer.status == health_pb2.HealthCheckResponse.SERVING)
        self._channel.unary_unary(_TRACES, request_serializer=None, response_deserializer=None)(_request(20), timeout=10)
        return True

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            began = time.monotonic()
            self.sent += 1
            try:
                good = self._grpc(False) if self.transport == "grpc" else self._http("POST", "/v1/traces", _request(20)) == 200
            except (OSError, http.client.HTTPException, grpc.RpcError):
                good = False
            if good:
                self.ok += 1
                self.latencies.append(time.monotonic() - began)
            self.health_sent += 1
            try:
                self.health_ok += self._grpc(True) if self.transport == "grpc" else self._http("GET", "/healthz") == 200
            except (OSError, http.client.HTTPException, grpc.RpcError):
                pass

    def __enter__(self) -> NormalClient:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(30)
        self._channel.close()

    def figures(self) -> dict[str, Any]:
        ms = sorted(1000 * x for x in self.latencies)
        return {"exports_ok": self.ok, "exports_sent": self.sent, "health_ok": self.health_ok, "health_sent": self.health_sent,
                "p50_ms": statistics.median(ms) if ms else None,
                "p95_ms": ms[min(len(ms) - 1, int(0.95 * len(ms)))] if ms else None, "max_ms": ms[-1] if ms else None}


def _connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    sock = socket.socket()
    sock.settimeout(10)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    return sock


def _head(length: int) -> bytes:
    return f"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\nContent-Length: {length}\r\n\r\n".encode()


# --- attacks: each holds its connections for `seconds`, then lets go --------------------------------


def attack_none(server: Server, seconds: float) -> str:
    time.sleep(seconds)
    return "-"


def attack_held(server: Server, seconds: float) -> str:
    chunk = b"\0" * _MIB
    with ExitStack() as stack:
        for _ in range(40):
            sock = stack.enter_context(_connect(server.http_port))
            with suppress(OSError):  # pushed back: the server answered 503 and stopped reading
                sock.sendall(_head(8 * _MIB))
                for _ in range(7):
                    sock.sendall(chunk)
                sock.sendall(chunk[:-1])
        time.sleep(seconds)
    return "40 x 8 MiB bodies held 1 byte short (320 MiB)"


def attack_steady(server: Server, seconds: float) -> str:
    stop = threading.Event()

    def send(sock: socket.socket) -> None:
        with suppress(OSError):
            sock.sendall(_head(4 * _MIB))
            while not stop.wait(0.2):
                sock.sendall(b"\0" * 1024)

    with ExitStack() as stack:
        for _ in range(8):
            sock = stack.enter_context(_connect(server.http_port, "127.0.0.2"))
            threading.Thread(target=send, args=(sock,), daemon=True).start()
        time.sleep(seconds)
        stop.set()
    return "8 x 4 MiB bodies from 127.0.0.2 at 5 KiB/s each (32 MiB budget)"


def _trickle(sock: socket.socket, stop: threading.Event) -> None:
    with suppress(OSError):
        sock.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\n")
        while not stop.wait(1.0):
            sock.sendall(b"X")


def attack_slow(server: Server, seconds: float) -> str:
    stop = threading.Event()
    opened = 0
    with ExitStack() as stack:
        for i in range(300):
            try:
                sock = stack.enter_context(_connect(server.http_port, "127.0.0.2" if i % 5 == 0 else "127.0.0.1"))
            except OSError:
                continue
            opened += 1
            if i % 3 == 0:
                threading.Thread(target=_trickle, args=(sock, stop), daemon=True).start()
            elif i % 3 == 1:
                with suppress(OSError):
                    sock.sendall(_head(1000) + b"\0" * 10)
        time.sleep(seconds)
        stop.set()
    return f"{opened} slow connections (cap 32, 16 per address)"


def _never(stop: threading.Event) -> Iterator[bytes]:
    stop.wait()
    return
    yield b""  # a request stream that sends nothing until told to end


def attack_grpc(server: Server, seconds: float) -> str:
    stop = threading.Event()
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        export = channel.stream_unary(_TRACES, request_serializer=None, response_deserializer=None)
        calls = [export.future(_never(stop), timeout=60) for _ in range(160)]
        time.sleep(seconds)
        stop.set()
        for call in calls:
            with suppress(grpc.RpcError, grpc.FutureCancelledError):
                call.result(timeout=10)
    return "160 idle export calls (cap 128, 5 s message deadline)"


def _queue_bytes(server: Server) -> float:
    connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        connection.request("GET", "/metrics")
        text = connection.getresponse().read().decode()
    finally:
        connection.close()
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith("plumbline_queue_bytes"))


def attack_idle(server: Server, seconds: float) -> str:
    stop = threading.Event()
    relays = [Relay(server.grpc_port, source) for source in ("127.0.0.2", "127.0.0.3")]
    local = [("grpc.use_local_subchannel_pool", 1)]  # a connection of its own per channel (100 streams each)
    held: list[float] = []
    try:
        with ExitStack() as stack:
            channels = [stack.enter_context(grpc.insecure_channel(relay.address, options=local)) for relay in relays]
            channels += [stack.enter_context(grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}", options=local)) for _ in range(2)]
            calls = []
            for i, channel in enumerate(channels):
                export = channel.stream_unary(_TRACES, request_serializer=None, response_deserializer=None)
                calls += [export.future(_never(stop), timeout=120) for _ in range(2 if i < 2 else 100)]
            ends = time.monotonic() + seconds
            while time.monotonic() < ends:
                held.append(_queue_bytes(server))
                time.sleep(0.5)
            stop.set()
            for call in calls:
                with suppress(grpc.RpcError, grpc.FutureCancelledError):
                    call.result(timeout=30)
    finally:
        stop.set()
        for relay in relays:
            relay.close()
    return f"204 idle gRPC exports (4 from two other addresses), budget held by them at most {max(held) / _MIB:.2f} MiB"


SCENARIOS: dict[str, tuple[Callable[[Server, float], str], str, tuple[str, ...]]] = {
    "none": (attack_none, "http", ()),
    "held": (attack_held, "http", ("--queue-max-bytes-mib", "64", "--max-request-body-size-mib", "8", "--http-read-timeout", "30")),
    "steady": (attack_steady, "http", ("--queue-max-bytes-mib", "32", "--max-request-body-size-mib", "8")),
    "steady-noshare": (attack_steady, "http", ("--queue-max-bytes-mib", "32", "--max-request-body-size-mib", "8",
                                               "--max-bytes-per-address-share", "1")),
    "slow": (attack_slow, "http", ("--max-connections", "32", "--max-connections-per-address", "16",
                                   "--http-read-header-timeout", "30", "--http-read-timeout", "30", "--http-idle-timeout", "30")),
    "grpc": (attack_grpc, "grpc", ("--grpc-message-timeout", "5")),
    "idle": (attack_idle, "grpc", ()),
    "idle-http": (attack_idle, "http", ()),
}


def run_scenario(name: str, workdir: Path, workers: int, seconds: float) -> dict[str, Any]:
    attack, transport, args = SCENARIOS[name]
    server = Server(workdir, "--workers", str(workers), *args)
    try:
        time.sleep(1.0)
        baseline = tree_rss_mib(server.proc.pid)
        with Peak(server.proc.pid) as peak, NormalClient(server, transport) as client:
            what = attack(server, seconds)
        return {"scenario": name, "attack": what, "transport": transport, "rss_before_mib": baseline, "rss_peak_mib": peak.peak,
                **client.figures()}
    finally:
        server.stop()


def run_burst(workdir: Path, workers: int, spans: int) -> dict[str, Any]:
    server = Server(workdir, "--workers", str(workers), "--max-request-body-size-mib", "256", "--queue-max-spans", str(spans))
    try:
        body = _request(spans, text=300)
        time.sleep(1.0)
        baseline = tree_rss_mib(server.proc.pid)
        with Peak(server.proc.pid) as peak:
            connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=300)
            began = time.monotonic()
            connection.request("POST", "/v1/traces", body=body, headers={"Content-Type": "application/x-protobuf"})
            response = connection.getresponse()
            response.read()
            took = time.monotonic() - began
            connection.close()
        del body
        time.sleep(10)
        after = tree_rss_mib(server.proc.pid)
        return {"scenario": "burst", "attack": f"one request of {spans} spans ({response.status} in {took:.1f} s)", "transport": "http",
                "rss_before_mib": baseline, "rss_peak_mib": peak.peak, "rss_idle_after_mib": after}
    finally:
        server.stop()


def run_large_json(workdir: Path, workers: int, spans: int) -> dict[str, Any]:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from otlp import to_otlp_json

    server = Server(workdir, "--workers", str(workers), "--max-request-body-size-mib", "256", "--queue-max-spans", str(spans))
    try:
        body = json.dumps(to_otlp_json(ExportTraceServiceRequest.FromString(_request(spans, text=100)))).encode()
        answers = []
        with Peak(server.proc.pid) as peak:
            baseline = tree_rss_mib(server.proc.pid)
            for _ in range(2):
                connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=1800)
                began = time.monotonic()
                connection.request("POST", "/v1/traces", body=body, headers={"Content-Type": "application/json"})
                response = connection.getresponse()
                response.read()
                answers.append(f"{response.status} in {time.monotonic() - began:.1f} s")
                connection.close()
    finally:
        server.stop()
    import duckdb

    with duckdb.connect(str(workdir / f"{server.http_port}.duckdb"), read_only=True) as db:
        stored = db.execute("SELECT count(*) FROM spans").fetchone()
    return {"scenario": "large-json", "attack": f"{spans} spans, {len(body) / _MIB:.0f} MiB of OTLP JSON, sent twice: "
            f"{', then '.join(answers)}; {stored[0] if stored else 0} spans stored", "transport": "http",
            "rss_before_mib": baseline, "rss_peak_mib": peak.peak}


def _fmt(value: Any, spec: str = ".0f") -> str:
    return "-" if value is None else format(value, spec)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=0, help="shard workers of each server [0: in-process]")
    parser.add_argument("--only", default="none,held,steady,steady-noshare,slow,grpc,burst", help="scenarios to run, comma-separated")
    parser.add_argument("--seconds", type=float, default=6.0, help="how long each attack is held")
    parser.add_argument("--burst-spans", type=int, default=50_000)
    parser.add_argument("--json-spans", type=int, default=200_000, help="spans of the large-json scenario's request")
    opts = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="plumbline-edge-") as tmp:
        for name in opts.only.split(","):
            print(f"running {name} ...", file=sys.stderr, flush=True)
            if name == "burst":
                rows.append(run_burst(Path(tmp), opts.workers, opts.burst_spans))
            elif name == "large-json":
                rows.append(run_large_json(Path(tmp), opts.workers, opts.json_spans))
            else:
                rows.append(run_scenario(name, Path(tmp), opts.workers, opts.seconds))
    print(f"\nplumbline serve under hostile peers (workers={opts.workers}; current code only; attacks held {opts.seconds:g} s)\n")
    print(f"{'scenario':<15}{'normal exports ok':>18}{'p50 ms':>8}{'p95 ms':>8}{'max ms':>8}{'health ok':>10}"
          f"{'RSS before':>11}{'RSS peak':>9}{'idle after':>11}  attack")
    for row in rows:
        exports = f"{row['exports_ok']}/{row['exports_sent']}" if "exports_ok" in row else "-"
        health = f"{row['health_ok']}/{row['health_sent']}" if "health_ok" in row else "-"
        print(f"{row['scenario']:<15}{exports:>18}{_fmt(row.get('p50_ms')):>8}{_fmt(row.get('p95_ms')):>8}{_fmt(row.get('max_ms')):>8}"
              f"{health:>10}{_fmt(row['rss_before_mib']):>11}{_fmt(row['rss_peak_mib']):>9}{_fmt(row.get('rss_idle_after_mib')):>11}"
              f"  {row['attack']}")
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps({"workers": opts.workers, "seconds": opts.seconds, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
