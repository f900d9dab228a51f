"""Options several subcommands share, declared once."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

import click

from plumbline_otel.compare_values import parse_iso
from plumbline_otel.errors import ConfigError
from plumbline_otel.sources import Sources
from plumbline_otel.store import DEFAULT_DB
from plumbline_otel.trials import KeyRing

db_option = click.option("--db", "db", default=DEFAULT_DB, show_default=True, help="DuckDB file of the store.")


_LAKE = "plumbline.lake"


def _keep_lake(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    ctx.meta[_LAKE] = value


_STATE = "plumbline.state"


def _keep_state(ctx: click.Context, param: click.Parameter, value: Any) -> None:
    ctx.meta[f"{_STATE}.{param.name}"] = value


def stores_option(command: Callable[..., Any]) -> Callable[..., Any]:
    """--db (repeatable, globs), --server (repeatable) and --lake: the stores a reader reads as one.

    --lake is kept in the command's context (`sources` reads it), so every reader takes it without
    a parameter of its own.
    """
    command = click.option("--lake", "lake", default=None, metavar="CATALOG_URI", expose_value=False, callback=_keep_lake,
                           help="a lake every instance commits to (a directory, sqlite:///FILE or postgresql://…?warehouse=URI): "
                                "read its runs as one store")(command)
    command = click.option("--server", "server", multiple=True, metavar="HOST:PORT",
                           help="a running `plumbline serve` (its gRPC API); repeat to read several instances as one")(command)
    return click.option("--db", "db", multiple=True, metavar="FILE|GLOB",
                        help=f"store file no server holds (default {DEFAULT_DB}); repeat, or give a glob, to read several as one")(command)


def sources(db: tuple[str, ...], server: tuple[str, ...], assemble: bool = False) -> Sources:
    """The stores a reader was given (with the command's --lake); the default file when it was given none."""
    ctx = click.get_current_context(silent=True)
    lake = ctx.meta.get(_LAKE) if ctx is not None else None
    return Sources(db or (() if server or lake else (DEFAULT_DB,)), server, assemble=assemble, lake=lake)


def keys_option(command: Callable[..., Any]) -> Callable[..., Any]:
    """--state (repeatable) and --state-url: where the keys that verify the replay driver's records are (`study_keys`)."""
    command = click.option("--state-url", "state_url", default=None, metavar="POSTGRES_URL", expose_value=False, callback=_keep_state,
                           help="the shared state of replay studies run with --state-url: the keys that verify their records")(command)
    return click.option("--state", "state", multiple=True, metavar="DIR", expose_value=False, callback=_keep_state,
                        type=click.Path(file_okay=False),
                        help="a replay study's state directory (or a folder of them) whose key verifies the driver's records; "
                             "the states beside each --db (<db>.replay/) are always read")(command)


def study_keys(stores: Sources) -> KeyRing:
    """The keys that verify the replay driver's records: the study states beside each store file, and the command's
    --state directories and --state-url (`trials.KeyRing`)."""
    ctx = click.get_current_context(silent=True)
    meta = ctx.meta if ctx is not None else {}
    keys = KeyRing.beside(stores.dbs).merged(KeyRing.load(meta.get(f"{_STATE}.state") or ()))
    url = meta.get(f"{_STATE}.state_url")
    if url:
        from plumbline_otel.replay.pgstate import shared_keys

        keys = keys.merged(shared_keys(url))
    return keys


def warn_misrouted(stores: Sources) -> None:
    """Say on stderr which traces reached several stores (they are left out of the runs)."""
    notice = stores.notice()
    if notice:
        click.echo(notice, err=True)


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
    when = parse_iso(text)
    if when is None:
        raise ConfigError(f"--since: {text!r} is neither an ISO time nor an age like 24h")
    return int(when.timestamp()) * 1_000_000_000 + when.microsecond * 1000


since_option: Callable[[Any], Any] = click.option("--since", default=None, help=SINCE_HELP)

