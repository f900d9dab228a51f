"""`plumbline proxy`: meter and record one agent's model calls, outside a study.

It opens one ad-hoc trial route on the model-API proxy (`replay.proxy`), prints the base URLs to
give the agent (``OPENAI_BASE_URL`` / ``ANTHROPIC_BASE_URL``), serves until Ctrl-C (or
``--seconds``), then prints what it witnessed: calls, usage, exact cost, refusals. Every exchange
goes to ``--cassette``; ``--offline`` answers from it and never calls the provider. Inside a study,
`plumbline replay --proxy` opens one route per attempt instead.
"""

from __future__ import annotations

import json
import time
from typing import Any

import click


@click.command("proxy")
@click.option("--upstream", "upstreams", multiple=True, metavar="PROVIDER=URL",
              help="openai=URL or anthropic=URL (default: OPENAI_BASE_URL / ANTHROPIC_BASE_URL here, then the public API)")
@click.option("--cassette", default="plumbline-cassette.jsonl", show_default=True, help="where every exchange is recorded")
@click.option("--offline", is_flag=True, help="answer only from --cassette; never call the provider")
@click.option("--port", type=click.IntRange(0, 65535), default=0, show_default=True, help="127.0.0.1 port (0: a free one)")
@click.option("--budget-usd", type=click.FloatRange(0), default=None, help="refuse calls past this spend (priced from full usage)")
@click.option("--name", default="adhoc", show_default=True, help="the ad-hoc trial's name (part of the cassette's keys)")
@click.option("--seconds", type=click.FloatRange(0, min_open=True), default=None, help="serve this long, then report (default: until Ctrl-C)")
def proxy(upstreams: tuple[str, ...], cassette: str, offline: bool, port: int, budget_usd: float | None, name: str,
          seconds: float | None) -> None:
    """Meter and record an agent's model calls: point it at the printed base URLs; Ctrl-C prints what it saw."""
    from plumbline_otel.cli.replay import parse_upstreams
    from plumbline_otel.replay import ReplayTask, ResponseCache, SpendCap, Trial, TrialBudget, TrialIdentity
    from plumbline_otel.replay.proxy import ModelProxy

    cap = SpendCap(budget_usd)
    budget = TrialBudget.open(cap, 0.0)
    trial = Trial(TrialIdentity(f"proxy/{name}", study="proxy"), ReplayTask(name, "", name), "")
    server = ModelProxy(parse_upstreams(upstreams), ResponseCache(cassette, "replay" if offline else "record"), port=port)
    server.start()
    try:
        route = server.open_trial(trial, budget)
        click.echo(f"plumbline proxy on {server.url} ({'offline: answers from ' if offline else 'recording to '}{cassette})")
        for key, value in route.env().items():
            click.echo(f"  export {key}={value}")
        click.echo("Ctrl-C to stop and see what it witnessed" if seconds is None else f"serving for {seconds:g}s", err=True)
        _wait(seconds)
        evidence = server.close_trial(route)
    finally:
        server.stop()
    if budget is not None:
        budget.close()
    click.echo(_summary(evidence.as_dict()))


def _wait(seconds: float | None) -> None:
    try:
        time.sleep(seconds) if seconds is not None else _forever()
    except KeyboardInterrupt:
        pass


def _forever() -> None:
    while True:
        time.sleep(3600)


def _summary(seen: dict[str, Any]) -> str:
    cost = "unpriced" if seen["cost_usd"] is None else f"${seen['cost_usd']:.6f}" + ("" if seen["cost_exact"] else " (some usage missing: estimated)")
    lines = [f"witnessed {seen['calls']} model call(s): {seen['upstream_calls']} to the provider, {seen['cache_hits']} from the cassette, "
             f"{seen['refused_budget']} refused by the budget, {seen['refused_offline']} not in the cassette; cost {cost}",
             f"usage {json.dumps(seen['usage'], sort_keys=True)}"]
    if seen["unpriced_models"]:
        lines.append(f"unpriced models: {', '.join(seen['unpriced_models'])}")
    return "\n".join(lines)
