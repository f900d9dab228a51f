"""`replay --endpoint` (issue 39 item 13): the protocol is given, said by the URL, or asked of the endpoint,
never guessed from an unusual port; the agent gets OTEL_EXPORTER_OTLP_* in the form its SDK reads. And
`replay --help` (item 15) lists every perturbation the code registers."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
import pytest
from click.testing import CliRunner
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from waits import EVENT_DEADLINE_S

from plumbline_otel.cli.main import cli
from plumbline_otel.errors import ConfigError
from plumbline_otel.replay.export import SpanSink, exporter_for_endpoint
from plumbline_otel.replay.otlp import resolve_endpoint
from plumbline_otel.replay.perturb import PERTURBATIONS

from .proxy_helpers import trial


class _Receiver(BaseHTTPRequestHandler):
    paths: list[str]
    got: threading.Event

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        self.rfile.read(int(self.headers.get("content-length") or 0))
        type(self).paths.append(self.path)
        ok = self.path == "/v1/traces"
        self.send_response(200 if ok else 404)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()
        if ok:
            type(self).got.set()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        return


@pytest.fixture
def http_receiver() -> Iterator[tuple[str, type[_Receiver]]]:
    handler = type("Receiver", (_Receiver,), {"paths": [], "got": threading.Event()})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler
    server.shutdown()
    server.server_close()


def test_an_http_endpoint_on_an_unusual_port_is_asked_and_the_agent_gets_the_base_url(http_receiver) -> None:
    url, handler = http_receiver
    target = resolve_endpoint(url)
    assert (target.protocol, target.how, target.url) == ("http/protobuf", "asked", f"{url}/v1/traces")
    # the driver's own exporter reaches /v1/traces (once, not twice)
    provider = TracerProvider(resource=Resource.create({"service.name": "probe"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter_for_endpoint(url)))
    provider.get_tracer("t").start_span("s").end()
    assert handler.got.wait(EVENT_DEADLINE_S) and handler.paths[-1] == "/v1/traces"
    provider.shutdown()
    # the agent: base URL without /v1/traces (its SDK appends it), the full URL for the traces variable, the protocol
    env = trial().__class__(**{**trial().__dict__, "sink": SpanSink(endpoint=url)}).env({})
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == url
    assert env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] == f"{url}/v1/traces"
    assert env["OTEL_EXPORTER_OTLP_PROTOCOL"] == env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "http/protobuf"


def test_a_traces_url_is_http_and_never_doubled_for_the_agent() -> None:
    target = resolve_endpoint("http://127.0.0.1:14318/v1/traces")  # nothing listens: the URL says it all, nothing is asked
    assert (target.protocol, target.how) == ("http/protobuf", "url")
    env = target.agent_env()
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://127.0.0.1:14318"
    assert env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] == "http://127.0.0.1:14318/v1/traces"


def test_a_grpc_endpoint_on_an_unusual_port_is_asked() -> None:
    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        target = resolve_endpoint(f"http://127.0.0.1:{port}")
    finally:
        server.stop(0)
    assert (target.protocol, target.how, target.url) == ("grpc", "asked", f"http://127.0.0.1:{port}")
    env = target.agent_env()
    assert env["OTEL_EXPORTER_OTLP_PROTOCOL"] == "grpc" and env["OTEL_EXPORTER_OTLP_ENDPOINT"] == f"http://127.0.0.1:{port}"


def test_given_protocols_scheme_and_default_ports_need_no_asking() -> None:
    assert resolve_endpoint("http://127.0.0.1:14319", "http/protobuf").url == "http://127.0.0.1:14319/v1/traces"
    assert resolve_endpoint("http://127.0.0.1:14320", "grpc").protocol == "grpc"
    assert resolve_endpoint("grpc://127.0.0.1:14321").how == "url"
    assert (resolve_endpoint("127.0.0.1:4317").protocol, resolve_endpoint("http://127.0.0.1:4318").protocol) == ("grpc", "http/protobuf")


def test_an_endpoint_that_answers_nothing_is_refused_with_what_to_do() -> None:
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    port = dead.getsockname()[1]
    dead.close()
    with pytest.raises(ConfigError, match="nothing answers there"):
        resolve_endpoint(f"http://127.0.0.1:{port}")
    with pytest.raises(ConfigError, match="expected grpc or http/protobuf"):
        resolve_endpoint(f"http://127.0.0.1:{port}", "thrift")


def test_replay_help_lists_every_perturbation() -> None:
    out = CliRunner().invoke(cli, ["replay", "--help"], terminal_width=400)
    assert out.exit_code == 0
    text = " ".join(out.output.split())
    assert all(name in text for name in PERTURBATIONS) and "model_fault" in text and "tool_result_fault" in text
    assert "--endpoint-protocol" in text
