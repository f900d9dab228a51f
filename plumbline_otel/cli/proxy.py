"""`plumbline proxy`: meter and record one agent's model calls, outside a study.

It opens one ad-hoc trial route on the model-API proxy (`replay.proxy`), prints the base URLs to
give the agent (``OPENAI_BASE_URL`` / ``ANTHROPIC_BASE_URL``), serves until Ctrl-C (or
``--seconds``), then prints what it witnessed: calls, usage, exact cost, refusals. Every exchange
goes to ``--cassette``; ``--offline`` answers from it and never calls the provider. Inside a study,
`plumbline replay --proxy` opens one route per attempt instead.

Record mode (``--otlp-file`` or ``--endpoint``): the calls are written as GenAI spans, one trace per
agent conversation (``replay.proxy.record``), with ``--mcp-upstream`` tool calls too, so an agent
with no instrumentation yields traffic that ``plumbline ingest`` stores and ``plumbline replay``
takes tasks from (each run's task: its first user request).
"""

from __future__ import annotations

import json
import signal
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
@click.option("--otlp-file", default=None, help="record mode: write the calls as spans (one run per agent conversation) to this OTLP file")
@click.option("--endpoint", default=None, help="record mode: send those spans to this OTLP endpoint (a running `plumbline serve`)")
@click.option("--endpoint-protocol", type=click.Choice(["grpc", "http/protobuf"]), default=None,
              help="the --endpoint's protocol (default: said by the URL, else asked of the endpoint)")
@click.option("--service", default="untraced-agent", show_default=True, help="record mode: the agent's name (service.name) on the spans")
@click.option("--mcp-upstream", default=None, metavar="URL|COMMAND",
              help="also put the MCP proxy in front of this MCP server (a Streamable HTTP URL or a stdio command); the agent's "
                   "MCP server URL is the printed PLUMBLINE_MCP_URL")
@click.option("--max-request-mib", type=click.FloatRange(0, min_open=True), default=None,
              help="largest request body read (default 32, or PLUMBLINE_PROXY_MAX_REQUEST_MIB)")
@click.option("--max-response-mib", type=click.FloatRange(0, min_open=True), default=None,
              help="largest provider answer held (default 64, or PLUMBLINE_PROXY_MAX_RESPONSE_MIB)")
def proxy(upstreams: tuple[str, ...], cassette: str, offline: bool, port: int, budget_usd: float | None, name: str,
          seconds: float | None, otlp_file: str | None, endpoint: str | None, endpoint_protocol: str | None, service: str,
          mcp_upstream: str | None, max_request_mib: float | None, max_response_mib: float | None) -> None:
    """Meter and record an agent's model calls: point it at the printed base URLs; Ctrl-C prints what it saw."""
    import shlex

    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from plumbline_otel.cli.replay import parse_upstreams
    from plumbline_otel.errors import ConfigError
    from plumbline_otel.replay import ReplayTask, ResponseCache, SpanSink, SpendCap, Trial, TrialBudget, TrialIdentity
    from plumbline_otel.replay.limits import ProxyLimits
    from plumbline_otel.replay.mcp_proxy import McpProxy
    from plumbline_otel.replay.proxy import ModelProxy
    from plumbline_otel.replay.proxy.record import ConversationRecorder

    if otlp_file and endpoint:
        raise ConfigError("record mode: give one of --otlp-file and --endpoint")
    limits = ProxyLimits.from_env().with_mib(request=max_request_mib, response=max_response_mib)
    sink = SpanSink(otlp_file=otlp_file, endpoint=endpoint) if (otlp_file or endpoint) else None
    provider: TracerProvider | None = None
    recorder: ConversationRecorder | None = None
    if sink is not None:
        if endpoint:
            from plumbline_otel.replay.otlp import resolve_endpoint

            resolve_endpoint(endpoint, endpoint_protocol)
        provider = TracerProvider(resource=Resource.create({"service.name": service}))
        provider.add_span_processor(SimpleSpanProcessor(sink.exporter()))
        recorder = ConversationRecorder()
    cap = SpendCap(budget_usd)
    budget = TrialBudget.open(cap, 0.0)
    trial = Trial(TrialIdentity(f"proxy/{name}", study="proxy"), ReplayTask(name, "", name), "")
    server = ModelProxy(parse_upstreams(upstreams), ResponseCache(cassette, "replay" if offline else "record"), port=port,
                        tracer_provider=provider, limits=limits, recorder=recorder)
    tools: McpProxy | None = None
    if mcp_upstream:
        upstream = mcp_upstream if mcp_upstream.startswith(("http://", "https://")) else shlex.split(mcp_upstream)
        tools = McpProxy(upstream, tracer_provider=provider, limits=limits, recorder=recorder)
    server.start()
    try:
        if tools is not None:
            tools.start()
        route = server.open_trial(trial, budget)
        mcp_route = tools.open_trial(trial) if tools is not None else None
        click.echo(f"plumbline proxy on {server.url} ({'offline: answers from ' if offline else 'recording to '}{cassette})")
        if sink is not None:
            click.echo(f"record mode: every agent conversation becomes a run in {sink.describe()} (service {service})")
        for key, value in {**route.env(), **(mcp_route.env() if mcp_route is not None else {})}.items():
            click.echo(f"  export {key}={value}")
        click.echo("Ctrl-C to stop and see what it witnessed" if seconds is None else f"serving for {seconds:g}s", err=True)
        _wait(seconds)
        evidence = server.close_trial(route)
        tool_evidence = tools.close_trial(mcp_route) if tools is not None and mcp_route is not None else None
    finally:
        server.stop()
        if tools is not None:
            tools.stop()
        if provider is not None:
            provider.shutdown()
        if sink is not None:
            sink.close()
    if budget is not None:
        budget.close()
    click.echo(_summary(evidence.as_dict()))
    if tool_evidence is not None:
        click.echo(f"witnessed {tool_evidence.calls} tool call(s) through the MCP proxy")
    if recorder is not None:
        where = otlp_file if otlp_file else "the endpoint's store"
        click.echo(f"recorded {recorder.conversations} agent conversation(s); next: plumbline ingest {otlp_file} --db traffic.duckdb"
                   if otlp_file else f"recorded {recorder.conversations} agent conversation(s) into {where}")


def _wait(seconds: float | None) -> None:
    """Serve for ``seconds``, or until Ctrl-C (SIGINT, honoured even when a background launcher left it ignored)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
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
    for failure in seen.get("provider_failures") or []:
        lines.append(f"provider failed on call {failure['call']} ({failure['kind']}): {failure['detail']}")
    for error in seen.get("proxy_errors") or []:
        lines.append(f"proxy error on call {error['call']} ({error['kind']}): {error['detail']}")
    return "\n".join(lines)
