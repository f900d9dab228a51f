"""`plumbline check`: judge stored runs against a spec and store the violations.

Exit codes: 0 done (violations are findings, not failures, unless --fail-on says otherwise),
1 a PlumblineError (bad spec, store locked), 2 usage, 3 --fail-on tripped.
"""

from __future__ import annotations

import json

import click

from plumbline_otel.cli.options import parse_since, since_option, sources, stores_option, warn_misrouted


def open_store(db: str, read_only: bool = False):  # type: ignore[no-untyped-def]
    """The store, imported late so commands that need none start fast."""
    from plumbline_otel.store import Store

    return Store(db, read_only=read_only)


@click.command("check")
@click.option("--spec", "spec_path", required=True, type=click.Path(exists=True, dir_okay=False), help="invariant spec (YAML)")
@stores_option
@since_option
@click.option("--service", default=None, help="only runs of this service (agent)")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option(
    "--fail-on",
    type=click.Choice(["never", "critical", "major", "minor"]),
    default="never",
    show_default=True,
    help="exit 3 when a violation of this severity or worse was found",
)
def check(spec_path: str, db: tuple[str, ...], server: tuple[str, ...], since: str | None, service: str | None, fmt: str, fail_on: str) -> None:
    """Judge every stored run against the spec; store violations (re-running adds nothing twice)."""
    from plumbline_otel.analyse.conformance import check as run_check
    from plumbline_otel.analyse.conformance import render_text
    from plumbline_otel.spec import SEVERITIES, load_spec

    spec = load_spec(spec_path)
    since_ns = parse_since(since)
    stores = sources(db, server, assemble=True)
    if stores.single_db is None:  # a server holds a store, or there are several: judge the runs here, store nothing
        summary = run_check(spec, stores.trajectories(service=service, since_ns=since_ns))
        click.echo(f"(runs read from {', '.join(stores.names)}; violations are reported, not stored)", err=True)
        warn_misrouted(stores)
    else:
        with open_store(stores.single_db) as store:
            store.assemble()
            summary = run_check(spec, store.trajectories(service=service, since_ns=since_ns), store)
    if fmt == "json":
        click.echo(json.dumps(summary.as_dict(), indent=2, default=str))
    else:
        click.echo(render_text(summary))
    if fail_on != "never":
        worst = SEVERITIES.index(fail_on)
        if any(t.failed for t in summary.invariants.values() if SEVERITIES.index(t.severity) <= worst):
            raise SystemExit(3)
