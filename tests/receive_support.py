"""Helpers for the receiver tests: `plumbline serve` as a subprocess, agent spans from the real SDK, certs."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any

import duckdb
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Tracer

TOKEN = "s3cret-token"
# What the tests wait for from `plumbline serve`: its ready line, printed once it listens (`Service.describe`).
READY_LINE = "plumbline serve: OTLP"
# Deadlines for a server that hangs, not expectations of speed: on a loaded machine importing the package alone took
# 20 s (load 17-25 on 2 cores), and a start or a drain may take several times that. A test waits for the event
# (the ready line, the exit) and fails early when the process exits; these only bound a hang.
STARTUP_DEADLINE = 600.0
STOP_DEADLINE = 600.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServeProcess:
    """`python -m plumbline_otel.cli.serve` on free loopback ports, with its stderr in a file."""

    _count = 0

    def __init__(self, tmp_path: Path, *args: str, db: Path | None = None, env: dict[str, str] | None = None,
                 grpc_port: int | None = None, http_port: int | None = None) -> None:
        self.tmp_path = tmp_path
        self.db = db or tmp_path / "plumbline.duckdb"
        self.grpc_port = grpc_port or free_port()
        self.http_port = http_port or free_port()
        self.args = args
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None
        ServeProcess._count += 1
        self.log_path = tmp_path / f"serve-{ServeProcess._count}.log"

    @property
    def grpc_address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        scheme = "https" if "--tls-cert" in self.args else "http"
        return f"{scheme}://127.0.0.1:{self.http_port}"

    def start(self, timeout: float = STARTUP_DEADLINE) -> ServeProcess:
        """Start the server and wait for its ready line (printed once it listens), failing at once if it exits first.

        The wait is for that event, not for a time: `timeout` is only how long a server that neither says it is ready
        nor exits may hang before the test gives up, far beyond what a slow start takes.
        """
        command = [sys.executable, "-m", "plumbline_otel.cli.serve", "--db", str(self.db),
                   "--grpc-port", str(self.grpc_port), "--http-port", str(self.http_port), *self.args]
        self.log = open(self.log_path, "ab")
        start = self.log.tell()  # a restarted server's log holds the earlier one's ready line: read only what this one writes
        self.proc = subprocess.Popen(command, stdout=self.log, stderr=self.log, env=self.env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if READY_LINE in self._written_since(start):
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"plumbline serve exited with {self.proc.returncode} before it was ready:\n{self.output()}")
            time.sleep(0.1)
        raise RuntimeError(f"plumbline serve neither said it was ready nor exited in {timeout:g} s:\n{self.output()}")

    def _written_since(self, offset: int) -> str:
        with open(self.log_path, "rb") as log:
            log.seek(offset)
            return log.read().decode(errors="replace")

    def stop(self, timeout: float = STOP_DEADLINE) -> int:
        """SIGTERM and wait: the server drains, commits, assembles and exits (`timeout`: how long a hung one may take)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout)
        self.log.close()
        return code

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(STOP_DEADLINE)
        self.log.close()

    def rss_mib(self) -> float:
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def output(self) -> str:
        return self.log_path.read_text()

    def __enter__(self) -> ServeProcess:
        return self if self.proc is not None else self.start()  # `with ServeProcess(...).start()` must not start a second server

    def __exit__(self, *exc: Any) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.kill()


def agent_run(tracer: Tracer, task: str, tools: Sequence[tuple[str, dict[str, Any], Any]] = (("lookup_invoice", {"invoice_id": "INV-1"}, {"status": "open"}),)) -> None:
    """invoke_agent with one execute_tool span per tool, in the current GenAI conventions."""
    with tracer.start_as_current_span("invoke_agent payer", attributes={
        "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "payer", "gen_ai.conversation.id": task,
        "plumbline.task.key": task,  # a conversation id alone does not name the task
        "gen_ai.input.messages": json.dumps([{"role": "user", "parts": [{"type": "text", "content": f"Handle {task}"}]}]),
    }):
        for i, (name, args, result) in enumerate(tools):
            with tracer.start_as_current_span(f"execute_tool {name}", attributes={
                "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name, "gen_ai.tool.call.id": f"call_{i}",
                "gen_ai.tool.call.arguments": json.dumps(args), "gen_ai.tool.call.result": json.dumps(result),
            }):
                pass


def finished_spans(runs: int, service: str = "test-agent", prefix: str = "task") -> list[ReadableSpan]:
    """Spans of `runs` agent runs made by the real SDK, ready for an exporter's `export()`."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("tests.receive")
    for i in range(runs):
        agent_run(tracer, f"{prefix}-{i}")
    provider.shutdown()
    return list(memory.get_finished_spans())


def span_key(span: ReadableSpan) -> tuple[str, str]:
    context = span.get_span_context()
    assert context is not None
    return f"{context.trace_id:032x}", f"{context.span_id:016x}"


def stored_span_keys(db: Path) -> list[tuple[str, str]]:
    """Every (trace_id, span_id) row, duplicates included (there must be none)."""
    with duckdb.connect(str(db), read_only=True) as connection:
        return [tuple(row) for row in connection.execute("SELECT trace_id, span_id FROM spans").fetchall()]


def query(db: Path, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    with duckdb.connect(str(db), read_only=True) as connection:
        return connection.execute(sql, list(params)).fetchall()


def self_signed_cert(directory: Path) -> tuple[Path, Path]:
    """A cert for 127.0.0.1/localhost and its key, made now (cryptography, else the openssl CLI)."""
    cert, key = directory / "server.pem", directory / "server-key.pem"
    try:
        _cert_with_cryptography(cert, key)
    except ImportError:
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                        "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                       check=True, capture_output=True)
    return cert, key


def _cert_with_cryptography(cert_path: Path, key_path: Path) -> None:
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))


def _cannot_load(message: str) -> None:
    raise RuntimeError(message)


class LoadsAsAnError:
    """Pickles fine and fails to unpickle: put in a shard's settings, it is a worker that cannot start
    (as one did when its install was broken), failing where a real worker would."""

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return _cannot_load, ("this worker cannot start (the test's doing)",)


class Relay:
    """A TCP relay whose connections reach `port` from `source`: a gRPC client seen as another address (the idle-caller test and bench/edge_hostile.py)."""

    def __init__(self, port: int, source: str) -> None:
        self.port, self.source = port, source
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._socks: list[socket.socket] = [self._listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with suppress(OSError):
            while True:
                client, _ = self._listener.accept()
                upstream = socket.create_connection(("127.0.0.1", self.port), source_address=(self.source, 0))
                self._socks += [client, upstream]
                for a, b in ((client, upstream), (upstream, client)):
                    threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        with suppress(OSError):
            while data := src.recv(1 << 16):
                dst.sendall(data)
        with suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        for sock in self._socks:
            sock.close()
