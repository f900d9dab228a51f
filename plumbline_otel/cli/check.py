"""`plumbline check`: judge stored runs against a spec and store the violations.

On a file the violations go into the file; against one running server (`--server HOST:PORT`) they
are sent to it through its API (`StoreCheck`) and its console shows them at once. Either way the
store also keeps which runs were judged, so a page can say "conforming" rather than "not checked".
Read from several stores at once, the violations are reported and not stored (check each alone).

Exit codes: 0 done (violations are findings, not failures, unless --fail-on says otherwise),
1 a PlumblineError (bad spec, store locked), 2 usage, 3 --fail-on tripped.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

from plumbline_otel.cli.options import parse_since, since_option, sources, stores_option, warn_misrouted

if TYPE_CHECKING:
    from plumbline_otel.store import Store


def open_store(db: str, read_only: bool = False) -> Store:
    """The store, imported late so commands that need none start fast."""
    from plumbline_otel.store import Store

    return Store(db, read_only=read_only)


class _Keeper:
    """Where `conformance.check` writes each batch: the store file, or the one server through its API; and which runs were judged."""

    def __init__(self, write: Any, record: Any) -> None:
        self._write, self._record = write, record

    def write_violations(self, spec_hash: str, checked: list[str], rows: list[tuple[Any, ...]]) -> int:
        written = int(self._write(spec_hash, checked, rows))
        self._record(checked)
        return written


def _left_out(stores: Any) -> dict[str, Any]:
    """What a read of several stores (a lake's instances) left out of the runs judged: misrouted traces, by id and stores."""
    if not stores.misrouted:
        return {}
    return {"misrouted_traces": [{"trace_id": m.trace_id, "stores": list(m.stores)} for m in stores.misrouted]}


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
@click.option("--store/--no-store", "keep", default=True, show_default=True,
              help="keep the violations (and which runs were judged) in the store, or, with one --server, in the served store")
def check(spec_path: str, db: tuple[str, ...], server: tuple[str, ...], since: str | None, service: str | None, fmt: str, fail_on: str,
          keep: bool = True) -> None:
    """Judge every stored run against the spec; store violations (re-running adds nothing twice)."""
    from plumbline_otel.analyse.conformance import check as run_check
    from plumbline_otel.analyse.conformance import render_text
    from plumbline_otel.spec import SEVERITIES, load_spec

    spec = load_spec(spec_path)
    since_ns = parse_since(since)
    stores = sources(db, server, assemble=True)
    if len(stores.servers) == 1 and not stores.dbs and keep:  # one server: judged here, kept there
        from plumbline_otel.api.client import PlumblineClient

        with PlumblineClient(stores.servers[0]) as client:
            keeper = _Keeper(lambda h, checked, rows: client.store_check(h, spec.name, spec_path, checked, rows), lambda _ids: None)
            summary = run_check(spec, stores.trajectories(service=service, since_ns=since_ns), keeper, batch=2000)
            if summary.runs == 0:  # still say the spec was checked, so the console shows "no runs", not "run check"
                client.store_check(spec.hash, spec.name, spec_path, [], [])
        click.echo(f"(violations kept by the server at {stores.servers[0]}: its console shows them)", err=True)
    elif stores.single_db is None:  # several stores, or --no-store: judge the runs here, store nothing
        summary = run_check(spec, stores.trajectories(service=service, since_ns=since_ns))
        why = "--no-store" if not keep else "read from several stores; check each alone to keep its violations"
        click.echo(f"(runs read from {', '.join(stores.names)}; violations are reported, not stored: {why})", err=True)
        warn_misrouted(stores)
    else:
        with open_store(stores.single_db) as store:
            store.assemble()
            if keep:
                keeper = _Keeper(store.write_violations,
                                 lambda ids: store.record_check(spec.hash, spec.name, spec_path, ids))
                summary = run_check(spec, store.trajectories(service=service, since_ns=since_ns), keeper)
                if summary.runs == 0:
                    store.record_check(spec.hash, spec.name, spec_path, [])
            else:
                summary = run_check(spec, store.trajectories(service=service, since_ns=since_ns))
    left_out = _left_out(stores)
    if fmt == "json":
        click.echo(json.dumps({**summary.as_dict(), **left_out}, indent=2, default=str))
    else:
        click.echo(render_text(summary))
        if left_out:  # the runs judged are fewer than the stores hold: say which were not, as every other reader does
            click.echo(stores.notice() or "")
    if fail_on != "never":
        worst = SEVERITIES.index(fail_on)
        if any(t.failed for t in summary.invariants.values() if SEVERITIES.index(t.severity) <= worst):
            raise SystemExit(3)
