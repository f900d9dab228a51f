"""`plumbline demo`: the main job on its embedded default, with nothing to install or configure.

Part one ingests the sample traces in `runs/samples` (recorded from real instrumentation
libraries) and prints coverage and trajectories. Part two is what a user does with the replay
driver, on the reference accounts-payable agents and a simulated model (a seeded policy behind a
loopback stand-in of the Anthropic API, labelled simulated everywhere): baseline "traffic" of one
agent is stored, its tasks are selected from the store, and each agent is replayed on them
through the same library `plumbline replay` uses (`open_study` / `Study.run`: guard, ledger,
response cache, spend cap, resume, one trace per attempt) under all six perturbations, into OTLP
JSON-lines files that are ingested; then check, certify and gate (`_check_certify_gate`).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import click

from plumbline_otel.cli.ingest import render_summary
from plumbline_otel.cli.trajectories import emit
from plumbline_otel.coverage import coverage_report, render_text
from plumbline_otel.errors import ConfigError
from plumbline_otel.ingest import ingest_files
from plumbline_otel.pipeline import collect_less_often
from plumbline_otel.plugins import DemoStudy, domain_plugin
from plumbline_otel.report import write_report
from plumbline_otel.store import RunFilter, Store
from plumbline_otel.trials import states_beside

_DEMO_RUNS = RunFilter(study_prefix="ap-demo-")  # the demo's studies' runs and records


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


DEMO_DOMAIN = "accounts_payable"
STUDY_PREFIX = "ap-demo-"


def _traffic(study: DemoStudy, store: Store, runs_dir: Path) -> list[Any]:
    """Store one agent's clean baseline runs of every reference invoice and select the tasks from them."""
    from plumbline_otel.replay import select_tasks

    traffic = runs_dir / "traffic.otlp.jsonl"
    source = study.service(study.source_arm)
    click.secho(f"\n4. Traffic: {source} on every invoice (SIMULATED model), stored as the tasks to replay", bold=True)
    study.record_traffic(traffic, "traffic")
    click.echo(render_summary(ingest_files(store, [str(traffic)])))
    return select_tasks(store, agent=source)


def _replay(study: DemoStudy, store: Store, runs_dir: Path, tasks: list[Any], repeats: int, concurrency: int) -> None:
    """Replay every arm on the tasks through the replay driver, then ingest what they exported."""
    from plumbline_otel.replay import PERTURBATIONS, SpanSink, StudyConfig, open_study
    from plumbline_otel.replay.perturb import PROXY_PERTURBATIONS

    # The reference agents run in this process on the metered client; the wire's faults need the proxy
    # (`plumbline replay --proxy`, tests/replay/test_replay_proxy_e2e.py).
    perturbations = [p for p in PERTURBATIONS if p not in PROXY_PERTURBATIONS]

    click.secho(f"\n5. Replay: {len(study.arms)} agents × {len(tasks)} tasks × {len(perturbations)} perturbations "
                f"({', '.join(perturbations)}) × {repeats} repeats, through the replay driver", bold=True)
    files = []
    for arm in study.arms:
        sink = SpanSink(otlp_file=str(runs_dir / f"{arm}.otlp.jsonl"))
        config = StudyConfig(f"{STUDY_PREFIX}{arm}", perturbations=tuple(perturbations), repeats=repeats, concurrency=concurrency,
                             budget_usd=1.00, state_dir=states_beside(store.path) / arm, sink=sink,
                             grace_s=1.0)  # in-process agents export through the sink as each trial ends
        adapter = study.adapter(arm)
        try:
            prepared = open_study(config, tasks, adapter)
            with click.progressbar(length=len(prepared.plan.trials), label=f"{study.service(arm):<28}") as bar:
                summary = prepared.run(on_record=lambda *_: bar.update(1))
        finally:
            adapter.close()
            sink.close()
        click.echo(summary.render())
        files.append(str(sink.otlp_file))
    click.echo(render_summary(ingest_files(store, files)))


def _check_certify_gate(study: DemoStudy, store: Store, runs_dir: Path, min_bound: float) -> Path:
    """Conformance, certificate and gate over the demo's replayed runs; returns the certificate's path."""
    from plumbline_otel.analyse import conformance
    from plumbline_otel.report import build_certificate
    from plumbline_otel.report import render_text as render_certificate
    from plumbline_otel.spec import load_spec

    spec = load_spec(study.spec_path)
    click.secho(f"\n6. Conformance: every replayed run against {study.spec_path.name}", bold=True)
    summary = conformance.check(spec, store.trajectories(runs=_DEMO_RUNS), store)
    click.echo(conformance.render_text(summary))
    click.secho("7. Certificate: critical conformance per agent and perturbation", bold=True)
    cert = build_certificate(spec, store.trajectories(runs=_DEMO_RUNS), target=min_bound, keys=store.study_keys())
    cert_path = runs_dir / "certificate.json"
    cert_path.write_text(cert.to_json())
    click.echo(render_certificate(cert))
    from plumbline_otel.report import gate_verdict

    verdict = gate_verdict(cert, min_bound)
    click.secho(f"8. Gate: `plumbline gate {cert_path} --min-bound {min_bound}` → {verdict.verdict} "
                f"(exit {verdict.exit_code}); `plumbline plan --target {min_bound}` says how many distinct tasks a cell needs.", bold=True)
    click.echo(verdict.lines[-1] if verdict.verdict == "INCONCLUSIVE" else verdict.lines[0])
    return cert_path


@click.command()
@click.option("--db", default="demo.duckdb", show_default=True, help="DuckDB file to create (replaced if it exists).")
@click.option("--show", default=5, show_default=True, help="How many sample trajectories to print.")
@click.option("--runs-dir", default="demo-runs", show_default=True, help="Where the study's traces and certificate go.")
@click.option("--repeats", default=2, show_default=True, type=click.IntRange(1), help="Trials per invoice, agent and perturbation.")
@click.option("--concurrency", default=4, show_default=True, type=click.IntRange(1, 64), help="Trials in flight per agent.")
@click.option("--min-bound", default=0.95, show_default=True, help="The gate's threshold.")
@click.option("--samples-only", is_flag=True, help="Skip the accounts-payable study.")
def demo(db: str, show: int, runs_dir: str, repeats: int, concurrency: int, min_bound: float, samples_only: bool) -> None:
    """Ingest the bundled sample traces, then replay, check and certify the reference agents."""
    runs = Path(runs_dir)
    for stale in (Path(db), Path(f"{db}.wal"), *runs.glob("*.otlp.jsonl")):
        stale.unlink(missing_ok=True)
    shutil.rmtree(states_beside(db), ignore_errors=True)  # a fresh study each time, not a refused re-run
    runs.mkdir(parents=True, exist_ok=True)
    collect_less_often()
    with Store(db) as store:
        _samples(store, show)
        if samples_only:
            return
        study = domain_plugin(DEMO_DOMAIN).demo
        if study is None:
            raise ConfigError(f"domain {DEMO_DOMAIN} has no demo study")
        tasks = _traffic(study, store, runs)
        _replay(study, store, runs, tasks, repeats, concurrency)
        cert_path = _check_certify_gate(study, store, runs, min_bound)
        report = write_report(store.path, cert_path, runs / "report.html")
        click.secho(f"\n9. Report: open {report.resolve()} in a browser (the interval chart, violations, and the agents' runs side by side)", bold=True)
