"""What one model call through the proxy may use of the server serving it: ``ProxyServices`` (the server, seen through
a narrow protocol, so `exchange` never imports `server`), ``Responder`` (the agent's connection) and ``refuse`` (a
provider-shaped error the agent's SDK will not retry)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

from plumbline_otel.replay.proxy.wire import error_body

if TYPE_CHECKING:
    import httpx
    from opentelemetry.trace import TracerProvider

    from plumbline_otel.replay.cache import ResponseCache
    from plumbline_otel.replay.limits import MemoryBudget, ProxyLimits
    from plumbline_otel.replay.proxy.record import ConversationRecorder

HOP_BY_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding", "te", "trailer",
                        "upgrade"})


class ProxyServices(Protocol):
    """What one model call needs of the proxy serving it, and nothing more: the server passes itself as this, so `exchange`
    never imports the server, and the one thing a call changes there (a span that failed) goes through
    ``span_failed``. Called from the server's handler threads, concurrently."""

    @property
    def cache(self) -> ResponseCache | None:
        """The study's cassette (record or replay mode), or None."""
        ...

    @property
    def http(self) -> httpx.Client:
        """The pooled client to the providers."""
        ...

    @property
    def memory(self) -> MemoryBudget:
        """What all calls together may hold."""
        ...

    @property
    def limits(self) -> ProxyLimits:
        """One answer's and one span payload's limits."""
        ...

    @property
    def tracer_provider(self) -> TracerProvider | None:
        """Where the call's span goes (None: no spans)."""
        ...

    @property
    def recorder(self) -> ConversationRecorder | None:
        """Record mode: the agent conversation a call's span joins."""
        ...

    def upstream_url(self, provider: str, path: str) -> str:
        """The provider's URL for ``path``."""
        ...

    def upstream_headers(self, provider: str, headers: Mapping[str, str]) -> dict[str, str]:
        """The headers forwarded to the provider (the proxy's key unless the agent's passes)."""
        ...

    def span_failed(self) -> None:
        """Count a span that could not be written (telemetry never fails the agent's call)."""
        ...


class Responder(Protocol):
    """How the handler writes to the agent (implemented over the HTTP connection by the server).

    ``gone``: the agent hung up (or the answer was cut); ``call``: the trial's call number being
    answered, once known, so a failure inside the proxy is charged to the right call.
    """

    gone: bool
    call: int | None

    def send(self, status: int, headers: list[tuple[str, str]], payload: bytes) -> None: ...
    def send_cut(self, status: int, headers: list[tuple[str, str]], payload: bytes) -> None: ...
    def start_stream(self, status: int, headers: list[tuple[str, str]]) -> None: ...
    def write(self, data: bytes) -> None: ...
    def end_stream(self) -> None: ...
    def abort(self) -> None: ...


def refuse(out: Responder, provider: str, status: int, kind: str, message: str) -> None:
    """A provider-shaped error the agent's SDK will not retry (``x-should-retry: false``)."""
    out.send(status, [("content-type", "application/json"), ("x-should-retry", "false")], error_body(provider, status, kind, message))
