"""Service configuration: a YAML file shaped like an OpenTelemetry Collector's, every key also a flag.

    receivers:
      otlp:
        protocols:
          grpc: {endpoint: 127.0.0.1:4317, max_recv_msg_size_mib: 64}
          http: {endpoint: 127.0.0.1:4318, max_request_body_size_mib: 64}
    storage: {path: plumbline.duckdb, task_keys: [session.id], memory_limit_mib: 256}
    queue: {max_spans: 8192, max_bytes_mib: 256, max_bytes_per_address_share: 0.5, batch_max_spans: 8192, retry_after_seconds: 1}
    assemble: {interval_seconds: 1, max_delay_seconds: 2}
    pipeline: {workers: 2}           # shard worker processes; default: one per core, 0 = in-process
    auth: {bearer_token_file: /run/secrets/plumbline-token}
    tls: {cert_file: server.pem, key_file: server-key.pem}
    content: {drop: ["gen_ai.input.messages"], hash: ["gen_ai.tool.call.arguments"]}
    check: {spec: configs/accounts_payable.invariants.yaml, interval_seconds: 5}
    emit: {endpoint: grpc://collector:4317}   # violations the standing check finds, as OTel events

`load_config(path, overrides)` reads the file (or nothing), applies flag overrides given as the
same dotted keys (`receivers.otlp.protocols.grpc.endpoint`), and validates the result into a
frozen `ServeConfig`. A wrong key or a wrong type raises `ConfigError` naming the key.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from plumbline_otel.errors import ConfigError

TOKEN_ENV = "PLUMBLINE_AUTH_TOKEN"
_MIB = 1 << 20

# The schema: nested mappings of key -> (type, default). A type of dict means a section.
_SCHEMA: dict[str, Any] = {
    "receivers": {
        "otlp": {
            "protocols": {
                "grpc": {"endpoint": (str, "127.0.0.1:4317"), "max_recv_msg_size_mib": (int, 64), "max_concurrent_streams": (int, 128),
                         "message_timeout_seconds": (float, 30.0), "keepalive_time_seconds": (float, 60.0),
                         "keepalive_timeout_seconds": (float, 20.0), "max_connection_idle_seconds": (float, 300.0),
                         "max_connection_age_seconds": (float, 0.0), "max_connection_age_grace_seconds": (float, 30.0)},
                "http": {"endpoint": (str, "127.0.0.1:4318"), "max_request_body_size_mib": (int, 64), "max_connections": (int, 256),
                         "max_connections_per_address": (int, 64), "idle_timeout_seconds": (float, 60.0),
                         "read_header_timeout_seconds": (float, 10.0), "read_timeout_seconds": (float, 30.0),
                         "min_body_rate_bytes_per_second": (int, 1024), "body_rate_window_seconds": (float, 5.0),
                         "max_request_head_kib": (int, 64)},
            },
        },
    },
    "storage": {"path": (str, "plumbline.duckdb"), "task_keys": (list, None), "memory_limit_mib": (int, 256)},
    "queue": {"max_spans": (int, 8192), "max_bytes_mib": (int, 256), "max_bytes_per_address_share": (float, 0.5),
              "batch_max_spans": (int, 8192), "retry_after_seconds": (float, 1.0), "commit_timeout_seconds": (float, 30.0)},
    "assemble": {"interval_seconds": (float, 1.0), "max_delay_seconds": (float, 2.0)},
    "pipeline": {"workers": (int, None)},
    "auth": {"bearer_token": (str, None), "bearer_token_file": (str, None)},
    "tls": {"cert_file": (str, None), "key_file": (str, None)},
    "content": {"drop": (list, None), "hash": (list, None), "hash_salt": (str, "")},
    "shutdown": {"grace_seconds": (float, 10.0)},
    "check": {"spec": (str, None), "interval_seconds": (float, 5.0)},
    "emit": {"endpoint": (str, None)},
    "console": {"certificate": (str, None)},
}


@dataclass(frozen=True)
class ContentRules:
    """Attribute-key patterns (fnmatch globs) whose values are dropped or hashed before storage."""

    drop: tuple[str, ...] = ()
    hash: tuple[str, ...] = ()
    hash_salt: str = ""

    def __bool__(self) -> bool:
        return bool(self.drop or self.hash)


@dataclass(frozen=True)
class ServeConfig:
    """Everything `plumbline serve` needs; an empty endpoint turns that transport off."""

    grpc_endpoint: str = "127.0.0.1:4317"
    http_endpoint: str = "127.0.0.1:4318"
    grpc_max_recv_bytes: int = 64 * _MIB
    grpc_max_concurrent_streams: int = 128
    grpc_message_timeout_seconds: float = 30.0
    grpc_keepalive_time_seconds: float = 60.0
    grpc_keepalive_timeout_seconds: float = 20.0
    grpc_max_connection_idle_seconds: float = 300.0
    grpc_max_connection_age_seconds: float = 0.0  # 0: no age limit
    grpc_max_connection_age_grace_seconds: float = 30.0
    http_max_body_bytes: int = 64 * _MIB
    http_max_connections: int = 256
    http_max_connections_per_address: int = 64
    http_idle_timeout_seconds: float = 60.0
    http_read_header_timeout_seconds: float = 10.0
    http_read_timeout_seconds: float = 30.0
    http_min_body_rate: int = 1024  # bytes a second a body must keep arriving at, over the window (0: no floor)
    http_body_rate_window_seconds: float = 5.0
    http_max_head_bytes: int = 64 << 10  # request line and headers together
    db_path: str = "plumbline.duckdb"
    task_keys: tuple[str, ...] | None = None
    db_memory_limit_mib: int = 256  # as a file ingest's writer (store.WRITER_MEMORY_LIMIT_MIB)
    queue_max_spans: int = 8192
    queue_max_bytes: int = 256 * _MIB  # the memory budget: request bytes being read, decoded or queued, both transports
    queue_max_bytes_per_address: int = 128 * _MIB  # of which requests being read from one client address may hold this much
    batch_max_spans: int = 8192
    retry_after_seconds: float = 1.0
    commit_timeout_seconds: float = 30.0  # a request waits this, plus its share of the queue, and on while the pipeline moves (receive/_intake.py)
    assemble_interval_seconds: float = 1.0
    assemble_max_delay_seconds: float = 2.0
    workers: int | None = None  # shard worker processes (None: one per core; 0: in the server's process)
    auth_token: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    content: ContentRules = field(default_factory=ContentRules)
    shutdown_grace_seconds: float = 10.0
    check_spec: str | None = None
    check_interval_seconds: float = 5.0
    emit_endpoint: str | None = None
    console_certificate: str | None = None  # certificate JSON the console shows (re-read per page)

    @property
    def tls(self) -> bool:
        """Both transports use TLS when a certificate and key are configured."""
        return bool(self.tls_cert_file)


def _check(value: Any, kind: type, key: str) -> Any:
    if value is None:
        return None
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind is list:
        if isinstance(value, str):
            return [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{key}: expected a list of strings, got {value!r}")
        return value
    if kind is str and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise ConfigError(f"{key}: expected {kind.__name__}, got {type(value).__name__} {value!r}")
    return value


def _flatten(doc: Any, schema: dict[str, Any], prefix: str, out: dict[str, Any]) -> None:
    if doc is None:
        return
    if not isinstance(doc, Mapping):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: expected a mapping, got {type(doc).__name__}")
    for key, value in doc.items():
        path = f"{prefix}{key}"
        spec = schema.get(key) if isinstance(key, str) else None
        if spec is None:
            known = ", ".join(sorted(schema))
            raise ConfigError(f"{path}: unknown key (expected one of: {known})")
        if isinstance(spec, dict):
            _flatten(value, spec, path + ".", out)
        else:
            out[path] = _check(value, spec[0], path)


def _defaults(schema: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, spec in schema.items():
        if isinstance(spec, dict):
            out.update(_defaults(spec, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = spec[1]
    return out


def _read(path: str | Path) -> Any:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config file: {exc.strerror}") from None
    try:
        return yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None


def _token(values: dict[str, Any]) -> str | None:
    token = values["auth.bearer_token"] or os.environ.get(TOKEN_ENV) or None
    path = values["auth.bearer_token_file"]
    if not token and path:
        try:
            token = Path(path).read_text().strip()
        except OSError as exc:
            raise ConfigError(f"auth.bearer_token_file: cannot read {path}: {exc.strerror}") from None
        if not token:
            raise ConfigError(f"auth.bearer_token_file: {path} is empty")
    return token


def _not_negative(values: dict[str, Any], *keys: str) -> None:
    for key in keys:
        if values[key] is not None and values[key] < 0:
            raise ConfigError(f"{key}: must be 0 or more, got {values[key]}")


def _positive(values: dict[str, Any], *keys: str) -> None:
    for key in keys:
        if values[key] is not None and values[key] <= 0:
            raise ConfigError(f"{key}: must be greater than 0, got {values[key]}")


def _build(values: dict[str, Any]) -> ServeConfig:
    _positive(values, "receivers.otlp.protocols.grpc.max_recv_msg_size_mib", "receivers.otlp.protocols.http.max_request_body_size_mib",
              "queue.max_spans", "queue.max_bytes_mib", "queue.batch_max_spans", "queue.commit_timeout_seconds", "assemble.interval_seconds",
              "storage.memory_limit_mib", "check.interval_seconds", "receivers.otlp.protocols.grpc.max_concurrent_streams",
              "receivers.otlp.protocols.http.max_connections", "receivers.otlp.protocols.http.max_connections_per_address",
              "receivers.otlp.protocols.http.idle_timeout_seconds", "receivers.otlp.protocols.http.read_header_timeout_seconds",
              "receivers.otlp.protocols.http.read_timeout_seconds")
    _positive(values, "receivers.otlp.protocols.http.body_rate_window_seconds", "receivers.otlp.protocols.http.max_request_head_kib")
    share = values["queue.max_bytes_per_address_share"]
    if share is None or not 0 < share <= 1:
        raise ConfigError(f"queue.max_bytes_per_address_share: the share of queue.max_bytes_mib one client address may hold "
                          f"while its requests are read, more than 0 and at most 1 (1: no per-address share), got {share}")
    _not_negative(values, "pipeline.workers", "receivers.otlp.protocols.http.min_body_rate_bytes_per_second",
                  "receivers.otlp.protocols.grpc.message_timeout_seconds",
                  "receivers.otlp.protocols.grpc.keepalive_time_seconds", "receivers.otlp.protocols.grpc.keepalive_timeout_seconds",
                  "receivers.otlp.protocols.grpc.max_connection_idle_seconds", "receivers.otlp.protocols.grpc.max_connection_age_seconds",
                  "receivers.otlp.protocols.grpc.max_connection_age_grace_seconds")
    if values["emit.endpoint"] and not values["check.spec"]:
        raise ConfigError("emit.endpoint: sends what the standing check finds, so it needs check.spec")
    cert, key = values["tls.cert_file"], values["tls.key_file"]
    if bool(cert) != bool(key):
        raise ConfigError(f"tls.{'key_file' if cert else 'cert_file'}: TLS needs both tls.cert_file and tls.key_file")
    for name, path in (("tls.cert_file", cert), ("tls.key_file", key)):
        if path and not Path(path).is_file():
            raise ConfigError(f"{name}: no such file {path}")
    grpc, http = "receivers.otlp.protocols.grpc.", "receivers.otlp.protocols.http."
    return ServeConfig(
        grpc_endpoint=values[grpc + "endpoint"] or "",
        http_endpoint=values[http + "endpoint"] or "",
        grpc_max_recv_bytes=values[grpc + "max_recv_msg_size_mib"] * _MIB,
        grpc_max_concurrent_streams=values[grpc + "max_concurrent_streams"],
        grpc_message_timeout_seconds=values[grpc + "message_timeout_seconds"],
        grpc_keepalive_time_seconds=values[grpc + "keepalive_time_seconds"],
        grpc_keepalive_timeout_seconds=values[grpc + "keepalive_timeout_seconds"],
        grpc_max_connection_idle_seconds=values[grpc + "max_connection_idle_seconds"],
        grpc_max_connection_age_seconds=values[grpc + "max_connection_age_seconds"],
        grpc_max_connection_age_grace_seconds=values[grpc + "max_connection_age_grace_seconds"],
        http_max_body_bytes=values[http + "max_request_body_size_mib"] * _MIB,
        http_max_connections=values[http + "max_connections"],
        http_max_connections_per_address=values[http + "max_connections_per_address"],
        http_idle_timeout_seconds=values[http + "idle_timeout_seconds"],
        http_read_header_timeout_seconds=values[http + "read_header_timeout_seconds"],
        http_read_timeout_seconds=values[http + "read_timeout_seconds"],
        http_min_body_rate=values[http + "min_body_rate_bytes_per_second"],
        http_body_rate_window_seconds=values[http + "body_rate_window_seconds"],
        http_max_head_bytes=values[http + "max_request_head_kib"] << 10,
        db_path=values["storage.path"],
        task_keys=tuple(values["storage.task_keys"]) if values["storage.task_keys"] else None,
        db_memory_limit_mib=values["storage.memory_limit_mib"],
        queue_max_spans=values["queue.max_spans"],
        queue_max_bytes=values["queue.max_bytes_mib"] * _MIB,
        queue_max_bytes_per_address=int(share * values["queue.max_bytes_mib"] * _MIB),
        batch_max_spans=values["queue.batch_max_spans"],
        retry_after_seconds=values["queue.retry_after_seconds"],
        commit_timeout_seconds=values["queue.commit_timeout_seconds"],
        assemble_interval_seconds=values["assemble.interval_seconds"],
        assemble_max_delay_seconds=values["assemble.max_delay_seconds"],
        workers=values["pipeline.workers"],
        auth_token=_token(values),
        tls_cert_file=cert,
        tls_key_file=key,
        content=ContentRules(tuple(values["content.drop"] or ()), tuple(values["content.hash"] or ()), values["content.hash_salt"] or ""),
        shutdown_grace_seconds=values["shutdown.grace_seconds"],
        check_spec=values["check.spec"],
        check_interval_seconds=values["check.interval_seconds"],
        emit_endpoint=values["emit.endpoint"],
        console_certificate=values["console.certificate"],
    )


def load_config(path: str | Path | None = None, overrides: Mapping[str, Any] | None = None) -> ServeConfig:
    """The file at `path` (if any), then `overrides` (dotted keys, None means "not given"), validated."""
    values = _defaults(_SCHEMA)
    if path is not None:
        file_values: dict[str, Any] = {}
        _flatten(_read(path), _SCHEMA, "", file_values)
        values.update(file_values)
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        if key not in values:
            raise ConfigError(f"{key}: unknown key")
        spec: Any = _SCHEMA
        for part in key.split("."):
            spec = spec[part]
        values[key] = _check(value, spec[0], key)
    return _build(values)


def config_keys() -> list[str]:
    """Every dotted key the config file accepts, for docs and error messages."""
    return sorted(_defaults(_SCHEMA))


__all__ = ["ContentRules", "ServeConfig", "TOKEN_ENV", "config_keys", "load_config"]
