"""`plumbline trajectories`: the stable export (JSON lines) or a table for people."""

from __future__ import annotations

from typing import Any, Iterable

import click
import orjson

from plumbline_otel.cli.options import db_option, parse_since, server_option, since_option
from plumbline_otel.model import Trajectory
from plumbline_otel.store import open_assembled, pending_note


def _table_line(t: Trajectory) -> str:
    tools = " → ".join(s.name + ("✗" if s.failed else "") for s in t.tool_steps) or "(no tool calls)"
    return f"{t.trace_id[:12]}  {str(t.service)[:20]:20}  {str(t.task_key)[:24]:24}  {tools}"


def emit(trajectories: Iterable[dict[str, Any]], fmt: str) -> None:
    """Write exported trajectory documents as JSON lines or as a table."""
    for doc in trajectories:
        if fmt == "jsonl":
            click.echo(orjson.dumps(doc).decode())
        else:
            from plumbline_otel.store import trajectory_from_doc

            click.echo(_table_line(trajectory_from_doc(doc)))


@click.command()
@db_option
@server_option
@click.option("--service", default=None, help="Only this service.name.")
@click.option("--task", default=None, help="Only this task key.")
@since_option
@click.option("--format", "fmt", type=click.Choice(["jsonl", "table"]), default="jsonl", show_default=True)
def trajectories(db: str, server: str | None, service: str | None, task: str | None, since: str | None, fmt: str) -> None:
    """Print stored trajectories: one JSON object per line, or a table.

    Traces still pending assembly (left by a crash) are assembled first; when another process
    holds the file, they are counted on stderr instead.
    """
    if server:
        from plumbline_otel.api.client import PlumblineClient

        docs: Iterable[dict[str, Any]] = PlumblineClient(server).trajectories(service=service, task=task)
        emit(docs, fmt)
        return
    store, pending = open_assembled(db)
    with store:
        emit((t.export() for t in store.trajectories(service=service, task=task, since_ns=parse_since(since))), fmt)
    if pending:
        click.echo(pending_note(pending), err=True)
