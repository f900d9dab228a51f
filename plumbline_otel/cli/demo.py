"""`plumbline demo`: the main job on its embedded default, with nothing to install or configure.

Part one ingests the sample traces in `runs/samples` (recorded from real instrumentation
libraries) and prints coverage and trajectories. Part two runs the reference accounts-payable
agents on a simulated model (a seeded policy behind a loopback stand-in of the Anthropic API,
labelled simulated everywhere), ingests their traces, checks them against the domain's
invariants, certifies each agent and applies the CI gate.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from plumbline_otel.cli.ingest import render_summary
from plumbline_otel.cli.trajectories import emit
from plumbline_otel.coverage import coverage_report, render_text
from plumbline_otel.errors import ConfigError
from plumbline_otel.ingest import ingest_files
from plumbline_otel.store import Store

_AP_RUNS = "service LIKE 'ap-agent-%'"


def repo_dir(*parts: str) -> Path:
    """A directory of the repository (runs/samples, configs), found from the package or the working directory."""
    for base in (Path(__file__).resolve().parents[2], Path.cwd()):
        candidate = base.joinpath(*parts)
        if candidate.exists():
            return candidate
    raise ConfigError(f"{'/'.join(parts)} not found: run `plumbline demo` from a clone of the repository")


def _samples(store: Store, show: int) -> None:
    samples = repo_dir("runs", "samples")
    click.secho(f"1. Ingesting sample traces from {samples}", bold=True)
    click.echo(render_summary(ingest_files(store, [str(samples)])))
    click.secho("\n2. Coverage: what this traffic can and cannot support", bold=True)
    click.echo(render_text(coverage_report(store)))
    click.secho(f"3. Trajectories (first {show}; `plumbline trajectories --db {store.path}` prints them all as JSON lines)", bold=True)
    docs = [t.export() for t in store.trajectories()][:show]
    emit(docs, "table")
    if docs:
        click.secho("\nOne of them in the export format:", bold=True)
        emit(docs[:1], "jsonl")


def _study(store: Store, runs_dir: Path, repeats: int, min_bound: float) -> None:
    from domains.accounts_payable.study import PERTURBATIONS, run_study
    from domains.accounts_payable.tasks import TASKS
    from plumbline_otel.analyse import conformance
    from plumbline_otel.report import build_certificate
    from plumbline_otel.report import render_text as render_certificate
    from plumbline_otel.spec import load_spec

    arms = ("plan_execute", "plan_execute_retry", "react")
    total = len(arms) * len(TASKS) * len(PERTURBATIONS) * repeats
    click.secho(f"\n4. Running the accounts-payable agents: {len(arms)} arms × {len(TASKS)} invoices × "
                f"{len(PERTURBATIONS)} perturbations × {repeats} = {total} trials on the SIMULATED model", bold=True)
    with click.progressbar(length=total, label="trials") as bar:
        run_study(runs_dir, arms=arms, repeats=repeats, on_result=lambda *_: bar.update(1))
    click.echo(render_summary(ingest_files(store, [str(runs_dir)])))
    spec = load_spec(repo_dir("configs", "accounts_payable.invariants.yaml"))
    click.secho("\n5. Conformance: every run against configs/accounts_payable.invariants.yaml", bold=True)
    summary = conformance.check(spec, store.trajectories(where=_AP_RUNS), store.connection)
    click.echo(conformance.render_text(summary))
    click.secho("6. Certificate: critical conformance per agent and perturbation, Wilson and task-clustered 95% bounds", bold=True)
    cert = build_certificate(spec, store.trajectories(where=_AP_RUNS), target=min_bound)
    cert_path = runs_dir / "certificate.json"
    cert_path.write_text(json.dumps(cert, indent=2) + "\n")
    click.echo(render_certificate(cert))
    verdict = "PASS" if cert["headline"]["lower_bound"] >= min_bound else "FAIL"
    click.secho(f"7. Gate: `plumbline gate {cert_path} --min-bound {min_bound}` → {verdict} "
                f"(exit {0 if verdict == 'PASS' else 1}); `plumbline plan --target {min_bound}` says how many runs a cell needs.", bold=True)


@click.command()
@click.option("--db", default="demo.duckdb", show_default=True, help="DuckDB file to create (replaced if it exists).")
@click.option("--show", default=5, show_default=True, help="How many sample trajectories to print.")
@click.option("--runs-dir", default="demo-runs", show_default=True, help="Where the study's traces and certificate go.")
@click.option("--repeats", default=1, show_default=True, help="Trials per invoice, arm and perturbation.")
@click.option("--min-bound", default=0.95, show_default=True, help="The gate's threshold.")
@click.option("--samples-only", is_flag=True, help="Skip the accounts-payable study.")
def demo(db: str, show: int, runs_dir: str, repeats: int, min_bound: float, samples_only: bool) -> None:
    """Ingest the bundled sample traces, then run, check and certify the reference agents."""
    for stale in (Path(db), Path(f"{db}.wal"), *Path(runs_dir).glob("*.otlp.jsonl")):
        stale.unlink(missing_ok=True)
    with Store(db) as store:
        _samples(store, show)
        if not samples_only:
            _study(store, Path(runs_dir), repeats, min_bound)
