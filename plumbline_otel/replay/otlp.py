"""Which OTLP protocol an endpoint speaks, and how to hand it to an agent's SDK.

A port says nothing certain: ``http://host:14318`` is as likely OTLP/HTTP as gRPC, and taking it
for gRPC by its port lost every record ("Failed parsing HTTP/2"). So the protocol is, in order:
given (``--endpoint-protocol``), said by the URL (a ``grpc://`` scheme, a path ending in
``/v1/traces``), the OTel default of the port (4317 gRPC, 4318 HTTP), or found by asking the
endpoint (an OTLP/HTTP POST first: a server that answers it in HTTP/1.1 speaks OTLP/HTTP; else a
gRPC channel that becomes ready speaks gRPC). One that answers neither is refused with what to say.

The agent's SDK then gets the variables it reads in the form it expects:
``OTEL_EXPORTER_OTLP_ENDPOINT`` is a base URL to which OTLP/HTTP exporters append ``/v1/traces``
(so it never carries that path), ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` the full URL (used as
is), and ``OTEL_EXPORTER_OTLP_PROTOCOL`` / ``..._TRACES_PROTOCOL`` the protocol.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

from plumbline_otel.errors import ConfigError

Protocol = Literal["grpc", "http/protobuf"]
PROTOCOLS: tuple[Protocol, ...] = ("grpc", "http/protobuf")
TRACES_PATH = "/v1/traces"

_KNOWN: dict[str, OtlpTarget] = {}  # endpoint text -> what it was resolved to, so the driver and every agent agree
_KNOWN_LOCK = threading.Lock()


@dataclass(frozen=True)
class OtlpTarget:
    """An endpoint with its protocol: ``url`` is the full traces URL (OTLP/HTTP) or ``scheme://host:port`` (gRPC)."""

    protocol: Protocol
    url: str
    how: str  # how the protocol was decided: given, url, port, asked

    @property
    def secure(self) -> bool:
        return urlsplit(self.url).scheme == "https"

    @property
    def base_url(self) -> str | None:
        """What ``OTEL_EXPORTER_OTLP_ENDPOINT`` takes: the URL an SDK appends ``/v1/traces`` to (None: the path cannot be so made)."""
        if self.protocol == "grpc":
            return self.url
        return self.url[: -len(TRACES_PATH)] if self.url.endswith(TRACES_PATH) else None

    def agent_env(self) -> dict[str, str]:
        """The OTel exporter variables for an agent whose spans go here."""
        env = {"OTEL_EXPORTER_OTLP_PROTOCOL": self.protocol, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": self.protocol,
               "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": self.url}
        if self.base_url is not None:
            env["OTEL_EXPORTER_OTLP_ENDPOINT"] = self.base_url
        return env

    def exporter(self, headers: Mapping[str, str] | None = None) -> object:
        """An OTLP span exporter for this target."""
        if self.protocol == "http/protobuf":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as Http

            return Http(endpoint=self.url, headers=dict(headers or {}))
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as Grpc

        return Grpc(endpoint=urlsplit(self.url).netloc, insecure=not self.secure, headers=dict(headers or {}))


def _normal_protocol(protocol: str) -> Protocol:
    value = protocol.strip().lower()
    if value in ("http", "http/protobuf", "otlphttp"):
        return "http/protobuf"
    if value == "grpc":
        return "grpc"
    raise ConfigError(f"OTLP protocol {protocol!r}: expected grpc or http/protobuf")


def resolve_endpoint(endpoint: str, protocol: str | None = None, *, probe_timeout_s: float = 3.0) -> OtlpTarget:
    """The protocol and URL of ``endpoint`` (see the module docstring); remembered, so it is asked once per process."""
    with _KNOWN_LOCK:
        known = _KNOWN.get(endpoint)
    if known is not None and (protocol is None or known.protocol == _normal_protocol(protocol)):
        return known
    target = _resolve(endpoint, protocol, probe_timeout_s)
    with _KNOWN_LOCK:
        _KNOWN[endpoint] = target
    return target


def _resolve(endpoint: str, protocol: str | None, probe_timeout_s: float) -> OtlpTarget:
    parts = urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https", "grpc", "grpcs"):
        raise ConfigError(f"OTLP endpoint {endpoint!r}: expected http://, https://, grpc:// or grpcs://")
    secure = scheme in ("https", "grpcs")
    web = "https" if secure else "http"
    path = parts.path.rstrip("/")
    if protocol is not None:
        chosen, how = _normal_protocol(protocol), "given"
    elif scheme.startswith("grpc"):
        chosen, how = "grpc", "url"
    elif path.endswith(TRACES_PATH):
        chosen, how = "http/protobuf", "url"
    elif parts.port in (4317, 4318) and not path:
        chosen, how = ("grpc" if parts.port == 4317 else "http/protobuf"), "port"
    else:
        chosen, how = _ask(f"{web}://{parts.netloc}", path, secure, probe_timeout_s, endpoint), "asked"
    if chosen == "grpc":
        return OtlpTarget("grpc", f"{web}://{parts.netloc}", how)
    return OtlpTarget("http/protobuf", f"{web}://{parts.netloc}{path if path.endswith(TRACES_PATH) else path + TRACES_PATH}", how)


def _ask(origin: str, path: str, secure: bool, timeout_s: float, endpoint: str) -> Protocol:
    """Ask the endpoint which protocol it speaks: an OTLP/HTTP POST first, then a gRPC channel."""
    import httpx

    try:
        with httpx.Client(timeout=timeout_s, trust_env=False, http2=False) as client:
            client.post(f"{origin}{path}{TRACES_PATH}", content=b"", headers={"content-type": "application/x-protobuf"})
        return "http/protobuf"  # any HTTP/1.1 answer, even an error status: it speaks HTTP
    except httpx.ConnectError as exc:
        raise ConfigError(f"OTLP endpoint {endpoint}: nothing answers there ({exc}); start the receiver, or check the "
                          "address") from exc
    except httpx.HTTPError:
        pass  # it spoke, but not HTTP/1.1: perhaps gRPC
    import grpc

    channel = grpc.secure_channel(origin.split("://", 1)[1], grpc.ssl_channel_credentials()) if secure else \
        grpc.insecure_channel(origin.split("://", 1)[1])
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout_s)
        return "grpc"
    except grpc.FutureTimeoutError:
        raise ConfigError(f"OTLP endpoint {endpoint}: it answers neither OTLP/HTTP nor gRPC; give --endpoint-protocol "
                          "grpc or http/protobuf (or a URL ending in /v1/traces for OTLP/HTTP)") from None
    finally:
        channel.close()
