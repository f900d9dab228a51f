"""`plumbline show`: one run's steps, or two runs on the same task side by side, in the terminal."""

from __future__ import annotations

import click

from plumbline_otel.cli.options import sources, stores_option
from plumbline_otel.cli.report import reading


@click.command("show")
@click.argument("run_id", required=False)
@stores_option
@click.option("--task", default=None, help="diff two runs of this task (with --vs)")
@click.option("--vs", default=None, metavar="AGENT", help="run B's agent (service or service@version)")
@click.option("--agent", default=None, help="run A's agent (default: any other agent; else a second run of --vs)")
@click.option("--perturbation", default=None, help="only pair runs made under this perturbation")
def show(run_id: str | None, db: tuple[str, ...], server: tuple[str, ...], task: str | None, vs: str | None, agent: str | None,
         perturbation: str | None) -> None:
    """Print RUN_ID step by step, or (--task K --vs AGENT) two runs aligned with the first divergence marked."""
    from plumbline_otel.errors import InputError
    from plumbline_otel.report import data
    from plumbline_otel.report.diff import diff_runs
    from plumbline_otel.report.terminal import diff_text, run_text

    if bool(run_id) == bool(task):
        raise click.UsageError("give a RUN_ID, or --task K with --vs AGENT")
    if task and not vs:
        raise click.UsageError("--task needs --vs AGENT (the agent of run B)")
    with reading(sources(db, server, assemble=True), task) as store:
        if run_id:
            run = store.load_run(run_id)
            if run is None:
                raise InputError(f"no stored run {run_id!r} (a trajectory id or trace id; `plumbline trajectories` lists them)")
            click.echo(run_text(run, store.run_violations(run.trajectory_id)))
            return
        pair = data.pair_on_task(store, task, vs, agent, perturbation)  # type: ignore[arg-type]
        if pair is None:
            raise InputError(f"task {task!r}: no run of {vs!r} shares a perturbation and variant with "
                             f"{'a run of ' + repr(agent) if agent else 'another run'}")
        click.echo(diff_text(diff_runs(*pair)))
