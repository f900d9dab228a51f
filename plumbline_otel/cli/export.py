"""`plumbline export`: the store as Hive-partitioned Parquet for a warehouse (see `plumbline_otel.parquet_export`)."""

from __future__ import annotations

import click

from plumbline_otel.cli.options import db_option, parse_since, since_option
from plumbline_otel.store import open_assembled, pending_note


@click.command("export")
@click.option("--format", "fmt", type=click.Choice(["parquet"]), default="parquet", show_default=True)
@click.option("--out", required=True, type=click.Path(file_okay=False), help="dataset folder (created; the window's days are replaced)")
@db_option
@since_option
@click.option("--cert", "cert_path", type=click.Path(exists=True, dir_okay=False), help="also export this certificate's cells")
def export(fmt: str, out: str, db: str, since: str | None, cert_path: str | None) -> None:
    """Export runs, steps, violations and certificate cells, partitioned by date and service.

    --since is rounded down to its UTC day; re-running replaces those days' files, so rows are
    never duplicated. Read it back with e.g. DuckDB:
    SELECT * FROM read_parquet('OUT/steps/**/*.parquet', hive_partitioning = true).
    """
    from plumbline_otel.parquet_export import export_parquet

    store, pending = open_assembled(db)
    with store:
        written = export_parquet(store, out, since_ns=parse_since(since), certificate=cert_path)
    for table, rows in written.items():
        click.echo(f"{table}: {rows} rows")
    if pending:
        click.echo(pending_note(pending), err=True)
