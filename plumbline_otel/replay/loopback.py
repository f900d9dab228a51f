"""What the model-API proxy and the MCP proxy share: they listen on loopback only, read a trial from W3C
``baggage`` when an agent propagates it, and start and stop as a context manager."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any
from urllib.parse import unquote

from plumbline_otel.errors import ConfigError

LOOPBACK = ("127.0.0.1", "::1", "localhost")


def loopback_only(host: str, what: str) -> str:
    """`host`, when it is a loopback address: a proxy holding the study's keys and budget never listens beyond it."""
    if host not in LOOPBACK:
        raise ConfigError(f"{what} host {host!r}: it listens on loopback only ({', '.join(LOOPBACK)})")
    return host


def parse_baggage(headers: str | Iterable[str] | None) -> dict[str, str]:
    """The members of one or more W3C ``baggage`` header values (properties dropped, values percent-decoded)."""
    values = [headers] if isinstance(headers, str) else list(headers or ())
    out: dict[str, str] = {}
    for header in values:
        for member in header.split(","):
            key, sep, value = member.split(";", 1)[0].partition("=")
            if sep:
                out[key.strip()] = unquote(value.strip())
    return out


class LoopbackService(ABC):
    """A proxy's lifecycle: ``start``/``stop`` (the subclass's), a context manager, and its ``url``."""

    host: str
    port: int

    @abstractmethod
    def start(self) -> None:
        """Listen on `host`:`port` (0: a free port, then `port` is the one taken)."""

    @abstractmethod
    def stop(self) -> None:
        """Stop listening and release what `start` took; stopping twice does nothing."""

    def __enter__(self) -> Any:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"
