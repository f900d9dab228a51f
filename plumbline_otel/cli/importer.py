"""`plumbline import plumbline03 DIR`: a plumbline 0.3.0 run directory stored as runs."""

from __future__ import annotations

import click

from plumbline_otel.cli.options import db_option
from plumbline_otel.importers import ImportResult, import_run_dir, outcome_cells
from plumbline_otel.runs import STUDY, run_status
from plumbline_otel.store import Store


@click.group(name="import")
def import_group() -> None:
    """Store runs recorded by other systems (their spans go through the ordinary ingest path)."""


Cells = dict[tuple[str, str], tuple[int, int]]


def render(result: ImportResult, cells: Cells, exposed: Cells) -> str:
    """Counts, then outcome correctness per (agent, perturbation): every run, as the seed scored
    it, beside the exposed runs only (this product's rule), then the figures the study published.
    """
    lines = [
        f"study {result.study}: files {', '.join(result.files)}",
        f"trials {result.trials} (with steps {result.with_steps}, errored {result.errored}, outcome only "
        f"{result.outcome_only}) + missing {result.missing}; spans stored {result.spans_stored}, "
        f"already there {result.spans_duplicate}; trajectories rebuilt {result.trajectories}",
    ]
    if result.outcome_only:
        lines.append(f"  note: {result.outcome_only} trials have an end state but no recorded steps "
                     "(no trajectories.jsonl): their outcomes are known, their conformance is not")
    if cells:
        lines.append(f"outcome correctness   {'agent':<14} {'perturbation':<12} {'every run':>10} {'exposed runs':>13}")
        for (agent, perturbation), (ok, n) in cells.items():
            ok_e, n_e = exposed.get((agent, perturbation), (0, 0))
            lines.append(f"{'':<22}{agent:<14} {perturbation:<12} {f'{ok}/{n}':>10} {f'{ok_e}/{n_e}':>13}")
    published = result.published or {}
    for agent, figure in published.items():
        if isinstance(figure, dict):
            lines.append(f"published overall {agent}: {figure.get('successes')}/{figure.get('total')}")
    return "\n".join(lines)


@import_group.command(name="plumbline03")
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@db_option
@click.option("--study", default=None, help="plumbline.study of the imported runs (default: the directory's name).")
def plumbline03(directory: str, db: str, study: str | None) -> None:
    """A plumbline 0.3.0 run directory (trajectories.jsonl, ledger_states.json, variants.json,
    errors.json, summary.json: whichever exist). Re-importing changes nothing.
    """
    with Store(db) as store:
        result = import_run_dir(store, directory, study)
        runs = [t for t in store.trajectories() if t.context.get(STUDY) == result.study]
    cells = outcome_cells(runs)
    exposed = outcome_cells(runs, scored=lambda t: run_status(t) == "exposed")
    click.echo(render(result, cells, exposed))
