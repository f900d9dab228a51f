"""Options several subcommands share, declared once."""

from __future__ import annotations

import re
import time
from typing import Any, Callable

import click

from plumbline_otel.errors import ConfigError
from plumbline_otel.store import DEFAULT_DB

db_option = click.option("--db", "db", default=DEFAULT_DB, show_default=True, help="DuckDB file of the store.")
server_option = click.option("--server", default=None, metavar="HOST:PORT", help="Ask a running `plumbline serve` instead of opening the file.")

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_since(value: str | None) -> int | None:
    """`--since` as nanoseconds: a duration back from now (`30m`, `2h`, `7d`) or an ISO date/time."""
    if not value:
        return None
    match = re.fullmatch(r"(\d+)([smhd])", value.strip())
    if match:
        return time.time_ns() - int(match.group(1)) * _UNITS[match.group(2)] * 1_000_000_000
    from datetime import datetime, timezone

    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise ConfigError(f"--since {value!r}: use a duration like 30m, 2h, 7d or an ISO date like 2026-12-01") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return int(moment.timestamp() * 1e9)


since_option: Callable[[Any], Any] = click.option("--since", default=None, help="Only data from this long ago (30m, 2h, 7d) or since this ISO date.")
