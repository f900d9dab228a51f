"""`plumbline ingest PATH…`: trace files into the store, with a summary of what was kept and why not."""

from __future__ import annotations

import sys
from itertools import accumulate
from pathlib import Path

import click

from plumbline_otel.cli.options import db_option
from plumbline_otel.cli.progress import Progress
from plumbline_otel.decode import input_size, iter_trace_files
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
@click.option("--task-key", "task_keys", multiple=True,
              help="Attribute naming a run's task: a span's or the resource's attribute, resource.NAME, or ATTR.FIELD inside a "
                   "JSON attribute (repeatable; default plumbline.task.key, else a hash of the normalised request).")
@click.option("--workers", type=click.IntRange(0), default=None,
              help="Worker processes decoding and normalising, sharded by trace id [default: one per core; none for inputs under 8 MiB or whose first 1,000 spans are one trace; 0 = in this process].")
@click.option("--quiet", is_flag=True, help="No progress line (drawn on stderr only when it is a terminal).")
def ingest(paths: tuple[str, ...], db: str, task_keys: tuple[str, ...], workers: int | None, quiet: bool) -> None:
    """Ingest OTLP trace files (protobuf, JSON, JSON lines; gzipped or not), directories or globs.

    Exit 0 when everything was accepted, 3 when some input was rejected (the rest is kept),
    2 when nothing usable was given.
    """
    files = [str(p) for p in iter_trace_files(list(paths))]
    ends = list(accumulate(input_size(Path(path)) for path in files))  # bytes read when each file is done
    collect_less_often()
    with Store(db) as store:
        if task_keys:
            store.set_task_keys(task_keys)
        with Progress("ingesting", ends[-1] if ends else 0, "B", quiet) as progress:
            ended = 0  # files read to their end, in order: their bytes are all done whatever their requests added up to

            def file_read(_path: Path) -> None:
                nonlocal ended
                ended += 1
                progress.update(ends[ended - 1])
                if ended == len(ends):
                    progress.stage("storing the last spans and assembling their runs")

            def read(size: int) -> None:  # never past the file's end: a gzip file's size is an estimate past 4 GiB
                progress.update(min(progress.done + size, ends[min(ended, len(ends) - 1)]))

            summary = ingest_files(store, files, on_file=file_read, workers=workers, on_read=read)
    click.echo(render_summary(summary))
    sys.exit(summary.exit_code)
