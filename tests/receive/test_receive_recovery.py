"""After a crash every reader sees every stored span: serve assembles what was left pending, and says what it could not."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan
from receive_support import ServeProcess, finished_spans, query, span_key
from waits import EVENT_DEADLINE_S

from plumbline_otel.api.client import PlumblineClient
from plumbline_otel.cli.main import cli

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

SPEC = """
version: 1
name: recovery
invariants:
  - id: MUST-LOOK-UP
    severity: critical
    must_call: lookup_invoice
"""


def _pending(db: Path) -> int:
    return query(db, "SELECT count(*) FROM dirty_traces")[0][0]


def _export(server: ServeProcess, runs: int, prefix: str) -> None:
    exporter = OTLPSpanExporter(endpoint=server.grpc_address, insecure=True, timeout=EVENT_DEADLINE_S)
    assert exporter.export(finished_spans(runs, prefix=prefix)) == SpanExportResult.SUCCESS
    exporter.shutdown()


def _late_spans(first: list[ReadableSpan]) -> list[ReadableSpan]:
    """One more span in each trace of `first`, made by the real SDK under the trace's root (a straggler)."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "test-agent"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("tests.receive")
    for root in (s for s in first if s.parent is None):
        root_context = root.get_span_context()
        assert root_context is not None
        with tracer.start_as_current_span("late", context=trace.set_span_in_context(NonRecordingSpan(root_context))):
            pass
    provider.shutdown()
    return list(memory.get_finished_spans())


def test_a_stop_out_of_grace_logs_what_it_left_pending_and_the_next_start_assembles_it(tmp_path: Path) -> None:
    lazy = ("--assemble-interval", "3600", "--assemble-max-delay", "3600")
    first = finished_spans(20, prefix="early")
    server = ServeProcess(tmp_path, *lazy).start()
    exporter = OTLPSpanExporter(endpoint=server.grpc_address, insecure=True, timeout=EVENT_DEADLINE_S)
    assert exporter.export(first) == SpanExportResult.SUCCESS
    assert server.stop() == 0
    assert _pending(server.db) == 0
    # Stragglers after a restart: their shard holds one span of each trace, so the store must rebuild
    # every trace from its rows, and a zero grace leaves that undone.
    late = ServeProcess(tmp_path, *lazy, "--shutdown-grace", "0", db=server.db).start()
    exporter = OTLPSpanExporter(endpoint=late.grpc_address, insecure=True, timeout=EVENT_DEADLINE_S)
    assert exporter.export(_late_spans(first)) == SpanExportResult.SUCCESS
    exporter.shutdown()
    assert late.stop() == 0
    assert _pending(server.db) == 20
    assert "20 traces left pending: not assembled within the 0.0 s shutdown grace" in late.output()
    again = ServeProcess(tmp_path, *lazy, db=server.db).start()
    assert "assembled 20 traces an earlier stop left pending" in again.output()
    listed = CliRunner().invoke(cli, ["trajectories", "--server", again.grpc_address])
    assert len(listed.stdout.splitlines()) == 20
    assert again.stop() == 0
    assert _pending(server.db) == 0
    assert "left pending" not in again.output().split("earlier stop left pending", 1)[1]


def _send(address: str, sender: int, acknowledged: list[tuple[str, str]], lock: threading.Lock, stop: threading.Event) -> None:
    """One real SDK exporter sending batches of ten runs until told to stop (it retries through a restart).

    It sends until stopped, not a fixed load, so the kill always comes while spans are still
    arriving however fast the machine is; the bound only keeps a broken test finite.
    """
    exporter = OTLPSpanExporter(endpoint=f"http://{address}", insecure=True, timeout=20)
    for i in range(2000):
        if stop.is_set():
            break
        batch = finished_spans(10, service="recovery", prefix=f"s{sender}b{i}")
        if exporter.export(batch) == SpanExportResult.SUCCESS:
            with lock:
                acknowledged.extend(span_key(s) for s in batch)
    exporter.shutdown()


def _readers(spec: Path, cert: Path, where: list[str]) -> dict[str, int]:
    """The runs each reader counts, through `where` (--db FILE or --server ADDRESS)."""
    runner = CliRunner()
    listed = runner.invoke(cli, ["trajectories", *where])
    covered = runner.invoke(cli, ["coverage", *where, "--format", "json"])
    checked = runner.invoke(cli, ["check", "--spec", str(spec), *where, "--format", "json"])
    certified = runner.invoke(cli, ["certify", "--spec", str(spec), *where, "--out", str(cert), "--format", "none"])
    for result in (listed, covered, checked, certified):
        assert result.exit_code == 0, result.output
        assert "not yet assembled" not in result.stderr
    return {
        "trajectories": len(listed.stdout.splitlines()),
        "coverage": json.loads(covered.stdout)["overall"]["trajectories"]["trajectories"],
        "check": json.loads(checked.stdout[checked.stdout.index("{"):])["runs"],
        "certify": sum(cell["n"] for cell in json.loads(cert.read_text())["headline"]["cells"]),
    }


def test_sigkill_under_load_restart_and_immediate_sigterm_leave_every_reader_counting_every_stored_trace(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    first = ServeProcess(tmp_path, "--assemble-interval", "5", "--assemble-max-delay", "5").start()
    acknowledged: list[tuple[str, str]] = []
    lock, stop = threading.Lock(), threading.Event()
    threads = [threading.Thread(target=_send, args=(first.grpc_address, k, acknowledged, lock, stop)) for k in range(4)]
    for thread in threads:
        thread.start()
    started = time.monotonic()  # until some traces are assembled and more keep coming: the crash leaves both kinds
    with PlumblineClient(first.grpc_address) as client:  # the wait ends with the event; its deadline only bounds a hang
        while time.monotonic() - started < EVENT_DEADLINE_S:
            if len(acknowledged) >= 1500 and next(iter(client.trajectories(assemble_first=False)), None) is not None:
                break
            time.sleep(0.2)
    assert any(thread.is_alive() for thread in threads), "the senders finished before the kill"
    first.kill()  # SIGKILL under load: spans committed, trajectories of the last seconds never built
    left_by_crash, at_kill = _pending(first.db), query(first.db, "SELECT count(DISTINCT trace_id) FROM spans")[0][0]
    assert 0 < left_by_crash < at_kill

    restarted = ServeProcess(tmp_path, db=first.db, grpc_port=first.grpc_port, http_port=first.http_port).start()
    assert restarted.stop() == 0  # immediately: whatever arrived meanwhile is committed and assembled too
    stop.set()
    for thread in threads:
        thread.join(EVENT_DEADLINE_S)  # each ends after its export in flight (to a stopped server: its 20 s timeout)
    assert f"assembled {left_by_crash} traces an earlier stop left pending" in restarted.output()
    assert "left pending:" not in restarted.output()

    stored = query(first.db, "SELECT count(DISTINCT trace_id) FROM spans")[0][0]
    assert set(acknowledged) <= {tuple(row) for row in query(first.db, "SELECT trace_id, span_id FROM spans")}
    assert _pending(first.db) == 0
    assert query(first.db, "SELECT count(*) FROM trajectories")[0][0] == stored

    by_file = _readers(spec, tmp_path / "file-cert.json", ["--db", str(first.db)])
    with ServeProcess(tmp_path, db=first.db) as served:
        by_server = _readers(spec, tmp_path / "server-cert.json", ["--server", served.grpc_address])
        assert served.stop() == 0
    assert by_file == by_server == dict.fromkeys(by_file, stored), (by_file, by_server, stored)
