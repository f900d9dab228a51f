"""`plumbline certify`: a certificate for an agent's stored runs against a spec.

Besides `--out`, the certificate is kept in the store it was read from (the file, or the one server
through its API), where the console shows the latest one; `--no-store` keeps it only in `--out`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import click

from plumbline_otel.cli.check import open_store
from plumbline_otel.cli.options import keys_option, sources, stores_option, study_keys, warn_misrouted
from plumbline_otel.cli.progress import Progress
from plumbline_otel.store import CertificateRow


@click.command("certify")
@click.option("--spec", "spec_path", required=True, type=click.Path(exists=True, dir_okay=False), help="invariant spec (YAML)")
@stores_option
@keys_option
@click.option("--agent", default=None, help="only runs of this service (or service@version)")
@click.option("--study", default=None, help="only runs whose plumbline.study is this")
@click.option("--target", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=0.95, show_default=True,
              help="the lower bound a gate will require (sets the runs each cell needs)")
@click.option("--out", "out", required=True, type=click.Path(dir_okay=False), help="where to write the certificate JSON")
@click.option("--format", "fmt", type=click.Choice(["text", "json", "none"]), default="text", show_default=True,
              help="what to print besides writing --out")
@click.option("--emit", "emit_url", default=None, metavar="URL",
              help="also send each cell and scored run as an OTel gen_ai.evaluation.result log event (grpc://HOST:PORT or http://HOST:PORT)")
@click.option("--store/--no-store", "keep", default=True, show_default=True,
              help="also keep the certificate in the store read (with one --server, the served store): the console shows it")
def certify(spec_path: str, db: tuple[str, ...], server: tuple[str, ...], agent: str | None, study: str | None, target: float,
            out: str, fmt: str, emit_url: str | None = None, keep: bool = True) -> None:
    """Certify critical conformance per agent and perturbation; headline = min lower 95% bound."""
    from plumbline_otel.report import build_certificate, render_text
    from plumbline_otel.spec import load_spec

    spec = load_spec(spec_path)
    runs: list[Any] = []  # kept for --emit, which sends one event per scored run
    progress = Progress("certifying", unit="runs", quiet=fmt == "json")  # a count, then a bar once the store's size is known

    def kept(trajectories: Iterable[Any]) -> Iterator[Any]:
        for t in trajectories:
            if emit_url:
                runs.append(t)
            progress.advance()
            yield t

    # Read every service: a replay study's records carry the driver's agent label, which decides a trial with no run.
    stores = sources(db, server, assemble=True)
    keys = study_keys(stores)
    if stores.single_db is None:  # per-(agent, perturbation, task) runs from every store, as one store would hold them
        with progress:
            cert = build_certificate(spec, kept(stores.trajectories()), agent=agent, study=study, target=target, keys=keys)
        warn_misrouted(stores)
        if keep and len(stores.servers) == 1 and not stores.dbs:
            from plumbline_otel.api.client import PlumblineClient

            with PlumblineClient(stores.servers[0]) as client:
                client.store_certificate(cert.to_dict())
            click.echo(f"(certificate kept by the server at {stores.servers[0]}: its console shows it)", err=True)
    else:
        with open_store(stores.single_db) as store, progress:
            progress.stage("assembling")
            store.assemble()
            progress.update(0, store.trajectories_built_since(0))  # every stored run
            progress.stage("certifying")
            cert = build_certificate(spec, kept(store.trajectories()), agent=agent, study=study, target=target, keys=keys)
            if keep:
                head, filters = cert.headline, cert.provenance.filters
                store.store_certificate(CertificateRow(cert.spec.hash, filters.study, filters.agent, head.verdict, head.lower_bound),
                                        json.dumps(cert.to_dict()))
    Path(out).write_text(cert.to_json(), encoding="utf-8")
    if fmt == "text":
        click.echo(render_text(cert))
    elif fmt == "json":
        click.echo(cert.to_json(), nl=False)
    if emit_url:
        from plumbline_otel.evaluation_events import certificate_events, send

        sent = send(emit_url, certificate_events(cert, spec, runs, keys))
        click.echo(f"sent {sent} gen_ai.evaluation.result events to {emit_url}", err=True)
