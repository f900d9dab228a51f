"""`plumbline lake`: commit a store to the lake every instance shares, look at it, and keep it small.

    plumbline lake sync --db FILE --lake URI [--instance NAME] [--every SECONDS]
    plumbline lake tables --lake URI
    plumbline lake maintain --lake URI [--older-than 1h] [--settle 1h] [--orphan-grace 1h] [--no-compact]
    plumbline lake rename --lake URI --from OLD --to NEW [--db FILE]

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


_LAKE_HELP = ("the lake's catalog: a directory (embedded SQLite catalog), sqlite:///FILE, or postgresql://…?warehouse=URI"
              "[&catalog=NAME] (the catalog's name engines use, default plumbline or PLUMBLINE_LAKE_CATALOG)")


@lake.command("sync")
@click.option("--db", "db", required=True, metavar="FILE", help="the store to commit (not one a server holds)")
@click.option("--lake", "lake_uri", required=True, metavar="CATALOG_URI", help=_LAKE_HELP)
@click.option("--instance", default=None,
              help="this store's name in the lake, kept in the store at its first sync (default: the kept one, else host and a "
                   "random suffix); a name other than the kept one is refused (see `lake rename`)")
@click.option("--every", type=click.FloatRange(min=0.1), default=None, metavar="SECONDS",
              help="keep syncing at this interval until interrupted (the store is opened for each sync)")
def sync(db: str, lake_uri: str, instance: str | None, every: float | None) -> None:
    """Make the lake's rows of this instance equal the store's (assembling it first); idempotent."""
    from plumbline_otel.lake import Lake, LakeSink
    from plumbline_otel.store import open_assembled

    sink = LakeSink(Lake(lake_uri), instance)
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
    from plumbline_otel.lake import SYNCS, TABLES, Lake, watermarks

    the_lake = Lake(lake_uri)
    out = {}
    for name in (*TABLES, SYNCS):
        table = the_lake.table(name, create=False)
        if table is None:
            continue
        instances = the_lake.scan(name, fields=("instance",))["instance"].value_counts().to_pylist()
        out[name] = {"location": table.location(), "rows": {v["values"]: v["counts"] for v in instances},
                     "data_files": int(table.inspect.files().num_rows) if table.current_snapshot() else 0,
                     "snapshots": len(table.snapshots())}
    marks = watermarks(the_lake) or {}
    click.echo(json.dumps({"lake": the_lake.label, "catalog": the_lake.catalog_name, "warehouse": the_lake.warehouse,
                           "instances_synced": sorted(marks), "tables": out}, indent=2))


@lake.command("maintain")
@click.option("--lake", "lake_uri", required=True, metavar="CATALOG_URI", help=_LAKE_HELP)
@click.option("--older-than", default="1h", show_default=True, metavar="AGE",
              help="expire snapshots older than this age (90m, 24h, 7d) and delete the files only they held: time travel past it is lost")
@click.option("--settle", default="1h", show_default=True, metavar="AGE",
              help="compact only the hours that began this long ago (newer ones still get late spans: their small files are cheap to rewrite)")
@click.option("--orphan-grace", default="1h", show_default=True, metavar="AGE",
              help="delete files no snapshot references (a killed commit's, or only snapshots commits expired held) once older than this: "
                   "a younger one may be a commit under way's")
@click.option("--compact/--no-compact", default=True, show_default=True,
              help="rewrite each settled (instance, hour) partition's data files as one sorted file first")
def maintain(lake_uri: str, older_than: str, settle: str, orphan_grace: str, compact: bool) -> None:
    """Compact, expire old snapshots, delete the files nothing live needs, and report what was freed; safe while instances commit.

    A table an older plumbline made (pyiceberg's manifest merge on) is brought up to date first: current
    properties, its manifests regrouped one instance each. Commits expire old snapshots themselves between
    maintenances (PLUMBLINE_LAKE_SNAPSHOTS); the files only those held are freed here, as orphans.
    """
    from plumbline_otel.lake import Lake
    from plumbline_otel.lake import maintain as run

    def age(text: str, option: str) -> float:
        cutoff = parse_since(text)
        if cutoff is None:
            raise click.BadParameter(f"{option}: give an age like 1h")
        return max(0.0, (time.time_ns() - cutoff) / 1e9)

    click.echo(json.dumps(run(Lake(lake_uri), older_than_s=age(older_than, "--older-than"), compact=compact,
                              settle_s=age(settle, "--settle"), orphan_grace_s=age(orphan_grace, "--orphan-grace")), indent=2))


@lake.command("rename")
@click.option("--lake", "lake_uri", required=True, metavar="CATALOG_URI", help=_LAKE_HELP)
@click.option("--from", "old", required=True, help="the instance's name in the lake now")
@click.option("--to", "new", required=True, help="its new name")
@click.option("--db", "db", default=None, metavar="FILE", help="the instance's store: its kept name is changed too (stop its server first)")
def rename(lake_uri: str, old: str, new: str, db: str | None) -> None:
    """Move an instance's rows to a new name (the instance stopped); the store keeps the new name."""
    from plumbline_otel.lake import INSTANCE_KEY, Lake
    from plumbline_otel.lake import rename as run
    from plumbline_otel.store import Store, meta_value, set_meta

    if db is not None:
        with Store(db) as store:
            kept = meta_value(store.connection, INSTANCE_KEY)
            if kept is not None and kept != old:
                raise click.ClickException(f"{db} is instance {kept!r} in the lake, not {old!r}")
            moved = run(Lake(lake_uri), old, new)
            set_meta(store.connection, INSTANCE_KEY, new)
    else:
        moved = run(Lake(lake_uri), old, new)
    click.echo(json.dumps({"from": old, "to": new, "rows_moved": moved}))
