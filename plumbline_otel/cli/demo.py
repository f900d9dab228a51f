"""`plumbline demo`: the main job on its embedded default, with nothing to install or configure.

It ingests the sample traces in `runs/samples` (recorded from real instrumentation libraries)
into a fresh DuckDB file, prints the coverage report and a few trajectories.
"""

from __future__ import annotations

from pathlib import Path

import click

from plumbline_otel.cli.ingest import render_summary
from plumbline_otel.cli.trajectories import emit
from plumbline_otel.coverage import coverage_report, render_text
from plumbline_otel.errors import ConfigError
from plumbline_otel.ingest import ingest_files
from plumbline_otel.store import Store


def samples_dir() -> Path:
    """The repository's `runs/samples`, found from the package or the working directory."""
    for base in (Path(__file__).resolve().parents[2], Path.cwd()):
        candidate = base / "runs" / "samples"
        if candidate.is_dir():
            return candidate
    raise ConfigError("runs/samples not found: run `plumbline demo` from a clone of the repository")


@click.command()
@click.option("--db", default="demo.duckdb", show_default=True, help="DuckDB file to create (replaced if it exists).")
@click.option("--show", default=5, show_default=True, help="How many trajectories to print.")
def demo(db: str, show: int) -> None:
    """Ingest the bundled sample traces, then print coverage and trajectories."""
    path = Path(db)
    for stale in (path, Path(f"{db}.wal")):
        stale.unlink(missing_ok=True)
    samples = samples_dir()
    click.secho(f"1. Ingesting sample traces from {samples} into {db}", bold=True)
    with Store(db) as store:
        summary = ingest_files(store, [str(samples)])
        click.echo(render_summary(summary))
        click.secho("\n2. Coverage: what this traffic can and cannot support", bold=True)
        click.echo(render_text(coverage_report(store)))
        click.secho(f"3. Trajectories (first {show}; `plumbline trajectories --db {db}` prints them all as JSON lines)", bold=True)
        docs = [t.export() for t in store.trajectories()][:show]
        emit(docs, "table")
        if docs:
            click.secho("\nOne of them in the export format:", bold=True)
            emit(docs[:1], "jsonl")
