"""`plumbline report`: one self-contained HTML file (headline, interval chart, violations, coverage, diffs)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from plumbline_otel.cli.options import server_option
from plumbline_otel.store import DEFAULT_DB, Store


def served_store(server: str, task: str | None = None) -> Store:
    """An in-memory store holding a running server's trajectories (those of `task` when given).

    The server owns its file; reading its runs over the API into memory lets every page query run
    the same SQL as on a file, without touching the served store.
    """
    from plumbline_otel.api.client import PlumblineClient
    from plumbline_otel.store import trajectory_from_doc

    store = Store(":memory:")
    with PlumblineClient(server) as client:
        batch = []
        for doc in client.trajectories(task=task):
            batch.append(trajectory_from_doc(doc))
            if len(batch) >= 1000:
                store._write_trajectories(batch, [])
                batch = []
        store._write_trajectories(batch, [])
    return store


@contextmanager
def reading(db: str, server: str | None, task: str | None = None) -> Iterator[Store]:
    """The store to read: the file (assembled first), or a served store's runs copied into memory."""
    if server:
        store = served_store(server, task)
    else:
        store = Store(db)
        store.assemble()
    with store:
        yield store


@click.command("report")
@click.option("--db", default=DEFAULT_DB, show_default=True, help="store file")
@server_option
@click.option("--cert", "cert_path", type=click.Path(exists=True, dir_okay=False), help="certificate JSON (`plumbline certify`) for the headline and chart")
@click.option("--spec", "spec_path", type=click.Path(exists=True, dir_okay=False),
              help="invariant spec: judge the runs (violations) and, without --cert, certify them")
@click.option("--study", default=None, help="with --spec and no --cert: certify only runs whose plumbline.study is this")
@click.option("--out", "out", required=True, type=click.Path(dir_okay=False), help="where to write the HTML file")
def report(db: str, server: str | None, cert_path: str | None, spec_path: str | None, study: str | None, out: str) -> None:
    """Write one HTML file that opens offline: the bound, the chart, violations, coverage and run diffs."""
    from plumbline_otel.analyse.conformance import check
    from plumbline_otel.report import build_certificate, load_certificate
    from plumbline_otel.report.pages import report_html
    from plumbline_otel.spec import load_spec

    cert: dict[str, Any] | None = load_certificate(cert_path) if cert_path else None
    coverage = None
    if server:
        from plumbline_otel.api.client import PlumblineClient

        with PlumblineClient(server) as client:
            coverage = client.coverage()
    with reading(db, server) as store:
        if spec_path:
            spec = load_spec(spec_path)
            check(spec, store.trajectories(), store.connection)
            if cert is None:
                cert = build_certificate(spec, store.trajectories(), study=study)
        html = report_html(store.connection, cert, server or db, coverage)
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(html, encoding="utf-8")
    click.echo(f"report written to {path} ({len(html.encode()) // 1024} KB); open it in a browser")
