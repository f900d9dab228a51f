"""`plumbline compare A B`: does agent B act like agent A (effect paths, outcomes, conformance)?"""

from __future__ import annotations

import json

import click

from plumbline_otel.cli.options import keys_option, parse_since, since_option, sources, stores_option, study_keys, warn_misrouted


@click.command("compare")
@click.argument("a")
@click.argument("b")
@stores_option
@keys_option
@click.option("--spec", "spec_path", default=None, type=click.Path(exists=True, dir_okay=False),
              help="invariant spec: effect_tools, argument types, and the paired conformance test")
@click.option("--study", default=None, help="only runs whose plumbline.study is this")
@since_option
@click.option("--consistency", "with_consistency", is_flag=True, help="also report each agent's consistency per task")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
def compare(a: str, b: str, db: tuple[str, ...], server: tuple[str, ...], spec_path: str | None, study: str | None, since: str | None,
            with_consistency: bool, fmt: str) -> None:
    """Compare agent B with agent A (service names, or service@version) on the same tasks and variants."""
    from plumbline_otel.analyse import consistency as cons
    from plumbline_otel.analyse.equivalence import equivalence, render_text
    from plumbline_otel.runs import STUDY
    from plumbline_otel.spec import load_spec

    spec = load_spec(spec_path) if spec_path else None
    since_ns = parse_since(since)
    stores = sources(db, server, assemble=True)  # runs pair by task across stores: all are read first
    runs = [t for t in stores.trajectories(since_ns=since_ns) if study is None or str(t.context.get(STUDY, "")) == study]
    warn_misrouted(stores)
    report = equivalence(runs, a, b, spec, study_keys(stores))
    tasks = cons.consistency([t for t in runs if _is(t, a) or _is(t, b)], spec) if with_consistency else []
    if fmt == "json":
        out = report.as_dict()
        if with_consistency:
            out["consistency"] = {"summary": cons.summarise(tasks), "tasks": [t.as_dict() for t in tasks]}
        click.echo(json.dumps(out, indent=2, default=str))
        return
    click.echo(render_text(report))
    if with_consistency:
        click.echo("")
        click.echo(cons.render_text(tasks))


def _is(t, agent: str) -> bool:  # type: ignore[no-untyped-def]
    return agent in (t.service, f"{t.service}@{t.service_version}")
