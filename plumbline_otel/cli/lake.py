"""`plumbline lake`: commit a store to the lake every instance shares, look at it, and keep it small.

    plumbline lake sync --db FILE --lake URI [--instance NAME] [--every SECONDS]
    plumbline lake tables --lake URI
    plumbline lake maintain --lake URI [--older-than 1h] [--no-compact]

A served store is committed by `plumbline serve` itself (PLUMBLINE_LAKE in its environment: a
served file cannot be opened by another process); `sync` is for files written by `ingest` or
`import`, and for a store whose server is stopped. Readers take `--lake URI`.
"""

from __future__ import annotations

import json
import time

import click

from plumbline_otel.cli.options import parse_since


@click.group("lake")
def lake() -> None:
    """One Apache Iceberg table set every instance commits to (plumbline_otel/lake.py)."""


_LAKE_HELP = "the lake's catalog: a directory (embedded SQLite catalog), sqlite:///FILE, or postgresql://…?warehouse=URI"


@lake.command("sync")
@click.option("--db", "db", required=True, metavar="FILE", help="the store to commit (not one a server holds)")
@click.option("--lake", "lake_uri", required=True, metavar="CATALOG_URI", help=_LAKE_HELP)
@click.option("--instance", default=None, help="this store's name in the lake (default: host and the file's absolute path)")
@click.option("--every", type=click.FloatRange(min=0.1), default=None, metavar="SECONDS",
              help="keep syncing at this interval until interrupted (the store is opened for each sync)")
def sync(db: str, lake_uri: str, instance: str | None, every: float | None) -> None:
    """Make the lake's rows of this instance equal the store's (assembling it first); idempotent."""
    from plumbline_otel.lake import Lake, LakeSink, default_instance
    from plumbline_otel.store import open_assembled

    sink = LakeSink(Lake(lake_uri), instance or default_instance(db))
    while True:
        store, pending = open_assembled(db)
        with store:
            result = sink.sync(store.connection)
        summary = result.as_dict()
        if pending:
            summary["pending_traces"] = pending
        click.echo(json.dumps({"instance": sink.instance, **summary}))
        if every is None:
            return
        time.sleep(every)


@lake.command("tables")
@click.option("--lake", "lake_uri", required=True, metavar="CATALOG_URI", help=_LAKE_HELP)
def tables(lake_uri: str) -> None:
    """Each table's rows per instance, its data files and snapshots, and where it lives."""
    from plumbline_otel.lake import TABLES, Lake

    the_lake = Lake(lake_uri)
    out = {}
    for name in TABLES:
        table = the_lake.table(name, create=False)
        if table is None:
            continue
        instances = the_lake.scan(name, fields=("instance",))["instance"].value_counts().to_pylist()
        out[name] = {"location": table.location(), "rows": {v["values"]: v["counts"] for v in instances},
                     "data_files": int(table.inspect.files().num_rows) if table.current_snapshot() else 0,
                     "snapshots": len(table.snapshots())}
    click.echo(json.dumps({"lake": the_lake.label, "warehouse": the_lake.warehouse, "tables": out}, indent=2))


@lake.command("maintain")
@click.option("--lake", "lake_uri", required=True, metavar="CATALOG_URI", help=_LAKE_HELP)
@click.option("--older-than", default="1h", show_default=True, metavar="AGE",
              help="expire snapshots older than this age (90m, 24h, 7d): time travel past it is lost, their files freed")
@click.option("--compact/--no-compact", default=True, show_default=True,
              help="rewrite each instance's many small data files as few large ones first")
def maintain(lake_uri: str, older_than: str, compact: bool) -> None:
    """Compact the data files and expire old snapshots; safe while instances commit (run it from cron, e.g. hourly)."""
    from plumbline_otel.lake import Lake
    from plumbline_otel.lake import maintain as run

    cutoff = parse_since(older_than)
    assert cutoff is not None
    age_s = max(0.0, (time.time_ns() - cutoff) / 1e9)
    click.echo(json.dumps(run(Lake(lake_uri), older_than_s=age_s, compact=compact), indent=2))
