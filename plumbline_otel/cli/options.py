"""Options several subcommands share, declared once."""

from __future__ import annotations

import re
import time
from datetime import datetime, timezone
from typing import Any, Callable, Iterator

import click

from plumbline_otel.errors import ConfigError
from plumbline_otel.model import Trajectory
from plumbline_otel.store import DEFAULT_DB

db_option = click.option("--db", "db", default=DEFAULT_DB, show_default=True, help="DuckDB file of the store.")
server_option = click.option("--server", default=None, metavar="HOST:PORT", help="Ask a running `plumbline serve` instead of opening the file.")

SINCE_HELP = "only runs started at/after this: an ISO time (2024-03-01, 2024-03-01T12:00Z) or an age (90m, 24h, 7d)"
_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_since(text: str | None, now_ns: int | None = None) -> int | None:
    """--since as epoch nanoseconds; naive ISO times are UTC. Raises ConfigError on nonsense."""
    if text is None or not text.strip():
        return None
    now_ns = time.time_ns() if now_ns is None else now_ns
    age = _AGE.match(text)
    if age:
        return now_ns - int(float(age.group(1)) * _UNIT_S[age.group(2)] * 1_000_000_000)
    iso = text.strip()
    if iso.endswith(("Z", "z")):
        iso = iso[:-1] + "+00:00"
    try:
        when = datetime.fromisoformat(iso)
    except ValueError:
        raise ConfigError(f"--since: {text!r} is neither an ISO time nor an age like 24h") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return int(when.timestamp()) * 1_000_000_000 + when.microsecond * 1000


since_option: Callable[[Any], Any] = click.option("--since", default=None, help=SINCE_HELP)


def server_trajectories(server: str, service: str | None = None, since_ns: int | None = None) -> Iterator[Trajectory]:
    """Trajectories from a running `plumbline serve` (its gRPC API), for commands given --server."""
    from plumbline_otel.api.client import PlumblineClient
    from plumbline_otel.store import trajectory_from_doc

    with PlumblineClient(server) as client:
        for doc in client.trajectories(service=service, since_ns=since_ns):
            yield trajectory_from_doc(doc)
