"""`plumbline coverage`: what the stored traffic can and cannot support."""

from __future__ import annotations

import click
import orjson

from plumbline_otel.cli.options import db_option, parse_since, server_option, since_option
from plumbline_otel.coverage import coverage_report, render_text
from plumbline_otel.store import open_assembled, pending_note


@click.command()
@db_option
@server_option
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@since_option
def coverage(db: str, server: str | None, fmt: str, since: str | None) -> None:
    """Report what the stored traces can and cannot support, per service and overall.

    On a file, traces pending assembly are assembled first, or (when another process holds the
    file) counted in `pending_traces` and on stderr as excluded from the figures.
    """
    if server:
        from plumbline_otel.api.client import PlumblineClient

        report = PlumblineClient(server).coverage()  # the server assembles first: nothing is left pending
        report["pending_traces"] = 0
    else:
        store, pending = open_assembled(db)
        with store:
            report = coverage_report(store, since_ns=parse_since(since))
        report["pending_traces"] = pending
        if pending:
            click.echo(pending_note(pending), err=True)
    click.echo(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() if fmt == "json" else render_text(report), nl=fmt == "json")
