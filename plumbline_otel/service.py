"""`plumbline serve`: the writer, the two OTLP transports, the plumbline API, the console and the standing
check wired together in this one place, with an orderly shutdown.

Start order: the writer opens the store first (a locked or unreadable file fails here, before any
port is bound) and assembles whatever a crash left pending, so health reports SERVING only when
every stored span is in a trajectory; then gRPC (OTLP, health, plumbline's API) and HTTP. Stop
order on SIGTERM: both transports stop accepting and finish the requests in flight (those wait for
their commits), then the writer commits whatever is still queued, assembles for at most the grace
period again, logs how many traces it left pending (the next start takes them up), and closes.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from plumbline_otel.api.servicer import PlumblineServicer, add_to_server
from plumbline_otel.config import ServeConfig
from plumbline_otel.content import ContentFilter
from plumbline_otel.errors import ConfigError
from plumbline_otel.lake import LakeSync
from plumbline_otel.pipeline import ShardSettings, default_workers
from plumbline_otel.receive import (
    Deadlines,
    GrpcLimits,
    GrpcReceiver,
    HttpServer,
    Intake,
    MemoryBudget,
    Metrics,
    StandingCheck,
    WriteQueue,
    make_ssl_context,
)
from plumbline_otel.report.console import Console
from plumbline_otel.spec import load_spec
from plumbline_otel.store import Store

log = logging.getLogger("plumbline.receive")

_COUNTERS = ("plumbline_spans_received_total", "plumbline_spans_stored_total", "plumbline_spans_duplicate_total",
             "plumbline_spans_rejected_total", "plumbline_spans_accepted_total", "plumbline_spans_committed_total", "plumbline_spans_pushed_back_total",
             "plumbline_log_records_received_total", "plumbline_log_records_stored_total")


def split_endpoint(endpoint: str, key: str) -> tuple[str, int]:
    """`host:port` or `[v6]:port` into its parts; `ConfigError` naming `key` otherwise."""
    host, sep, port = endpoint.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"{key}: expected HOST:PORT, got {endpoint!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


class Server:
    """A running `plumbline serve`; `run()` serves until SIGTERM/SIGINT, `start()`/`stop()` for tests."""

    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.metrics = Metrics()
        for name in _COUNTERS:
            self.metrics.inc(name, 0)
        content = ContentFilter(config.content)
        settings = ShardSettings(content=config.content if content else None)  # task keys: the store's, once open
        self.workers = config.workers if config.workers is not None else default_workers()
        budget = MemoryBudget(config.queue_max_bytes, config.queue_max_bytes_per_address)
        self.metrics.gauge("plumbline_memory_budget_address_refusals", lambda: budget.refused_owner)  # requests past their address's share
        self.queue = WriteQueue(self._open_store, self.metrics, max_spans=config.queue_max_spans, max_bytes=config.queue_max_bytes,
                                settings=settings, workers=self.workers, batch_max_spans=config.batch_max_spans,
                                assemble_interval=config.assemble_interval_seconds, assemble_max_delay=config.assemble_max_delay_seconds,
                                budget=budget)
        self.intake = Intake(self.queue, self.metrics, content, commit_timeout=config.commit_timeout_seconds)
        self.deadlines = Deadlines()  # slow peers' deadlines on both transports
        self.standing = self._standing_check()
        self.lake = LakeSync.from_env(self.queue, config.db_path)  # PLUMBLINE_LAKE: commit to the shared lake (lake.py)
        self.grpc: GrpcReceiver | None = None
        self.http: HttpServer | None = None
        self._http_thread: threading.Thread | None = None
        self._stop_requested = threading.Event()
        self._stopped = False
        self.status = "STARTING"

    def _standing_check(self) -> StandingCheck | None:
        """The configured standing check (its spec is read now, so a bad spec fails before anything starts)."""
        if not self.config.check_spec:
            return None
        return StandingCheck(self.queue, load_spec(self.config.check_spec), self.config.check_interval_seconds, self.metrics,
                             emit_url=self.config.emit_endpoint)

    def _open_store(self) -> Store:
        store = Store(self.config.db_path)
        store.set_memory_limit(self.config.db_memory_limit_mib)
        # DuckDB's allocator purges what it freed only from its own background threads: without them a
        # burst's ~200 MiB stayed in the process for good (`memory.py`).
        store.connection.execute("SET allocator_background_threads = true")
        store.leave_cores_to(self.workers)  # the console's queries share that core
        if self.config.task_keys:
            store.set_task_keys(self.config.task_keys)
        return store

    def _start_grpc(self) -> None:
        cfg = self.config
        api = PlumblineServicer(self.queue, self.metrics, cfg.db_path, lambda: self.status if self.queue.store_problem is None else "STORE_UNUSABLE")
        try:
            limits = GrpcLimits(max_exports=cfg.grpc_max_concurrent_streams, message_timeout=cfg.grpc_message_timeout_seconds,
                                keepalive_time=cfg.grpc_keepalive_time_seconds, keepalive_timeout=cfg.grpc_keepalive_timeout_seconds,
                                max_connection_idle=cfg.grpc_max_connection_idle_seconds, max_connection_age=cfg.grpc_max_connection_age_seconds,
                                max_connection_age_grace=cfg.grpc_max_connection_age_grace_seconds)
            self.grpc = GrpcReceiver(self.intake, cfg.grpc_endpoint, max_recv_bytes=cfg.grpc_max_recv_bytes,
                                     max_concurrent=cfg.grpc_max_concurrent_streams, retry_after=cfg.retry_after_seconds,
                                     token=cfg.auth_token, tls_cert_file=cfg.tls_cert_file, tls_key_file=cfg.tls_key_file,
                                     extra=lambda server: add_to_server(api, server), limits=limits, deadlines=self.deadlines,
                                     budget=self.queue.budget)
        except RuntimeError as exc:
            raise ConfigError(f"receivers.otlp.protocols.grpc.endpoint: cannot listen on {cfg.grpc_endpoint}: {exc}") from None
        self.grpc.start()
        grpc_server = self.grpc
        self.metrics.gauge("plumbline_grpc_calls_evicted", lambda: grpc_server.gate.evicted)  # idle calls cancelled for new ones
        self.queue.on_store_state.append(lambda problem: grpc_server.set_serving(problem is None))

    def _console(self) -> Console:
        """The console, reading through its own cursor of the store: pages never wait on ingest, nor it on them.
        "Replay from here" gives each step's command; starting it (`replay.branch.ConsoleReplay`) is on only when
        the operator set PLUMBLINE_CONSOLE_REPLAY_ADAPTER and serve has a token."""
        cursor = self.queue.call(lambda store: store.connection.cursor())
        from plumbline_otel.replay.branch import ConsoleReplay
        from plumbline_otel.replay.tape import replay_from_here

        launcher, note = ConsoleReplay.from_env(os.environ, self.config.db_path, bool(self.config.auth_token), ingest=self._take_spans)
        return Console(cursor, self.config.db_path, self.config.console_certificate, api=self.config.grpc_endpoint or None,
                       token=bool(self.config.auth_token), check_spec=self.config.check_spec, branch_view=replay_from_here,
                       replay=launcher, replay_note=note)

    def _take_spans(self, path: Path) -> str:
        """A console replay's spans (its OTLP JSON-lines file) into this server's store, through the same intake as an
        export, so its runs and records show beside the run it started from; what happened, in words."""
        stored = refused = 0
        with path.open("rb") as lines:
            for line in lines:
                if line.strip():
                    outcome = self.intake.traces(line, "application/json", "", "console-replay", self.config.http_max_body_bytes)
                    stored, refused = (stored + 1, refused) if outcome.status in ("ok", "partial") else (stored, refused + 1)
        return f"{stored} export request(s) of its spans taken into the store" + (f", {refused} refused" if refused else "")

    def _render_metrics(self) -> str:
        """/metrics: the receiver's own, then the lake sync's (`LakeSync.render_metrics`) when PLUMBLINE_LAKE is set."""
        text = self.metrics.render()
        return text + self.lake.render_metrics() if self.lake is not None else text

    def _start_http(self) -> None:
        cfg = self.config
        host, port = split_endpoint(cfg.http_endpoint, "receivers.otlp.protocols.http.endpoint")
        context = make_ssl_context(cfg.tls_cert_file, cfg.tls_key_file) if cfg.tls_cert_file and cfg.tls_key_file else None
        try:
            self.http = HttpServer(host, port, self.intake, max_body_bytes=cfg.http_max_body_bytes, max_connections=cfg.http_max_connections,
                                   retry_after=cfg.retry_after_seconds, render_metrics=self._render_metrics, token=cfg.auth_token,
                                   ssl_context=context, console=self._console(), budget=self.queue.budget, deadlines=self.deadlines,
                                   max_per_address=cfg.http_max_connections_per_address, idle_timeout=cfg.http_idle_timeout_seconds,
                                   header_timeout=cfg.http_read_header_timeout_seconds, body_timeout=cfg.http_read_timeout_seconds,
                                   body_min_rate=cfg.http_min_body_rate, rate_window=cfg.http_body_rate_window_seconds,
                                   max_head_bytes=cfg.http_max_head_bytes)
        except OSError as exc:
            raise ConfigError(f"receivers.otlp.protocols.http.endpoint: cannot listen on {cfg.http_endpoint}: {exc.strerror}") from None
        self._http_thread = threading.Thread(target=self.http.serve_forever, name="plumbline-http", daemon=True)
        self._http_thread.start()

    def start(self) -> None:
        """Open the store, then listen; raises `StoreError`/`ConfigError` (nothing left running)."""
        self.queue.start()
        try:
            if self.config.grpc_endpoint:
                self._start_grpc()
            if self.config.http_endpoint:
                self._start_http()
        except BaseException:
            self.stop()
            raise
        if self.standing is not None:
            self.standing.start()
        if self.lake is not None:
            self.lake.start()
        self.status = "SERVING"

    def describe(self) -> str:
        """One line saying where the server listens, for the log."""
        scheme = "https" if self.config.tls else "http"
        parts = []
        if self.grpc:
            parts.append(f"OTLP/gRPC and plumbline API on {self.config.grpc_endpoint}{' (TLS)' if self.config.tls else ''}")
        if self.http:
            parts.append(f"OTLP/HTTP on {scheme}://{self.config.http_endpoint}")
        auth = ", bearer token required" if self.config.auth_token else ""
        if self.config.check_spec:
            emit = f", violations sent to {self.config.emit_endpoint}" if self.config.emit_endpoint else ""
            auth += f"; standing check of {self.config.check_spec} every {self.config.check_interval_seconds:g} s{emit}"
        return f"plumbline serve: {'; '.join(parts) or 'no transport enabled'}; store {self.config.db_path}{auth}"

    def request_stop(self, *_: Any) -> None:
        """Ask `run()` to shut down (signal-handler safe)."""
        self._stop_requested.set()

    def stop(self) -> None:
        """Stop accepting, finish requests in flight, commit and assemble what was accepted, close."""
        if self._stopped:
            return
        self._stopped = True
        self.status = "DRAINING"
        grace = self.config.shutdown_grace_seconds
        stoppers = []
        if self.http is not None:
            stoppers.append(threading.Thread(target=self.http.drain, args=(grace,)))
        if self.grpc is not None:
            stoppers.append(threading.Thread(target=self.grpc.stop, args=(grace,)))
        for thread in stoppers:
            thread.start()
        for thread in stoppers:
            thread.join()
        if self.standing is not None:
            self.standing.stop()
        if self.http is not None and self.http.console is not None:
            self.http.console.close()
        if self.lake is not None:
            self.lake.stop()  # a last sync, while the store is open
        self.queue.close(assemble_budget=grace)
        self.status = "STOPPED"

    def run(self) -> None:
        """Serve until SIGTERM or SIGINT, then stop cleanly."""
        previous = {sig: signal.signal(sig, self.request_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.start()
            if self.queue.recovered:
                print(f"plumbline serve: assembled {self.queue.recovered} traces an earlier stop left pending",
                      file=sys.stderr, flush=True)
            print(self.describe(), file=sys.stderr, flush=True)
            while not self._stop_requested.wait(1.0):
                pass
            print("plumbline serve: shutting down (draining accepted requests)", file=sys.stderr, flush=True)
        finally:
            self.stop()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        print("plumbline serve: stopped", file=sys.stderr, flush=True)


__all__ = ["Server", "split_endpoint"]
