"""`plumbline coverage`: what the stored traffic can and cannot support."""

from __future__ import annotations

import click
import orjson

from plumbline_otel.cli.options import parse_since, since_option, sources, stores_option, warn_misrouted
from plumbline_otel.coverage import coverage_report, render_text
from plumbline_otel.store import open_assembled, pending_note


@click.command()
@stores_option
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@since_option
def coverage(db: tuple[str, ...], server: tuple[str, ...], fmt: str, since: str | None) -> None:
    """Report what the stored traces can and cannot support, per service and overall.

    On a file, traces pending assembly are assembled first, or (when another process holds the
    file) counted in `pending_traces` and on stderr as excluded from the figures. Several stores
    (or a server) give their counts summed, the report derived once.
    """
    stores = sources(db, server)
    if stores.single_db is None:  # a server assembles first; each file follows the one-file rule below
        report = stores.coverage(since_ns=parse_since(since))
        pending = stores.pending_traces
        warn_misrouted(stores)
    else:
        store, pending = open_assembled(stores.single_db)
        with store:
            report = coverage_report(store, since_ns=parse_since(since))
    report["pending_traces"] = pending
    if pending:
        click.echo(pending_note(pending), err=True)
    click.echo(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() if fmt == "json" else render_text(report), nl=fmt == "json")
