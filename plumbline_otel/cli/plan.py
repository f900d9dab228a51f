"""`plumbline plan`: how many distinct tasks a cell needs for a target lower bound (the gate's method)."""

from __future__ import annotations

import click


@click.command("plan")
@click.option("--target", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=0.95, show_default=True,
              help="the lower bound on the mean conformance over tasks to reach")
@click.option("--failing-tasks", type=click.IntRange(min=0), default=0, show_default=True,
              help="tasks you expect to fail on every run")
@click.option("--cells", type=click.IntRange(min=1), default=1, show_default=True, help="perturbations (cells) to plan for")
@click.option("--repeats", type=click.IntRange(min=1), default=1, show_default=True, help="runs per task (trials = tasks × repeats)")
@click.option("--sequential", is_flag=True, help="plan for a study that stops when its answer is known (replay --target)")
def plan(target: float, failing_tasks: int, cells: int, repeats: int, sequential: bool) -> None:
    """Print the distinct tasks per perturbation the gate's bound needs to reach --target (73 for 0.95)."""
    from plumbline_otel.analyse.stats import SEQUENTIAL_METHOD, TASK_METHOD, tasks_needed

    method = SEQUENTIAL_METHOD if sequential else TASK_METHOD
    clean = tasks_needed(target, [(0, repeats)] * failing_tasks, method=method)
    if clean is None:
        click.echo(f"no number of clean tasks reaches a lower bound of {target} with {failing_tasks} failing task(s) ({method})")
        raise SystemExit(1)
    tasks = clean + failing_tasks
    line = (f"{tasks} distinct tasks per perturbation ({clean} clean, {failing_tasks} failing) reach a lower bound of {target} "
            f"({method}); at {repeats} repeat(s) that is {tasks * repeats} trials")
    if cells > 1:
        line += f", {tasks * repeats * cells} over {cells} perturbations"
    click.echo(line + ". Repeats sharpen each task's rate; only more tasks raise the bound.")
