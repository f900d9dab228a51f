"""The MCP proxy with a real MCP server behind it and the SDK's real client as the agent.

The upstream is a tiny MCP-SDK server (``lookup_invoice`` and ``pay``) that logs every call it
executes to a file, run over stdio (launched by the proxy) and over Streamable HTTP (its own
process on 127.0.0.1). The agent is ``mcp.Client`` (a ``ClientSession`` over Streamable HTTP) in
both protocol eras: the 2026-07-28 single exchange (``auto``) and the initialize handshake
(``legacy``). Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from waits import EVENT_DEADLINE_S

from plumbline_otel.errors import ConfigError
from plumbline_otel.replay.adapters import Trial
from plumbline_otel.replay.identity import FaultPlan, TrialIdentity
from plumbline_otel.replay.mcp_proxy import McpEvidence, McpProxy, McpRoute
from plumbline_otel.replay.perturb import DECOY_TOOLS
from plumbline_otel.replay.tasks import ReplayTask

pytestmark = pytest.mark.slow

SERVER = textwrap.dedent('''
    import json, os, socket, sys

    import anyio
    import uvicorn
    from mcp.server.mcpserver import MCPServer

    LOG = os.environ["UPSTREAM_LOG"]
    app = MCPServer("billing")

    def _log(tool, args):
        with open(LOG, "a") as f:
            f.write(json.dumps({"tool": tool, "args": args}) + "\\n")

    @app.tool()
    def lookup_invoice(invoice_id: str) -> dict:
        """Look up an invoice by id."""
        _log("lookup_invoice", {"invoice_id": invoice_id})
        return {"invoice_id": invoice_id, "amount": 120.5, "payee": "ACME"}

    @app.tool()
    def pay(invoice_id: str, amount: float) -> str:
        """Pay an invoice."""
        _log("pay", {"invoice_id": invoice_id, "amount": amount})
        return f"paid {amount} on {invoice_id}"

    @app.resource("invoices://open")
    def open_invoices() -> str:
        """The open invoices."""
        return "INV-7"

    @app.prompt()
    def pay_prompt(invoice_id: str) -> str:
        """Ask to pay an invoice."""
        return f"Please pay {invoice_id}."

    if sys.argv[1:] == ["http"]:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)
        print(sock.getsockname()[1], flush=True)
        anyio.run(uvicorn.Server(uvicorn.Config(app.streamable_http_app(), log_level="warning")).serve, [sock])
    else:
        app.run("stdio")
''')

TASK = ReplayTask("INV-7", "Pay invoice INV-7.", "src-7", tools=("lookup_invoice", "pay"))
DECOY: dict[str, Any] = DECOY_TOOLS[0]  # search_knowledge_base
PAY_FAULT = FaultPlan("pay", "503", on_call=1, times=1)


def make_trial(k: int, fault: FaultPlan | None = None, decoys: tuple[dict[str, Any], ...] = (), attempt: int = 1) -> Trial:
    perturbation = "tool_fault" if fault else ("decoy_tools" if decoys else "baseline")
    identity = TrialIdentity(f"s/INV-7/{perturbation}/0/k{k}", perturbation, "0", "s", k, "INV-7", attempt=attempt, fault=fault)
    metadata: dict[str, Any] = {"decoy_tools": [dict(d) for d in decoys]} if decoys else {}
    return Trial(identity, TASK, TASK.input, metadata, fault=fault)


class Upstream:
    """The server's own record of what it executed."""

    def __init__(self, log: Path) -> None:
        self.log = log

    def calls(self, invoice_id: str) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        rows = [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]
        return [r for r in rows if r["args"].get("invoice_id") == invoice_id]


@pytest.fixture(scope="module")
def spans() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture(scope="module")
def provider(spans: InMemorySpanExporter) -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    return provider


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("mcp_upstream")
    (path / "server.py").write_text(SERVER)
    return path


@pytest.fixture(scope="module")
def stdio_proxy(workdir: Path, provider: TracerProvider) -> Iterator[tuple[McpProxy, Upstream]]:
    log = workdir / "stdio_calls.jsonl"
    with open(workdir / "stdio_server.err", "w") as errlog:
        proxy = McpProxy([sys.executable, str(workdir / "server.py")], env={"UPSTREAM_LOG": str(log)}, tracer_provider=provider,
                         errlog=errlog, timeout_s=EVENT_DEADLINE_S, start_timeout_s=EVENT_DEADLINE_S)
        proxy.start()
        try:
            yield proxy, Upstream(log)
        finally:
            proxy.stop()


@pytest.fixture(scope="module")
def http_proxy(workdir: Path, provider: TracerProvider) -> Iterator[tuple[McpProxy, Upstream]]:
    log = workdir / "http_calls.jsonl"
    with open(workdir / "http_server.err", "w") as errlog:
        server = subprocess.Popen([sys.executable, str(workdir / "server.py"), "http"], stdout=subprocess.PIPE, stderr=errlog,
                                  text=True, env={**os.environ, "UPSTREAM_LOG": str(log)})
        try:
            assert server.stdout is not None
            line: list[str] = []
            reader = threading.Thread(target=lambda: line.append(server.stdout.readline()), daemon=True)  # type: ignore[union-attr]
            reader.start()
            reader.join(EVENT_DEADLINE_S)  # ends with the port line: importing the SDK takes long under load
            assert line and line[0].strip().isdigit(), "the HTTP MCP server did not report its port"
            proxy = McpProxy(f"http://127.0.0.1:{int(line[0])}/mcp", tracer_provider=provider, timeout_s=EVENT_DEADLINE_S, start_timeout_s=EVENT_DEADLINE_S)
            proxy.start()
            try:
                yield proxy, Upstream(log)
            finally:
                proxy.stop()
        finally:
            server.terminate()
            server.wait(EVENT_DEADLINE_S)
            if server.stdout is not None:
                server.stdout.close()


@pytest.fixture(params=["stdio", "http"])
def proxied(request: pytest.FixtureRequest) -> tuple[McpProxy, Upstream]:
    return request.getfixturevalue(f"{request.param}_proxy")


def run(coro: Any, timeout: float = EVENT_DEADLINE_S) -> Any:
    async def bounded() -> Any:
        return await asyncio.wait_for(coro, timeout)
    return asyncio.run(bounded())


def text(result: Any) -> str:
    return " ".join(getattr(c, "text", "") for c in result.content)


async def pay_twice(url: str, mode: str, invoice: str) -> dict[str, Any]:
    """The agent: list the tools, pay twice (amounts 1 and 2), call the decoy, look the invoice up."""
    async with Client(url, mode=mode) as client:
        listed = await client.list_tools()
        first = await client.call_tool("pay", {"invoice_id": invoice, "amount": 1})
        second = await client.call_tool("pay", {"invoice_id": invoice, "amount": 2})
        decoy = await client.call_tool(DECOY["name"], {"query": invoice})
        lookup = await client.call_tool("lookup_invoice", {"invoice_id": invoice})
        return {"tools": [t.name for t in listed.tools], "first": first, "second": second, "decoy": decoy, "lookup": lookup,
                "protocol": client.protocol_version}


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_tool_fault_fails_the_planned_call_without_the_server_and_decoys_are_offered(proxied, mode):
    proxy, upstream = proxied
    invoice = f"INV-{mode}-{'http' if isinstance(proxy.upstream, str) else 'stdio'}"
    route = proxy.open_trial(make_trial(0, PAY_FAULT, (DECOY,)))
    assert route.url.startswith(proxy.url + "/t/") and route.url.endswith("/mcp")
    assert route.env() == {"PLUMBLINE_MCP_URL": route.url}
    try:
        out = run(pay_twice(route.url, mode, invoice))
    finally:
        evidence = proxy.close_trial(route)
    assert out["protocol"] == ("2026-07-28" if mode == "auto" else "2025-11-25")
    assert out["tools"] == ["lookup_invoice", "pay", DECOY["name"]]
    # call 1 of pay: the plan's error, and the server never saw it (its own log has only amount 2)
    assert out["first"].is_error and text(out["first"]) == PAY_FAULT.error_message
    assert not out["second"].is_error and text(out["second"]) == f"paid 2.0 on {invoice}"
    assert [c["args"]["amount"] for c in upstream.calls(invoice) if c["tool"] == "pay"] == [2.0]
    # the decoy: an error result, never forwarded
    assert out["decoy"].is_error and DECOY["name"] in text(out["decoy"])
    assert [c["tool"] for c in upstream.calls(invoice)] == ["pay", "lookup_invoice"]
    assert not out["lookup"].is_error and json.loads(text(out["lookup"]))["payee"] == "ACME"
    assert out["second"].structured_content == {"result": f"paid 2.0 on {invoice}"}  # structured results pass through

    assert isinstance(evidence, McpEvidence)
    assert evidence.faults == ({"tool": "pay", "call": 1, "error": PAY_FAULT.error_message},)
    assert evidence.fault_fired and evidence.decoy_called
    assert evidence.calls == 4 and evidence.calls_by_tool == {"pay": 2, DECOY["name"]: 1, "lookup_invoice": 1}
    assert evidence.upstream_calls == 2 and evidence.upstream_errors == 0
    assert evidence.decoys_offered == (DECOY["name"],) and evidence.decoys_called == ({"tool": DECOY["name"], "call": 1},)
    assert evidence.lists >= 1 and evidence.unroutable == 0
    as_dict = evidence.as_dict()
    loaded = json.loads(json.dumps(as_dict))
    assert loaded == as_dict and loaded["faults"][0]["call"] == 1


def test_fault_times_and_on_call_count_calls_of_the_planned_tool_only(stdio_proxy):
    proxy, upstream = stdio_proxy
    plan = FaultPlan("lookup_invoice", "timeout", on_call=2, times=2)
    route = proxy.open_trial(make_trial(1, plan))

    async def agent() -> list[bool]:
        async with Client(route.url) as client:
            out = []
            for n in range(4):
                await client.call_tool("pay", {"invoice_id": "INV-times", "amount": n})
                out.append((await client.call_tool("lookup_invoice", {"invoice_id": "INV-times"})).is_error)
            return out

    try:
        assert run(agent()) == [False, True, True, False]
    finally:
        evidence = proxy.close_trial(route)
    assert [f["call"] for f in evidence.faults] == [2, 3] and {f["error"] for f in evidence.faults} == {plan.error_message}
    assert len([c for c in upstream.calls("INV-times") if c["tool"] == "lookup_invoice"]) == 2
    assert evidence.decoys_offered == () and evidence.upstream_calls == 6


def test_spans_carry_arguments_results_and_the_fault_under_the_trials_trace(stdio_proxy, spans):
    proxy, _ = stdio_proxy
    trial = make_trial(2, PAY_FAULT, (DECOY,))
    route = proxy.open_trial(trial)
    spans.clear()
    try:
        run(pay_twice(route.url, "auto", "INV-span"))
    finally:
        proxy.close_trial(route)
    mine = [s for s in spans.get_finished_spans() if s.attributes and s.attributes.get("plumbline.trial.id") == trial.trial_id]
    assert [s.name for s in mine] == ["tools/call pay", "tools/call pay", f"tools/call {DECOY['name']}", "tools/call lookup_invoice"]
    identity = trial.identity
    for span in mine:
        assert span.context.trace_id == int(identity.trace_id, 16)
        assert span.parent is not None and span.parent.span_id == int(identity.parent_span_id, 16)
        attrs = span.attributes
        assert attrs["gen_ai.operation.name"] == "execute_tool" and attrs["mcp.method.name"] == "tools/call"
        assert attrs["gen_ai.tool.name"] == span.name.split(" ", 1)[1]
        assert attrs["plumbline.fault.tool"] == "pay" and attrs["plumbline.trial.attempt"] == 1
        assert attrs["mcp.protocol.version"] == "2026-07-28" and "jsonrpc.request.id" in attrs
        assert span.end_time >= span.start_time
    faulted, paid, decoy, lookup = mine
    assert json.loads(faulted.attributes["gen_ai.tool.call.arguments"]) == {"invoice_id": "INV-span", "amount": 1}
    assert faulted.status.status_code is StatusCode.ERROR and faulted.attributes["error.type"] == "tool_error"
    assert faulted.attributes["plumbline.fault.injected"] is True and faulted.attributes["plumbline.fault.source"] == "mcp_proxy"
    assert faulted.attributes["plumbline.mcp.source"] == "fault" and faulted.attributes["plumbline.mcp.call"] == 1
    assert json.loads(faulted.attributes["gen_ai.tool.call.result"])["content"][0]["text"] == PAY_FAULT.error_message
    assert paid.status.status_code is StatusCode.UNSET and "plumbline.fault.injected" not in paid.attributes
    assert json.loads(paid.attributes["gen_ai.tool.call.result"])["structuredContent"] == {"result": "paid 2.0 on INV-span"}
    assert paid.attributes["plumbline.mcp.call"] == 2 and paid.attributes["plumbline.mcp.source"] == "upstream"
    assert decoy.attributes["plumbline.mcp.source"] == "decoy" and decoy.status.status_code is StatusCode.ERROR
    result = json.loads(lookup.attributes["gen_ai.tool.call.result"])
    assert json.loads(result["content"][0]["text"]) == {"invoice_id": "INV-span", "amount": 120.5, "payee": "ACME"} and not result["isError"]


def test_unroutable_requests_are_refused_and_counted(stdio_proxy):
    proxy, upstream = stdio_proxy
    route = proxy.open_trial(make_trial(3))
    before = proxy.unroutable
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "pay", "arguments": {"invoice_id": "INV-lost", "amount": 9}}}
    headers = {"accept": "application/json, text/event-stream", "mcp-protocol-version": "2025-11-25"}
    try:
        for url in (f"{proxy.url}/t/not-a-route/mcp", proxy.bare_url):
            answer = httpx.post(url, json=body, headers=headers, timeout=EVENT_DEADLINE_S)
            assert answer.status_code == 403
            assert answer.json()["error"]["code"] == -32001 and "no open trial" in answer.json()["error"]["message"]
        bad_baggage = httpx.post(proxy.bare_url, json=body, headers={**headers, "baggage": "plumbline.trial.id=nope,plumbline.trial.attempt=1"},
                                 timeout=EVENT_DEADLINE_S)
        assert bad_baggage.status_code == 403 and "not open" in bad_baggage.json()["error"]["message"]
        with pytest.raises(Exception):  # noqa: B017 - the SDK's client raises what its transport makes of a 403
            run(pay_twice(f"{proxy.url}/t/not-a-route/mcp", "auto", "INV-lost"), timeout=EVENT_DEADLINE_S)
        assert httpx.get(f"{proxy.url}/elsewhere", timeout=EVENT_DEADLINE_S).status_code == 404
    finally:
        evidence = proxy.close_trial(route)
    assert proxy.unroutable - before >= 4 and evidence.unroutable >= 4 and evidence.calls == 0
    assert upstream.calls("INV-lost") == []
    assert any("not-a-route"[:6] in reason for reason in proxy.unroutable_reasons)
    # a closed route is unroutable too: a straggler is never counted in the attempt's evidence
    assert httpx.post(route.url, json=body, headers=headers, timeout=EVENT_DEADLINE_S).status_code == 403


def test_baggage_routes_a_request_on_the_bare_url(stdio_proxy):
    proxy, upstream = stdio_proxy
    trial = make_trial(4, PAY_FAULT)
    route = proxy.open_trial(trial)

    async def agent() -> Any:
        http = httpx2.AsyncClient(headers={"baggage": trial.identity.baggage()}, timeout=EVENT_DEADLINE_S)
        async with http, Client(streamable_http_client(proxy.bare_url, http_client=http)) as client:
            return await client.call_tool("pay", {"invoice_id": "INV-bag", "amount": 5})

    try:
        result = run(agent())
    finally:
        evidence = proxy.close_trial(route)
    assert result.is_error and text(result) == PAY_FAULT.error_message
    assert evidence.faults[0]["call"] == 1 and evidence.calls == 1 and upstream.calls("INV-bag") == []


def test_two_trials_at_once_keep_their_evidence_apart(http_proxy):
    proxy, upstream = http_proxy
    faulted = proxy.open_trial(make_trial(5, PAY_FAULT))
    decoyed = proxy.open_trial(make_trial(6, None, (DECOY, DECOY_TOOLS[1])))

    async def agent(route: McpRoute, invoice: str, calls: int) -> list[bool]:
        async with Client(route.url) as client:
            tools = [t.name for t in (await client.list_tools()).tools]
            out = [await client.call_tool("pay", {"invoice_id": invoice, "amount": n}) for n in range(calls)]
            if DECOY["name"] in tools:
                out.append(await client.call_tool(DECOY["name"], {"query": invoice}))
            return [r.is_error for r in out]

    async def both() -> tuple[list[bool], list[bool]]:
        a, b = await asyncio.gather(agent(faulted, "INV-a", 3), agent(decoyed, "INV-b", 3))
        return a, b

    try:
        a, b = run(both())
    finally:
        ea, eb = proxy.close_trial(faulted), proxy.close_trial(decoyed)
    assert a == [True, False, False] and b == [False, False, False, True]
    assert ea.faults == ({"tool": "pay", "call": 1, "error": PAY_FAULT.error_message},) and eb.faults == ()
    assert ea.decoys_offered == () and ea.decoys_called == ()
    assert eb.decoys_offered == (DECOY["name"], DECOY_TOOLS[1]["name"]) and [d["tool"] for d in eb.decoys_called] == [DECOY["name"]]
    assert ea.calls_by_tool == {"pay": 3} and eb.calls_by_tool == {"pay": 3, DECOY["name"]: 1}
    assert ea.upstream_calls == 2 and eb.upstream_calls == 3
    assert len(upstream.calls("INV-a")) == 2 and len(upstream.calls("INV-b")) == 3


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_resources_and_prompts_pass_through_unchanged(stdio_proxy, mode):
    proxy, _ = stdio_proxy
    route = proxy.open_trial(make_trial(9, PAY_FAULT, (DECOY,)))

    async def agent() -> tuple[list[str], str, list[str], str]:
        async with Client(route.url, mode=mode) as client:
            resources = [str(r.uri) for r in (await client.list_resources()).resources]
            read = await client.read_resource("invoices://open")
            prompts = [p.name for p in (await client.list_prompts()).prompts]
            prompt = await client.get_prompt("pay_prompt", {"invoice_id": "INV-9"})
            return resources, getattr(read.contents[0], "text", ""), prompts, getattr(prompt.messages[0].content, "text", "")

    try:
        resources, body, prompts, prompt = run(agent())
    finally:
        evidence = proxy.close_trial(route)
    assert (resources, body, prompts, prompt) == (["invoices://open"], "INV-7", ["pay_prompt"], "Please pay INV-9.")
    assert evidence.passthrough == 4 and evidence.calls == 0 and evidence.faults == ()


def test_routes_are_per_attempt_and_the_proxy_refuses_what_it_cannot_serve(stdio_proxy):
    proxy, _ = stdio_proxy
    route = proxy.open_trial(make_trial(7))
    with pytest.raises(ConfigError, match="already has an open"):
        proxy.open_trial(make_trial(7))
    second = proxy.open_trial(make_trial(7, attempt=2))
    assert second.token != route.token and second.attempt == 2
    proxy.close_trial(route)
    proxy.close_trial(second)
    with pytest.raises(ConfigError, match="no open MCP proxy route"):
        proxy.close_trial(route)
    with pytest.raises(ConfigError, match="has no name"):
        proxy.open_trial(make_trial(8, None, ({"description": "nameless"},)))
    with pytest.raises(ConfigError, match="loopback"):
        McpProxy("http://127.0.0.1:1/mcp", host="0.0.0.0")
    with pytest.raises(ConfigError, match="stdio server command"):
        McpProxy("python server.py")
    with pytest.raises(ConfigError, match="empty"):
        McpProxy([])


def test_an_upstream_that_cannot_start_fails_start_quickly(tmp_path):
    started = time.monotonic()
    with open(tmp_path / "err", "w") as errlog:
        proxy = McpProxy([sys.executable, "-c", "import sys; sys.exit(3)"], start_timeout_s=600, errlog=errlog)
        with pytest.raises(ConfigError, match="cannot connect to upstream"):
            proxy.start()
    assert time.monotonic() - started < 300  # failed when the upstream exited, far from its 600 s start timeout (however loaded)
    proxy.stop()  # idempotent after a failed start


def test_an_upstream_that_never_answers_is_given_up_on(tmp_path):
    def loops() -> int:
        return len([t for t in threading.enumerate() if t.name == "plumbline-mcp-proxy"])

    before, started = loops(), time.monotonic()
    with open(tmp_path / "err", "w") as errlog:
        proxy = McpProxy([sys.executable, "-c", "import time; time.sleep(300)"], start_timeout_s=1, errlog=errlog)
        with pytest.raises(ConfigError, match="not ready within 1s"):
            proxy.start()
    assert time.monotonic() - started < 200  # given up on at its 1 s start timeout, not when the server exits (300 s)
    assert loops() == before  # its loop thread ended, the server process with it
