"""`plumbline serve`: receive OTLP traces and logs over gRPC and HTTP into the store."""

from __future__ import annotations

import logging
from typing import Any

import click

from plumbline_otel.config import TOKEN_ENV, load_config
from plumbline_otel.errors import PlumblineError
from plumbline_otel.pipeline import collect_less_often
from plumbline_otel.service import Server, split_endpoint

_GRPC = "receivers.otlp.protocols.grpc."
_HTTP = "receivers.otlp.protocols.http."


def _endpoint(configured: str, host: str | None, port: int | None) -> str | None:
    """The endpoint after --host/--port; None when neither flag changes it, "" when port 0 turns it off."""
    if port == 0:
        return ""
    if (host is None and port is None) or (port is None and not configured):
        return None
    configured_host, configured_port = split_endpoint(configured, "endpoint") if configured else ("127.0.0.1", 0)
    host = host or configured_host
    port = port if port is not None else configured_port
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _overrides(opts: dict[str, Any], config_path: str | None) -> dict[str, Any]:
    """Flags as dotted config keys (None where a flag was not given, so the file's value stands)."""
    base = load_config(config_path)
    return {
        _GRPC + "endpoint": _endpoint(base.grpc_endpoint, opts["host"], opts["grpc_port"]),
        _HTTP + "endpoint": _endpoint(base.http_endpoint, opts["host"], opts["http_port"]),
        _GRPC + "max_recv_msg_size_mib": opts["max_recv_msg_size_mib"],
        _HTTP + "max_request_body_size_mib": opts["max_request_body_size_mib"],
        "storage.path": opts["db"],
        "storage.task_keys": list(opts["task_key"]) or None,
        "storage.memory_limit_mib": opts["db_memory_limit_mib"],
        "queue.max_spans": opts["queue_max_spans"],
        "queue.max_bytes_mib": opts["queue_max_bytes_mib"],
        "queue.max_bytes_per_address_share": opts["max_bytes_per_address_share"],
        "queue.batch_max_spans": opts["batch_max_spans"],
        "queue.retry_after_seconds": opts["retry_after"],
        "queue.commit_timeout_seconds": opts["commit_timeout"],
        "assemble.interval_seconds": opts["assemble_interval"],
        "assemble.max_delay_seconds": opts["assemble_max_delay"],
        "pipeline.workers": opts["workers"],
        _GRPC + "max_concurrent_streams": opts["max_concurrent_streams"],
        _GRPC + "message_timeout_seconds": opts["grpc_message_timeout"],
        _GRPC + "keepalive_time_seconds": opts["grpc_keepalive_time"],
        _GRPC + "keepalive_timeout_seconds": opts["grpc_keepalive_timeout"],
        _GRPC + "max_connection_idle_seconds": opts["grpc_max_connection_idle"],
        _GRPC + "max_connection_age_seconds": opts["grpc_max_connection_age"],
        _GRPC + "max_connection_age_grace_seconds": opts["grpc_max_connection_age_grace"],
        _HTTP + "max_connections": opts["max_connections"],
        _HTTP + "max_connections_per_address": opts["max_connections_per_address"],
        _HTTP + "idle_timeout_seconds": opts["http_idle_timeout"],
        _HTTP + "read_header_timeout_seconds": opts["http_read_header_timeout"],
        _HTTP + "read_timeout_seconds": opts["http_read_timeout"],
        _HTTP + "min_body_rate_bytes_per_second": opts["http_min_body_rate"],
        _HTTP + "body_rate_window_seconds": opts["http_body_rate_window"],
        _HTTP + "max_request_head_kib": opts["max_request_head_kib"],
        "shutdown.grace_seconds": opts["shutdown_grace"],
        "content.hash_salt": opts["hash_salt"],
        "auth.bearer_token": opts["auth_token"],
        "auth.bearer_token_file": opts["auth_token_file"],
        "tls.cert_file": opts["tls_cert"],
        "tls.key_file": opts["tls_key"],
        "console.certificate": opts["console_cert"],
        "content.drop": list(opts["drop_content"]) or None,
        "content.hash": list(opts["hash_content"]) or None,
        "check.spec": opts["check_spec"],
        "check.interval_seconds": opts["check_interval"],
        "emit.endpoint": opts["emit"],
    }


@click.command()
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="YAML config (see configs/plumbline.yaml).")
@click.option("--db", help="DuckDB file to write [storage.path; default plumbline.duckdb].")
@click.option("--db-memory-limit-mib", type=int, help="DuckDB's memory limit [storage.memory_limit_mib; default 256].")
@click.option("--host", help="Address both transports bind [default 127.0.0.1; binding elsewhere must be explicit].")
@click.option("--grpc-port", type=int, help="OTLP/gRPC port, also plumbline's API [default 4317; 0 turns gRPC off].")
@click.option("--http-port", type=int, help="OTLP/HTTP port [default 4318; 0 turns HTTP off].")
@click.option("--max-recv-msg-size-mib", type=int, help="Largest gRPC message accepted [default 64].")
@click.option("--max-request-body-size-mib", type=int, help="Largest HTTP body after decompression [default 64].")
@click.option("--queue-max-spans", type=int, help="Spans waiting to be committed before pushback [default 8192].")
@click.option("--queue-max-bytes-mib", type=int, help="Memory budget: request bytes being read, decoded or waiting to be committed, both transports, before pushback [default 256].")
@click.option("--max-bytes-per-address-share", type=float,
              help="Share of the memory budget requests being read from one client address may hold, 0-1 [default 0.5; 1: no share].")
@click.option("--batch-max-spans", type=int, help="Most spans committed in one transaction [default 8192].")
@click.option("--retry-after", type=float, help="Seconds clients are told to wait when pushed back [default 1].")
@click.option("--commit-timeout", type=float, help="Seconds a request waits for its commit, plus its share of the queue, and on while the pipeline moves [queue.commit_timeout_seconds; default 30].")
@click.option("--assemble-interval", type=float, help="Idle seconds before trajectories are rebuilt [default 1].")
@click.option("--assemble-max-delay", type=float, help="Longest a write waits for assembly under sustained load [default 2].")
@click.option("--workers", type=int, help="Shard worker processes for decoding and normalising [pipeline.workers; default one per core; 0 in-process].")
@click.option("--max-concurrent-streams", type=int, help="gRPC export calls in flight before RESOURCE_EXHAUSTED [default 128].")
@click.option("--grpc-message-timeout", type=float, help="Seconds a gRPC call has to send its whole request message [default 30; 0 off].")
@click.option("--grpc-keepalive-time", type=float, help="Seconds of quiet before the server pings a gRPC connection [default 60; 0 off].")
@click.option("--grpc-keepalive-timeout", type=float, help="Seconds a keep-alive ping may go unanswered before the connection closes [default 20].")
@click.option("--grpc-max-connection-idle", type=float, help="Seconds a gRPC connection may stay without calls [default 300; 0 off].")
@click.option("--grpc-max-connection-age", type=float, help="Seconds before a gRPC connection is asked to reconnect [default 0: off].")
@click.option("--grpc-max-connection-age-grace", type=float, help="Seconds calls may finish after that [default 30].")
@click.option("--max-connections", type=int, help="HTTP connections holding a thread; past it the slowest waiting one makes room [default 256].")
@click.option("--max-connections-per-address", type=int, help="HTTP connections from one client address [default 64].")
@click.option("--http-idle-timeout", type=float, help="Seconds an HTTP connection may wait between requests [default 60].")
@click.option("--http-read-header-timeout", type=float, help="Seconds to send a request's line and headers (and the TLS handshake) [default 10].")
@click.option("--http-read-timeout", type=float, help="Seconds to send a request body [default 30].")
@click.option("--http-min-body-rate", type=int, help="Bytes a second a body must keep arriving at, else 408 [default 1024; 0: no floor].")
@click.option("--http-body-rate-window", type=float, help="Seconds that rate is measured over [default 5].")
@click.option("--max-request-head-kib", type=int, help="Largest HTTP request line and headers together [default 64].")
@click.option("--shutdown-grace", type=float, help="Seconds SIGTERM allows requests in flight [default 10].")
@click.option("--auth-token", envvar=TOKEN_ENV, help=f"Bearer token required on both transports [env {TOKEN_ENV}].")
@click.option("--auth-token-file", type=click.Path(dir_okay=False), help="File holding the bearer token.")
@click.option("--tls-cert", type=click.Path(dir_okay=False), help="PEM certificate; with --tls-key, both transports use TLS.")
@click.option("--tls-key", type=click.Path(dir_okay=False), help="PEM private key.")
@click.option("--task-key", multiple=True,
              help="Attribute naming a run's task: a span's or the resource's attribute, resource.NAME, or ATTR.FIELD inside a JSON "
                   "attribute (repeatable; docs/conventions.md) [storage.task_keys].")
@click.option("--drop-content", multiple=True, metavar="PATTERN", help="Attribute-key glob whose values are replaced by __REDACTED__ (repeatable).")
@click.option("--hash-content", multiple=True, metavar="PATTERN", help="Attribute-key glob whose values are stored as sha256 hashes (repeatable).")
@click.option("--hash-salt", help="Salt mixed into --hash-content hashes [content.hash_salt].")
@click.option("--check-spec", type=click.Path(dir_okay=False), help="Judge newly assembled runs against this spec [check.spec].")
@click.option("--check-interval", type=float, help="Seconds between standing-check passes [check.interval_seconds; default 5].")
@click.option("--emit", metavar="URL", help="Send the standing check's violations as gen_ai.evaluation.result events [emit.endpoint].")
@click.option("--console-cert", type=click.Path(dir_okay=False), help="Certificate JSON the console at / shows [console.certificate].")
@click.option("--log-level", default="WARNING", show_default=True, type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]))
def serve(config_path: str | None, log_level: str, **opts: Any) -> None:
    """Receive OTLP traces (and GenAI log events) from collectors and SDK exporters into the store.

    Listens on 127.0.0.1 unless --host or the config says otherwise. Stops on SIGTERM/SIGINT after
    committing everything it acknowledged. Other commands read a served store with --server.
    """
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = load_config(config_path, _overrides(opts, config_path))
        collect_less_often()
        Server(config).run()
    except PlumblineError as exc:
        raise click.ClickException(str(exc)) from None


if __name__ == "__main__":
    serve(prog_name="plumbline serve")  # `python -m plumbline_otel.cli.serve`, used by tests and supervisors
