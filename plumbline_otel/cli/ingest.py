"""`plumbline ingest PATH…`: trace files into the store, with a summary of what was kept and why not."""

from __future__ import annotations

import sys

import click

from plumbline_otel.cli.options import db_option
from plumbline_otel.decode import iter_trace_files
from plumbline_otel.ingest import IngestSummary, ingest_files
from plumbline_otel.pipeline import collect_less_often
from plumbline_otel.store import Store


def render_summary(summary: IngestSummary, limit: int = 20) -> str:
    """The counts, then each rejection with where it was."""
    lines = [
        f"files {summary.files}, requests {summary.requests}: spans read {summary.spans_read}, "
        f"stored {summary.stored}, duplicate {summary.duplicate}, rejected {summary.rejected_spans}; "
        f"trajectories rebuilt {summary.trajectories}"
        + (f"; GenAI log records read {summary.log_records} (folded into their spans)" if summary.log_records else "")
    ]
    for problem in summary.problems[:limit]:
        lines.append(f"  rejected: {problem}")
    if len(summary.problems) > limit:
        lines.append(f"  … and {len(summary.problems) - limit} more problems (all recorded in the store's `problems` table)")
    return "\n".join(lines)


@click.command()
@click.argument("paths", nargs=-1, required=True)
@db_option
@click.option("--task-key", "task_keys", multiple=True, help="Attribute naming a run's task (repeatable; default plumbline.task.key, else a hash of the normalised request).")
@click.option("--workers", type=click.IntRange(0), default=None,
              help="Worker processes decoding and normalising, sharded by trace id [default: one per core; none for inputs under 8 MiB or whose first 1,000 spans are one trace; 0 = in this process].")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def ingest(paths: tuple[str, ...], db: str, task_keys: tuple[str, ...], workers: int | None, quiet: bool) -> None:
    """Ingest OTLP trace files (protobuf, JSON, JSON lines; gzipped or not), directories or globs.

    Exit 0 when everything was accepted, 3 when some input was rejected (the rest is kept),
    2 when nothing usable was given.
    """
    files = [str(p) for p in iter_trace_files(list(paths))]
    collect_less_often()
    with Store(db) as store:
        if task_keys:
            store.set_task_keys(task_keys)
        with click.progressbar(length=len(files), label="ingesting", file=sys.stderr, hidden=quiet) as bar:
            summary = ingest_files(store, files, on_file=lambda _path: bar.update(1), workers=workers)
    click.echo(render_summary(summary))
    sys.exit(summary.exit_code)
