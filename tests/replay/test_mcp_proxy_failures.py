"""The MCP proxy when the tool server or the request misbehaves (issue 39 items 3 and 11): a stdio server
that crashes on a call is relaunched (bounded, with back-off) and the evidence names the death; one
that dies between calls is relaunched before the next call needs it; one that dies at every launch is
given up on; an HTTP server that goes away is "unreachable"; a huge tool result is truncated in its
span with ingest's marker; an oversize request body is refused unread; the proxy's own failure is a
proxy error. The agent is the MCP SDK's real client; the server a tiny MCP-SDK server."""

from __future__ import annotations

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
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from waits import EVENT_DEADLINE_S

from plumbline_otel.replay.limits import MIB, TRUNCATED_MARKER, ProxyLimits
from plumbline_otel.replay.mcp_proxy import McpProxy
from plumbline_otel.replay.mcp_proxy.evidence import McpTrialState

from .test_mcp_proxy import make_trial, run, text

pytestmark = pytest.mark.slow

SERVER = textwrap.dedent('''
    import os, socket, sys, threading

    from mcp.server.mcpserver import MCPServer

    DOOM = os.environ.get("DOOM_FILE", "")
    if DOOM and os.path.exists(DOOM):  # told to die at launch from now on
        sys.exit(7)
    app = MCPServer("crashy")

    @app.tool()
    def whoami() -> str:
        """The server process's id."""
        return str(os.getpid())

    @app.tool()
    def crash() -> str:
        """Die in the middle of the call."""
        os._exit(3)

    @app.tool()
    def exit_soon() -> str:
        """Answer, then die a moment later (between calls)."""
        threading.Timer(0.2, lambda: os._exit(4)).start()
        return "bye"

    @app.tool()
    def doom() -> str:
        """From now on, die at every launch; and die now."""
        open(DOOM, "w").close()
        os._exit(5)

    @app.tool()
    def big(n: int) -> str:
        """A result of n bytes."""
        return "y" * n

    if sys.argv[1:] == ["http"]:
        import anyio
        import uvicorn
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        print(sock.getsockname()[1], flush=True)
        anyio.run(uvicorn.Server(uvicorn.Config(app.streamable_http_app(), log_level="warning")).serve, [sock])
    else:
        app.run("stdio")
''')


@pytest.fixture
def server_py(tmp_path: Path) -> Path:
    path = tmp_path / "crashy.py"
    path.write_text(SERVER)
    return path


@pytest.fixture
def spans() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def stdio(server_py: Path, tmp_path: Path, spans: InMemorySpanExporter) -> Iterator[McpProxy]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    with open(tmp_path / "server.err", "w") as errlog:
        proxy = McpProxy([sys.executable, str(server_py)], env={"DOOM_FILE": str(tmp_path / "doom")}, tracer_provider=provider,
                         errlog=errlog, timeout_s=20, start_timeout_s=30, max_relaunches=2,
                         limits=ProxyLimits(max_request_bytes=1 * MIB, span_payload_bytes=64 << 10))
        proxy.start()
        try:
            yield proxy
        finally:
            proxy.stop()


def until(condition: Any, timeout: float = 30.0) -> bool:
    """Poll ``condition`` until true or a generous deadline: for states no event announces (a process's death)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


async def calls(url: str, *steps: tuple[str, dict[str, Any]]) -> list[Any]:
    """The agent: each step a tools/call; an MCPError is kept as the step's outcome."""
    out: list[Any] = []
    async with Client(url) as client:
        for tool, args in steps:
            try:
                out.append(await client.call_tool(tool, args))
            except MCPError as exc:
                out.append(exc)
    return out


def test_a_stdio_server_that_crashes_on_a_call_is_relaunched_and_the_death_is_in_the_evidence(stdio: McpProxy) -> None:
    route = stdio.open_trial(make_trial(0))
    try:
        before, died, after = run(calls(route.url, ("whoami", {}), ("crash", {}), ("whoami", {})), timeout=60)
    finally:
        evidence = stdio.close_trial(route)
    assert isinstance(died, MCPError) and "tool server died" in died.error.message
    assert not after.is_error and text(after) != text(before)  # a new process answered
    (death,) = evidence.server_died
    assert death == {"call": 1, "tool": "crash", "detail": death["detail"], "kind": "died", "relaunched": True}
    assert "during this call" in str(death["detail"]) and evidence.relaunches == 1 and evidence.proxy_errors == ()
    assert evidence.as_dict()["server_died"] == [death]
    # the next trial finds a working server and no death of its own
    second = stdio.open_trial(make_trial(1))
    try:
        (ok,) = run(calls(second.url, ("whoami", {})), timeout=60)
    finally:
        clean = stdio.close_trial(second)
    assert text(ok) == text(after) and clean.server_died == () and clean.relaunches == 0
    assert [r["ok"] for r in stdio.relaunches] == [True]


def test_a_server_that_dies_between_calls_is_relaunched_before_the_next_call(stdio: McpProxy) -> None:
    route = stdio.open_trial(make_trial(2))
    try:
        (bye,) = run(calls(route.url, ("exit_soon", {})), timeout=60)
        assert text(bye) == "bye"
        assert until(lambda: stdio.relaunches and stdio.relaunches[-1]["ok"]), "the dead server was not relaunched"
        (ok,) = run(calls(route.url, ("whoami", {})), timeout=60)
    finally:
        evidence = stdio.close_trial(route)
    assert not ok.is_error and evidence.server_died == () and evidence.relaunches == 1


def test_a_server_that_dies_at_every_launch_is_given_up_on_and_said_so(stdio: McpProxy) -> None:
    route = stdio.open_trial(make_trial(3))
    try:
        (doomed,) = run(calls(route.url, ("doom", {})), timeout=60)
        assert until(lambda: len(stdio.relaunches) >= 2 and all(r.get("error") for r in stdio.relaunches), 60)
        (refused,) = run(calls(route.url, ("whoami", {})), timeout=60)
    finally:
        evidence = stdio.close_trial(route)
    assert isinstance(doomed, MCPError) and isinstance(refused, MCPError)
    assert "not relaunched again" in refused.error.message
    assert [(d["call"], d["tool"], d["kind"], d["relaunched"]) for d in evidence.server_died] == [(1, "doom", "died", False),
                                                                                                  (1, "whoami", "died", False)]
    assert len(stdio.relaunches) == 2  # bounded: max_relaunches in a row


def test_an_http_server_that_goes_away_is_unreachable(server_py: Path, tmp_path: Path) -> None:
    with open(tmp_path / "http.err", "w") as errlog:
        server = subprocess.Popen([sys.executable, str(server_py), "http"], stdout=subprocess.PIPE, stderr=errlog, text=True,
                                  env={**os.environ, "DOOM_FILE": ""})
        try:
            assert server.stdout is not None
            line: list[str] = []
            reader = threading.Thread(target=lambda: line.append(server.stdout.readline()), daemon=True)  # type: ignore[union-attr]
            reader.start()
            reader.join(EVENT_DEADLINE_S)  # ends with the port line: importing the SDK takes long under load
            assert line and line[0].strip().isdigit()
            proxy = McpProxy(f"http://127.0.0.1:{int(line[0])}/mcp", timeout_s=10, start_timeout_s=3, max_relaunches=1)
            proxy.start()
            try:
                route = proxy.open_trial(make_trial(4))
                (ok,) = run(calls(route.url, ("whoami", {})), timeout=60)
                server.kill()
                server.wait(10)
                (gone,) = run(calls(route.url, ("whoami", {})), timeout=60)
                evidence = proxy.close_trial(route)
            finally:
                proxy.stop()
        finally:
            if server.poll() is None:
                server.kill()
                server.wait(10)
            if server.stdout is not None:
                server.stdout.close()
    assert not ok.is_error and isinstance(gone, MCPError) and "tool server died" in gone.error.message
    assert [(d["call"], d["tool"], d["kind"]) for d in evidence.server_died] == [(2, "whoami", "unreachable")]


def test_a_huge_tool_result_reaches_the_agent_whole_and_its_span_truncated(stdio: McpProxy, spans: InMemorySpanExporter) -> None:
    trial = make_trial(5)
    route = stdio.open_trial(trial)
    size = 4 * MIB
    try:
        (result,) = run(calls(route.url, ("big", {"n": size})), timeout=60)
    finally:
        stdio.close_trial(route)
    assert len(text(result)) == size  # the agent gets all of it
    (span,) = [s for s in spans.get_finished_spans() if s.attributes and s.attributes.get("plumbline.trial.id") == trial.trial_id]
    attributes: Any = span.attributes
    value = attributes["gen_ai.tool.call.result"]
    assert isinstance(value, str) and len(value.encode()) < (64 << 10) + 200 and TRUNCATED_MARKER in value
    assert "bytes in all" in value and list(attributes["plumbline.truncated"]) == ["gen_ai.tool.call.result"]
    assert json.loads(attributes["gen_ai.tool.call.arguments"]) == {"n": size}


def test_an_oversize_request_body_is_refused_unread(stdio: McpProxy) -> None:
    route = stdio.open_trial(make_trial(6))
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "big", "arguments": {"pad": "x" * (2 * MIB)}}}
    headers = {"accept": "application/json, text/event-stream", "mcp-protocol-version": "2025-11-25"}
    try:
        answer = httpx.post(route.url, json=body, headers=headers, timeout=EVENT_DEADLINE_S)
    finally:
        evidence = stdio.close_trial(route)
    assert answer.status_code == 413 and "PLUMBLINE_PROXY_MAX_REQUEST_MIB" in answer.json()["error"]["message"]
    assert [e["kind"] for e in evidence.proxy_errors] == ["request_too_large"] and evidence.calls == 0


def test_an_exception_inside_the_proxy_is_a_proxy_error(stdio: McpProxy, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: McpTrialState, tool: str, call: int) -> bool:
        raise KeyError("a bug in the proxy")

    monkeypatch.setattr(McpTrialState, "fault_fires", broken)
    route = stdio.open_trial(make_trial(7))
    try:
        (failed,) = run(calls(route.url, ("whoami", {})), timeout=60)
    finally:
        evidence = stdio.close_trial(route)
    assert isinstance(failed, MCPError) and "plumbline MCP proxy internal error" in failed.error.message
    assert [(e["call"], e["tool"], e["kind"]) for e in evidence.proxy_errors] == [(1, "whoami", "internal")]
    assert evidence.server_died == ()

