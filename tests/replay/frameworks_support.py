"""The framework agents' replays (tests/replay/agents: the OpenAI Agents SDK, pydantic-ai, LangGraph, a Node agent on
the OpenAI JavaScript SDK), shared by the end-to-end replay and branch-point tests: the simulated model they all reach
through the proxy, the invariants their runs are certified against, and one `plumbline replay` then `certify` of the toy
traffic (`conftest.db`). The provider started on ``scripted_model`` is `conftest.provider`; the Node agent's packages
`conftest.node_agent_packages`."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import orjson
from click.testing import CliRunner

from plumbline_otel.cli.main import cli
from plumbline_otel.replay.proxy.simulated import SimReply
from plumbline_otel.replay.proxy.wire import Api, request_tool_calls, tool_name

ROOT = Path(__file__).resolve().parents[2]
NODE_AGENT = ROOT / "tests" / "replay" / "agents" / "node"
SPEC = """version: 1
name: ap
invariants:
  - {id: PAY, severity: critical, must_call: pay}
  - {id: LOOK-FIRST, severity: critical, ordering: [lookup_invoice, pay]}
"""
TOOLS = ("lookup_invoice", "pay")
ENV = {"OPENAI_API_KEY": "sk-not-a-real-key", "OPENAI_AGENTS_DISABLE_TRACING": "1", "OPENAI_BASE_URL": None}


def scripted_model(api: Api, body: dict[str, Any]) -> SimReply:
    """The simulated model: look the invoice up, then pay it, then say so (it never calls a decoy)."""
    invoice = (re.findall(r"INV-\d+", orjson.dumps(body).decode()) or ["INV-0"])[0]
    called = {c.name for c in request_tool_calls(api, body)}
    offered = [tool_name(api, t) for t in body.get("tools") or []]
    for tool in TOOLS:
        if tool in offered and tool not in called:
            return SimReply(tool_calls=[(tool, {"invoice_id": invoice})], input_tokens=200, output_tokens=20)
    return SimReply(text=f"Paid {invoice}.", input_tokens=300, output_tokens=10)


def replay(tmp_path: Path, db: Path, provider: Any, study: str, adapter: str, perturbations: str, *extra: str) -> tuple[Any, dict[str, Any]]:
    """`plumbline replay --proxy` of ``db``'s tasks as ``study`` with ``adapter`` (its model ``provider``, anything with
    an ``openai_url``), its spans ingested and the study certified against `SPEC`: (the replay's result, the
    certificate's cells by perturbation)."""
    runner = CliRunner()
    spans = tmp_path / f"{study}.jsonl"
    result = runner.invoke(cli, ["replay", "--db", str(db), "--study", study, "--agent", "toy-agent", "--service", f"{study}-agent@1",
                                 "--adapter", adapter, "--adapter-option", f"cwd={ROOT}", "--adapter-option", "timeout_s=120",
                                 "--perturbations", perturbations, "--proxy", "--upstream", f"openai={provider.openai_url}",
                                 "--otlp-file", str(spans), "--concurrency", "2", "--trace-wait", "10", "--quiet", *extra], env=ENV)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert runner.invoke(cli, ["ingest", str(spans), "--db", str(db), "--quiet"]).exit_code in (0, 3)
    spec, out = tmp_path / "ap.spec.yaml", tmp_path / f"{study}.cert.json"
    spec.write_text(SPEC)
    certified = runner.invoke(cli, ["certify", "--spec", str(spec), "--db", str(db), "--study", study,
                                    "--out", str(out), "--format", "none"])
    assert certified.exit_code == 0, certified.output
    return result, {c["perturbation"]: c for a in json.loads(out.read_text())["agents"] for c in a["perturbations"]}
