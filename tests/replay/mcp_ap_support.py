"""The accounts-payable agent on an MCP server, replayed against the recorded production fixture `mcp_openai_agents`:
the unmodified OpenAI Agents SDK agent (`agents/openai_agents_mcp_ap.py`), its tools on the scripted tool server
(`branch_tools_server.py`, which logs every call it gets) and its model the simulated provider, scripted to do what
the fixture's clean runs did. Shared by the branch-point replay tests and the console's "replay from here" test."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
from click.testing import CliRunner

from plumbline_otel.cli.main import cli
from plumbline_otel.model import Trajectory
from plumbline_otel.replay.proxy.simulated import SimReply, SimulatedProvider
from plumbline_otel.replay.proxy.wire import Api, request_tool_calls, tool_name
from plumbline_otel.store import Store

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "frameworks" / "mcp_openai_agents" / "trace.otlp.jsonl"
SERVER = ROOT / "tests" / "replay" / "branch_tools_server.py"
AGENT = f"command:sh -c 'AP_MCP_URL=\"$PLUMBLINE_MCP_URL\" exec {sys.executable} -m tests.replay.agents.openai_agents_mcp_ap'"
REQUEST = "Please pay invoice INV-1001 from Acme GmbH."  # the production task every test here replays
ARGS: dict[str, dict[str, Any]] = {"lookup_invoice": {"invoice_id": "INV-1001"}, "check_duplicate": {"invoice_id": "INV-1001", "vendor": "Acme GmbH"},
        "schedule_payment": {"invoice_id": "INV-1001", "amount": 4820.0, "currency": "EUR"}}


def scripted_model(api: Api, body: dict[str, Any]) -> SimReply:
    """The fixture's clean script (simulated): look up, check for a duplicate, schedule the payment, say so (never a decoy)."""
    called = {c.name for c in request_tool_calls(api, body)}
    offered = [tool_name(api, t) for t in body.get("tools") or []]
    for tool, args in ARGS.items():
        if tool in offered and tool not in called:
            return SimReply(tool_calls=[(tool, args)], input_tokens=200, output_tokens=20)
    failed = "error" in orjson.dumps(body).decode().lower()
    return SimReply(text="Could not pay INV-1001." if failed else "Paid INV-1001.", input_tokens=300, output_tokens=10)


def production_store(path: Path) -> Path:
    """The production traffic at `path`: the framework fixture's six runs (the OpenAI Agents SDK over MCP, content captured)."""
    result = CliRunner().invoke(cli, ["ingest", str(FIXTURE), "--db", str(path), "--quiet"])
    assert result.exit_code == 0, result.output
    return path


def production_runs(db: Path) -> list[Trajectory]:
    """The stored runs of the production task (`REQUEST`), assembled."""
    with Store(db) as store:
        store.assemble()
        return [t for t in store.trajectories() if t.input == REQUEST]


def simulated_provider() -> Iterator[SimulatedProvider]:
    """The simulated model provider, scripted by `scripted_model`, for the length of a fixture."""
    sim = SimulatedProvider(scripted_model).start()
    yield sim
    sim.stop()
