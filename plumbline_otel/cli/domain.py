"""`plumbline domain run`: run a reference domain's agent arm end to end, traced and graded."""

from __future__ import annotations

import click

from plumbline_otel.errors import ConfigError, ReplayError

DOMAINS = ("accounts_payable",)
ARMS = ("plan_execute", "plan_execute_retry", "react")


@click.group()
def domain() -> None:
    """Reference domains: run their agent arms end to end and grade them."""


@domain.command("run")
@click.argument("name", type=click.Choice(DOMAINS))
@click.option("--arm", type=click.Choice(ARMS), required=True, help="Which agent arm to run.")
@click.option("--task", default="all", show_default=True, help="A task id (INV-1001), a comma list, or all.")
@click.option("--endpoint", help="OTLP endpoint for the traces: http://127.0.0.1:4317 (gRPC) or "
              "http://127.0.0.1:4318/v1/traces (HTTP).")
@click.option("--otlp-file", type=click.Path(dir_okay=False), help="Append the traces as OTLP JSON lines.")
@click.option("--imperfections", default="", help="Simulated model only: name=p,... "
              "(skip_check_under_distraction, skip_check, misread_amount, stop_retrying, wrong_reason_code, "
              "skip_approval, forget_audit_log, misidentify_invoice).")
@click.option("--fault", help="Inject a transient fault per trial: tool:kind[:on_call[:times]], "
              "kind one of 503, 429, timeout, connection_reset.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the simulated model.")
@click.option("--repeats", type=click.IntRange(1), default=1, show_default=True, help="Trials per task.")
@click.option("--model", help="Model to request (default claude-haiku-4-5; simulated-ap-policy-v1 offline).")
@click.option("--model-url", help="Messages API base URL to use instead of the real API or the stand-in.")
@click.option("--offline", is_flag=True, help="Use the simulated model even when an API key is set.")
@click.option("--study", help="Study name written on every trial (default ap-<arm>-seed<N>).")
@click.option("--results", "results_path", type=click.Path(dir_okay=False),
              help="Write every trial's result as JSON lines.")
def run(name: str, arm: str, task: str, endpoint: str | None, otlp_file: str | None, imperfections: str,
        fault: str | None, seed: int, repeats: int, model: str | None, model_url: str | None,
        offline: bool, study: str | None, results_path: str | None) -> None:
    """Run an arm on one or all tasks; print each task's outcome against ground truth."""
    from domains.accounts_payable import run as ap_run
    from domains.accounts_payable.arms import FaultPlan

    if endpoint and otlp_file:
        raise click.UsageError("give --endpoint or --otlp-file, not both")
    try:
        tasks = ap_run.select_tasks(task)
        spec = FaultPlan.parse(fault) if fault else None
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    try:
        summary = ap_run.run_domain(
            arm, tasks, endpoint=endpoint, otlp_file=otlp_file, imperfections=imperfections or None,
            fault=spec, seed=seed, model=model, model_url=model_url, offline=offline, repeats=repeats,
            study=study, on_result=lambda r: click.echo(ap_run.format_result(r)),
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    except Exception as exc:
        import anthropic

        if isinstance(exc, anthropic.APIError):  # infrastructure, not the agent: stop, say so
            raise ReplayError(f"model call failed ({type(exc).__name__}): {exc}") from exc
        raise
    click.echo(ap_run.format_summary(summary))
    if results_path:
        ap_run.write_results(results_path, summary.results)
