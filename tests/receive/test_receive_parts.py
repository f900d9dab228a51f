"""The receiver's parts in-process: config, content rules, pushback status, metrics, queue bounds."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, cast

import pytest
from click.testing import CliRunner
from google.protobuf.any_pb2 import Any as AnyProto
from google.rpc import error_details_pb2, status_pb2
from grpc import StatusCode
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from receive_support import LoadsAsAnError
from waits import EVENT_DEADLINE_S, wait_for

from plumbline_otel.cli.serve import serve
from plumbline_otel.config import ContentRules, load_config
from plumbline_otel.errors import ConfigError, PlumblineError
from plumbline_otel.pipeline import ShardSettings
from plumbline_otel.receive import ContentFilter, Metrics, Overloaded, WriteQueue
from plumbline_otel.receive._grpc import pushback_status
from plumbline_otel.store import Store

REPO = Path(__file__).resolve().parents[2]


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "plumbline.yaml"
    path.write_text(text)
    return path


def test_shipped_config_loads_with_loopback_defaults() -> None:
    config = load_config(REPO / "configs" / "plumbline.yaml")
    assert config.grpc_endpoint == "127.0.0.1:4317" and config.http_endpoint == "127.0.0.1:4318"
    assert config.grpc_max_recv_bytes == 64 << 20 and config.queue_max_spans == 8192


def test_unknown_key_is_a_config_error_naming_the_key(tmp_path: Path) -> None:
    path = _write(tmp_path, "receivers:\n  otlp:\n    protocols:\n      grpc:\n        endpoitn: 0.0.0.0:4317\n")
    with pytest.raises(ConfigError, match=r"receivers\.otlp\.protocols\.grpc\.endpoitn: unknown key \(expected one of: endpoint"):
        load_config(path)


def test_wrong_type_is_a_config_error_naming_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"queue\.max_spans: expected int, got str 'lots'"):
        load_config(_write(tmp_path, "queue: {max_spans: lots}\n"))
    with pytest.raises(ConfigError, match=r"content\.drop: expected a list of strings"):
        load_config(_write(tmp_path, "content: {drop: [1, 2]}\n"))


def test_tls_needs_both_files(tmp_path: Path) -> None:
    (tmp_path / "cert.pem").write_text("x")
    with pytest.raises(ConfigError, match=r"tls\.key_file"):
        load_config(overrides={"tls.cert_file": str(tmp_path / "cert.pem")})


def test_flags_override_the_file_and_the_token_comes_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLUMBLINE_AUTH_TOKEN", "from-env")
    path = _write(tmp_path, "storage: {path: a.duckdb}\nqueue: {max_spans: 10}\n")
    config = load_config(path, {"storage.path": "b.duckdb", "queue.max_spans": None})
    assert (config.db_path, config.queue_max_spans, config.auth_token) == ("b.duckdb", 10, "from-env")


def test_serve_with_a_bad_config_exits_1_with_the_key_in_the_message(tmp_path: Path) -> None:
    path = _write(tmp_path, "storage: {paht: x.duckdb}\n")
    result = CliRunner().invoke(serve, ["--config", str(path)])
    assert result.exit_code == 1 and "storage.paht: unknown key" in result.output


def _request_with(attrs: dict[str, str], event_attrs: dict[str, str]) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    span = request.resource_spans.add().scope_spans.add().spans.add()
    for key, value in attrs.items():
        span.attributes.add(key=key).value.string_value = value
    event = span.events.add(name="gen_ai.user.message")
    for key, value in event_attrs.items():
        event.attributes.add(key=key).value.string_value = value
    return request


def test_content_filter_drops_and_hashes_by_glob_on_span_and_event_attributes() -> None:
    content = ContentFilter(ContentRules(drop=("gen_ai.*.messages", "content"), hash=("gen_ai.tool.call.arguments",)))
    request = _request_with({"gen_ai.input.messages": "[secret]", "gen_ai.tool.call.arguments": '{"id": 1}', "gen_ai.tool.name": "pay"},
                            {"content": "secret"})
    assert content.apply_traces(request) == 3
    span = request.resource_spans[0].scope_spans[0].spans[0]
    values = {kv.key: kv.value.string_value for kv in span.attributes}
    assert values["gen_ai.input.messages"] == "__REDACTED__" and values["gen_ai.tool.name"] == "pay"
    assert values["gen_ai.tool.call.arguments"].startswith("sha256:") and len(values["gen_ai.tool.call.arguments"]) == 71
    assert span.events[0].attributes[0].value.string_value == "__REDACTED__"
    again = _request_with({"gen_ai.tool.call.arguments": '{"id": 1}'}, {})
    content.apply_traces(again)
    assert again.resource_spans[0].scope_spans[0].spans[0].attributes[0].value.string_value == values["gen_ai.tool.call.arguments"]
    assert not ContentFilter(ContentRules())


def test_pushback_status_carries_retry_info_in_details_and_in_the_python_trailer() -> None:
    status = pushback_status(StatusCode.UNAVAILABLE, "queue full", 1.5)
    assert status.code == StatusCode.UNAVAILABLE and status.details == "queue full"
    trailers = dict(status.trailing_metadata)
    rich = status_pb2.Status.FromString(trailers["grpc-status-details-bin"])
    detail: AnyProto = rich.details[0]
    info = error_details_pb2.RetryInfo()
    assert rich.code == 14 and detail.Unpack(info) and info.retry_delay.ToTimedelta().total_seconds() == 1.5
    assert error_details_pb2.RetryInfo.FromString(trailers["google.rpc.retryinfo-bin"]) == info


def test_metrics_render_prometheus_text_with_a_cumulative_histogram() -> None:
    metrics = Metrics()
    metrics.inc("plumbline_spans_stored_total", 5)
    metrics.gauge("plumbline_queue_spans", lambda: 7)
    for seconds in (0.002, 0.02, 20.0):
        metrics.observe(seconds, transport="grpc")
    text = metrics.render()
    assert "# TYPE plumbline_spans_stored_total counter\nplumbline_spans_stored_total 5\n" in text
    assert "plumbline_queue_spans 7" in text
    assert 'plumbline_request_duration_seconds_bucket{transport="grpc",le="0.0025"} 1' in text
    assert 'plumbline_request_duration_seconds_bucket{transport="grpc",le="10.0"} 2' in text
    assert 'plumbline_request_duration_seconds_bucket{transport="grpc",le="+Inf"} 3' in text
    assert 'plumbline_request_duration_seconds_count{transport="grpc"} 3' in text


@pytest.mark.slow
def test_a_queue_whose_shard_workers_cannot_start_says_so_and_closes_its_store(tmp_path: Path) -> None:
    # The server used to wait forever in its stop, SIGTERM included, for a writer thread that waited
    # for parts from workers that never started.
    settings = ShardSettings(content=cast(Any, LoadsAsAnError()))
    already = set(threading.enumerate())  # threads other tests' servers left running are not this queue's
    queue = WriteQueue(lambda: Store(tmp_path / "q.duckdb"), Metrics(), max_spans=10, max_bytes=1000, settings=settings, workers=1)
    began = time.monotonic()
    with pytest.raises(PlumblineError, match="the shard workers could not start"):
        queue.start()
    queue.close(timeout=EVENT_DEADLINE_S)  # what the server's stop does next (joins each thread up to this long)
    assert time.monotonic() - began < EVENT_DEADLINE_S  # every thread ended: one left hanging takes the join's whole timeout
    assert [t.name for t in set(threading.enumerate()) - already if t.name.startswith("plumbline-")] == []
    with Store(tmp_path / "q.duckdb") as store:  # closed by its thread, so it opens again
        assert store.pending_traces() == 0


def test_queue_admits_one_oversized_request_alone_and_pushes_back_past_its_bounds(tmp_path: Path) -> None:
    queue = WriteQueue(lambda: Store(tmp_path / "q.duckdb"), Metrics(), max_spans=10, max_bytes=1000)
    queue.start()
    try:
        queue.admit(5000)  # bigger than the bound, but the queue is empty
        with pytest.raises(Overloaded, match="queue is full"):
            queue.admit(1)
        queue.release(5000)
        queue.admit(600)
        with pytest.raises(Overloaded):
            queue.admit(600)
        queue.release(600)
        assert queue.depth == (0, 0)
        assert queue.call(lambda store: store.connection.execute("SELECT 41 + 1").fetchall()[0][0]) == 42
    finally:
        queue.close()
    with pytest.raises(Overloaded, match="shutting down"):
        queue.admit(1)


def test_a_long_trace_its_shard_let_go_is_assembled_once_quiet_without_waiting_for_shutdown(tmp_path: Path) -> None:
    from corpus import build_requests

    from plumbline_otel.decode import Unit, decode_unit
    from plumbline_otel.pipeline import ShardSettings

    requests = list(build_requests(350, 50))
    for request in requests:  # one long-running agent: one trace of 50 runs
        for span in request.resource_spans[0].scope_spans[0].spans:
            span.trace_id = (7).to_bytes(16, "big")
    queue = WriteQueue(lambda: Store(tmp_path / "q.duckdb"), Metrics(), max_spans=10_000, max_bytes=1 << 30,
                       settings=ShardSettings(long_trace_spans=60), assemble_interval=0.2, assemble_max_delay=1.0)
    queue.start()
    try:
        for request in requests:
            body = request.SerializeToString()
            queue.admit(len(body))
            queue.submit(len(body), decode_unit(Unit("protobuf", body, "test")), 50).wait(EVENT_DEADLINE_S)
        def runs() -> int:
            return queue.call(lambda store: len(store.connection.execute("SELECT trajectory_id FROM trajectories").fetchall()))

        wait_for(lambda: runs() >= 50, "50 runs assembled")  # as soon as they are: the deadline only bounds a hang
        assert runs() == 50
        assert queue.call(lambda store: store.pending_traces()) == 0
    finally:
        queue.close()


def test_a_trace_refused_beside_a_trace_of_several_runs_is_rebuilt_once_quiet(tmp_path: Path) -> None:
    """A shard's part stores one trace of two runs and is refused another (half its spans came before a
    restart): the refused trace is rebuilt from the store once quiet, not left pending until shutdown."""
    from corpus import build_requests

    from plumbline_otel.decode import Unit, decode_unit

    two_runs = next(build_requests(14, 14))
    for span in two_runs.resource_spans[0].scope_spans[0].spans:
        span.trace_id = (7).to_bytes(16, "big")
    split = next(build_requests(7, 7, first_trace=100))
    spans = split.resource_spans[0].scope_spans[0].spans
    first_half = ExportTraceServiceRequest()
    first_half.CopyFrom(split)
    del first_half.resource_spans[0].scope_spans[0].spans[3:]
    del spans[:3]
    spans.extend(two_runs.resource_spans[0].scope_spans[0].spans)

    def served(request: ExportTraceServiceRequest) -> WriteQueue:
        queue = WriteQueue(lambda: Store(tmp_path / "q.duckdb"), Metrics(), max_spans=10_000, max_bytes=1 << 30,
                           assemble_interval=0.2, assemble_max_delay=1.0)
        queue.start()
        body = request.SerializeToString()
        queue.admit(len(body))
        queue.submit(len(body), decode_unit(Unit("protobuf", body, "test")), len(request.resource_spans[0].scope_spans[0].spans)).wait(EVENT_DEADLINE_S)
        return queue

    served(first_half).close()
    queue = served(split)  # the rest of the split trace, and the trace of two runs
    try:
        wait_for(lambda: queue.call(lambda store: store.pending_traces()) == 0, "no trace left pending")
        assert queue.call(lambda store: len(store.connection.execute("SELECT trajectory_id FROM trajectories").fetchall())) == 3
    finally:
        queue.close()


def test_every_config_key_is_also_a_flag() -> None:
    from plumbline_otel.cli.serve import _overrides
    from plumbline_otel.config import config_keys

    opts = {p.name: (() if p.multiple else None) for p in serve.params}
    assert set(config_keys()) <= set(_overrides(opts, None))


def test_edge_settings_come_from_the_config_and_bad_values_name_the_key(tmp_path: Path) -> None:
    config = load_config(_write(tmp_path, "receivers: {otlp: {protocols: {http: {min_body_rate_bytes_per_second: 0, "
                                          "body_rate_window_seconds: 2, max_request_head_kib: 16}}}}\n"
                                          "queue: {max_bytes_mib: 100, max_bytes_per_address_share: 0.25}\n"))
    assert (config.http_min_body_rate, config.http_body_rate_window_seconds, config.http_max_head_bytes) == (0, 2.0, 16 << 10)
    assert config.queue_max_bytes_per_address == 25 << 20
    assert load_config().queue_max_bytes_per_address == 128 << 20  # half of the 256 MiB budget
    http = "receivers.otlp.protocols.http."
    for key, value, message in ((http + "min_body_rate_bytes_per_second", -1, "must be 0 or more, got -1"),
                                (http + "body_rate_window_seconds", 0, "must be greater than 0, got 0.0"),
                                (http + "max_request_head_kib", 0, "must be greater than 0, got 0"),
                                ("queue.max_bytes_per_address_share", 0, "more than 0 and at most 1 .*got 0.0"),
                                ("queue.max_bytes_per_address_share", 1.5, "more than 0 and at most 1 .*got 1.5")):
        with pytest.raises(ConfigError, match=rf"{key}: .*{message}"):
            load_config(overrides={key: value})
    result = CliRunner().invoke(serve, ["--max-bytes-per-address-share", "2", "--db", str(tmp_path / "x.duckdb")])
    assert result.exit_code == 1 and "queue.max_bytes_per_address_share" in result.output


def test_one_owner_holds_at_most_its_share_of_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    from plumbline_otel.receive import MemoryBudget, _budget

    # "At once" is told apart from a wait for reclaimed bytes: that wait made long, a bound far from both.
    monkeypatch.setattr(_budget, "RECLAIM_WAIT", 120.0)

    mib = 1 << 20
    budget = MemoryBudget(32 * mib, 16 * mib)
    assert budget.take(8 * mib, owner="10.0.0.1") and budget.take(8 * mib, owner="10.0.0.1")
    began = time.monotonic()
    assert not budget.take(1, owner="10.0.0.1")  # past its share: refused at once, with room left in the budget
    assert time.monotonic() - began < 60 and budget.used == 16 * mib and budget.refused_owner == 1
    assert budget.take(8 * mib, owner="10.0.0.2") and budget.take(8 * mib)  # others still fit
    budget.disown(8 * mib, "10.0.0.1")  # one body read: it stays in the budget, out of the address's share
    assert budget.owned("10.0.0.1") == 8 * mib and budget.used == 32 * mib
    budget.give(8 * mib)
    assert budget.take(8 * mib, owner="10.0.0.1")  # its share has room again
    budget.give(16 * mib, "10.0.0.1")
    budget.give(8 * mib, "10.0.0.2")
    budget.give(8 * mib)
    assert budget.used == 0 and budget.owned("10.0.0.1") == budget.owned("10.0.0.2") == 0
    assert budget.take(20 * mib, owner="10.0.0.3")  # holding nothing, an address may read one body past its share
    waited: list[bool] = []
    taker = threading.Thread(target=lambda: waited.append(budget.take(mib, owner="10.0.0.3", timeout=EVENT_DEADLINE_S)))
    taker.start()  # with a timeout (gRPC), it waits for its own share to have room
    time.sleep(0.2)
    budget.give(20 * mib, "10.0.0.3")
    taker.join(EVENT_DEADLINE_S)
    assert waited == [True] and budget.owned("10.0.0.3") == mib


@pytest.mark.parametrize("media", ["application/x-protobuf", "application/json"])
def test_an_in_process_server_parses_a_request_once_on_its_way_to_the_steps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                            media: str) -> None:
    """The handler decodes a request (protobuf or JSON) and the in-process shard prepares that decoded request: its bytes
    are never parsed a second time (nor is a JSON request encoded to protobuf and parsed back)."""
    import json

    from corpus import build_requests
    from otlp import to_otlp_json

    from plumbline_otel.receive import Intake

    request = next(build_requests(40, 40))
    body = request.SerializeToString() if media == "application/x-protobuf" else json.dumps(to_otlp_json(request)).encode()
    parses: list[int] = []
    parse = ExportTraceServiceRequest.FromString

    def counted(data: bytes) -> ExportTraceServiceRequest:
        parses.append(len(data))
        return parse(data)

    monkeypatch.setattr(ExportTraceServiceRequest, "FromString", staticmethod(counted))
    queue = WriteQueue(lambda: Store(tmp_path / "q.duckdb"), Metrics(), max_spans=10_000, max_bytes=1 << 30, workers=0)
    queue.start()
    try:
        outcome = Intake(queue, Metrics(), ContentFilter(ContentRules())).traces(body, media, "", "grpc", 64 << 20)
        assert outcome.status == "ok", outcome.message
        queue.call(lambda store: store.assemble())
        steps = queue.call(lambda store: sum(len(t.steps) for t in store.trajectories()))
    finally:
        queue.close()
    assert steps > 0
    assert parses == ([len(body)] if media == "application/x-protobuf" else [])
