"""`plumbline trajectories`: the stable export (JSON lines) or a table for people."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import click
import orjson

from plumbline_otel.cli.options import parse_since, since_option, sources, stores_option, warn_misrouted
from plumbline_otel.model import Trajectory
from plumbline_otel.store import open_assembled, pending_note


def _table_line(t: Trajectory) -> str:
    from plumbline_otel.report.html import task_label

    tools = " → ".join(s.name + ("✗" if s.failed else "") for s in t.tool_steps) or "(no tool calls)"
    task = task_label(t.task_key, t.task_key_source, t.input, 40)  # a hashed task reads as its request
    return f"{t.trace_id[:12]}  {str(t.service)[:20]:20}  {task:44}  {tools}"


def emit(trajectories: Iterable[dict[str, Any]], fmt: str) -> None:
    """Write exported trajectory documents as JSON lines or as a table."""
    for doc in trajectories:
        if fmt == "jsonl":
            click.echo(orjson.dumps(doc).decode())
        else:
            from plumbline_otel.rows import trajectory_from_doc

            click.echo(_table_line(trajectory_from_doc(doc)))


@click.command()
@stores_option
@click.option("--service", default=None, help="Only this service.name.")
@click.option("--task", default=None, help="Only this task key.")
@since_option
@click.option("--format", "fmt", type=click.Choice(["jsonl", "table"]), default="jsonl", show_default=True)
def trajectories(db: tuple[str, ...], server: tuple[str, ...], service: str | None, task: str | None, since: str | None,
                 fmt: str) -> None:
    """Print stored trajectories: one JSON object per line, or a table.

    Traces still pending assembly (left by a crash) are assembled first; when another process
    holds the file, they are counted on stderr instead.
    """
    stores = sources(db, server)
    if stores.single_db is None:
        emit((t.export() for t in stores.trajectories(service=service, task=task, since_ns=parse_since(since))), fmt)
        warn_misrouted(stores)
        if stores.pending_traces:
            click.echo(pending_note(stores.pending_traces), err=True)
        return
    store, pending = open_assembled(stores.single_db)
    with store:
        emit((t.export() for t in store.trajectories(service=service, task=task, since_ns=parse_since(since))), fmt)
    if pending:
        click.echo(pending_note(pending), err=True)
