"""How much the proxies may hold: per request, per answer, in all, and per span payload.

Both proxies sit between an agent and peers plumbline does not control (a provider, a tool
server), so what they hold must not grow with what a peer sends: an endless stream, a 100 MiB
answer or a 512 MiB request body must cost a bounded amount of memory, and a value copied into a
span must stay below what ``plumbline ingest`` keeps (it drops a value past
``normalise.Limits.max_value_bytes`` whole, so a proxy span carrying a bigger one would lose it).

Limits come from the constructor, else the environment (``PLUMBLINE_PROXY_MAX_REQUEST_MIB``,
``PLUMBLINE_PROXY_MAX_RESPONSE_MIB``, ``PLUMBLINE_PROXY_MAX_HELD_MIB``,
``PLUMBLINE_PROXY_SPAN_PAYLOAD_KIB``), else the defaults below.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from plumbline_otel.errors import ConfigError
from plumbline_otel.normalise import Limits as IngestLimits

MIB = 1 << 20
KIB = 1 << 10

# The span payload cap is kept well under what ingest keeps whole, so a truncated payload is never dropped there.
INGEST_MAX_VALUE_BYTES = IngestLimits().max_value_bytes
TRUNCATED_MARKER = "…[plumbline: truncated"


def truncate_text(text: str, max_bytes: int) -> tuple[str, bool]:
    """``text`` cut to at most ``max_bytes`` UTF-8 bytes plus a marker naming the original size; (text, was it cut).

    The marker (``…[plumbline: truncated, N bytes in all, first M kept]``) says a reader has a
    prefix, not the value: a JSON payload cut so is no longer JSON and is read as plain text.
    """
    if len(text) * 4 <= max_bytes:  # no character takes more than 4 bytes: nothing to measure
        return text, False
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) <= max_bytes:
        return text, False
    kept = raw[:max_bytes].decode("utf-8", "ignore")  # never half a character
    return f"{kept}{TRUNCATED_MARKER}, {len(raw)} bytes in all, first {len(kept.encode('utf-8', 'surrogatepass'))} kept]", True


@dataclass(frozen=True)
class ProxyLimits:
    """The proxies' memory limits (bytes).

    ``max_request_bytes``: one request body (larger: 413, never read). ``max_response_bytes``: one
    answer held for metering and the cassette (a longer stream is cut there, a larger whole answer
    refused with 502). ``max_held_bytes``: request and answer bytes held by all calls at once (past
    it a call is refused with 503, which SDKs retry). ``span_payload_bytes``: one payload copied
    into a span (longer: truncated with ``TRUNCATED_MARKER``).
    """

    max_request_bytes: int = 32 * MIB
    max_response_bytes: int = 64 * MIB
    max_held_bytes: int = 512 * MIB
    span_payload_bytes: int = 256 * KIB

    def __post_init__(self) -> None:
        for name in ("max_request_bytes", "max_response_bytes", "max_held_bytes", "span_payload_bytes"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"proxy limit {name} must be positive, not {getattr(self, name)}")
        if self.span_payload_bytes >= INGEST_MAX_VALUE_BYTES:
            raise ConfigError(f"proxy span payload limit {self.span_payload_bytes} bytes: keep it under ingest's "
                              f"{INGEST_MAX_VALUE_BYTES} bytes per value, or ingest drops the whole value")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ProxyLimits:
        """The defaults, overridden by ``PLUMBLINE_PROXY_*`` variables of ``env`` (this process's environment)."""
        env = os.environ if env is None else env
        values: dict[str, int] = {}
        for field_name, var, unit in (("max_request_bytes", "PLUMBLINE_PROXY_MAX_REQUEST_MIB", MIB),
                                      ("max_response_bytes", "PLUMBLINE_PROXY_MAX_RESPONSE_MIB", MIB),
                                      ("max_held_bytes", "PLUMBLINE_PROXY_MAX_HELD_MIB", MIB),
                                      ("span_payload_bytes", "PLUMBLINE_PROXY_SPAN_PAYLOAD_KIB", KIB)):
            text = env.get(var)
            if text:
                try:
                    values[field_name] = int(float(text) * unit)
                except ValueError:
                    raise ConfigError(f"{var}={text!r}: expected a number") from None
        return cls(**values)

    def with_mib(self, request: float | None = None, response: float | None = None, held: float | None = None) -> ProxyLimits:
        """These limits with the ones given (in MiB, as the CLI takes them) replaced."""
        from dataclasses import replace

        return replace(self, **{k: int(v * MIB) for k, v in (("max_request_bytes", request), ("max_response_bytes", response),
                                                             ("max_held_bytes", held)) if v is not None})


class MemoryBudget:
    """Bytes held by every call of one proxy at once: a call takes what it holds and gives it back when done.

    ``take`` never waits: a proxy that waited for memory would hold the agent's connection with
    no answer, while a refusal (503) is something every SDK already retries.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.peak = 0
        self._lock = threading.Lock()

    def take(self, n: int) -> bool:
        with self._lock:
            if self.held + n > self.limit:
                return False
            self.held += n
            self.peak = max(self.peak, self.held)
            return True

    def give(self, n: int) -> None:
        with self._lock:
            self.held = max(0, self.held - n)


class Holding:
    """One call's share of a ``MemoryBudget``: taken piecewise, given back whole (``release``) when the call ends."""

    def __init__(self, budget: MemoryBudget) -> None:
        self.budget = budget
        self.bytes = 0

    def take(self, n: int) -> bool:
        if self.budget.take(n):
            self.bytes += n
            return True
        return False

    def release(self) -> None:
        self.budget.give(self.bytes)
        self.bytes = 0
