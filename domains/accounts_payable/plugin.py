"""The accounts-payable domain as a plumbline plugin: `plumbline domain run accounts_payable` and the demo's study.

Registered in `pyproject.toml` under the `plumbline_otel.domains` entry point (`plumbline_otel/plugins.py`).
"""

from __future__ import annotations

from pathlib import Path

import click

from domains.accounts_payable import run as ap_run
from domains.accounts_payable.arms import FaultPlan
from domains.accounts_payable.replay_adapter import DEMO_IMPERFECTIONS, APAdapter
from domains.accounts_payable.vocabulary import LEXICON
from plumbline_otel.errors import ConfigError, ReplayError
from plumbline_otel.plugins import DomainPlugin

ARMS = ("plan_execute", "plan_execute_retry", "react")
_SPEC = ("configs", "accounts_payable.invariants.yaml")


def _spec_path() -> Path:
    """The domain's invariants in the clone this package runs from, else in the working directory (a plain install)."""
    beside = Path(__file__).resolve().parents[2].joinpath(*_SPEC)
    return beside if beside.exists() else Path.cwd().joinpath(*_SPEC)


SPEC_PATH = _spec_path()


@click.command("accounts_payable")
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
def run_command(arm: str, task: str, endpoint: str | None, otlp_file: str | None, imperfections: str,
                fault: str | None, seed: int, repeats: int, model: str | None, model_url: str | None,
                offline: bool, study: str | None, results_path: str | None) -> None:
    """Run an accounts-payable arm on one or all invoices; print each task's outcome against ground truth."""
    if endpoint and otlp_file:
        raise click.UsageError("give --endpoint or --otlp-file, not both")
    try:
        tasks = ap_run.select_tasks(task)
        plan = FaultPlan.parse(fault) if fault else None
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    try:
        summary = ap_run.run_domain(
            arm, tasks, endpoint=endpoint, otlp_file=otlp_file, imperfections=imperfections or None,
            fault=plan, seed=seed, model=model, model_url=model_url, offline=offline, repeats=repeats,
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


class Demo:
    """`plumbline demo`'s study: the three arms on every invoice, the retrying arm's runs as traffic (simulated model)."""

    arms: tuple[str, ...] = ARMS
    source_arm: str = "plan_execute_retry"
    spec_path: Path = SPEC_PATH

    def service(self, arm: str) -> str:
        return f"ap-agent-{arm}"

    def record_traffic(self, otlp_file: Path, study: str) -> None:
        ap_run.run_domain(self.source_arm, "all", otlp_file=otlp_file, offline=True, imperfections={}, study=study)

    def adapter(self, arm: str) -> APAdapter:
        return APAdapter(arm, imperfections=DEMO_IMPERFECTIONS)


PLUGIN = DomainPlugin("accounts_payable", run_command, Demo(), LEXICON)
