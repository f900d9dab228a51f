"""`plumbline coverage`: what the stored traffic can and cannot support."""

from __future__ import annotations

import click
import orjson

from plumbline_otel.cli.options import db_option, parse_since, server_option, since_option
from plumbline_otel.coverage import coverage_report, render_text
from plumbline_otel.store import Store


@click.command()
@db_option
@server_option
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@since_option
def coverage(db: str, server: str | None, fmt: str, since: str | None) -> None:
    """Report what the stored traces can and cannot support, per service and overall."""
    if server:
        from plumbline_otel.api.client import PlumblineClient

        report = PlumblineClient(server).coverage()
    else:
        with Store(db, read_only=True) as store:
            report = coverage_report(store, since_ns=parse_since(since))
    click.echo(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() if fmt == "json" else render_text(report), nl=fmt == "json")
