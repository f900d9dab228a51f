"""`plumbline report`: one self-contained HTML file (headline, interval chart, violations, coverage, diffs)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import click

from plumbline_otel.cli.options import keys_option, sources, stores_option, study_keys, warn_misrouted
from plumbline_otel.sources import Sources
from plumbline_otel.store import Store


def memory_store(stores: Sources, task: str | None = None) -> Store:
    """An in-memory store holding the runs of servers or several files (those of `task` when given).

    A server owns its file, and several stores are one only once merged; copying their runs into
    memory lets every page query run the same SQL as on a file, without touching the stores.
    """
    store = Store(":memory:")
    store.add_trajectories(stores.trajectories(task=task))
    warn_misrouted(stores)
    return store


@contextmanager
def reading(stores: Sources, task: str | None = None) -> Iterator[Store]:
    """The store to read: the one file (assembled first), or the stores' runs copied into memory."""
    if stores.single_db is None:
        store = memory_store(stores, task)
    else:
        store = Store(stores.single_db)
        store.assemble()
    with store:
        yield store


@click.command("report")
@stores_option
@keys_option
@click.option("--cert", "cert_path", type=click.Path(exists=True, dir_okay=False), help="certificate JSON (`plumbline certify`) for the headline and chart")
@click.option("--spec", "spec_path", type=click.Path(exists=True, dir_okay=False),
              help="invariant spec: judge the runs (violations) and, without --cert, certify them")
@click.option("--study", default=None,
              help="only runs whose plumbline.study is this, in every section (default: the certificate's study, if it has one)")
@click.option("--out", "out", required=True, type=click.Path(dir_okay=False), help="where to write the HTML file")
def report(db: tuple[str, ...], server: tuple[str, ...], cert_path: str | None, spec_path: str | None, study: str | None, out: str) -> None:
    """Write one HTML file that opens offline: the bound, the chart, violations, coverage and run diffs."""
    from plumbline_otel.analyse.conformance import check
    from plumbline_otel.report import Certificate, build_certificate, load_certificate
    from plumbline_otel.report.pages import report_html, report_study
    from plumbline_otel.runs import STUDY
    from plumbline_otel.spec import load_spec

    cert: Certificate | None = load_certificate(cert_path) if cert_path else None
    study = report_study(cert, study)  # one study's report: every section holds its runs, and only they are judged
    stores = sources(db, server, assemble=True)
    coverage = stores.coverage() if stores.single_db is None else None
    with reading(stores) as store:
        if spec_path:
            spec = load_spec(spec_path)
            check(spec, (t for t in store.trajectories() if study is None or t.context.get(STUDY) == study), store)
            if cert is None:
                cert = build_certificate(spec, store.trajectories(), study=study, keys=study_keys(stores))
        html = report_html(store, cert, ", ".join(stores.names), coverage, study=study)
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(html, encoding="utf-8")
    click.echo(f"report written to {path} ({len(html.encode()) // 1024} KB); open it in a browser")
