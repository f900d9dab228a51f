"""`plumbline coverage`: what the stored traffic can and cannot support."""

from __future__ import annotations

import click
import orjson

from plumbline_otel.cli.options import parse_since, since_option, sources, stores_option, warn_misrouted
from plumbline_otel.coverage import coverage_report, render_text
from plumbline_otel.store import Store


@click.command()
@stores_option
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@since_option
def coverage(db: tuple[str, ...], server: tuple[str, ...], fmt: str, since: str | None) -> None:
    """Report what the stored traces can and cannot support, per service and overall."""
    stores = sources(db, server)
    if stores.single_db is None:  # several stores, or a server: counts summed, the report derived once
        report = stores.coverage(since_ns=parse_since(since))
        warn_misrouted(stores)
    else:
        with Store(stores.single_db, read_only=True) as store:
            report = coverage_report(store, since_ns=parse_since(since))
    click.echo(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() if fmt == "json" else render_text(report), nl=fmt == "json")
