"""`plumbline plan`: how many runs a cell needs for a target lower bound."""

from __future__ import annotations

import click


@click.command("plan")
@click.option("--target", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=0.95, show_default=True,
              help="the lower 95% bound to reach")
@click.option("--failures", type=click.IntRange(min=0), default=0, show_default=True, help="failures you expect to see")
@click.option("--cells", type=click.IntRange(min=1), default=1, show_default=True, help="perturbations (cells) to plan for")
def plan(target: float, failures: int, cells: int) -> None:
    """Print the runs per perturbation needed for a Wilson 95% lower bound of --target (73 for 0.95)."""
    from plumbline_otel.analyse.stats import trials_needed

    n = trials_needed(target, failures=failures)
    line = f"{n} runs per perturbation reach a lower 95% bound of {target} with {failures} failure(s)"
    if cells > 1:
        line += f"; {n * cells} runs over {cells} perturbations"
    click.echo(line)
